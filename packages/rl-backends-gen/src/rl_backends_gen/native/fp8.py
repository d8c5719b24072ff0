"""FP8 weights for the native engine (``generation.quantization: fp8``).

After loading, every linear layer the shared rule allows (``rl_core.fp8.is_fp8_eligible``: a plain
``nn.Linear`` with in/out features multiples of 16, not the LM head, a reward head or a MoE router)
becomes an ``rl_core.fp8.Fp8Linear``: its weight in float8_e4m3fn with fp32 scales (one per output row,
or per 128 x 128 block), its activations quantized per token (per 1 x 128 group) in each forward, the
product by ``torch._scaled_mm`` on CUDA (per-channel scales, SM 8.9+) or the dequantized fp32 reference
elsewhere. Embeddings, norms, convolutions and MoE experts stored as 3-D parameters are not
``nn.Linear``s and stay in the engine's dtype.

The engine also keeps the linears whose ``weight`` it reads itself rather than calling the module
(``ENGINE_READS_WEIGHT``): multi-head latent attention absorbs ``kv_b_proj``'s weight into its query
and output (``latent.py``).

Refit: ``rl_backends_gen.weights.copy_weights_in_place`` routes an FP8 layer's HF weight name to
``Fp8Linear.load_weight``, which re-quantizes into the same buffers (no reallocation).
"""

from __future__ import annotations

from typing import Literal

from torch import nn

from rl_core.fp8 import DEFAULT_SKIP_MODULES, quantize_linear_weights_

ENGINE_READS_WEIGHT: tuple[str, ...] = ("kv_b_proj",)
"""Linears whose weight the engine multiplies itself (so they must stay high precision)."""


def quantize_engine_weights(model: nn.Module, quantization: Literal["fp8"] | None,
                            scheme: Literal["per_channel", "block"] | None = None) -> list[str]:
    """Convert ``model``'s eligible linears to FP8 in place when ``quantization == "fp8"``, with
    ``scheme`` scales (None: per_channel); returns the converted module paths (empty without quantization)."""
    if quantization is None:
        return []
    if quantization != "fp8":
        raise ValueError(f"quantization must be 'fp8' or None, got {quantization!r}")
    return quantize_linear_weights_(model, scheme or "per_channel",
                                    skip_modules=DEFAULT_SKIP_MODULES + ENGINE_READS_WEIGHT)
