"""The native engine's sampler: the two-level inverse-CDF search, masking and the logprob convention."""

from __future__ import annotations

import pytest
import torch

from rl_backends_gen.native.sampling import BLOCK, inverse_cdf, sample_tokens
from rl_core.types import SamplingParams


def reference_inverse_cdf(weights: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """First index whose float64 prefix sum exceeds ``u x total``."""
    cdf = weights.double().cumsum(dim=-1)
    target = uniforms.double()[:, None] * cdf[:, -1:]
    return torch.searchsorted(cdf, target, right=True).squeeze(1)


@pytest.mark.parametrize("size", [50, 4 * BLOCK + 1, 5000, 49152])
def test_inverse_cdf_equals_a_full_prefix_sum(size):
    generator = torch.Generator().manual_seed(size)
    weights = torch.rand(64, size, generator=generator) ** 4  # skewed, like real probabilities
    weights[:, ::7] = 0.0  # tokens that must never be picked
    uniforms = torch.rand(64, generator=generator, dtype=torch.float64)
    picked = inverse_cdf(weights, uniforms)
    assert torch.equal(picked, reference_inverse_cdf(weights, uniforms))
    assert bool((weights.gather(1, picked[:, None]) > 0).all())


def test_inverse_cdf_edges_pick_tokens_with_weight():
    size = 5000  # two levels, with a short last block (5000 = 19 x 256 + 136)
    weights = torch.zeros(4, size)
    weights[0, 0] = 1.0  # all mass on the first token
    weights[1, size - 1] = 1.0  # all mass on the last token, inside the short block
    weights[2, [300, 4999]] = torch.tensor([1e-30, 1.0])
    weights[3, 1000:1010] = 1e-3
    for u in (0.0, 0.5, 1.0 - 1e-16):
        picked = inverse_cdf(weights, torch.full((4,), u, dtype=torch.float64))
        assert picked[0] == 0 and picked[1] == size - 1
        assert picked[2] == (300 if u == 0.0 else 4999)  # u = 0 picks the first token with any weight
        assert 1000 <= picked[3] < 1010


def test_logprobs_follow_the_convention_and_the_work_buffer_changes_nothing():
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(8, 3000, generator=generator) * 4
    uniforms = torch.rand(8, generator=generator, dtype=torch.float64)
    for sampling in (SamplingParams(temperature=0.0), SamplingParams(temperature=1.0),
                     SamplingParams(temperature=0.7, top_k=20), SamplingParams(temperature=1.3, top_p=0.8),
                     SamplingParams(temperature=1.0, min_p=0.2)):
        tokens, logprobs = sample_tokens(logits, sampling, uniforms)
        scale = 1.0 if sampling.greedy else sampling.temperature
        want = torch.log_softmax(logits / scale, dim=-1).gather(1, tokens[:, None]).squeeze(1)
        assert torch.allclose(logprobs, want, atol=1e-5, rtol=0)
        work = torch.full((16, 3000), float("nan"))  # larger than needed, garbage inside
        again = sample_tokens(logits, sampling, uniforms, work)
        assert torch.equal(again[0], tokens) and torch.equal(again[1], logprobs)


def test_masks_decide_which_tokens_can_be_drawn():
    generator = torch.Generator().manual_seed(1)
    logits = torch.randn(1, 2000, generator=generator).expand(256, -1)
    uniforms = torch.rand(256, generator=generator, dtype=torch.float64)
    probs = torch.softmax(logits[0], dim=-1)
    order = probs.argsort(descending=True)
    top_k, _ = sample_tokens(logits, SamplingParams(temperature=1.0, top_k=5), uniforms)
    assert set(top_k.tolist()) <= set(order[:5].tolist()) and len(set(top_k.tolist())) > 1
    nucleus_size = int((probs[order].cumsum(0) - probs[order] < 0.5).sum())  # smallest set with mass >= 0.5
    top_p, _ = sample_tokens(logits, SamplingParams(temperature=1.0, top_p=0.5), uniforms)
    assert set(top_p.tolist()) <= set(order[:nucleus_size].tolist())
    min_p, _ = sample_tokens(logits, SamplingParams(temperature=1.0, min_p=0.3), uniforms)
    assert bool((probs[min_p] >= 0.3 * probs.max()).all())
    greedy, _ = sample_tokens(logits, SamplingParams(temperature=0.0), uniforms)
    assert bool((greedy == order[0]).all())
