"""Ctrl-C ends a conversion as interrupted: one line, exit 130, no traceback; OUT is left as it was (an
existing one kept) and no temporary directory stays, also where torch turns the KeyboardInterrupt into an
error of its own (dcp.save: a CheckpointException)."""

from __future__ import annotations

import os
import signal
import time

import pytest
from cli_testlib import no_leftovers

from rl_checkpoint import convert
from rl_checkpoint.cli import main

pytestmark = pytest.mark.usefixtures("sigint_as_in_a_terminal")


def interrupt() -> None:
    """A real SIGINT, delivered while "writing"."""
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(5)
    raise AssertionError("SIGINT was not delivered")


def run_interrupted(capsys, argv: list[str]) -> None:
    capsys.readouterr()
    try:
        code = main(argv)
    except BaseException as e:  # escaping main(), a KeyboardInterrupt would end the whole test session
        pytest.fail(f"{type(e).__name__} escaped main()")
    printed = capsys.readouterr()
    assert (code, printed.err) == (130, "rl-checkpoint: interrupted\n")
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the command's handler is gone


def test_ctrl_c_while_writing_shards_keeps_the_old_output(tiny_model_dir, tmp_path, monkeypatch, capsys):
    out = tmp_path / "out"
    assert main(["to-hf", tiny_model_dir, str(out)]) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    write_sharded = convert.write_sharded

    def write_then_interrupt(out_dir, infos, load, **kwargs):
        def load_then_interrupt(names):
            load(names)
            interrupt()

        write_sharded(out_dir, infos, load_then_interrupt, **kwargs)

    monkeypatch.setattr(convert, "write_sharded", write_then_interrupt)
    run_interrupted(capsys, ["to-hf", tiny_model_dir, str(out), "--force", "--dtype", "bf16"])
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_ctrl_c_inside_dcp_save_is_an_interruption(tiny_model_dir, tmp_path, monkeypatch, capsys):
    from torch.distributed.checkpoint.filesystem import FileSystemWriter

    monkeypatch.setattr(FileSystemWriter, "write_data", lambda *args, **kwargs: interrupt())
    run_interrupted(capsys, ["hf-to-dcp", tiny_model_dir, str(tmp_path / "ckpt")])
    no_leftovers(tmp_path / "ckpt")
