"""FP8 numerics shared by training and generation (torch only): block-scaled e4m3 quantization, the
FP8 matmul (``torch._scaled_mm`` on CUDA, a dequantized fp32 reference elsewhere), ``Fp8Linear`` and
the rule of which linears run in FP8."""

from rl_core.fp8.modules import (
    DEFAULT_SKIP_MODULES,
    FEATURE_MULTIPLE,
    Fp8Linear,
    fp8_layers_by_weight_name,
    is_fp8_eligible,
    matches_module,
    quantize_linear_weights_,
)
from rl_core.fp8.numerics import (
    BLOCK,
    E4M3,
    E4M3_MAX,
    Fp8Tensor,
    WeightScheme,
    can_use_scaled_mm,
    fp8_linear,
    fp8_matmul,
    quantize,
    quantize_weight,
)

__all__ = [
    "BLOCK",
    "DEFAULT_SKIP_MODULES",
    "E4M3",
    "E4M3_MAX",
    "FEATURE_MULTIPLE",
    "Fp8Linear",
    "Fp8Tensor",
    "WeightScheme",
    "can_use_scaled_mm",
    "fp8_layers_by_weight_name",
    "fp8_linear",
    "fp8_matmul",
    "is_fp8_eligible",
    "matches_module",
    "quantize",
    "quantize_linear_weights_",
    "quantize_weight",
]
