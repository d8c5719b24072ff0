"""A training checkpoint as a model: converted once into <step>/hf, reused, refused when damaged."""

from __future__ import annotations

import pytest

from rl_checkpoint import CheckpointError, hf_model_dir


def test_converted_once_and_reused(tiny_run, tiny_model_dir, read_hf, same_tensors):
    hf = hf_model_dir(tiny_run)
    assert hf == tiny_run / "checkpoints" / "step_000005" / "hf"
    same_tensors(read_hf(hf), read_hf(tiny_model_dir))
    built = (hf / "model-00001-of-00001.safetensors").stat().st_mtime_ns
    assert hf_model_dir(tiny_run / "checkpoints" / "step_000005" / "policy") == hf
    assert (hf / "model-00001-of-00001.safetensors").stat().st_mtime_ns == built
    assert not [p for p in hf.parent.iterdir() if ".tmp-" in p.name]


def test_not_a_checkpoint_or_damaged(tiny_run, tiny_model_dir, tmp_path):
    assert hf_model_dir(tiny_model_dir) is None
    assert hf_model_dir(tmp_path / "nothing-here") is None
    (tiny_run / "checkpoints" / "step_000005" / "policy" / "dcp" / ".metadata").write_bytes(b"junk")
    with pytest.raises(CheckpointError, match="step_000005/policy/dcp/.metadata: .* bytes"):
        hf_model_dir(tiny_run)


def test_an_hf_to_dcp_output_is_a_start_point(tiny_model_dir, tmp_path, read_hf, same_tensors):
    from rl_checkpoint import hf_to_dcp

    hf_to_dcp(tiny_model_dir, tmp_path / "start")
    same_tensors(read_hf(hf_model_dir(tmp_path / "start")), read_hf(tiny_model_dir))
