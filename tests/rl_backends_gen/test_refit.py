"""Weights updated in place: the engine then generates what a model with those weights generates."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rl_backends_gen.hf import HFGenerationBackend
from rl_backends_gen.native import NativeEngine
from rl_core.types import SamplingParams

GREEDY = SamplingParams(max_new_tokens=16, temperature=0.0)


def perturbed_weights(path: str, load_hf_model, scale: float = 0.05) -> dict[str, torch.Tensor]:
    model = load_hf_model(path)
    generator = torch.Generator().manual_seed(7)
    return {name: p.detach() + scale * torch.randn(p.shape, generator=generator) * p.detach().std()
            for name, p in model.named_parameters()}


def test_refit_then_greedy_equals_hf_with_the_new_weights(tiny_model_dir, tiny_prompts, load_hf_model, tmp_path):
    engine = NativeEngine(tiny_model_dir, max_batch_size=8, max_seq_len=128)
    before = [r[0].token_ids for r in engine.generate(tiny_prompts, GREEDY)]
    keys_before = [t.data_ptr() for t in engine.cache.buffers()]
    weights = perturbed_weights(tiny_model_dir, load_hf_model)
    engine.update_weights(weights.items())
    after = [r[0].token_ids for r in engine.generate(tiny_prompts, GREEDY)]
    assert after != before  # the engine no longer samples the old policy
    assert [t.data_ptr() for t in engine.cache.buffers()] == keys_before  # no cache reallocation

    reference_model = load_hf_model(tiny_model_dir)
    reference_model.load_state_dict(weights, strict=False)
    reference_model.save_pretrained(tmp_path)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (tmp_path / name).write_bytes((Path(tiny_model_dir) / name).read_bytes())
    expected = HFGenerationBackend(str(tmp_path), batch_size=1).generate(tiny_prompts, GREEDY)
    assert after == [r[0].token_ids for r in expected]


def test_refit_of_tied_embeddings_updates_both_names(tmp_path, tiny_tokenizer):
    from rl_core.models import build_tiny_model

    model = build_tiny_model(tiny_tokenizer, tie_word_embeddings=True)
    model.save_pretrained(tmp_path)
    tiny_tokenizer.save_pretrained(tmp_path)
    engine = NativeEngine(str(tmp_path), max_batch_size=2, max_seq_len=64)
    assert engine.model.lm_head.weight is engine.model.model.embed_tokens.weight
    new = torch.randn_like(engine.model.lm_head.weight)
    engine.update_weights([("lm_head.weight", new)])
    assert torch.equal(engine.model.model.embed_tokens.weight, new)
    newer = torch.randn_like(new)
    engine.update_weights([("model.embed_tokens.weight", newer)])
    assert torch.equal(engine.model.lm_head.weight, newer)


def test_refit_rejects_unknown_names_and_wrong_shapes(llama_engine, tiny_prompts):
    with pytest.raises(ValueError, match="no weight named 'model.layers.0.self_attn.q_projj.weight'.*did you mean"):
        llama_engine.update_weights([("model.layers.0.self_attn.q_projj.weight", torch.zeros(1))])
    with pytest.raises(ValueError, match=r"shape \(3, 3\)"):
        llama_engine.update_weights([("model.norm.weight", torch.zeros(3, 3))])
    assert llama_engine.generate([tiny_prompts[0]], GREEDY)[0][0].token_ids  # still usable


def test_hf_backend_refit_matches_native_refit(tiny_model_dir, tiny_prompts, load_hf_model):
    weights = perturbed_weights(tiny_model_dir, load_hf_model, scale=0.1)
    engine = NativeEngine(tiny_model_dir, max_batch_size=8, max_seq_len=128)
    engine.update_weights(weights.items())
    reference = HFGenerationBackend(tiny_model_dir, batch_size=1)
    reference.update_weights(weights.items())
    assert ([r[0].token_ids for r in engine.generate(tiny_prompts, GREEDY)]
            == [r[0].token_ids for r in reference.generate(tiny_prompts, GREEDY)])
