"""FP8 (float8_e4m3fn) quantization with block scales, and the matmul of quantized operands.

One concept covers every granularity: a 2-D tensor ``[rows, cols]`` is cut into blocks of
``(block_rows, block_cols)`` elements (the last ones partial when the size does not divide), each
block gets one fp32 scale ``amax(block) / 448`` and its values are stored as ``round_e4m3(x / scale)``.
``x ~= data * scale``. The usual schemes are block shapes:

* per output channel of a weight ``[out, in]``: ``(1, in)``, scales ``[out, 1]``;
* 128 x 128 weight blocks (DeepSeek-V3 / NeMo RL blockwise): ``(128, 128)``, scales ``[ceil(out/128), ceil(in/128)]``;
* per token of an activation ``[tokens, k]``: ``(1, k)``; per 1 x 128 group: ``(1, 128)``.

Rounding to nearest e4m3 (3 mantissa bits) has a relative error <= 2**-4 for values whose scaled
magnitude is normal (>= 2**-6); below, the absolute error is <= 2**-10 * scale (half the subnormal step).

``fp8_matmul(a, b)`` computes ``a @ b.T`` of two quantized operands: on CUDA with per-row scales on
both (per-token activations x per-channel weights) through ``torch._scaled_mm`` (fp32 accumulation,
bf16 output); everywhere else by the reference, the dequantized operands multiplied in fp32, which
is the same sum of the same products up to accumulation order.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch

E4M3 = torch.float8_e4m3fn
E4M3_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max
BLOCK = 128

WeightScheme = Literal["per_channel", "block"]
"""per_channel: one scale per output row of a weight [out, in]. block: one per 128 x 128 block."""


@dataclass(frozen=True)
class Fp8Tensor:
    """A 2-D tensor held in float8_e4m3fn with one fp32 scale per block: ``x ~= data * scale``."""

    data: torch.Tensor  # [rows, cols] float8_e4m3fn
    scale: torch.Tensor  # [ceil(rows / block[0]), ceil(cols / block[1])] float32
    block: tuple[int, int]  # (block_rows, block_cols)

    @property
    def shape(self) -> torch.Size:
        return self.data.shape

    @property
    def row_scaled(self) -> bool:
        """One scale per row (a block spans every column)."""
        return self.block[0] == 1 and self.scale.shape[1] == 1

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """``[rows, cols]`` values ``data * scale`` (computed in fp32, then cast to ``dtype``)."""
        return (self.data.float() * expand_scale(self.scale, self.block, self.shape)).to(dtype)

    def to(self, device: torch.device | str) -> Fp8Tensor:
        return Fp8Tensor(self.data.to(device), self.scale.to(device), self.block)


def block_shape(scheme: WeightScheme, cols: int) -> tuple[int, int]:
    """The block of a weight scheme for a weight with ``cols`` input features."""
    if scheme == "per_channel":
        return (1, cols)
    if scheme == "block":
        return (BLOCK, BLOCK)
    raise ValueError(f"unknown FP8 weight scheme {scheme!r}: use 'per_channel' or 'block'")


def activation_block(weight: Fp8Tensor) -> tuple[int, int]:
    """How the activations multiplying ``weight`` are quantized: per token (one scale per row) for a
    per-channel weight, per 1 x block_cols group for a blockwise one (the groups line up with the
    weight's blocks along the reduced dimension)."""
    cols = weight.shape[1]
    return (1, cols) if weight.row_scaled else (1, weight.block[1])


def scale_shape(shape: tuple[int, int], block: tuple[int, int]) -> tuple[int, int]:
    return (math.ceil(shape[0] / block[0]), math.ceil(shape[1] / block[1]))


def expand_scale(scale: torch.Tensor, block: tuple[int, int], shape: tuple[int, int]) -> torch.Tensor:
    """``[rows, cols]``: each element's block scale."""
    full = scale.repeat_interleave(block[0], dim=0).repeat_interleave(block[1], dim=1)
    return full[: shape[0], : shape[1]]


def quantize(x: torch.Tensor, block: tuple[int, int]) -> Fp8Tensor:
    """``x`` [rows, cols] to e4m3 with one scale ``amax / 448`` per ``block`` (partial blocks at the
    ends use their own elements). A block of zeros gets scale 1."""
    if x.dim() != 2:
        raise ValueError(f"quantize takes a 2-D tensor, got shape {tuple(x.shape)}")
    rows, cols = x.shape
    block = (min(block[0], rows) or 1, min(block[1], cols) or 1)
    grid = scale_shape((rows, cols), block)
    padded = x.float().new_zeros(grid[0] * block[0], grid[1] * block[1])
    padded[:rows, :cols] = x.float()
    # [grid_rows, block_rows, grid_cols, block_cols] -> amax per block: [grid_rows, grid_cols]
    amax = padded.view(grid[0], block[0], grid[1], block[1]).abs().amax(dim=(1, 3))
    scale = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))
    scaled = x.float() / expand_scale(scale, block, (rows, cols))
    data = scaled.clamp(-E4M3_MAX, E4M3_MAX).to(E4M3)
    return Fp8Tensor(data, scale, block)


def quantize_weight(weight: torch.Tensor, scheme: WeightScheme) -> Fp8Tensor:
    """A linear layer's weight ``[out, in]`` with per-output-channel or 128 x 128 block scales."""
    return quantize(weight, block_shape(scheme, weight.shape[1]))


def fp8_matmul(a: Fp8Tensor, b: Fp8Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """``a @ b.T`` ([m, k] x [n, k] -> [m, n]) of quantized operands, in ``out_dtype``.

    CUDA, both row-scaled, k and n multiples of 16: ``torch._scaled_mm`` (rowwise scales, bf16 out).
    Otherwise the reference: dequantized operands multiplied in fp32."""
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"fp8_matmul: inner sizes differ, {tuple(a.shape)} x {tuple(b.shape)}.T")
    if can_use_scaled_mm(a, b):
        # _scaled_mm wants mat2 column-major: b.data.t() of a contiguous [n, k] is exactly that.
        out = torch._scaled_mm(a.data, b.data.t(), scale_a=a.scale, scale_b=b.scale.t().contiguous(), out_dtype=torch.bfloat16)
        return out.to(out_dtype)
    return (a.dequantize(torch.float32) @ b.dequantize(torch.float32).t()).to(out_dtype)


def can_use_scaled_mm(a: Fp8Tensor, b: Fp8Tensor) -> bool:
    """Whether ``fp8_matmul`` takes the ``torch._scaled_mm`` path (CUDA, SM 8.9+, rowwise scales)."""
    if not (a.data.is_cuda and b.data.is_cuda and a.row_scaled and b.row_scaled):
        return False
    if a.shape[1] % 16 or b.shape[0] % 16:
        return False
    return torch.cuda.get_device_capability(a.data.device) >= (8, 9)


def fp8_linear(x: torch.Tensor, weight: Fp8Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ W.T + bias`` with ``W`` quantized and ``x`` [..., in] quantized on the fly (per token
    for a per-channel weight, per 1 x 128 group for a blockwise one); the output in ``x.dtype``."""
    lead = x.shape[:-1]
    x2d = x.reshape(-1, x.shape[-1])
    out = fp8_matmul(quantize(x2d, activation_block(weight)), weight, x.dtype)
    if bias is not None:
        out = out + bias.to(out.dtype)
    return out.reshape(*lead, weight.shape[0])
