"""pass@k against brute-force enumeration; cons@k voting and its tie rule; mean@k."""

from __future__ import annotations

import itertools
from fractions import Fraction

import pytest

from rl_eval.metrics import cons_at_k, majority_vote, mean_at_k, pass_at_k


def brute_force_pass_at_k(n: int, c: int, k: int) -> Fraction:
    """Fraction of all k-subsets of n samples (c of them correct) holding at least one correct sample."""
    samples = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    return Fraction(sum(any(samples[i] for i in s) for s in subsets), len(subsets))


@pytest.mark.parametrize("n", range(1, 8))
def test_pass_at_k_equals_enumeration(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(float(brute_force_pass_at_k(n, c, k)), abs=1e-12), (n, c, k)


def test_pass_at_k_large_n_is_stable():
    # C(1000, 500) overflows floats; the product form does not
    assert pass_at_k(1000, 1, 1) == pytest.approx(0.001)
    assert pass_at_k(1000, 500, 10) == pytest.approx(1 - 0.5**10, abs=1e-3)
    assert 0.0 <= pass_at_k(1000, 3, 500) <= 1.0


def test_pass_at_k_rejects_bad_k():
    with pytest.raises(ValueError, match="k must be in"):
        pass_at_k(4, 1, 5)
    with pytest.raises(ValueError, match="k must be in"):
        pass_at_k(4, 1, 0)
    with pytest.raises(ValueError, match="0 <= c <= n"):
        pass_at_k(4, 5, 1)


def test_majority_vote_and_ties():
    assert majority_vote(["7", "8", "8"]) == ("8", 2)
    # a tie goes to the answer seen first
    assert majority_vote(["8", "7", "7", "8"]) == ("8", 2)
    assert majority_vote(["7", "8", "8", "7"]) == ("7", 2)
    # None (no answer extracted) never wins
    assert majority_vote([None, None, "3"]) == ("3", 1)
    assert majority_vote([None, None]) == (None, 0)


def test_cons_at_k():
    answers = ["5", "6", "6", "5", None]
    correct = [True, False, False, True, False]
    assert cons_at_k(answers, correct, 1) == 1.0          # just "5"
    assert cons_at_k(answers, correct, 3) == 0.0          # "6" wins 2-1
    assert cons_at_k(answers, correct, 4) == 1.0          # 2-2 tie: "5" came first
    assert cons_at_k([None, None], [False, False], 2) == 0.0
    with pytest.raises(ValueError):
        cons_at_k(answers, correct, 6)


def test_mean_at_k():
    assert mean_at_k([True, False, True, True], 4) == 0.75
    assert mean_at_k([True, False, True, True], 2) == 0.5
