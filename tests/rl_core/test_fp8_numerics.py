"""rl_core.fp8: e4m3 quantization with block scales, its error bounds, the FP8 matmul and Fp8Linear."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from rl_core.fp8 import (
    E4M3,
    E4M3_MAX,
    Fp8Linear,
    fp8_layers_by_weight_name,
    fp8_linear,
    fp8_matmul,
    quantize,
    quantize_linear_weights_,
    quantize_weight,
)
from rl_core.fp8.numerics import expand_scale

# Every finite e4m3 value (the 256 codes less the two NaNs).
E4M3_VALUES = torch.arange(256, dtype=torch.uint8).view(E4M3).float()
E4M3_VALUES = E4M3_VALUES[~E4M3_VALUES.isnan()]
MIN_NORMAL = 2.0**-6  # smallest normal e4m3 magnitude


def weight_of_many_magnitudes(scheme: str, seed=0) -> torch.Tensor:
    """Gaussian values whose magnitude (1e-4 .. 1e3) changes per row (per_channel) or per 128 x 128
    block (block, 300 x 200: partial blocks too), so the scales span many binades."""
    gen = torch.Generator().manual_seed(seed)
    if scheme == "per_channel":
        magnitudes = 10.0 ** torch.linspace(-4, 3, 96).unsqueeze(1)
        return torch.randn(96, 200, generator=gen) * magnitudes
    magnitudes = 10.0 ** torch.tensor([[-4.0, 3.0], [0.0, -1.0], [2.0, -2.5]])
    full = magnitudes.repeat_interleave(128, dim=0).repeat_interleave(128, dim=1)[:300, :200]
    return torch.randn(300, 200, generator=gen) * full


@pytest.mark.parametrize("scheme", ["per_channel", "block"])
def test_round_trip_error_is_within_e4m3_rounding(scheme):
    w = weight_of_many_magnitudes(scheme)
    q = quantize_weight(w, scheme)
    assert q.data.dtype == E4M3 and q.scale.dtype == torch.float32
    scale = expand_scale(q.scale, q.block, q.shape)  # [rows, cols]: each element's scale
    back = q.dequantize()
    normal = (w / scale).abs() >= MIN_NORMAL
    rel = ((back - w).abs() / w.abs())[normal]
    # Round to nearest with 3 mantissa bits: |error| <= 2**-4 |x| (the brief's bound 2**-3 with a margin).
    assert rel.max() <= 2.0**-4
    assert normal.float().mean() > 0.95
    # Subnormal scaled values: absolute error <= half the subnormal step (2**-9) times the scale.
    assert ((back - w).abs()[~normal] <= 2.0**-10 * scale[~normal] * (1 + 1e-6)).all()
    assert (q.data.float().abs() <= E4M3_MAX).all()


def test_values_representable_after_scaling_round_trip_exactly():
    gen = torch.Generator().manual_seed(1)
    codes = E4M3_VALUES[torch.randint(len(E4M3_VALUES), (64, 256), generator=gen)]
    codes[:, 0] = E4M3_MAX  # each row's (and each 128-block's first row's) amax is exactly 448 x scale
    codes[:, 128] = -E4M3_MAX
    row_scales = 2.0 ** torch.randint(-20, 10, (64, 1), generator=gen).float()
    w = codes * row_scales
    q = quantize_weight(w, "per_channel")
    assert torch.equal(q.data.float(), codes)
    assert torch.equal(q.scale, row_scales)
    assert torch.equal(q.dequantize(), w)
    # 128 x 128 blocks with one power-of-two scale per block: exact as well.
    block_scales = 2.0 ** torch.tensor([[-3.0, 5.0]])
    wb = codes * block_scales.repeat_interleave(128, dim=1)
    qb = quantize_weight(wb, "block")
    assert torch.equal(qb.scale, block_scales)
    assert torch.equal(qb.dequantize(), wb)


@pytest.mark.parametrize("shape, block, expected", [
    ((300, 200), (128, 128), (3, 2)),
    ((300, 200), (1, 200), (300, 1)),
    ((5, 3), (128, 128), (1, 1)),
    ((129, 257), (128, 128), (2, 3)),
    ((7, 300), (1, 128), (7, 3)),
])
def test_block_scale_shapes_for_sizes_that_do_not_divide(shape, block, expected):
    w = torch.randn(shape, generator=torch.Generator().manual_seed(2))
    q = quantize(w, block)
    assert tuple(q.scale.shape) == expected
    assert q.dequantize().shape == w.shape


def test_partial_blocks_use_their_own_amax_and_zero_blocks_scale_one():
    w = torch.zeros(130, 260)
    w[0, 0] = 4.0           # block (0, 0)
    w[129, 259] = -0.5      # the last, partial block (1, 2): 2 x 4 elements
    q = quantize(w, (128, 128))
    expected = torch.tensor([[4.0 / E4M3_MAX, 1.0, 1.0], [1.0, 1.0, 0.5 / E4M3_MAX]])
    torch.testing.assert_close(q.scale, expected, rtol=0, atol=0)
    assert torch.equal(q.dequantize(), w)


def test_fp8_linear_is_the_product_of_the_quantized_operands():
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(2, 5, 64, generator=gen)
    w = torch.randn(48, 64, generator=gen) * 0.05
    bias = torch.randn(48, generator=gen)
    qw = quantize_weight(w, "per_channel")
    y = fp8_linear(x, qw, bias)
    qx = quantize(x.reshape(10, 64), (1, 64))  # per token
    expected = (qx.dequantize() @ qw.dequantize().T + bias).reshape(2, 5, 48)
    torch.testing.assert_close(y, expected, rtol=1e-6, atol=1e-6)
    exact = x @ w.T + bias
    # Both operands carry <= 2**-4 relative rounding per element; the sums average it down.
    assert (y - exact).norm() / exact.norm() < 0.05


def test_blockwise_weights_quantize_activations_in_groups_of_128():
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(3, 256, generator=gen)
    x[:, 128:] *= 1000.0  # a per-token scale would flush the first group's values to subnormals
    w = torch.randn(32, 256, generator=gen)
    qw = quantize_weight(w, "block")
    y = fp8_linear(x, qw)
    qx = quantize(x, (1, 128))
    assert qx.scale.shape == (3, 2)
    torch.testing.assert_close(y, qx.dequantize() @ qw.dequantize().T, rtol=1e-6, atol=1e-4)
    exact = x[:, :128] @ w[:, :128].T
    grouped = fp8_matmul(quantize(x[:, :128].contiguous(), (1, 128)), quantize_weight(w[:, :128].contiguous(), "block"),
                         torch.float32)
    assert (grouped - exact).norm() / exact.norm() < 0.05


def test_fp8_linear_refit_requantizes_in_place():
    linear = nn.Linear(64, 32, bias=True)
    layer = Fp8Linear.from_linear(linear, "per_channel")
    pointers = (layer.weight.data_ptr(), layer.weight_scale.data_ptr())
    new = torch.randn(32, 64) * 3.0
    layer.load_weight(new)
    assert (layer.weight.data_ptr(), layer.weight_scale.data_ptr()) == pointers
    x = torch.randn(4, 64)
    torch.testing.assert_close(layer(x), fp8_linear(x, quantize_weight(new, "per_channel"), linear.bias), rtol=0, atol=0)
    with pytest.raises(ValueError, match=r"expected shape \(32, 64\)"):
        layer.load_weight(torch.randn(64, 32))


class _AdapterLinear(nn.Linear):
    """A subclass with its own forward (as a LoRA layer): never converted."""


def test_quantize_linear_weights_converts_the_eligible_linears(tiny_tokenizer):
    from rl_core.models import build_tiny_model

    model = build_tiny_model(tiny_tokenizer)
    model.model.layers[0].mlp.odd = nn.Linear(64, 20)        # out features not a multiple of 16
    model.model.layers[1].mlp.adapter = _AdapterLinear(64, 64)
    converted = quantize_linear_weights_(model, "per_channel")
    projections = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                   "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]
    assert converted == [f"model.layers.{i}.{p}" for i in range(2) for p in projections]
    assert type(model.lm_head) is nn.Linear and type(model.model.layers[0].mlp.odd) is nn.Linear
    assert type(model.model.layers[1].mlp.adapter) is _AdapterLinear
    assert isinstance(model.model.layers[0].self_attn.q_proj, Fp8Linear)
    assert model.model.layers[0].self_attn.q_proj.weight.dtype == E4M3
    # Refit: the converted layers by the HF name of their weight, re-quantizing what they receive.
    layers = fp8_layers_by_weight_name(model)
    assert sorted(layers) == sorted(f"{name}.weight" for name in converted)
    new = torch.randn(64, 64)
    layers["model.layers.1.self_attn.o_proj.weight"].load_weight(new)
    assert torch.equal(model.model.layers[1].self_attn.o_proj.fp8_weight.dequantize(),
                       quantize_weight(new, "per_channel").dequantize())


@pytest.mark.gpu
def test_scaled_mm_on_cuda_equals_the_reference():
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("FP8 matmul needs compute capability 8.9+")
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(64, 256, generator=gen)
    w = torch.randn(128, 256, generator=gen) * 0.02
    qx, qw = quantize(x, (1, 256)), quantize_weight(w, "per_channel")
    reference = fp8_matmul(qx, qw, torch.float32)  # CPU: dequantized fp32 product
    from rl_core.fp8 import can_use_scaled_mm

    qx_cuda, qw_cuda = qx.to("cuda"), qw.to("cuda")
    assert can_use_scaled_mm(qx_cuda, qw_cuda)
    got = fp8_matmul(qx_cuda, qw_cuda, torch.float32).cpu()
    # The same products summed in fp32 by cuBLAS, rounded once to bf16 (8 bits: <= 2**-9 relative).
    torch.testing.assert_close(got, reference, rtol=2**-8, atol=1e-3)
