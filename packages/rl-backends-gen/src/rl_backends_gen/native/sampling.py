"""Vectorised token sampling under the project's logprob convention.

The convention (rl_core/types.py): the logprob of a sampled token is ``log_softmax(logits / T)`` over
the FULL vocabulary, before any top-k / top-p / min-p masking; greedy (T = 0) reports T = 1.
Masking only decides which tokens may be drawn.

Randomness: every sample owns one uniform number per generated token, drawn up front from its own
``torch.Generator`` (see :func:`sample_seed`). A token is drawn by inverse-CDF sampling with that
number, so a sample's tokens depend only on its own seed and its own logits, never on which other
rows share the batch.
"""

from __future__ import annotations

import os

import torch

from rl_core.types import SamplingParams

_MASK64 = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def fresh_base_seed() -> int:
    """A random base seed for calls with ``seed=None``."""
    return int.from_bytes(os.urandom(7), "little")


def sample_seed(base_seed: int, prompt_index: int, sample_index: int) -> int:
    """Seed of sample ``sample_index`` of prompt ``prompt_index``: a mix of ``(base_seed + prompt_index,
    sample_index)``, so the same pair always gives the same stream whatever the batch holds."""
    pair = (((base_seed + prompt_index) & 0xFFFFFFFFFFFF) << 16) ^ (sample_index & 0xFFFF) ^ (sample_index << 48)
    return _splitmix64(pair & _MASK64) & ((1 << 63) - 1)


def draw_uniforms(seed: int, count: int) -> torch.Tensor:
    """``count`` uniforms in [0, 1) from a generator seeded with ``seed`` (CPU, float64)."""
    generator = torch.Generator(device="cpu")
    generator.manual_seed(seed)
    return torch.rand(count, generator=generator, dtype=torch.float64)


def sample_tokens(logits: torch.Tensor, sampling: SamplingParams, uniforms: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick one token per row and return ``(tokens [R], logprobs [R])``.

    ``logits``: [R, V] float32 raw logits. ``uniforms``: [R] numbers in [0, 1) (unused when greedy).
    """
    if sampling.greedy:
        logprobs = torch.log_softmax(logits, dim=-1)
        tokens = logits.argmax(dim=-1)
        return tokens, logprobs.gather(1, tokens[:, None]).squeeze(1)
    logprobs = torch.log_softmax(logits / sampling.temperature, dim=-1)  # [R, V], the reported convention
    tokens = _draw(logprobs, sampling, uniforms)
    return tokens, logprobs.gather(1, tokens[:, None]).squeeze(1)


def _draw(logprobs: torch.Tensor, sampling: SamplingParams, uniforms: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF draw from the masked distribution (order: top-k, then top-p, then min-p, as in HF)."""
    probs = logprobs.exp()  # [R, V]
    vocab = probs.shape[-1]
    candidate_ids = None  # None: candidates are the whole vocabulary in its own order
    if 0 < sampling.top_k < vocab:
        probs, candidate_ids = probs.topk(sampling.top_k, dim=-1)  # [R, k], sorted descending
    elif sampling.top_p < 1.0:
        probs, candidate_ids = probs.sort(dim=-1, descending=True)
    if sampling.top_p < 1.0:
        renormalised = probs / probs.sum(dim=-1, keepdim=True)
        mass_before = renormalised.cumsum(dim=-1) - renormalised  # exclusive prefix sum, descending order
        probs = probs.masked_fill(mass_before >= sampling.top_p, 0.0)  # the top token always survives
    if sampling.min_p > 0.0:
        max_prob = probs.amax(dim=-1, keepdim=True)
        probs = probs.masked_fill(probs < sampling.min_p * max_prob, 0.0)
    cdf = probs.cumsum(dim=-1)  # [R, C], unnormalised
    total = cdf[:, -1:]
    target = uniforms.to(cdf.dtype)[:, None] * total
    # Keep the target strictly below the total so the pick is always a token with non-zero mass.
    target = torch.minimum(target, torch.nextafter(total, torch.zeros_like(total)))
    picked = torch.searchsorted(cdf, target, right=True).squeeze(1)  # [R]
    if candidate_ids is None:
        return picked
    return candidate_ids.gather(1, picked[:, None]).squeeze(1)
