"""Bad input fails with exit 2 and one clear line, and never leaves a half-written output."""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import pytest
import torch
from cli_testlib import no_leftovers, run_error

from rl_checkpoint.cli import main
from rl_checkpoint.dcp_io import save_dcp


@pytest.fixture
def ckpt(tiny_model_dir, tmp_path):
    """A DCP checkpoint without manifest.json (as saved before checksums): the reader's own checks."""
    assert main(["hf-to-dcp", tiny_model_dir, str(tmp_path / "ckpt")]) == 0
    (tmp_path / "ckpt" / "manifest.json").unlink()
    return tmp_path / "ckpt"


def test_missing_directory(capsys, tmp_path):
    err = run_error(capsys, ["dcp-to-hf", str(tmp_path / "nope"), str(tmp_path / "out")])
    assert "nope: no such file or directory" in err
    no_leftovers(tmp_path / "out")


def test_missing_and_corrupt_metadata(capsys, ckpt, tmp_path):
    meta = ckpt / "dcp" / ".metadata"
    raw = meta.read_bytes()
    meta.write_bytes(raw[: len(raw) // 2])
    err = run_error(capsys, ["dcp-to-hf", str(ckpt), str(tmp_path / "out")])
    assert "corrupt DCP metadata" in err and ".metadata" in err
    no_leftovers(tmp_path / "out")
    meta.unlink()
    err = run_error(capsys, ["dcp-to-hf", str(ckpt / "dcp"), str(tmp_path / "out")])
    assert "unknown checkpoint format" in err
    (ckpt / "meta.json").write_text("{not json")
    meta.write_bytes(raw)
    err = run_error(capsys, ["dcp-to-hf", str(ckpt), str(tmp_path / "out")])
    assert "meta.json" in err and "corrupt" in err


def test_metadata_pickle_cannot_run_code(capsys, tmp_path):
    """A .metadata that would call a function when unpickled is refused, and the function never runs."""
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (shutil.copy, (__file__, str(marker)))

    (tmp_path / "evil").mkdir()
    (tmp_path / "evil" / ".metadata").write_bytes(pickle.dumps(Evil()))
    err = run_error(capsys, ["dcp-to-hf", str(tmp_path / "evil"), str(tmp_path / "out"), "--config-dir", str(tmp_path)])
    assert "refused" in err and "shutil.copy" in err
    assert not marker.exists()


def test_truncated_shard(capsys, tiny_model_dir, tmp_path):
    hf = tmp_path / "hf"
    shutil.copytree(tiny_model_dir, hf)
    shard = hf / "model.safetensors"
    shard.write_bytes(shard.read_bytes()[:-1000])
    err = run_error(capsys, ["hf-to-dcp", str(hf), str(tmp_path / "out")])
    assert "truncated safetensors shard" in err and "model.safetensors" in err
    no_leftovers(tmp_path / "out")
    shard.write_bytes(b"\x05\x00")
    assert "truncated safetensors file" in run_error(capsys, ["inspect", str(hf)])


def test_truncated_dcp_data_leaves_nothing(capsys, ckpt, tmp_path):
    data = ckpt / "dcp" / "__0_0.distcp"
    data.write_bytes(data.read_bytes()[:-5000])
    err = run_error(capsys, ["dcp-to-hf", str(ckpt), str(tmp_path / "out")])
    assert "truncated DCP data file" in err
    no_leftovers(tmp_path / "out")


def test_unknown_format(capsys, tmp_path):
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "notes.txt").write_text("hello")
    assert "unknown checkpoint format" in run_error(capsys, ["to-hf", str(tmp_path / "junk"), str(tmp_path / "out")])
    (tmp_path / "w.bin").write_bytes(b"x")
    assert "unknown checkpoint file type" in run_error(capsys, ["inspect", str(tmp_path / "w.bin")])
    (tmp_path / "pt").mkdir()
    (tmp_path / "pt" / "pytorch_model.bin").write_bytes(b"x")
    assert "never loads" in run_error(capsys, ["inspect", str(tmp_path / "pt")])


def test_unsupported_dtype(capsys, tmp_path):
    save_dcp({"model": {"model.norm.weight": torch.zeros(4, dtype=torch.complex64)}}, tmp_path / "cplx")
    err = run_error(capsys, ["dcp-to-hf", str(tmp_path / "cplx"), str(tmp_path / "out")])
    assert "complex64" in err and "cannot be stored in safetensors" in err
    no_leftovers(tmp_path / "out")


def test_refuses_overwrite_without_force(capsys, ckpt, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    assert "already exists; pass --force" in run_error(capsys, ["dcp-to-hf", str(ckpt), str(out)])
    assert (out / "keep.txt").read_text() == "mine"
    assert main(["dcp-to-hf", str(ckpt), str(out), "--force"]) == 0
    assert not (out / "keep.txt").exists() and (out / "config.json").is_file()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".out")] == []


