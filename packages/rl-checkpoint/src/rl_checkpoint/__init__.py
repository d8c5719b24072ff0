"""Standalone checkpoint converter (DCP, Megatron, LoRA, GGUF <-> HF safetensors)."""

__version__ = "0.1.0"
