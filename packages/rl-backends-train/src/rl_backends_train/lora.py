"""LoRA without peft: a LoRALinear that IS an nn.Linear (so ``q_proj.weight`` keeps its HF name)
with two small children ``lora_A`` / ``lora_B`` (so adapter names match PEFT: ``q_proj.lora_A.weight``).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import nn

from rl_backends_train.config import LoRAConfig
from rl_backends_train.families import lora_targets


class LoRALinear(nn.Linear):
    """y = x W^T + b + (alpha / r) * dropout(x) A^T B^T; W and b frozen, A and B trained.

    B starts at zero, so a fresh adapter leaves the model unchanged."""

    def __init__(self, in_features: int, out_features: int, bias: bool, rank: int, alpha: float,
                 dropout: float, device=None, dtype=None) -> None:
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        self.lora_A = nn.Linear(in_features, rank, bias=False, device=device, dtype=dtype)
        self.lora_B = nn.Linear(rank, out_features, bias=False, device=device, dtype=dtype)
        self.lora_dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.scale = alpha / rank
        self.adapters_enabled = True
        nn.init.kaiming_uniform_(self.lora_A.weight, a=5**0.5)
        nn.init.zeros_(self.lora_B.weight)

    @classmethod
    def wrap(cls, linear: nn.Linear, cfg: LoRAConfig) -> LoRALinear:
        """A LoRALinear sharing ``linear``'s weight and bias (frozen)."""
        new = cls(linear.in_features, linear.out_features, linear.bias is not None, cfg.rank, cfg.alpha,
                  cfg.dropout, device=linear.weight.device, dtype=linear.weight.dtype)
        new.weight = linear.weight
        new.bias = linear.bias
        new.weight.requires_grad_(False)
        if new.bias is not None:
            new.bias.requires_grad_(False)
        return new

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = super().forward(x)
        if not self.adapters_enabled:
            return out
        return out + self.lora_B(self.lora_A(self.lora_dropout(x))) * self.scale

    def merged_weight(self, weight: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor) -> torch.Tensor:
        """W + scale * B @ A, computed in fp32 and cast back ([out, in])."""
        delta = (lora_b.float() @ lora_a.float()) * self.scale
        return (weight.float() + delta).to(weight.dtype)


def apply_lora(model: nn.Module, cfg: LoRAConfig, within: str | None = None) -> list[str]:
    """Freeze ``model`` and replace every targeted nn.Linear by a LoRALinear. Returns their names.

    Targets: ``cfg.target_modules`` when set (each must name a Linear of the model), else the
    family's default list (``families.LORA_TARGETS``). ``within``: only modules under this qualified
    name (a vision-language model's language model)."""
    for p in model.parameters():
        p.requires_grad_(False)
    configured = cfg.target_modules if "target_modules" in cfg.model_fields_set else None
    targets = lora_targets(model, configured)
    replaced = []
    for name, module in list(model.named_modules()):
        if within is not None and not name.startswith(f"{within}."):
            continue
        if name.rsplit(".", 1)[-1] in targets and type(module) is nn.Linear:
            parent_name, _, child = name.rpartition(".")
            parent = model.get_submodule(parent_name) if parent_name else model
            setattr(parent, child, LoRALinear.wrap(module, cfg))
            replaced.append(name)
    return replaced


def lora_modules(model: nn.Module) -> dict[str, LoRALinear]:
    return {name: m for name, m in model.named_modules() if isinstance(m, LoRALinear)}


def set_adapters_enabled(model: nn.Module, enabled: bool) -> None:
    for module in lora_modules(model).values():
        module.adapters_enabled = enabled


def is_adapter_name(name: str) -> bool:
    return ".lora_A." in name or ".lora_B." in name


def merge_full_state_dict(model: nn.Module, full: dict[str, torch.Tensor]) -> Iterator[tuple[str, torch.Tensor]]:
    """HF-named tensors with each adapter folded into its base weight; adapter tensors left out.

    ``full`` holds unsharded tensors under the model's parameter names."""
    modules = lora_modules(model)
    for name, tensor in full.items():
        if is_adapter_name(name):
            continue
        owner = name.rsplit(".", 1)[0]
        if name.endswith(".weight") and owner in modules:
            tensor = modules[owner].merged_weight(tensor, full[f"{owner}.lora_A.weight"], full[f"{owner}.lora_B.weight"])
        yield name, tensor


def adapter_config(cfg: LoRAConfig, base_model_path: str, task: str, targets: list[str] | None = None,
                   within: str | None = None) -> dict:
    """A PEFT-compatible adapter_config.json. ``targets``: the adapted Linear names (default: the
    configured ones). ``within`` (adapters only under that module, see ``apply_lora``): ``target_modules``
    is then PEFT's regex form, matched against the whole module name."""
    names = sorted(targets if targets is not None else cfg.target_modules)
    target_modules: list[str] | str = names
    if within is not None:
        target_modules = rf"{re.escape(within)}\..*\.({'|'.join(re.escape(t) for t in names)})"
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM" if task == "causal_lm" else "SEQ_CLS",
        "base_model_name_or_path": base_model_path,
        "r": cfg.rank,
        "lora_alpha": cfg.alpha,
        "lora_dropout": cfg.dropout,
        "target_modules": target_modules,
        "bias": "none",
        "fan_in_fan_out": False,
        "inference_mode": True,
    }


def write_adapter(path: str | Path, adapters: dict[str, torch.Tensor], config: dict) -> None:
    """PEFT layout: adapter_model.safetensors (``base_model.model.<name>``) + adapter_config.json."""
    from safetensors.torch import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tensors = {f"base_model.model.{k}": v.detach().contiguous().cpu() for k, v in adapters.items()}
    tmp = path / ".adapter_model.safetensors.tmp"
    save_file(tensors, str(tmp), metadata={"format": "pt"})
    os.replace(tmp, path / "adapter_model.safetensors")
    tmp_cfg = path / ".adapter_config.json.tmp"
    tmp_cfg.write_text(json.dumps(config, indent=2))
    os.replace(tmp_cfg, path / "adapter_config.json")


def adapted_names(adapters: dict[str, torch.Tensor]) -> list[str]:
    """The Linear names (last path component) that the adapter tensors ``adapters`` belong to."""
    return sorted({name.split(".lora_")[0].rsplit(".", 1)[-1] for name in adapters})
