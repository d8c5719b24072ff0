"""The Megatron mapping of Qwen3 (q/k norms <-> megatron-core's q/k layernorms) and Qwen3-MoE (its
per-expert files, ``mlp.experts.{j}.gate_proj`` ..., and HF's stacked in-memory experts): HF -> Megatron
-> HF bit-exact, ``hf-to-dcp --megatron`` then ``to-hf`` loads in transformers with the same logits;
families without a megatron-core counterpart are refused with the family, the layer type and the
DTensor backend named, and nothing is written."""

from __future__ import annotations

import json
import re

import pytest
import torch
from cli_testlib import no_leftovers, run_error

from rl_checkpoint.cli import main
from rl_checkpoint.errors import CheckpointError
from rl_checkpoint.megatron_mapping import hf_to_megatron, megatron_to_hf

# rl_core.models.tiny's qwen3 / qwen3_moe settings (helper "families" adds them there).
_TINY = dict(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
             num_key_value_heads=1, head_dim=32, tie_word_embeddings=False)
_FAMILIES = {"qwen3": {}, "qwen3_moe": dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64)}


@pytest.fixture(scope="module", params=sorted(_FAMILIES))
def family_dir(request, tmp_path_factory):
    from transformers import AutoConfig, AutoModelForCausalLM

    path = tmp_path_factory.mktemp(request.param)
    config = AutoConfig.for_model(request.param, **_TINY, **_FAMILIES[request.param])
    with torch.random.fork_rng():
        torch.manual_seed(0)
        AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(path)
    return path


def test_mapping_round_trip_is_bit_exact(family_dir, read_hf, same_tensors):
    from transformers import AutoModelForCausalLM

    disk = read_hf(family_dir)
    cfg = json.loads((family_dir / "config.json").read_text())
    mg = hf_to_megatron(disk, cfg)
    layer = "decoder.layers.1."
    assert torch.equal(mg[layer + "self_attention.q_layernorm.weight"], disk["model.layers.1.self_attn.q_norm.weight"])
    assert torch.equal(mg[layer + "self_attention.k_layernorm.weight"], disk["model.layers.1.self_attn.k_norm.weight"])
    if cfg["model_type"] == "qwen3_moe":
        expert = {k: disk[f"model.layers.1.mlp.experts.2.{k}_proj.weight"] for k in ("gate", "up", "down")}
        assert torch.equal(mg[layer + "mlp.experts.local_experts.2.linear_fc1.weight"],
                           torch.cat([expert["gate"], expert["up"]]))
        assert torch.equal(mg[layer + "mlp.experts.local_experts.2.linear_fc2.weight"], expert["down"])
        assert torch.equal(mg[layer + "mlp.router.weight"], disk["model.layers.1.mlp.gate.weight"])
    hf = megatron_to_hf(mg, cfg)  # HF's in-memory layout (experts stacked)
    same_tensors(hf, AutoModelForCausalLM.from_pretrained(family_dir, dtype=torch.float32).state_dict())
    same_tensors(mg, hf_to_megatron(hf, cfg))


def test_cli_round_trip_loads_in_transformers(family_dir, tmp_path, read_hf):
    from transformers import AutoModelForCausalLM

    assert main(["hf-to-dcp", str(family_dir), str(tmp_path / "mg"), "--megatron"]) == 0
    assert json.loads((tmp_path / "mg" / "meta.json").read_text())["format"] == "rl-megatron"
    assert main(["to-hf", str(tmp_path / "mg"), str(tmp_path / "hf")]) == 0
    ids = torch.tensor([[3, 17, 42, 99, 7, 250]])
    ref = AutoModelForCausalLM.from_pretrained(family_dir).eval()
    got = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    for name, tensor in got.state_dict().items():
        assert torch.equal(tensor, ref.state_dict()[name]), name
    with torch.no_grad():
        assert torch.equal(ref(ids).logits, got(ids).logits)


_REFUSED = {
    "qwen3_5_text": "gated delta-net linear-attention layers",
    "nemotron_h": "Mamba-2 state-space layers",
    "glm4_moe_lite": "multi-head latent attention (MLA) layers and MoE with shared experts",
    "gemma3_text": "sliding-window attention layers",
    "gpt_oss": "sliding-window attention layers with attention sinks",
}


@pytest.mark.parametrize("family", sorted(_REFUSED))
def test_families_without_a_megatron_counterpart_are_refused(family, tmp_path, capsys):
    from safetensors.torch import save_file
    from transformers import AutoConfig

    src = tmp_path / family
    AutoConfig.for_model(family).save_pretrained(src)
    save_file({"model.embed_tokens.weight": torch.zeros(4, 8)}, str(src / "model.safetensors"))
    expected = rf"{family}: its {re.escape(_REFUSED[family])}.* have no megatron-core GPTModel counterpart.*" \
               r"use the DTensor backend \(policy.backend=dtensor\)"
    err = run_error(capsys, ["hf-to-dcp", str(src), str(tmp_path / "mg"), "--megatron"])
    assert re.search(expected, err), err
    no_leftovers(tmp_path / "mg")
    with pytest.raises(CheckpointError, match=expected):
        megatron_to_hf({"embedding.word_embeddings.weight": torch.zeros(4, 8)}, {"model_type": family})
