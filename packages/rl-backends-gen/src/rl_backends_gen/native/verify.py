"""Verification of proposed tokens: exact speculative sampling by coupling with the plain sampler.

A row proposes ``d`` tokens ``x_1 .. x_d`` (n-gram lookup, or a draft model's draws with the same uniforms);
the target model scores the row's last token and the proposals in one forward, giving logits
``l_0 .. l_d``. At each of those positions the plain sampler draws the token it would draw there,
``y_j = sample(l_j, u[t + j])`` (``u[t]``: the row's own uniform of token index ``t``; argmax when
greedy). Proposal ``x_j`` is accepted while ``y_{j-1} == x_j``; the row emits ``y_0 .. y_a``, where
``a`` is the number accepted (``y_a``: the correction at the first mismatch, or the bonus token after
``d`` accepted).

Every emitted token is the token the plain engine draws with the same uniform from the same context,
so the output is the plain engine's, token for token, whatever was proposed and whether a step
speculated at all (up to float rounding of the wider forward). For a proposal that does not depend on
the uniforms (n-gram) this is exactly the rejection rule of speculative sampling (Leviathan et al. 2023, Chen et al. 2023): ``x_j`` is
accepted with probability ``p(x_j)``, and on rejection ``y`` follows ``p`` without ``x_j``,
renormalised. Logprobs are the plain sampler's: ``log_softmax(logits / T)`` over the full vocabulary
before masking (T = 1 when greedy).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rl_backends_gen.native.sampling import sample_tokens
from rl_core.types import SamplingParams


@dataclass
class Verified:
    """One verification: row r emits ``tokens[r, :accepted[r] + 1]`` (the accepted proposals, then the
    correction or bonus token) with the target's ``logprobs``."""

    tokens: torch.Tensor  # [R, q] long
    logprobs: torch.Tensor  # [R, q] float32
    accepted: torch.Tensor  # [R] long, 0 .. counts[r]


def leading_accepted(accept: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """[R]: how many of each row's first ``counts`` tests pass before the first failure (``accept`` [R, d])."""
    valid = torch.arange(accept.shape[1], device=accept.device)[None, :] < counts[:, None]
    return (accept & valid).long().cumprod(dim=1).sum(dim=1)


def verify(logits: torch.Tensor, proposals: torch.Tensor, counts: torch.Tensor, sampling: SamplingParams,
           uniforms: torch.Tensor, work: torch.Tensor | None = None) -> Verified:
    """``logits`` [R, q, V] raw float32 target logits at the last token and the proposals; ``proposals``
    [R, q - 1] (row r's first ``counts[r]`` are real); ``uniforms`` [R, q]: the row's uniforms of the
    token indices the step may emit (unused when greedy); ``work``: a float32 buffer of at least
    [R x q, V] for the sampler."""
    rows, queries, vocab = logits.shape
    drawn, logprobs = sample_tokens(logits.reshape(rows * queries, vocab), sampling, uniforms.reshape(-1), work)
    drawn = drawn.view(rows, queries)
    accepted = leading_accepted(drawn[:, : queries - 1] == proposals, counts)
    return Verified(drawn, logprobs.view(rows, queries), accepted)
