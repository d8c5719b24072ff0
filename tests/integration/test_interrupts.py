"""Ctrl-C ends an `rl` command as interrupted (one line, exit 130), also where a library turns the
KeyboardInterrupt into an error of its own: torch's checkpoint writers, interrupted mid-file, raise a
CheckpointException around a RuntimeError of the half-written stream."""

from __future__ import annotations

import os
import signal
import time

import pytest

from rl_algorithms.checkpointing import CheckpointManager

pytestmark = pytest.mark.usefixtures("sigint_as_in_a_terminal")


def test_ctrl_c_during_a_checkpoint_save_is_an_interruption_and_keeps_the_last_checkpoint(rl, monkeypatch, tmp_path):
    save = CheckpointManager.save

    def save_interrupted_mid_file(self, done, policy, state, files=None):
        if done < 2:
            return save(self, done, policy, state, files)
        try:  # a real SIGINT, delivered while "writing"
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)
        except KeyboardInterrupt:
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598") from None
        raise AssertionError("SIGINT was not delivered")

    monkeypatch.setattr(CheckpointManager, "save", save_interrupted_mid_file)
    out = tmp_path / "run"
    result = rl("sft", "--config", "sft_tiny", f"output_dir={out}", "sft.max_steps=2", "sft.val_every=0",
                "checkpointing.every_n_steps=1", "checkpointing.keep_last=null")
    assert result.code == 130 and result.err.strip().splitlines()[-1] == "rl sft: interrupted"
    assert "Traceback" not in result.err
    assert [p.name for p in (out / "checkpoints").iterdir() if not p.name.startswith(".")] == ["step_000001"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the command's handler is gone
