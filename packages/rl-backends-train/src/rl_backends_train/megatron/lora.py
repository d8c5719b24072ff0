"""LoRA on megatron-core's fused linears, with one adapter pair per HF projection.

Megatron fuses q/k/v into ``linear_qkv`` (per query group: the group's query heads, its key head,
its value head) and gate/up into ``linear_fc1`` (``[gate; up]``). Each targeted HF projection still
gets its own pair with PEFT's shapes, ``lora_A`` [r, in] and ``lora_B`` [out_hf, r]; the update
``scale * B_i A_i x`` of each pair is placed where that projection's rows sit in the fused output
(an untargeted projection of a fused linear adds zeros). So adapters, PEFT files and merged weights
are the DTensor backend's, while the base stays Megatron's own fused layers.

A ``FusedLoRA`` is a child ``lora`` of the Megatron linear (parameter names such as
``decoder.layers.0.self_attention.linear_qkv.lora.q_proj.lora_A.weight``, which ``hf_adapter_name``
turns into PEFT's ``model.layers.0.self_attn.q_proj.lora_A.weight``); a forward hook on the linear
adds its update to the linear's ``(output, bias)``. The base weights are frozen.

Tensor parallel, mirroring the base weight's split:

* column-parallel ``linear_qkv`` / ``linear_fc1``: A replicated, B split on its output rows like the
  base (rank r holds query groups r*G/tp.., and rows r*ffn/tp.. of gate and of up). ``A x`` goes
  through ``copy_to_tensor_model_parallel_region``: in backward its gradient, a partial sum over the
  rank's rows of B, is all-reduced, so A's gradient is whole and equal on every rank.
* row-parallel ``linear_proj`` / ``linear_fc2``: A split on its input columns like the base, its
  partial product ``A_r x_r`` all-reduced (``reduce_from_tensor_model_parallel_region``) before the
  replicated B.
"""

from __future__ import annotations

import contextlib
import re

import torch
from torch import nn

from rl_backends_train.config import LoRAConfig

# Megatron linear (under a decoder layer) -> (HF parent module, HF projections in fused order).
FUSED_LINEARS = {
    "self_attention.linear_qkv": ("self_attn", ("q_proj", "k_proj", "v_proj")),
    "self_attention.linear_proj": ("self_attn", ("o_proj",)),
    "mlp.linear_fc1": ("mlp", ("gate_proj", "up_proj")),
    "mlp.linear_fc2": ("mlp", ("down_proj",)),
}
ROW_PARALLEL = ("self_attention.linear_proj", "mlp.linear_fc2")
HF_PROJECTIONS = tuple(p for _, projections in FUSED_LINEARS.values() for p in projections)
_OWNER = {p: linear for linear, (_, projections) in FUSED_LINEARS.items() for p in projections}
_MEGATRON_ADAPTER = re.compile(r"^decoder\.layers\.(\d+)\.(\w+\.linear_\w+)\.lora\.(\w+)\.(lora_[AB]\.weight)$")
_HF_ADAPTER = re.compile(r"^model\.layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)\.(lora_[AB]\.weight)$")


class LoRAPair(nn.Module):
    """One HF projection's adapter: this rank's ``lora_A`` [r, in_local] and ``lora_B`` [out_local, r]."""

    def __init__(self, a: torch.Tensor, b: torch.Tensor) -> None:
        super().__init__()
        self.lora_A = nn.Linear(a.shape[1], a.shape[0], bias=False, device=a.device, dtype=a.dtype)
        self.lora_B = nn.Linear(b.shape[1], b.shape[0], bias=False, device=b.device, dtype=b.dtype)
        with torch.no_grad():
            self.lora_A.weight.copy_(a)
            self.lora_B.weight.copy_(b)


