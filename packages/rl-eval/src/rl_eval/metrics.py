"""Metrics over n samples per item: pass@k, cons@k (majority vote), mean@k, greedy accuracy.

All are averages over items of a per-item value, so per-item results are kept and summed.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from ``n`` samples with ``c`` correct: ``1 - C(n-c, k) / C(n, k)``.

    Computed as the stable product ``prod_{i=n-c+1}^{n} (1 - k / i)`` (Chen et al., 2021), which never
    forms the huge binomials.

    >>> pass_at_k(4, 1, 1), pass_at_k(4, 1, 4), pass_at_k(4, 0, 2)
    (0.25, 1.0, 0.0)
    """
    if not 0 <= c <= n:
        raise ValueError(f"need 0 <= c <= n, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"k must be in [1, n]: got k={k} with n={n} samples per item; lower k or raise n")
    if n - c < k:
        return 1.0
    prob_all_wrong = 1.0
    for i in range(n - c + 1, n + 1):
        prob_all_wrong *= 1.0 - k / i
    return 1.0 - prob_all_wrong


def mean_at_k(correct: Sequence[bool | float], k: int) -> float:
    """Mean score of the first ``k`` samples (mean@k: the expected accuracy of one sample)."""
    if not 1 <= k <= len(correct):
        raise ValueError(f"k must be in [1, n]: got k={k} with n={len(correct)} samples per item")
    return sum(float(x) for x in correct[:k]) / k


def majority_vote(answers: Sequence[str | None]) -> tuple[str | None, int]:
    """``(answer, votes)`` of the most frequent non-None answer among ``answers``.

    Ties go to the answer that appeared FIRST in sample order (deterministic, and with a fixed seed the
    same answer every run). All-None gives ``(None, 0)``.

    >>> majority_vote(["3", "4", "4", "3"])
    ('3', 2)
    """
    counts = Counter(a for a in answers if a is not None)
    if not counts:
        return None, 0
    best = max(counts.values())
    for answer in answers:
        if answer is not None and counts[answer] == best:
            return answer, best
    raise AssertionError("unreachable")


def cons_at_k(answers: Sequence[str | None], correct: Sequence[bool], k: int) -> float:
    """1.0 when the majority answer of the first ``k`` samples is correct (ties: first seen wins).

    Correctness of the voted answer is that of the first sample that gave it (graders are deterministic
    in the answer, so any sample with the same answer grades the same)."""
    if not 1 <= k <= len(answers):
        raise ValueError(f"k must be in [1, n]: got k={k} with n={len(answers)} samples per item")
    winner, _ = majority_vote(answers[:k])
    if winner is None:
        return 0.0
    first = answers[:k].index(winner)
    return float(bool(correct[first]))
