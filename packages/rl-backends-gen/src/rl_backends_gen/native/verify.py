"""Verification of proposed tokens: exact speculative sampling (Leviathan et al. 2023, Chen et al. 2023).

A row proposes ``d`` tokens ``x_1 .. x_d``; the target model scores the row's last token and the
proposals in one forward, giving the target's processed distributions ``p_0 .. p_d`` (temperature, then
top-k / top-p / min-p, renormalised: exactly what the plain sampler draws from). Proposal ``x_j`` came
from a distribution ``q_{j-1}`` (a draft model's, processed the same way; one-hot for an n-gram
proposal or a greedy draft). Going left to right:

* accept ``x_j`` when ``u < p_{j-1}(x_j) / q_{j-1}(x_j)`` (``u`` uniform), i.e. with probability
  ``min(1, p/q)``; for a one-hot q that is ``p_{j-1}(x_j)``;
* at the first rejection, emit a token drawn from the residual ``max(0, p - q)``, renormalised (for a
  one-hot q: p without the rejected token), and stop;
* if all ``d`` are accepted, emit a token drawn from ``p_d`` (the "bonus" token).

Each emitted token is then distributed exactly as the target's own sample would be. Greedy: a proposal
is accepted when it equals the target's argmax, the first mismatch is replaced by that argmax: token for
token the plain greedy output. Every emitted token's logprob is the target's, under the library's
convention: ``log_softmax(logits / T)`` over the full vocabulary before masking (T = 1 when greedy).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rl_backends_gen.native.sampling import inverse_cdf, masked_candidates
from rl_core.types import SamplingParams


@dataclass
class Verified:
    """One verification: row r emits ``tokens[r, :accepted[r] + 1]`` (the accepted proposals, then the
    residual or bonus token) with the target's ``logprobs``."""

    tokens: torch.Tensor  # [R, q] long
    logprobs: torch.Tensor  # [R, q] float32
    accepted: torch.Tensor  # [R] long, 0 .. counts[r]


def processed_probs(logits: torch.Tensor, sampling: SamplingParams, out: torch.Tensor | None = None
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(probs [N, V], log_normaliser [N])`` of raw ``logits`` [N, V]: the distribution the plain
    sampler draws from (temperature, top-k, top-p, min-p; renormalised) and ``logsumexp(logits / T)``
    over the full vocabulary. ``out``: a float32 buffer of at least [N, V] that receives ``probs``."""
    rows, vocab = logits.shape
    buffer = out[:rows, :vocab] if out is not None else None
    weights = torch.div(logits, sampling.temperature, out=buffer)
    top = weights.amax(dim=-1, keepdim=True)
    weights.sub_(top).exp_()  # [N, V] unnormalised, the largest is exactly 1
    log_normaliser = weights.sum(dim=-1).log_() + top.squeeze(1)
    masked, candidate_ids = masked_candidates(weights, sampling)
    if candidate_ids is not None:  # back from candidate order to vocabulary order
        weights.zero_().scatter_(1, candidate_ids, masked)
    elif masked is not weights:
        weights.copy_(masked)
    weights.div_(weights.sum(dim=-1, keepdim=True))
    return weights, log_normaliser


def leading_accepted(accept: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """[R]: how many of each row's first ``counts`` tests pass before the first failure (``accept`` [R, d])."""
    valid = torch.arange(accept.shape[1], device=accept.device)[None, :] < counts[:, None]
    return (accept & valid).long().cumprod(dim=1).sum(dim=1)


def verify_greedy(logits: torch.Tensor, proposals: torch.Tensor, counts: torch.Tensor) -> Verified:
    """``logits`` [R, q, V] raw target logits at the last token and the proposals [R, q - 1]."""
    rows, queries, _ = logits.shape
    best = logits.argmax(dim=-1)  # [R, q]
    accepted = leading_accepted(proposals == best[:, : queries - 1], counts)
    tokens = torch.cat([proposals, proposals.new_zeros(rows, 1)], dim=1)
    tokens[torch.arange(rows, device=logits.device), accepted] = best.gather(1, accepted[:, None]).squeeze(1)
    log_normaliser = torch.logsumexp(logits, dim=-1)
    return Verified(tokens, logits.gather(2, tokens[..., None]).squeeze(2) - log_normaliser, accepted)


def verify_sampled(logits: torch.Tensor, proposals: torch.Tensor, counts: torch.Tensor,
                   draft_probs: torch.Tensor | None, sampling: SamplingParams, accept_uniforms: torch.Tensor,
                   sample_uniforms: torch.Tensor, work: torch.Tensor | None = None) -> Verified:
    """Speculative sampling of one step (see the module docstring).

    ``logits`` [R, q, V] raw target logits; ``proposals`` [R, q - 1] (row r's first ``counts[r]`` are
    real); ``draft_probs`` [q - 1, R, V] the processed distributions each proposal was drawn from, or
    None for deterministic (one-hot) proposals; ``accept_uniforms`` [R, q - 1] and ``sample_uniforms``
    [R, q]: the uniforms of the token indices the step may emit; ``work`` a float32 buffer of at least
    [R x q, V] for the target's probabilities."""
    rows, queries, vocab = logits.shape
    arange = torch.arange(rows, device=logits.device)
    probs, log_normaliser = processed_probs(logits.reshape(rows * queries, vocab), sampling, work)
    probs = probs.view(rows, queries, vocab)
    proposed = probs[:, : queries - 1].gather(2, proposals[..., None]).squeeze(2)  # p(x_j) [R, q - 1]
    if draft_probs is not None:
        draft = draft_probs[: queries - 1].permute(1, 0, 2).gather(2, proposals[..., None]).squeeze(2)
        proposed = proposed / draft.clamp(min=torch.finfo(draft.dtype).tiny)  # q(x_j) > 0: x_j was drawn from it
    accepted = leading_accepted(accept_uniforms < proposed.double(), counts)
    target = probs[arange, accepted]  # [R, V] the distribution of the last emitted token
    rejected = accepted < counts
    if draft_probs is not None and queries > 1:
        draft_at = draft_probs[accepted.clamp(max=queries - 2), arange]  # [R, V]
        residual = torch.where(rejected[:, None], (target - draft_at).clamp_(min=0.0), target)
    else:  # one-hot q: the residual is p without the rejected proposal
        residual = target.clone()
        if queries > 1:
            dropped = proposals.gather(1, accepted.clamp(max=queries - 2)[:, None]).squeeze(1)
            residual[arange[rejected], dropped[rejected]] = 0.0
    empty = residual.sum(dim=-1) <= 0  # p == q up to rounding: nothing left to correct, draw from p
    if bool(empty.any()):
        residual[empty] = target[empty]
    last = inverse_cdf(residual, sample_uniforms[arange, accepted])
    tokens = torch.cat([proposals, proposals.new_zeros(rows, 1)], dim=1)
    tokens[arange, accepted] = last
    picked = logits.gather(2, tokens[..., None]).squeeze(2) / sampling.temperature  # [R, q]
    return Verified(tokens, picked - log_normaliser.view(rows, queries), accepted)
