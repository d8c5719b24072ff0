"""Round trips through every format are bit-exact, and the HF output loads in transformers."""

from __future__ import annotations

import json

import pytest
import torch

from rl_checkpoint.cli import main
from rl_checkpoint.dcp_io import save_dcp
from rl_checkpoint.errors import CheckpointError
from rl_checkpoint.megatron_mapping import hf_to_megatron, megatron_to_hf


def test_hf_dcp_hf_roundtrip_is_exact_and_loads(tiny_hf, tmp_path, capsys, read_hf, same_tensors):
    assert main(["hf-to-dcp", str(tiny_hf), str(tmp_path / "ckpt")]) == 0
    meta = json.loads((tmp_path / "ckpt" / "meta.json").read_text())
    assert meta["format"] == "rl-dcp"
    assert (tmp_path / "ckpt" / "hf_config" / "config.json").is_file()
    # small shards force several files plus the index
    assert main(["dcp-to-hf", str(tmp_path / "ckpt"), str(tmp_path / "hf"), "--max-shard-size", "100KB"]) == 0
    files = sorted(p.name for p in (tmp_path / "hf").glob("*.safetensors"))
    assert len(files) > 1
    index = json.loads((tmp_path / "hf" / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"].values()) == set(files)
    same_tensors(read_hf(tiny_hf), read_hf(tmp_path / "hf"))
    assert (tmp_path / "hf" / "tokenizer.json").is_file()

    from transformers import AutoModelForCausalLM

    ids = torch.tensor([[3, 17, 42, 99, 7]])
    ref = AutoModelForCausalLM.from_pretrained(str(tiny_hf)).eval()
    got = AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf")).eval()
    with torch.no_grad():
        assert torch.equal(ref(ids).logits, got(ids).logits)
    capsys.readouterr()
    assert main(["diff", str(tiny_hf), str(tmp_path / "ckpt")]) == 0
    assert "same: " in capsys.readouterr().out


def test_bare_dcp_with_and_without_prefix(tiny_model_dir, tmp_path, read_hf, same_tensors):
    ref = read_hf(tiny_model_dir)
    save_dcp({"model": dict(ref), "optimizer": {"state": {"step": torch.tensor(3.0)}},
              "rng": {"cpu": torch.get_rng_state()}, "step": 7}, tmp_path / "prefixed")
    save_dcp(dict(ref), tmp_path / "bare")
    for name in ("prefixed", "bare"):
        out = tmp_path / f"{name}-hf"
        assert main(["dcp-to-hf", str(tmp_path / name), str(out), "--config-dir", tiny_model_dir]) == 0
        same_tensors(ref, read_hf(out))
        assert (out / "config.json").is_file()


def test_dtype_cast(tiny_model_dir, tmp_path, read_hf, same_tensors):
    assert main(["to-hf", tiny_model_dir, str(tmp_path / "bf16"), "--dtype", "bf16"]) == 0
    got = read_hf(tmp_path / "bf16")
    for name, tensor in read_hf(tiny_model_dir).items():
        assert torch.equal(got[name], tensor.to(torch.bfloat16)), name


@pytest.mark.parametrize("layer_spec", ["local", "te"])
def test_megatron_mapping_roundtrip_and_layout(tiny_hf, layer_spec, read_hf, same_tensors):
    hf = read_hf(tiny_hf)
    cfg = json.loads((tiny_hf / "config.json").read_text())
    mg = hf_to_megatron(hf, cfg, layer_spec=layer_spec)
    norm = "input_layernorm.weight" if layer_spec == "local" else "self_attention.linear_qkv.layer_norm_weight"
    assert f"decoder.layers.0.{norm}" in mg
    # per query group g: [q heads of g, k head g, v head g] -- check group 0 by hand
    heads, kv, d = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    qkv = mg["decoder.layers.0.self_attention.linear_qkv.weight"]
    per_group = heads // kv * d
    assert torch.equal(qkv[:per_group], hf["model.layers.0.self_attn.q_proj.weight"][:per_group])
    assert torch.equal(qkv[per_group:per_group + d], hf["model.layers.0.self_attn.k_proj.weight"][:d])
    assert torch.equal(qkv[per_group + d:per_group + 2 * d], hf["model.layers.0.self_attn.v_proj.weight"][:d])
    fc1 = mg["decoder.layers.1.mlp.linear_fc1.weight"]
    assert torch.equal(fc1, torch.cat([hf["model.layers.1.mlp.gate_proj.weight"], hf["model.layers.1.mlp.up_proj.weight"]]))
    if "model.layers.0.self_attn.q_proj.bias" in hf:
        assert "decoder.layers.0.self_attention.linear_qkv.bias" in mg
    same_tensors(hf, megatron_to_hf(mg, cfg))
    # wrapped names (DDP "module.", NeMo "model.") map the same way
    same_tensors(hf, megatron_to_hf({f"module.{k}": v for k, v in mg.items()}, cfg))


def test_megatron_dist_checkpoint_to_hf(tiny_hf, tmp_path, read_hf, same_tensors):
    """A megatron-core style DCP (stacked layers, fused norms, split fc1, _extra_state) -> HF, exact."""
    hf = read_hf(tiny_hf)
    cfg = json.loads((tiny_hf / "config.json").read_text())
    mg = hf_to_megatron(hf, cfg, layer_spec="te")
    layers = cfg["num_hidden_layers"]
    stacked: dict[str, torch.Tensor] = {}
    for name in [n for n in mg if n.startswith("decoder.layers.0.")]:
        suffix = name.removeprefix("decoder.layers.0.")
        stacked[f"decoder.layers.{suffix}"] = torch.stack([mg[f"decoder.layers.{i}.{suffix}"] for i in range(layers)])
    gate_up = stacked.pop("decoder.layers.mlp.linear_fc1.weight")
    stacked["decoder.layers.mlp.linear_fc1.weight_w"], stacked["decoder.layers.mlp.linear_fc1.weight_v"] = gate_up.chunk(2, dim=1)
    flat = {k: v for k, v in mg.items() if not k.startswith("decoder.layers.")} | stacked
    iter_dir = tmp_path / "megatron" / "iter_0000010"
    save_dcp({"model": flat | {"decoder.layers.self_attention.core_attention._extra_state": torch.zeros(1)}}, iter_dir)
    (tmp_path / "megatron" / "latest_checkpointed_iteration.txt").write_text("10")
    out = tmp_path / "hf"
    assert main(["megatron-to-hf", str(tmp_path / "megatron"), str(out), "--config-dir", str(tiny_hf)]) == 0
    same_tensors(hf, read_hf(out))
    assert main(["megatron-to-hf", str(iter_dir), str(tmp_path / "no-config")]) == 2


def test_hf_megatron_hf_through_cli(tiny_hf, tmp_path, read_hf, same_tensors):
    assert main(["hf-to-dcp", str(tiny_hf), str(tmp_path / "mg"), "--megatron"]) == 0
    assert main(["to-hf", str(tmp_path / "mg"), str(tmp_path / "hf")]) == 0
    same_tensors(read_hf(tiny_hf), read_hf(tmp_path / "hf"))
    # megatron-to-hf reads it too (it looked for DCP metadata beside meta.json, not in dcp/)
    assert main(["megatron-to-hf", str(tmp_path / "mg"), str(tmp_path / "hf2")]) == 0
    same_tensors(read_hf(tiny_hf), read_hf(tmp_path / "hf2"))


def test_inspect_and_diff(tiny_model_dir, tiny_qwen2_dir, tmp_path, capsys, read_hf, same_tensors):
    assert main(["inspect", tiny_model_dir, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    ref = read_hf(tiny_model_dir)
    assert report["format"] == "hf"
    assert report["num_tensors"] == len(ref)
    assert report["total_bytes"] == sum(t.numel() * t.element_size() for t in ref.values())
    assert report["tensors"]["lm_head.weight"]["shape"] == list(ref["lm_head.weight"].shape)

    changed = dict(ref)
    changed["model.norm.weight"] = ref["model.norm.weight"] + 0.25
    save_dcp({"model": changed}, tmp_path / "changed")
    assert main(["diff", tiny_model_dir, str(tmp_path / "changed")]) == 1
    out = capsys.readouterr().out
    assert "DIFF model.norm.weight: max_abs_diff=2.500e-01" in out
    assert main(["diff", tiny_model_dir, str(tmp_path / "changed"), "--atol", "0.3"]) == 0
    assert main(["diff", tiny_model_dir, tiny_qwen2_dir]) == 1
    assert "ONLY-B model.layers.0.self_attn.q_proj.bias" in capsys.readouterr().out


def test_megatron_mapping_of_mixture_of_experts(tmp_path, read_hf, same_tensors):
    """Mixtral: the router and the per-expert files (w1 = gate, w3 = up, w2 = down) <-> the router and
    local experts of Megatron's SequentialMLP; Megatron -> HF gives HF's in-memory layout (experts
    stacked), which reads back to the same Megatron tensors and loads with from_pretrained."""
    from transformers import AutoModelForCausalLM

    from rl_core.models import save_tiny_model

    model_dir = save_tiny_model(tmp_path / "mixtral", family="mixtral")
    disk = read_hf(model_dir)
    cfg = json.loads((model_dir / "config.json").read_text())
    mg = hf_to_megatron(disk, cfg)
    expert = "decoder.layers.1.mlp.experts.local_experts.2."
    w = {k: disk[f"model.layers.1.block_sparse_moe.experts.2.{k}.weight"] for k in ("w1", "w2", "w3")}
    assert torch.equal(mg[expert + "linear_fc1.weight"], torch.cat([w["w1"], w["w3"]]))
    assert torch.equal(mg[expert + "linear_fc2.weight"], w["w2"])
    assert torch.equal(mg["decoder.layers.1.mlp.router.weight"], disk["model.layers.1.block_sparse_moe.gate.weight"])
    hf = megatron_to_hf(mg, cfg)
    same_tensors(hf, AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).state_dict())
    same_tensors(mg, hf_to_megatron(hf, cfg))
    del mg[expert + "linear_fc2.weight"]
    with pytest.raises(CheckpointError, match=r"router has 4 experts but the tensors hold experts \[0, 1, 2, 3\] "
                                              r"\(linear_fc1\) and \[0, 1, 3\]"):
        megatron_to_hf(mg, cfg)
    assert main(["hf-to-dcp", str(model_dir), str(tmp_path / "mg"), "--megatron"]) == 0
    assert main(["to-hf", str(tmp_path / "mg"), str(tmp_path / "hf")]) == 0
    same_tensors(hf, read_hf(tmp_path / "hf"))
