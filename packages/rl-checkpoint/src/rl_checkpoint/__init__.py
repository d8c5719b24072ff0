"""Standalone checkpoint converter (DCP, Megatron, LoRA, GGUF <-> HF safetensors).

Depends only on torch, safetensors and numpy (``gguf`` and ``transformers`` are optional extras).
"""

__version__ = "0.1.0"

from rl_checkpoint.convert import diff, gguf_to_hf, hf_to_dcp, inspect, merge_lora, to_hf, write_hf
from rl_checkpoint.detect import detect_format, open_checkpoint
from rl_checkpoint.errors import CheckpointError
from rl_checkpoint.integrity import verify, write_manifest
from rl_checkpoint.layout import model_dir
from rl_checkpoint.runs import hf_model_dir

__all__ = ["CheckpointError", "detect_format", "diff", "gguf_to_hf", "hf_model_dir", "hf_to_dcp", "inspect",
           "merge_lora", "model_dir", "open_checkpoint", "to_hf", "verify", "write_hf", "write_manifest"]
