"""The fused gradient norm (``optim.clip_grad_norm``): torch's norm on one rank, the same over two ranks
holding shards and replicas, with one all-reduce."""

from __future__ import annotations

import pytest
import torch
from backend_testlib import clipping_case_tensors, two_rank_grad_norm

from rl_backends_train.optim import clip_grad_norm


@pytest.mark.parametrize("max_norm", [None, 1.0, 100.0])
def test_one_rank_equals_torch_clip_grad_norm(max_norm):
    ours = [t.clone() for t in clipping_case_tensors()]
    theirs = [torch.nn.Parameter(t.clone()) for t in ours]
    for p, t in zip(theirs, ours):
        p.grad = t.clone()
    norm = clip_grad_norm(ours, [1.0] * len(ours), max_norm, torch.device("cpu"))
    expected = torch.nn.utils.clip_grad_norm_(theirs, max_norm if max_norm is not None else float("inf"))
    assert norm == pytest.approx(float(expected), rel=1e-6)
    for p, t in zip(theirs, ours):
        torch.testing.assert_close(t, p.grad, rtol=1e-6, atol=0)


def test_bf16_gradients_are_summed_in_fp32():
    grad = torch.randn(4096, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    norm = clip_grad_norm([grad], [1.0], None, torch.device("cpu"))
    assert norm == pytest.approx(float(grad.double().norm()), rel=1e-6)


def test_two_ranks_equal_one_rank_with_one_all_reduce(tmp_path):
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    results = ctx.SimpleQueue()
    mp.spawn(two_rank_grad_norm, args=(str(tmp_path / "init"), results), nprocs=2)
    by_rank = dict((rank, rest) for rank, *rest in (results.get(), results.get()))
    one = clipping_case_tensors()
    expected = clip_grad_norm(one, [1.0] * len(one), 1.0, torch.device("cpu"))
    for norm, all_reduces, clipped in by_rank.values():
        assert norm == pytest.approx(expected, rel=1e-6)  # fp32 norms of shards vs of whole tensors
        assert all_reduces == 1  # one reduction for the whole gradient, not one per tensor
        for got, want in zip(clipped, one):
            torch.testing.assert_close(torch.tensor(got), want, rtol=1e-6, atol=0)
