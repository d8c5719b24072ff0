"""GGUF (llama.cpp) files -> HF Llama/Qwen2 tensors and config, dequantised with the ``gguf`` package.

llama.cpp's converter permutes the rows of ``q_proj``/``k_proj`` of Llama models so its rotary kernel
sees pairs ``(x0, x1), (x2, x3)...`` instead of HF's half-split ``(x0, x_{d/2})``; loading undoes it per
head: ``w.reshape(heads, 2, d/2, in)`` was written as ``w.reshape(heads, d/2, 2, in)``. Qwen2 files
are not permuted. Tensor shapes in GGUF are listed innermost-first, so they are reversed here.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import torch

from rl_checkpoint.errors import CheckpointError
from rl_checkpoint.safetensors_io import TensorInfo
from rl_checkpoint.sources import natural_key

_TOP = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
        "output.weight": "lm_head.weight"}
_LAYER = {
    "attn_norm.weight": "input_layernorm.weight", "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight", "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight", "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias", "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias", "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight", "ffn_down.weight": "mlp.down_proj.weight",
}
_CONFIG_KEYS = {  # "<arch>.<key>" -> HF config field
    "context_length": "max_position_embeddings", "block_count": "num_hidden_layers",
    "feed_forward_length": "intermediate_size", "embedding_length": "hidden_size",
    "rope.freq_base": "rope_theta", "attention.head_count": "num_attention_heads",
    "attention.head_count_kv": "num_key_value_heads", "attention.layer_norm_rms_epsilon": "rms_norm_eps",
}
_ARCHS = {"llama": ("LlamaForCausalLM", "llama"), "qwen2": ("Qwen2ForCausalLM", "qwen2")}


def _require_gguf():
    try:
        import gguf
    except ImportError:
        raise CheckpointError('reading GGUF files needs the gguf package: pip install "rl-checkpoint[gguf]"') from None
    return gguf


def hf_name(gguf_name: str) -> str:
    """GGUF tensor name -> HF Llama/Qwen2 parameter name."""
    if gguf_name in _TOP:
        return _TOP[gguf_name]
    m = re.match(r"^blk\.(\d+)\.(.+)$", gguf_name)
    if m and m.group(2) in _LAYER:
        return f"model.layers.{m.group(1)}.{_LAYER[m.group(2)]}"
    raise CheckpointError(f"GGUF tensor {gguf_name} has no HF Llama/Qwen2 counterpart")


def unpermute_rotary(w: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's per-head rotary row interleave of q_proj/k_proj ([heads * d, ...])."""
    half = w.shape[0] // heads // 2
    return w.reshape(heads, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


class GGUFSource:
    """Dequantised tensors of a GGUF file under HF names, cast to ``dtype``."""

    def __init__(self, path: str | Path, dtype: torch.dtype = torch.float32):
        gguf = _require_gguf()
        self.path = Path(path)
        if not self.path.is_file():
            raise CheckpointError(f"{self.path}: no such GGUF file")
        try:
            self.reader = gguf.GGUFReader(str(self.path))
        except Exception as e:
            raise CheckpointError(f"{self.path}: not a readable GGUF file ({type(e).__name__}: {e}); re-download it") from None
        self.arch = self.field("general.architecture")
        if self.arch not in _ARCHS:
            raise CheckpointError(f"{self.path}: GGUF architecture {self.arch!r} is not supported (llama, qwen2)")
        self.dtype = dtype
        self._tensors = {hf_name(t.name): t for t in self.reader.tensors}
        self.infos = {name: TensorInfo(tuple(int(d) for d in reversed(self._tensors[name].shape.tolist())), dtype)
                      for name in sorted(self._tensors, key=natural_key)}

    def field(self, key: str, default=None):
        f = self.reader.fields.get(key)
        return default if f is None else f.contents()

    def hf_config(self) -> dict:
        """An HF config.json dict built from the GGUF metadata."""
        arch_cls, model_type = _ARCHS[self.arch]
        cfg: dict = {"architectures": [arch_cls], "model_type": model_type, "hidden_act": "silu",
                     "tie_word_embeddings": "lm_head.weight" not in self._tensors, "dtype": str(self.dtype).removeprefix("torch.")}
        for key, hf_key in _CONFIG_KEYS.items():
            value = self.field(f"{self.arch}.{key}")
            if value is not None:
                cfg[hf_key] = value
        cfg["vocab_size"] = self.infos["model.embed_tokens.weight"].shape[0]
        cfg["head_dim"] = cfg["hidden_size"] // cfg["num_attention_heads"]
        for token in ("bos", "eos", "padding"):
            value = self.field(f"tokenizer.ggml.{token}_token_id")
            if value is not None:
                cfg["pad_token_id" if token == "padding" else f"{token}_token_id"] = int(value)
        if model_type == "llama":
            cfg |= {"attention_bias": False, "mlp_bias": False}
        return cfg

    def load(self, names: list[str]) -> dict[str, torch.Tensor]:
        gguf = _require_gguf()
        cfg = self.hf_config()
        out = {}
        for name in names:
            tensor = self._tensors[name]
            values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
            values = np.asarray(values, dtype=np.float32).reshape(self.infos[name].shape)
            if self.arch == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):
                heads = cfg["num_attention_heads"] if "q_proj" in name else cfg.get("num_key_value_heads", cfg["num_attention_heads"])
                values = unpermute_rotary(values, heads)
            if not values.flags.writeable or not values.flags.c_contiguous:  # F32 tensors are views of the mmap
                values = np.array(values, order="C")
            out[name] = torch.from_numpy(values).to(self.dtype)
        return out


def save_gguf_tokenizer(gguf_path: Path, out_dir: Path) -> None:
    """Write the GGUF's tokenizer as HF files (needs transformers: the ``[hf]`` extra)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    tok.save_pretrained(str(out_dir))