def test_wrong_command_for_format(capsys, tiny_model_dir, tmp_path):
    assert "not DCP; use `rl-checkpoint to-hf`" in run_error(capsys, ["dcp-to-hf", tiny_model_dir, str(tmp_path / "o")])
    cfg = json.loads((__import__("pathlib").Path(tiny_model_dir) / "config.json").read_text())
    assert cfg["model_type"] == "llama"


def test_megatron_to_hf_of_a_checkpoint_not_in_megatron_format(capsys, tiny_model_dir, tmp_path):
    """It used to blame a missing .metadata (a training checkpoint) or a tensor without HF counterpart (a bare DCP)."""
    assert main(["hf-to-dcp", tiny_model_dir, str(tmp_path / "ckpt")]) == 0
    out = tmp_path / "out"
    detects = "`rl-checkpoint to-hf` without --format (it detects the format)"
    for path, found, use in [
        (tmp_path / "ckpt", "a training checkpoint with HF tensor names", f"`rl-checkpoint dcp-to-hf`, or {detects}"),
        (tmp_path / "ckpt" / "dcp", "a DCP checkpoint with HF tensor names", f"`rl-checkpoint dcp-to-hf`, or {detects}"),
        (tiny_model_dir, "an HF safetensors model", detects),
    ]:
        for argv in (["megatron-to-hf", str(path), str(out)], ["to-hf", str(path), str(out), "--format", "megatron"]):
            err = run_error(capsys, [*argv, "--config-dir", tiny_model_dir])
            assert err == f"rl-checkpoint: error: {path}: is {found}, not in Megatron format; use {use}"
            no_leftovers(out)


def test_gguf_takes_no_config_dir(capsys, tiny_model_dir, tmp_path):
    """A GGUF carries its config and tokenizer; a --config-dir beside it was ignored without a word."""
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")  # refused before it is read
    for argv in (["to-hf", str(gguf), str(tmp_path / "out")], ["inspect", str(gguf)]):
        err = run_error(capsys, [*argv, "--config-dir", tiny_model_dir])
        assert err == (f"rl-checkpoint: error: --config-dir {tiny_model_dir}: a GGUF file carries its own config and "
                       f"tokenizer, so {gguf} takes no --config-dir; leave the flag out")
    no_leftovers(tmp_path / "out")


def test_an_explicit_format_reads_what_detection_cannot_name(tiny_model_dir, tmp_path):
    """--format is the escape hatch: a safetensors file under another suffix converts with --format hf (the
    format check compares --format with what was detected only where something was)."""
    weights = tmp_path / "weights.st"
    shutil.copy(Path(tiny_model_dir) / "model.safetensors", weights)
    assert main(["to-hf", str(weights), str(tmp_path / "out"), "--format", "hf", "--config-dir", tiny_model_dir]) == 0
    assert (tmp_path / "out" / "config.json").is_file()
