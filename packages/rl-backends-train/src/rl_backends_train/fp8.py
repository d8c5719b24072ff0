"""FP8 linear layers of the DTensor backend: torchao's float8 training (extra ``rl-backends-train[fp8]``).

``convert_linears_to_fp8`` swaps each eligible ``nn.Linear`` (``rl_core.fp8.is_fp8_eligible`` with
``policy.precision.skip_modules``) for torchao's ``Float8Linear`` before FSDP2 shards the model. A
``Float8Linear`` is an ``nn.Linear`` whose weight stays a high-precision parameter (the fp32 master
FSDP2 holds): each forward casts input and weight to float8 with dynamic scales, and the backward
casts the output gradient, so the three matmuls of a linear run in FP8 while state dicts,
checkpoints, export and refit see the same names, shapes and dtypes as without FP8.

- On CUDA (compute capability 8.9+, e.g. H100/H200) the matmuls are ``torch._scaled_mm``; with FSDP2
  and recipe tensorwise the weights are all-gathered in float8 (``enable_fsdp_float8_all_gather``).
- On CPU torchao's emulation mode (``emulate=True``) runs the same casts and an fp32 matmul of the
  float8 values: the same numerics, without the speed.
- recipe blockwise is torchao's prototype ``Float8BlockwiseLinear`` (triton kernels, SM90, bf16,
  no bias, features multiples of 128); it has no emulation, so CPU runs refuse it.
- The float8 matmuls want aligned shapes whatever the micro-batch's token count: tensorwise and
  rowwise pad inner dimensions to multiples of 16 (torchao's ``pad_inner_dim``), blockwise pads the
  tokens to whole 128-row blocks (``pad_tokens_to_blocks``).
"""

from __future__ import annotations

import dataclasses
import importlib
import sys

import torch
from torch import nn

from rl_backends_train.config import PrecisionConfig, TrainBackendConfig
from rl_core.fp8 import is_fp8_eligible

TORCHAO_EXTRA_HINT = 'Please install "rl-backends-train[fp8]" to train with policy.precision.linear=fp8'
BLOCKWISE_MULTIPLE = 128


def import_extra(module: str, hint: str):
    """Import ``module`` or raise one ImportError: ``hint`` (naming the pip extra), then the cause."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ImportError(f"{hint}: {e}") from e


def require_torchao():
    """torchao's float8 training, or one ImportError naming the extra."""
    return import_extra("torchao.float8", f"{TORCHAO_EXTRA_HINT} (torchao float8 training, backend=dtensor)")


def check_before_start(cfg: TrainBackendConfig) -> None:
    """In the driver, before any worker starts: torchao is importable, and a recipe without CPU
    emulation is not asked of CPU ranks (Ray ranks without GPUs, or an in-process rank without CUDA)."""
    require_torchao()
    on_cpu = cfg.gpus_per_worker == 0 if cfg.use_ray else not torch.cuda.is_available()
    if on_cpu:
        check_device(cfg.precision, torch.device("cpu"))


def check_device(precision: PrecisionConfig, device: torch.device) -> None:
    """Refuse a recipe this device cannot run (one line saying what to use instead)."""
    if device.type != "cuda":
        if precision.recipe == "blockwise":
            raise ValueError("policy.precision.recipe=blockwise needs a CUDA GPU with compute capability 9.0 (torchao's "
                             "blockwise kernels are triton, with no CPU emulation): use tensorwise or rowwise on CPU")
        return
    capability = torch.cuda.get_device_capability(device)
    needed = (9, 0) if precision.recipe == "blockwise" else (8, 9)
    if capability < needed:
        raise ValueError(f"policy.precision.linear=fp8 with recipe={precision.recipe} needs compute capability "
                         f"{needed[0]}.{needed[1]}+ (float8 matmuls); this GPU has {capability[0]}.{capability[1]}: "
                         "set policy.precision.linear=dtype")


