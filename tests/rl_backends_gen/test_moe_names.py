"""The trainer's stacked MoE expert tensors -> the per-expert checkpoint names vLLM loads (``moe_names``),
checked against what ``save_pretrained`` writes for the tiny qwen3_moe and mixtral models. No vLLM needed."""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from rl_backends_gen.moe_names import CHECKPOINT_EXPERT_NAMES, refit_buckets, to_checkpoint_names


def trainer_weights(path: str, seed: int | None = None) -> dict[str, torch.Tensor]:
    """HF's in-memory parameters of the model at ``path`` (experts stacked); with ``seed``, perturbed."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    weights = {n: p.detach() for n, p in model.named_parameters()}
    if seed is not None:
        generator = torch.Generator().manual_seed(seed)
        weights = {n: w + torch.randn(w.shape, generator=generator) for n, w in weights.items()}
    assert any(n.endswith("mlp.experts.gate_up_proj") for n in weights)  # the layout this module translates
    return weights


@pytest.mark.parametrize("family", sorted(CHECKPOINT_EXPERT_NAMES))
def test_stacked_experts_become_the_checkpoint_layout_exactly(family, tiny_family_dir):
    """Stacked in memory (from_pretrained of the per-expert checkpoint) -> per-expert again: the names and
    bytes of the checkpoint file, every tensor equal."""
    path = tiny_family_dir(family)
    on_disk = load_file(str(Path(path) / "model.safetensors"))
    translated = dict(to_checkpoint_names(CHECKPOINT_EXPERT_NAMES[family], trainer_weights(path).items()))
    assert sorted(translated) == sorted(on_disk)
    for name, tensor in on_disk.items():
        assert torch.equal(translated[name], tensor), name


@pytest.mark.parametrize("family", sorted(CHECKPOINT_EXPERT_NAMES))
def test_new_weights_land_in_the_named_expert(family, tiny_family_dir, tmp_path):
    """Other weights (a perturbed copy) go back through HF's own per-expert loader to the same stacked
    tensors: expert e's gate, up and down are expert e's, gate before up, no transpose."""
    from transformers import AutoModelForCausalLM

    path = tiny_family_dir(family)
    weights = trainer_weights(path, seed=1)
    translated = dict(to_checkpoint_names(CHECKPOINT_EXPERT_NAMES[family], weights.items()))
    expert_names = CHECKPOINT_EXPERT_NAMES[family]
    layer = "model.layers.1"
    gate_up = weights[f"{layer}.mlp.experts.gate_up_proj"]  # [E, 2 * I, H]
    inter = gate_up.shape[1] // 2
    prefix = f"{layer}.{expert_names.block}.experts.3"
    assert torch.equal(translated[f"{prefix}.{expert_names.gate}.weight"], gate_up[3, :inter])
    assert torch.equal(translated[f"{prefix}.{expert_names.up}.weight"], gate_up[3, inter:])
    assert torch.equal(translated[f"{prefix}.{expert_names.down}.weight"], weights[f"{layer}.mlp.experts.down_proj"][3])
    assert torch.equal(translated[f"{layer}.{expert_names.block}.gate.weight"], weights[f"{layer}.mlp.gate.weight"])

    shutil.copy(Path(path) / "config.json", tmp_path / "config.json")
    save_file({n: t.contiguous() for n, t in translated.items()}, str(tmp_path / "model.safetensors"))
    reloaded = dict(AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).named_parameters())
    assert reloaded.keys() == weights.keys()
    for name, param in reloaded.items():
        assert torch.equal(param.detach(), weights[name]), name


def test_an_expert_tensor_is_split_inside_its_bucket():
    """Buckets are cut on the stacked tensors (bytes after the cast to the engine's dtype), so each layer's
    per-expert pieces travel together, and a bucket's serialized size stays the stacked bytes (views)."""
    experts, inter, hidden = 4, 8, 16
    stacked = [(f"model.layers.{i}.mlp.experts.gate_up_proj", torch.randn(experts, 2 * inter, hidden))
               for i in range(3)]
    stacked_bytes = experts * 2 * inter * hidden * 2  # bfloat16
    names = CHECKPOINT_EXPERT_NAMES["qwen3_moe"]
    buckets = list(refit_buckets(stacked, 2 * stacked_bytes, dtype="bfloat16", names=names))
    assert [len(b) for b in buckets] == [2 * 2 * experts, 2 * experts]  # two layers, then one
    for bucket in buckets:
        layers = {name.split(".experts.")[0] for name, _ in bucket}
        for layer in layers:
            pieces = {name for name, _ in bucket if name.startswith(layer)}
            assert pieces == {f"{layer}.experts.{e}.{part}.weight" for e in range(experts)
                              for part in ("gate_proj", "up_proj")}
        assert all(t.dtype == torch.bfloat16 for _, t in bucket)
        buffer = io.BytesIO()
        torch.save(bucket, buffer)
        assert buffer.tell() < len(layers) * stacked_bytes + 4096  # shared storage, not copies
    dense = list(refit_buckets(stacked, 2 * stacked_bytes, dtype="bfloat16", names=None))
    assert [[n for n, _ in b] for b in dense] == [[n for n, _ in stacked[:2]], [stacked[2][0]]]


def test_other_names_pass_unchanged():
    tensors = [("model.layers.0.mlp.gate_proj.weight", torch.ones(2, 2)), ("lm_head.weight", torch.zeros(3, 2)),
               ("model.layers.0.self_attn.q_proj.weight", torch.ones(2, 2))]
    assert list(to_checkpoint_names(CHECKPOINT_EXPERT_NAMES["mixtral"], tensors)) == tensors
