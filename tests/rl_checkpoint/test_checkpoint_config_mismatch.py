"""A ``--config-dir`` that does not describe the checkpoint is refused: one line naming it and the first
tensors that differ, exit 2, nothing written. It used to be written: a Qwen3-MoE run's DCP with a Llama
config loaded with 6 MISSING (random MLP weights) and 10 UNEXPECTED keys, and with a VLM's config
(vocabulary 516, not 512) OUT did not load at all."""

from __future__ import annotations

import importlib.util
import json
import logging
from pathlib import Path

import pytest
import torch
from cli_testlib import no_leftovers, run_error
from conftest import make_run

from rl_checkpoint import write_manifest
from rl_checkpoint.cli import main
from rl_checkpoint.dcp_io import save_dcp


def qwen3_moe_run(tmp_path: Path, qwen3_moe_dir: str, saved_by: str) -> Path:
    """A run whose step 1 holds the tiny Qwen3-MoE, as the trainer saves it (transformers' names: stacked
    experts) or as ``hf-to-dcp`` does (the HF files' names: one tensor per expert). Returns its ``dcp/``."""
    run = make_run(tmp_path / "run", {1: qwen3_moe_dir})
    dcp = run / "checkpoints" / "step_000001" / "policy" / "dcp"
    if saved_by == "trainer":
        from transformers import AutoModelForCausalLM

        state = AutoModelForCausalLM.from_pretrained(qwen3_moe_dir).state_dict()
        assert "model.layers.0.mlp.experts.gate_up_proj" in state
        for file in dcp.iterdir():
            file.unlink()
        save_dcp({"model": {k: v.detach().clone() for k, v in state.items()}}, dcp)
        write_manifest(dcp.parents[1])
    return dcp


@pytest.mark.parametrize(("saved_by", "unexpected"), [
    ("trainer", "10 unexpected (model.layers.0.mlp.experts.down_proj, model.layers.0.mlp.experts.gate_up_proj, "),
    ("hf-to-dcp", "30 unexpected (model.layers.0.mlp.experts.0.down_proj.weight, "),
], ids=["trainer", "hf-to-dcp"])
def test_config_dir_of_another_family_is_refused(saved_by, unexpected, tiny_family_dir, tiny_model_dir, tmp_path,
                                                 capsys):
    dcp = qwen3_moe_run(tmp_path, tiny_family_dir("qwen3_moe"), saved_by)
    out = tmp_path / "out"
    for command in ("dcp-to-hf", "to-hf"):
        err = run_error(capsys, [command, str(dcp), str(out), "--config-dir", tiny_model_dir])
        assert f"--config-dir {tiny_model_dir}: its config.json (LlamaForCausalLM) does not describe" in err
        assert "6 missing (model.layers.0.mlp.down_proj.weight, model.layers.0.mlp.gate_proj.weight, " in err
        assert unexpected in err
        assert "nothing was written" in err
        no_leftovers(out)


def test_config_dir_of_its_own_model_converts_exactly(tiny_family_dir, tmp_path, read_hf, same_tensors):
    """The check reads the names as transformers loads them: per-expert files and stacked experts both pass."""
    qwen3_moe = tiny_family_dir("qwen3_moe")
    for saved_by in ("trainer", "hf-to-dcp"):
        dcp = qwen3_moe_run(tmp_path / saved_by, qwen3_moe, saved_by)
        assert main(["dcp-to-hf", str(dcp), str(tmp_path / saved_by / "out"), "--config-dir", qwen3_moe]) == 0
    same_tensors(read_hf(qwen3_moe), read_hf(tmp_path / "hf-to-dcp" / "out"))
    from transformers import AutoModelForCausalLM

    reference = AutoModelForCausalLM.from_pretrained(qwen3_moe).state_dict()
    loaded, info = AutoModelForCausalLM.from_pretrained(tmp_path / "trainer" / "out", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in reference.items())


def test_config_dir_of_a_vlm_names_the_shapes(tiny_family_dir, tiny_vlm_dir, tmp_path, capsys):
    dcp = qwen3_moe_run(tmp_path, tiny_family_dir("qwen3_moe"), "trainer")
    vlm = tiny_vlm_dir("qwen2_5_vl")
    assert json.loads((Path(vlm) / "config.json").read_text())["text_config"]["vocab_size"] == 516
    err = run_error(capsys, ["dcp-to-hf", str(dcp.parent), str(tmp_path / "out"), "--config-dir", vlm])
    assert f"--config-dir {vlm}: its config.json (Qwen2_5_VLForConditionalGeneration) does not describe" in err
    assert "2 of another shape (lm_head.weight [512, 64], config [516, 64], " in err
    no_leftovers(tmp_path / "out")


