"""MoE router replay, the engine's half (``generation.record_routing``): every completion carries the
experts each MoE layer chose for each token the engine ran, and they are the experts a plain HF forward
over the same tokens chooses, through continuous batching (rows moving), shared-prompt prefill and
sleep/wake; dense models and other backends are refused."""

from __future__ import annotations

import pytest
import torch

from rl_backends_gen.config import GenerationConfig
from rl_backends_gen.native import NativeEngine
from rl_core.models.moe import moe_routers
from rl_core.models.tiny import FAMILIES
from rl_core.types import SamplingParams

MOE = ["glm4_moe_lite", "gpt_oss", "mixtral", "nemotron_h", "qwen3_5_moe_text", "qwen3_moe"]
SAMPLED = SamplingParams(max_new_tokens=12, temperature=1.0, n=2, seed=3)


def hf_routing(path: str):
    """``routing(token_ids) -> [len(token_ids), moe_layers, k]``: the experts HF's own forward chooses,
    sorted per token."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    chosen = []
    for router in moe_routers(model):
        router.register_forward_hook(lambda _m, _a, out: chosen.append(out[2]))

    def routing(token_ids: list[int]) -> torch.Tensor:
        chosen.clear()
        with torch.no_grad():
            model(input_ids=torch.tensor([token_ids]))
        return torch.stack(chosen, dim=1).sort(-1).values
    return routing


def test_every_moe_family_of_the_matrix_is_covered(documented_families):
    """``MOE`` is every family with routers, and docs/models.md's router replay column says so."""
    assert [f for f in FAMILIES if moe_routers_of(f)] == [f for f in FAMILIES if f in MOE]
    for family, row in documented_families.items():
        assert row["MoE router replay"] == ("yes" if family in MOE else "dense"), family


def moe_routers_of(family: str) -> bool:
    from rl_core.models.tiny import build_tiny_model, build_tiny_tokenizer

    return bool(moe_routers(build_tiny_model(build_tiny_tokenizer(), family=family)))


@pytest.mark.parametrize("family", MOE)
def test_recorded_experts_are_those_of_a_plain_forward(family, tiny_family_dir, tiny_prompts):
    """4 rows for 12 samples of different lengths: rows finish, move and refill; 2 samples per prompt
    share its prefill; the engine sleeps and wakes between two calls."""
    path = tiny_family_dir(family)
    engine = NativeEngine(path, max_batch_size=4, max_seq_len=128, record_routing=True)
    prompts = tiny_prompts[:6]
    results = engine.generate(prompts, SAMPLED)
    engine.sleep()
    engine.wake()
    results += engine.generate(prompts[:1], SAMPLED)
    routers, routing = len(moe_routers(engine.model)), hf_routing(path)
    for prompt, samples in zip(prompts + prompts[:1], results):
        for completion in samples:
            tokens = prompt + completion.token_ids[:-1]  # the last generated token never ran
            record = completion.routed_experts
            assert record.dtype == torch.int16 and record.shape[:2] == (len(tokens), routers)
            assert torch.equal(record.long().sort(-1).values, routing(tokens)), family


@pytest.mark.parametrize("family", ["qwen3_moe", "gpt_oss"])
def test_speculative_verify_steps_record_the_experts_of_a_plain_forward(family, tiny_family_dir, tiny_prompts):
    """n-gram speculation verifies several tokens per row in one forward and rolls back rejected ones: the
    record still holds, for every token, the experts HF's forward over the final tokens chooses."""
    from rl_backends_gen.config import SpeculativeConfig

    path = tiny_family_dir(family)
    spec = SpeculativeConfig(method="ngram", num_tokens=3, ngram={"min_n": 1, "max_n": 3}, max_batch_rows=4096)
    engine = NativeEngine(path, max_batch_size=3, max_seq_len=128, record_routing=True, speculative=spec)
    prompts = tiny_prompts[:4]
    results = engine.generate(prompts, SamplingParams(max_new_tokens=24, temperature=0.0))
    stats = engine.speculative.last_call
    assert stats.verify_steps > 0 and 0 < stats.accepted_tokens < stats.proposed_tokens  # accepted and rolled back
    routing = hf_routing(path)
    for prompt, [completion] in zip(prompts, results):
        tokens = prompt + completion.token_ids[:-1]
        assert torch.equal(completion.routed_experts.long().sort(-1).values, routing(tokens)), family


def test_without_record_routing_completions_carry_nothing(tiny_family_dir, tiny_prompts):
    engine = NativeEngine(tiny_family_dir("qwen3_moe"), max_batch_size=4, max_seq_len=128)
    assert engine.generate(tiny_prompts[:1], SAMPLED)[0][0].routed_experts is None


def test_a_dense_model_is_refused(tiny_family_dir):
    with pytest.raises(ValueError, match="generation.record_routing=true: qwen3 has no mixture-of-experts router"):
        NativeEngine(tiny_family_dir("qwen3"), max_batch_size=2, max_seq_len=64, record_routing=True)


@pytest.mark.parametrize("backend", ["vllm", "hf", "sglang"])
def test_other_backends_are_refused(backend):
    with pytest.raises(ValueError, match=f"record_routing=true is implemented by the native engine, not backend={backend}"):
        GenerationConfig(backend=backend, record_routing=True)
