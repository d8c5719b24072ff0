"""What an exported HF directory says about itself: its dtype, no duplicate tied head, a tokenizer or a loud error."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch
from cli_testlib import no_leftovers, run_error

from rl_checkpoint.cli import main
from rl_checkpoint.dcp_io import save_dcp


def test_dtype_flag_sets_config_dtype(tiny_model_dir, tmp_path, read_hf):
    assert main(["hf-to-dcp", tiny_model_dir, str(tmp_path / "ckpt")]) == 0
    assert main(["dcp-to-hf", str(tmp_path / "ckpt"), str(tmp_path / "bf16"), "--dtype", "bf16"]) == 0
    config = json.loads((tmp_path / "bf16" / "config.json").read_text())
    assert {config.get("torch_dtype"), config.get("dtype")} - {None} == {"bfloat16"}
    assert {t.dtype for t in read_hf(tmp_path / "bf16").values()} == {torch.bfloat16}

    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tmp_path / "bf16"))
    assert model.dtype == torch.bfloat16  # the dtype transformers loads it in by default


def test_tied_embeddings_are_written_once(tmp_path, read_hf):
    """A training checkpoint of a tied model holds lm_head.weight (the embedding again); the export drops it."""
    from transformers import AutoModelForCausalLM

    from rl_core.models import save_tiny_model

    hf = save_tiny_model(tmp_path / "tied", tie_word_embeddings=True)
    model = AutoModelForCausalLM.from_pretrained(str(hf)).eval()
    state = model.state_dict()
    assert "lm_head.weight" in state  # as get_state_dict gives it in training
    save_dcp({"model": state}, tmp_path / "dcp")
    out = tmp_path / "out"
    assert main(["dcp-to-hf", str(tmp_path / "dcp"), str(out), "--config-dir", str(hf)]) == 0
    tensors = read_hf(out)
    assert "lm_head.weight" not in tensors and "model.embed_tokens.weight" in tensors
    reloaded = AutoModelForCausalLM.from_pretrained(str(out)).eval()
    ids = torch.tensor([[1, 5, 9, 2]])
    with torch.no_grad():
        assert torch.equal(reloaded(ids).logits, model(ids).logits)


def test_gguf_without_transformers_fails_loudly(tmp_path, capsys, monkeypatch):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "transformers"
                        else real_find_spec(name, *a))
    err = run_error(capsys, ["gguf-to-hf", str(tmp_path / "m.gguf"), str(tmp_path / "out")])
    assert 'pip install "rl-checkpoint[hf]"' in err and "--no-tokenizer" in err
    no_leftovers(tmp_path / "out")


@pytest.mark.slow
def test_gguf_no_tokenizer_writes_weights_and_config(tmp_path, monkeypatch):
    from test_gguf import smollm2_gguf

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "transformers"
                        else real_find_spec(name, *a))
    out = tmp_path / "out"
    assert main(["gguf-to-hf", str(smollm2_gguf()), str(out), "--no-tokenizer", "--dtype", "bf16"]) == 0
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    assert not (out / "tokenizer.json").exists()