def test_moe_config_of_another_expert_count_is_refused(tiny_family_dir, tmp_path, capsys, read_hf):
    """Per-expert tensors are stacked as transformers loads them; the stacks' shapes are compared, and experts
    that cannot be stacked (one missing) are refused too."""
    qwen3_moe = tiny_family_dir("qwen3_moe")
    dcp = qwen3_moe_run(tmp_path, qwen3_moe, "hf-to-dcp")
    two = tmp_path / "two-experts"
    two.mkdir()
    config = json.loads((Path(qwen3_moe) / "config.json").read_text())
    (two / "config.json").write_text(json.dumps(config | {"num_local_experts": 2}))
    err = run_error(capsys, ["dcp-to-hf", str(dcp), str(tmp_path / "out"), "--config-dir", str(two)])
    assert "6 of another shape (model.layers.0.mlp.experts.down_proj [4, 64, 64], config [2, 64, 64], " in err
    no_leftovers(tmp_path / "out")
    tensors = read_hf(qwen3_moe)
    del tensors["model.layers.0.mlp.experts.3.up_proj.weight"]
    save_dcp({"model": tensors}, tmp_path / "no-expert-3")
    err = run_error(capsys, ["dcp-to-hf", str(tmp_path / "no-expert-3"), str(tmp_path / "out"), "--config-dir", qwen3_moe])
    assert "transformers: cannot convert them into the model's tensors" in err
    no_leftovers(tmp_path / "out")


def test_megatron_config_dir_is_checked(tiny_model_dir, tiny_qwen2_dir, tmp_path, capsys):
    """A Llama's Megatron checkpoint with Qwen2's config (same shapes, but q/k/v biases) or a config of
    another depth: the mapping alone would have written it, biases and a third layer left random."""
    assert main(["hf-to-dcp", tiny_model_dir, str(tmp_path / "mg"), "--megatron"]) == 0
    out = tmp_path / "out"
    err = run_error(capsys, ["megatron-to-hf", str(tmp_path / "mg" / "dcp"), str(out), "--config-dir", tiny_qwen2_dir])
    assert "its config.json (Qwen2ForCausalLM)" in err and "6 missing (model.layers.0.self_attn.k_proj.bias, " in err
    no_leftovers(out)
    deeper = tmp_path / "deeper"
    deeper.mkdir()
    config = json.loads((Path(tiny_model_dir) / "config.json").read_text())
    (deeper / "config.json").write_text(json.dumps(config | {"num_hidden_layers": 3}))
    err = run_error(capsys, ["megatron-to-hf", str(tmp_path / "mg" / "dcp"), str(out), "--config-dir", str(deeper)])
    assert "9 missing (model.layers.2.input_layernorm.weight, " in err
    no_leftovers(out)
    assert main(["megatron-to-hf", str(tmp_path / "mg" / "dcp"), str(out), "--config-dir", tiny_model_dir]) == 0


def test_hf_dir_with_another_config_dir_is_refused(tiny_model_dir, tiny_family_dir, tmp_path, capsys):
    err = run_error(capsys, ["to-hf", tiny_family_dir("qwen3"), str(tmp_path / "out"), "--config-dir", tiny_model_dir])
    assert "4 unexpected (model.layers.0.self_attn.k_norm.weight, " in err
    no_leftovers(tmp_path / "out")


@pytest.mark.parametrize("why", ["no transformers", "unknown model type"])
def test_unchecked_config_dir_converts_with_a_warning(why, tiny_model_dir, tmp_path, monkeypatch, caplog, read_hf):
    """Without transformers (rl-checkpoint installed alone) or for a model transformers does not know,
    nothing can be checked: the conversion goes on, and says so."""
    config_dir = Path(tiny_model_dir)
    if why == "no transformers":
        real_find_spec = importlib.util.find_spec
        monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "transformers"
                            else real_find_spec(name, *a))
    else:
        config_dir = tmp_path / "future"
        config_dir.mkdir()
        (config_dir / "config.json").write_text(json.dumps({"model_type": "llama9000", "architectures": ["X"]}))
    save_dcp({"model": read_hf(tiny_model_dir)}, tmp_path / "dcp")
    with caplog.at_level(logging.WARNING, logger="rl_checkpoint"):
        assert main(["dcp-to-hf", str(tmp_path / "dcp"), str(tmp_path / "out"), "--config-dir", str(config_dir)]) == 0
    (warning,) = [r.getMessage() for r in caplog.records if r.name.startswith("rl_checkpoint")]
    assert warning.startswith(f"rl-checkpoint: warning: --config-dir {config_dir} was not checked against the tensors")
    assert ('pip install "rl-checkpoint[hf]"' if why == "no transformers" else "llama9000") in warning
    written = json.loads((tmp_path / "out" / "config.json").read_text())
    assert written == json.loads((config_dir / "config.json").read_text())
