"""Top-k distillation KL: forward/reverse/mixed by hand, the full-vocabulary tail, micro-batch sums."""

from __future__ import annotations

import pytest
import torch

from rl_algorithms.losses.distill_kl import DistillationKLLoss
from rl_algorithms.losses.masking import make_normalizer
from rl_core.batch import split
from rl_core.types import ModelOutputs


def make_case(seed: int = 0, batch_size: int = 4, length: int = 5, vocab: int = 11, k: int = 3):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch_size, length, vocab, generator=g)
    teacher = torch.randn(batch_size, length, vocab, generator=g)
    values, indices = teacher.topk(k, dim=-1)
    mask = (torch.rand(batch_size, length, generator=g) > 0.3).float()
    mask[:, 0] = 0
    batch = {"loss_mask": mask, "teacher_topk_logits": values, "teacher_topk_indices": indices}
    return logits, batch


def reference_kl(logits, batch, kl_type, weight=0.5, full_vocab=False, tail_logprob=-100.0):
    """Straightforward per-position loops (the definition), averaged over masked tokens."""
    total = 0.0
    mask = batch["loss_mask"]
    for b in range(logits.shape[0]):
        for t in range(logits.shape[1]):
            if not mask[b, t]:
                continue
            idx = batch["teacher_topk_indices"][b, t]
            p = torch.softmax(batch["teacher_topk_logits"][b, t].double(), -1)
            q_all = torch.softmax(logits[b, t].double(), -1)
            q = q_all[idx] if full_vocab else q_all[idx] / q_all[idx].sum()
            forward = (p * (p.log() - q.log())).sum()
            reverse = (q * (q.log() - p.log())).sum()
            if full_vocab:
                rest = torch.ones_like(q_all, dtype=torch.bool)
                rest[idx] = False
                reverse = reverse + (q_all[rest] * (q_all[rest].log() - tail_logprob)).sum()
            value = {"forward": forward, "reverse": reverse, "mixed": weight * forward + (1 - weight) * reverse}[kl_type]
            total += value.item()
    return total / mask.sum().item()


@pytest.mark.parametrize("kl_type", ["forward", "reverse", "mixed"])
@pytest.mark.parametrize("full_vocab", [False, True])
def test_distillation_kl_matches_definition(kl_type, full_vocab):
    logits, batch = make_case()
    loss_fn = DistillationKLLoss(kl_type=kl_type, forward_weight=0.3, student_full_vocab=full_vocab)
    loss, metrics = loss_fn(ModelOutputs(logprobs=torch.zeros(4, 5), logits=logits), batch, make_normalizer(batch))
    expected = reference_kl(logits, batch, kl_type, 0.3, full_vocab)
    assert loss.item() == pytest.approx(expected, rel=1e-5)
    assert metrics["distill_kl"] == pytest.approx(expected, rel=1e-5)


def test_distillation_kl_is_zero_when_student_equals_teacher_and_micro_batches_sum():
    logits, batch = make_case(seed=1)
    values, indices = logits.topk(3, dim=-1)
    same = dict(batch, teacher_topk_logits=values, teacher_topk_indices=indices)
    loss, _ = DistillationKLLoss(kl_type="mixed")(ModelOutputs(logprobs=torch.zeros(4, 5), logits=logits), same,
                                                  make_normalizer(same))
    assert abs(loss.item()) < 1e-6

    loss_fn = DistillationKLLoss(kl_type="reverse", student_full_vocab=True)
    normalizer = make_normalizer(batch)
    full, _ = loss_fn(ModelOutputs(logprobs=torch.zeros(4, 5), logits=logits), batch, normalizer)
    parts = sum(loss_fn(ModelOutputs(logprobs=torch.zeros(1, 5), logits=logits[i : i + 1]), micro, normalizer)[0].item()
                for i, micro in enumerate(split(batch, 1)))
    assert parts == pytest.approx(full.item(), rel=1e-6)


def test_distillation_kl_gradient_moves_student_towards_teacher():
    logits, batch = make_case(seed=2)
    logits = logits.clone().requires_grad_(True)
    loss_fn = DistillationKLLoss()
    normalizer = make_normalizer(batch)
    before, _ = loss_fn(ModelOutputs(logprobs=torch.zeros(4, 5), logits=logits), batch, normalizer)
    before.backward()
    stepped = (logits - 1.0 * logits.grad).detach()
    after, _ = loss_fn(ModelOutputs(logprobs=torch.zeros(4, 5), logits=stepped), batch, normalizer)
    assert after.item() < before.item()
