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


def call_base_seed(seed: int | None, generator: torch.Generator | None) -> int:
    """The base seed of one generate call: ``SamplingParams.seed`` when given, else one drawn from the
    backend's seeded ``generator``, else fresh entropy."""
    if seed is not None:
        return seed
    if generator is not None:
        return int(torch.randint(0, 2**62, (1,), generator=generator))
    return fresh_base_seed()


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


BLOCK = 256  # vocabulary block of the two-level inverse-CDF search


def sample_tokens(logits: torch.Tensor, sampling: SamplingParams, uniforms: torch.Tensor,
                  work: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick one token per row and return ``(tokens [R], logprobs [R])``.

    ``logits``: [R, V] float32 raw logits (left unchanged). ``uniforms``: [R] numbers in [0, 1)
    (unused when greedy). ``work``: an optional float32 buffer of at least [R, V] that receives the
    unnormalised probabilities (an engine passes the same one every step: no fresh [R, V] memory per
    token). The logprob is ``logits[token] / T - logsumexp(logits / T)``: the value of
    ``log_softmax(logits / T)`` at the token (T = 1 when greedy), without building the [R, V]
    log-probabilities.
    """
    temperature = 1.0 if sampling.greedy else sampling.temperature
    out = work[: logits.shape[0], : logits.shape[1]] if work is not None else None
    if temperature == 1.0:
        top = logits.amax(dim=-1, keepdim=True)  # [R, 1]
        weights = torch.sub(logits, top, out=out)
    else:
        weights = torch.div(logits, temperature, out=out)
        top = weights.amax(dim=-1, keepdim=True)
        weights.sub_(top)
    weights.exp_()  # [R, V] unnormalised probabilities, the largest is exactly 1
    log_total = weights.sum(dim=-1).log_() + top.squeeze(1)  # logsumexp(logits / T)
    tokens = logits.argmax(dim=-1) if sampling.greedy else _draw(weights, sampling, uniforms)
    picked = logits.gather(1, tokens[:, None]).squeeze(1)
    return tokens, (picked if temperature == 1.0 else picked / temperature) - log_total


def _draw(weights: torch.Tensor, sampling: SamplingParams, uniforms: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF draw from the masked distribution (see :func:`masked_candidates`)."""
    weights, candidate_ids = masked_candidates(weights, sampling)
    picked = inverse_cdf(weights, uniforms)
    if candidate_ids is None:
        return picked
    return candidate_ids.gather(1, picked[:, None]).squeeze(1)


def masked_candidates(weights: torch.Tensor, sampling: SamplingParams) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The tokens that may be drawn and their weights (order: top-k, then top-p, then min-p, as in HF).

    ``weights`` [R, V]: non-negative, proportional to the tempered probabilities (need not sum to 1).
    Returns ``(weights [R, C], candidate_ids [R, C])``, masked-out candidates at weight 0; ``candidate_ids``
    is None when the candidates are the whole vocabulary in its own order (C = V).
    """
    vocab = weights.shape[-1]
    candidate_ids = None
    if 0 < sampling.top_k < vocab:
        weights, candidate_ids = weights.topk(sampling.top_k, dim=-1)  # [R, k], sorted descending
    elif sampling.top_p < 1.0:
        weights, candidate_ids = weights.sort(dim=-1, descending=True)
    if sampling.top_p < 1.0:
        renormalised = weights / weights.sum(dim=-1, keepdim=True)
        mass_before = renormalised.cumsum(dim=-1) - renormalised  # exclusive prefix sum, descending order
        weights = weights.masked_fill(mass_before >= sampling.top_p, 0.0)  # the top token always survives
    if sampling.min_p > 0.0:
        max_weight = weights.amax(dim=-1, keepdim=True)
        weights = weights.masked_fill(weights < sampling.min_p * max_weight, 0.0)
    return weights, candidate_ids


def inverse_cdf(weights: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Per row, the first index whose cumulative weight exceeds ``uniform x total`` ([R, C] -> [R]).

    Two levels, so no [R, C] prefix sum is built: block sums pick the block holding the target, then
    a prefix sum inside that one block picks the token. The pick always has non-zero weight.
    """
    rows, size = weights.shape
    uniforms = uniforms.to(weights.dtype)[:, None]
    if size <= 4 * BLOCK:
        cdf = weights.cumsum(dim=-1)
        return _search(cdf, uniforms * cdf[:, -1:]).squeeze(1)
    full = size // BLOCK
    block_sums = weights[:, : full * BLOCK].reshape(rows, full, BLOCK).sum(dim=-1)  # [R, full]
    if size > full * BLOCK:
        block_sums = torch.cat([block_sums, weights[:, full * BLOCK :].sum(dim=-1, keepdim=True)], dim=1)
    block_cdf = block_sums.cumsum(dim=-1)
    target = uniforms * block_cdf[:, -1:]  # [R, 1]
    block = _search(block_cdf, target)  # [R, 1], a block with non-zero weight
    before = block_cdf.gather(1, block) - block_sums.gather(1, block)  # mass of the earlier blocks
    columns = block * BLOCK + torch.arange(BLOCK, device=weights.device)  # [R, BLOCK]
    inside = columns < size
    in_block = weights.gather(1, columns.clamp(max=size - 1)) * inside  # the last block may be short
    return columns.gather(1, _search(in_block.cumsum(dim=-1), target - before)).squeeze(1)


def _search(cdf: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """[R, 1]: first index with ``cdf > target`` per row (``cdf``: inclusive prefix sums), the target
    kept inside [0, total) so the index always lands on a step of non-zero weight."""
    total = cdf[:, -1:]
    target = torch.minimum(target.clamp(min=0.0), torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cdf, target, right=True)