class FusedLoRA(nn.Module):
    """The adapters of the HF projections one Megatron linear fuses; ``forward`` is their update.

    ``out_sizes``: this rank's rows of each projection in the fused output, in fused order.
    ``groups``: how many interleaved blocks the fused output holds on this rank (the local query
    groups for ``linear_qkv``; 1 for gate-then-up and for single projections)."""

    def __init__(self, pairs: dict[str, LoRAPair], out_sizes: dict[str, int], groups: int, *,
                 row_parallel: bool, scale: float, dropout: float, tp_group) -> None:
        super().__init__()
        for name, pair in pairs.items():
            self.add_module(name, pair)
        self.out_sizes = out_sizes
        self.groups = groups
        self.row_parallel = row_parallel
        self.scale = scale
        self.lora_dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.tp_group = tp_group
        self.enabled = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [s, b, in_local] (the linear's input) -> [s, b, out_local] in the fused layout."""
        from megatron.core.tensor_parallel import (
            copy_to_tensor_model_parallel_region,
            reduce_from_tensor_model_parallel_region,
        )

        blocks = []
        for name, size in self.out_sizes.items():
            pair = getattr(self, name, None)
            if pair is None:  # untargeted projection of a fused linear
                blocks.append(x.new_zeros(*x.shape[:-1], size))
                continue
            h = pair.lora_A(self.lora_dropout(x))  # [s, b, r]
            if self.row_parallel:
                h = reduce_from_tensor_model_parallel_region(h, group=self.tp_group)
            else:
                h = copy_to_tensor_model_parallel_region(h, group=self.tp_group)
            blocks.append(pair.lora_B(h) * self.scale)
        # [s, b, out_i] -> [s, b, groups, out_i / groups], concatenated per group, flattened back.
        return torch.cat([blk.unflatten(-1, (self.groups, -1)) for blk in blocks], dim=-1).flatten(-2)


def _add_update(linear: nn.Module, args: tuple, kwargs: dict, output):
    """Forward hook of a Megatron linear: ``(out, bias)`` -> ``(out + lora(x), bias)``."""
    if not linear.lora.enabled:
        return output
    out, bias = output
    x = args[0] if args else kwargs["input_"]
    return out + linear.lora(x), bias


def apply_lora(model, cfg: LoRAConfig, *, seed: int) -> list[str]:
    """Freeze ``model`` (a MegatronCausalLM) and give each targeted HF projection an adapter pair.

    A is Kaiming-uniform (as ``nn.Linear`` and PEFT), drawn whole from a generator seeded with
    ``seed`` and then split, so every tensor-parallel size starts from the same adapters; B is zero.
    Each pipeline stage draws the A of every layer of the model in order and keeps its own layers',
    so every pipeline size starts from the same adapters too.
    Returns the HF module names that got adapters; names outside ``HF_PROJECTIONS`` are rejected by
    ``check_megatron_config``."""
    model.requires_grad_(False)
    shapes = _hf_shapes(model.config)
    generator = torch.Generator().manual_seed(seed)
    tp, rank = model.tp_size, model.tp_rank
    targets = set(cfg.target_modules)
    adapted = []
    layers, offset = model.gpt.decoder.layers, model.stage.layer_offset
    for i in range(model.config.num_hidden_layers):
        layer = layers[i - offset] if 0 <= i - offset < len(layers) else None  # None: another stage's
        for linear_name, (parent, projections) in FUSED_LINEARS.items():
            row_parallel = linear_name in ROW_PARALLEL
            pairs = {}
            for proj in projections:
                if proj not in targets:
                    continue
                out_f, in_f = shapes[proj]
                a = torch.empty(cfg.rank, in_f)
                nn.init.kaiming_uniform_(a, a=5**0.5, generator=generator)
                if layer is None:
                    continue
                weight = layer.get_submodule(linear_name).weight
                b = torch.zeros(out_f, cfg.rank)
                a, b = (a.chunk(tp, dim=1)[rank], b) if row_parallel else (a, b.chunk(tp, dim=0)[rank])
                pairs[proj] = LoRAPair(a.to(weight), b.to(weight))
                adapted.append(f"model.layers.{i}.{parent}.{proj}")
            if not pairs:
                continue
            linear = layer.get_submodule(linear_name)
            out_sizes = {p: shapes[p][0] // (1 if row_parallel else tp) for p in projections}
            groups = shapes["groups"] // tp if linear_name == "self_attention.linear_qkv" else 1
            linear.lora = FusedLoRA(pairs, out_sizes, groups, row_parallel=row_parallel, scale=cfg.alpha / cfg.rank,
                                    dropout=cfg.dropout, tp_group=model.tp_group)
            linear.register_forward_hook(_add_update, with_kwargs=True)
    if model.gpt.config.recompute_granularity is not None and model.stage.first:
        # Megatron's recompute is a reentrant autograd.Function: with the embedding frozen its input
        # would not require grad, and no gradient would reach the adapters inside it. (Later pipeline
        # stages start from a received activation, which requires grad.)
        model.gpt.embedding.register_forward_hook(_require_grad)
    model.lora_scale = cfg.alpha / cfg.rank
    return adapted


def _require_grad(module: nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
    return output.requires_grad_(True) if torch.is_grad_enabled() and not output.requires_grad else output


def _hf_shapes(hf_config) -> dict:
    """Full HF ``[out, in]`` of each projection, plus the number of query groups."""
    hidden, ffn = hf_config.hidden_size, hf_config.intermediate_size
    heads = hf_config.num_attention_heads
    groups = getattr(hf_config, "num_key_value_heads", None) or heads
    head_dim = getattr(hf_config, "head_dim", None) or hidden // heads
    return {"q_proj": (heads * head_dim, hidden), "k_proj": (groups * head_dim, hidden),
            "v_proj": (groups * head_dim, hidden), "o_proj": (hidden, heads * head_dim),
            "gate_proj": (ffn, hidden), "up_proj": (ffn, hidden), "down_proj": (hidden, ffn), "groups": groups}


def is_adapter_name(megatron_name: str) -> bool:
    return ".lora." in megatron_name


def hf_adapter_name(megatron_name: str) -> str:
    """``decoder.layers.0.self_attention.linear_qkv.lora.q_proj.lora_A.weight`` ->
    ``model.layers.0.self_attn.q_proj.lora_A.weight`` (PEFT's name, without ``base_model.model.``)."""
    layer, linear, proj, tensor = _MEGATRON_ADAPTER.match(megatron_name).groups()
    return f"model.layers.{layer}.{FUSED_LINEARS[linear][0]}.{proj}.{tensor}"


def megatron_adapter_name(hf_name: str) -> str:
    """Inverse of ``hf_adapter_name``; a PEFT ``base_model.model.`` prefix is accepted."""
    m = _HF_ADAPTER.match(hf_name.removeprefix("base_model.model."))
    if m is None or m.group(2) not in _OWNER:
        raise ValueError(f"{hf_name} is not a LoRA tensor of a Megatron-mapped projection {list(HF_PROJECTIONS)}")
    layer, proj, tensor = m.groups()
    return f"decoder.layers.{layer}.{_OWNER[proj]}.lora.{proj}.{tensor}"


def merged_weight(weight: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor, scale: float) -> torch.Tensor:
    """W + scale * B @ A in fp32, cast back: the DTensor backend's ``LoRALinear.merged_weight``."""
    delta = (lora_b.float() @ lora_a.float()) * scale
    return (weight.float() + delta).to(weight.dtype)


def merge_into(hf: dict[str, torch.Tensor], adapters: dict[str, torch.Tensor], scale: float) -> dict[str, torch.Tensor]:
    """HF base tensors with each full adapter pair (PEFT names) folded into its weight."""
    out = dict(hf)
    for name in adapters:
        if name.endswith(".lora_A.weight"):
            module = name.removesuffix(".lora_A.weight")
            if f"{module}.weight" in out:
                out[f"{module}.weight"] = merged_weight(out[f"{module}.weight"], adapters[name],
                                                        adapters[f"{module}.lora_B.weight"], scale)
    return out


def fused_loras(model: nn.Module) -> list[FusedLoRA]:
    return [m for m in model.modules() if isinstance(m, FusedLoRA)]


@contextlib.contextmanager
def adapters_disabled(model: nn.Module):
    """Run the base model: every adapter update off inside the block."""
    loras = fused_loras(model)
    for lora in loras:
        lora.enabled = False
    try:
        yield model
    finally:
        for lora in loras:
            lora.enabled = True
