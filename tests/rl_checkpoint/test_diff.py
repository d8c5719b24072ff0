"""`diff` compares NaN and inf by position (the same in both is equal), and --atol is a finite number >= 0."""

from __future__ import annotations

import math

import pytest
import torch

from rl_checkpoint import diff
from rl_checkpoint.cli import main
from rl_checkpoint.safetensors_io import write_file

NAN, INF = math.nan, math.inf
BASE = {"bias": torch.tensor([0.5, -0.5]), "weight": torch.tensor([1.0, 2.0, 3.0, 4.0])}


def hf_dir(path, weight: list[float]):
    """An HF directory of BASE with ``weight`` as its weight."""
    path.mkdir()
    write_file(path / "model.safetensors", BASE | {"weight": torch.tensor(weight)})
    return str(path)


@pytest.mark.parametrize("value", [NAN, INF, -INF])
def test_nan_or_inf_in_one_checkpoint_only_is_a_difference(tmp_path, capsys, value):
    a, b = hf_dir(tmp_path / "a", [1, 2, 3, 4]), hf_dir(tmp_path / "b", [1, value, 3, 4])
    capsys.readouterr()
    assert main(["diff", a, b]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines == ["DIFF weight: max_abs_diff=0.000e+00, nan_inf_mismatches=1",
                     "different: 2 common tensors, max_abs_diff=0.000e+00, nan_inf_mismatches=1, atol=0.0"]
    assert main(["diff", b, a, "--atol", "1e30"]) == 1  # no tolerance covers a NaN or an infinity


def test_nan_and_inf_at_the_same_positions_count_as_equal(tmp_path, capsys):
    a, b = hf_dir(tmp_path / "a", [NAN, 2, INF, -INF]), hf_dir(tmp_path / "b", [NAN, 2.25, INF, -INF])
    capsys.readouterr()
    assert main(["diff", a, b, "--atol", "0.25"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == ["NAN-INF weight: 3 NaN/inf at the same positions in both (counted as equal)",
                     "same: 2 common tensors, max_abs_diff=2.500e-01, nan_inf_in_both=3, atol=0.25"]


def test_each_position_and_value_of_nan_and_inf_is_compared(tmp_path):
    # NaN vs number, number vs NaN, +inf vs -inf, NaN vs inf: 4 mismatches; the finite positions differ by 0.5
    a = hf_dir(tmp_path / "a", [NAN, 2, INF, 4, NAN, INF])
    b = hf_dir(tmp_path / "b", [1, NAN, -INF, 4.5, INF, INF])
    report = diff(a, b)
    assert report["max_abs_diff"] == {"bias": 0.0, "weight": 0.5}
    assert report["nonfinite_mismatch"] == {"weight": 4}
    assert report["nonfinite_same"] == {"weight": 1}


@pytest.mark.parametrize("atol", ["nan", "inf", "-1", "-0.5"])
def test_atol_must_be_a_finite_number_not_below_zero(tmp_path, capsys, atol):
    a, b = hf_dir(tmp_path / "a", [1, 2, 3, 4]), hf_dir(tmp_path / "b", [1, 2, 3, 5])
    for other in (a, b):  # `--atol nan` called different models the same, `--atol -1` identical ones different
        capsys.readouterr()
        assert main(["diff", a, other, "--atol", atol]) == 2
        printed = capsys.readouterr()
        assert printed.err == f"rl-checkpoint: error: --atol {float(atol)}: must be a finite number >= 0 " \
                              "(the largest max abs difference allowed)\n"
        assert printed.out == ""
