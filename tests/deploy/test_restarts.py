"""`rl <command> --max-restarts N`: the checks before a supervised run and what is never retried.
A real restart after a killed worker: tests/deploy/test_multinode.py."""

from __future__ import annotations

import pytest

from rl_apps.cli import main
from rl_apps.restarts import run_with_restarts, strip_max_restarts


@pytest.mark.parametrize("argv", [
    ["--max-restarts", "3", "a=1"],
    ["--max-restarts=3", "a=1"],
    ["a=1", "--max-r", "3"],
    ["--max-r=3", "a=1"],
])
def test_the_child_never_gets_the_flag(argv):
    assert strip_max_restarts(argv) == ["a=1"]


def test_checkpointing_off_is_a_usage_error(capsys):
    assert main(["grpo", "--max-restarts", "2", "checkpointing.enabled=false"]) == 2
    assert "--max-restarts needs checkpointing.enabled=true" in capsys.readouterr().err


def test_negative_restarts_is_a_usage_error(capsys):
    assert main(["grpo", "--max-restarts=-1"]) == 2
    assert "--max-restarts must be >= 0, got -1" in capsys.readouterr().err


def test_a_config_error_is_not_retried(capfd):
    # The child exits 2 (unknown key): restarting could only fail the same way.
    assert run_with_restarts("grpo", ["grpo.max_stepz=1"], 3) == 2
    err = capfd.readouterr().err
    assert "Did you mean 'max_steps'" in err
    assert "restart" not in err
