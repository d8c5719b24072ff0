"""An output never replaces, lies inside or holds its input; OS errors are one line and leave nothing;
a killed conversion's temporary directory is removed by the next one."""

from __future__ import annotations

import errno
import fcntl
import os
import shutil

import pytest
from cli_testlib import no_leftovers, run_error

from rl_checkpoint import safetensors_io
from rl_checkpoint.cli import main


@pytest.fixture
def ckpt(tiny_model_dir, tmp_path):
    assert main(["hf-to-dcp", tiny_model_dir, str(tmp_path / "ckpt")]) == 0
    return tmp_path / "ckpt"


def test_output_equal_to_inside_or_around_the_input_is_refused(ckpt, tiny_run, tmp_path, capsys):
    before = sorted(p.relative_to(ckpt) for p in ckpt.rglob("*"))
    err = run_error(capsys, ["dcp-to-hf", str(ckpt), str(ckpt), "--force"])
    assert f"{ckpt}: is the input {ckpt}; write the output outside the checkpoint" in err
    assert "is inside the input" in run_error(capsys, ["dcp-to-hf", str(ckpt), str(ckpt / "hf"), "--force"])
    assert "holds the input" in run_error(capsys, ["to-hf", str(ckpt), str(tmp_path), "--force"])
    assert sorted(p.relative_to(ckpt) for p in ckpt.rglob("*")) == before
    step = tiny_run / "checkpoints" / "step_000005"
    assert "is inside the input" in run_error(capsys, ["dcp-to-hf", str(tiny_run), str(step / "hf")])
    assert "holds the input" in run_error(capsys, ["dcp-to-hf", str(tiny_run), str(tiny_run), "--force"])
    assert main(["dcp-to-hf", str(tiny_run), str(tiny_run / "exported")]) == 0  # in the run, outside its checkpoint


def test_hf_to_dcp_into_its_own_input_is_refused(tiny_model_dir, tmp_path, capsys):
    hf = tmp_path / "hf"
    shutil.copytree(tiny_model_dir, hf)
    assert "is inside the input" in run_error(capsys, ["hf-to-dcp", str(hf), str(hf / "dcp")])
    assert "is the input" in run_error(capsys, ["hf-to-dcp", str(hf), str(hf), "--force"])
    assert (hf / "model.safetensors").is_file()


def test_parent_is_a_file(ckpt, tmp_path, capsys):
    (tmp_path / "afile").write_text("x")
    err = run_error(capsys, ["dcp-to-hf", str(ckpt), str(tmp_path / "afile" / "out")])
    assert f"{tmp_path / 'afile'}: is a file, so" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "ckpt"]


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EACCES, errno.EROFS])
def test_disk_full_or_read_only_leaves_nothing(ckpt, tmp_path, capsys, monkeypatch, code):
    def failing_open(path, mode="r", *args, **kwargs):
        raise OSError(code, os.strerror(code), str(path))

    monkeypatch.setattr(safetensors_io, "open", failing_open, raising=False)  # the shard writer's open()
    out = tmp_path / "out"
    err = run_error(capsys, ["dcp-to-hf", str(ckpt), str(out)])
    assert os.strerror(code) in err and ".safetensors" in err
    no_leftovers(out)


def test_a_killed_conversions_temporary_directory_is_removed(ckpt, tmp_path):
    out = tmp_path / "out"
    stale = tmp_path / ".out.tmp-deadbeef"
    (stale / "half").mkdir(parents=True)
    busy = tmp_path / ".out.tmp-0badcafe"  # a conversion still running holds its lock
    busy.mkdir()
    fd = os.open(busy, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        assert main(["dcp-to-hf", str(ckpt), str(out)]) == 0
    finally:
        os.close(fd)
    assert not stale.exists() and busy.exists() and (out / "config.json").is_file()