def float8_linear_config(precision: PrecisionConfig, *, emulate: bool, fsdp: bool):
    """torchao's ``Float8LinearConfig`` of the recipe; emulated matmuls on CPU; float8 all-gather
    under FSDP2 for tensorwise (the only recipe torchao all-gathers in float8)."""
    float8 = require_torchao()
    config = float8.Float8LinearConfig.from_recipe_name(precision.recipe)
    all_gather = fsdp and precision.fsdp_float8_all_gather and precision.recipe == "tensorwise"
    # pad_inner_dim: ``_scaled_mm`` needs every inner dimension a multiple of 16, and the weight
    # gradient's inner dimension is the micro-batch's token count (any number): padded with zeros.
    return dataclasses.replace(config, emulate=emulate, enable_fsdp_float8_all_gather=all_gather,
                               pad_inner_dim=True)


def fp8_eligible(fqn: str, module: nn.Module, precision: PrecisionConfig) -> bool:
    """Whether the linear at ``fqn`` runs in FP8 under ``precision`` (blockwise: stricter shapes)."""
    if not is_fp8_eligible(fqn, module, precision.skip_modules):
        return False
    if precision.recipe == "blockwise":
        return (module.bias is None and module.in_features % BLOCKWISE_MULTIPLE == 0
                and module.out_features % BLOCKWISE_MULTIPLE == 0)
    return True


def convert_linears_to_fp8(model: nn.Module, precision: PrecisionConfig, device: torch.device, *,
                           fsdp: bool) -> list[str]:
    """Swap the eligible linears of ``model`` for torchao's float8 training layers, in place; returns
    their module paths. ``fsdp``: FSDP2 will shard the model (float8 all-gather for tensorwise)."""
    require_torchao()
    check_device(precision, device)
    targets = [fqn for fqn, module in model.named_modules() if fp8_eligible(fqn, module, precision)]
    if not targets:
        raise ValueError("policy.precision.linear=fp8 found no linear layer to convert (in/out features must be "
                         f"multiples of 16, not in skip_modules {precision.skip_modules}): set precision.linear=dtype")

    def wanted(module: nn.Module, fqn: str) -> bool:
        return fp8_eligible(fqn, module, precision)

    if precision.recipe == "blockwise":
        from torchao.prototype.blockwise_fp8_training.linear import Float8BlockwiseLinearConfig
        from torchao.quantization import quantize_

        quantize_(model, Float8BlockwiseLinearConfig(), filter_fn=wanted)
        for fqn in targets:
            pad_tokens_to_blocks(model.get_submodule(fqn))
    else:
        from torchao.float8 import convert_to_float8_training

        config = float8_linear_config(precision, emulate=device.type != "cuda", fsdp=fsdp)
        convert_to_float8_training(model, config=config, module_filter_fn=wanted)
    return targets


def pad_tokens_to_blocks(module: nn.Module) -> None:
    """Make ``module``'s forward pad its input's tokens (the rows of the flattened input) with zeros to
    a multiple of 128 and drop the padded rows of the output: torchao's blockwise kernels take only
    whole 128-row blocks, and a micro-batch has any number of tokens. Zero rows add nothing to the
    weight's gradient, and the dropped rows get no gradient."""
    forward = module.forward

    def padded_forward(x: torch.Tensor) -> torch.Tensor:
        tokens = x.numel() // x.shape[-1]
        short = -tokens % BLOCKWISE_MULTIPLE
        if short == 0:
            return forward(x)
        out = forward(torch.nn.functional.pad(x.reshape(tokens, x.shape[-1]), (0, 0, 0, short)))
        return out[:tokens].reshape(*x.shape[:-1], out.shape[-1])

    module.forward = padded_forward


def plain_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """The high-precision tensor inside torchao's float8 all-gather weight (a tensor subclass FSDP2
    shards when ``enable_fsdp_float8_all_gather`` is on); any other tensor as it is. Refit and export
    hand plain tensors to the generation engine and to safetensors."""
    fsdp_utils = sys.modules.get("torchao.float8.fsdp_utils")  # loaded only if FP8 was set up
    if fsdp_utils is not None and isinstance(tensor, fsdp_utils.WeightWithDynamicFloat8CastTensor):
        return tensor._tensor
    return tensor
