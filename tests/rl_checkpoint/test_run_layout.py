"""Every command takes a run directory, its checkpoints/, a step directory or its policy/, and verifies
the checkpoint's manifest before reading it."""

from __future__ import annotations

import json

import pytest
from cli_testlib import run_error

from rl_checkpoint.cli import main


@pytest.mark.parametrize("where", ["", "checkpoints", "checkpoints/step_000005", "checkpoints/step_000005/policy"])
def test_dcp_to_hf_finds_the_latest_complete_checkpoint(tiny_run, tiny_model_dir, tmp_path, read_hf, same_tensors,
                                                        where):
    out = tmp_path / "exported"
    assert main(["dcp-to-hf", str(tiny_run / where), str(out)]) == 0
    same_tensors(read_hf(out), read_hf(tiny_model_dir))  # step 5 (Llama), not step 3 (Qwen2) or 7 (incomplete)
    assert json.loads((out / "config.json").read_text())["model_type"] == "llama"
    assert not (out / "rng.pt").exists() and not (out / "manifest.json").exists()


def test_inspect_shows_the_checkpoint_and_its_checksums(tiny_run, capsys):
    capsys.readouterr()
    assert main(["inspect", str(tiny_run)]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-2:]
    assert f"path={tiny_run}/checkpoints/step_000005/policy" in last[0]
    assert last[1].startswith("checksums: sha256 verified: ") and " files, " in last[1]
    assert main(["inspect", str(tiny_run / "checkpoints" / "step_000003"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["format"] == "rl-dcp" and "model.layers.0.self_attn.q_proj.bias" in report["tensors"]


def test_incomplete_and_empty_runs(tiny_run, tmp_path, capsys):
    err = run_error(capsys, ["dcp-to-hf", str(tiny_run / "checkpoints" / "step_000007"), str(tmp_path / "o")])
    assert "incomplete checkpoint (no trainer_state.json" in err and "use an earlier step" in err
    (tmp_path / "empty" / "checkpoints" / "step_000001").mkdir(parents=True)
    err = run_error(capsys, ["to-hf", str(tmp_path / "empty"), str(tmp_path / "o")])
    assert "holds no complete checkpoint" in err


def test_flipped_bytes_are_refused_naming_the_file_and_tensor(tiny_run, tmp_path, capsys):
    data = tiny_run / "checkpoints" / "step_000005" / "policy" / "dcp" / "__0_0.distcp"
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2:len(raw) // 2 + 16] = bytes(b ^ 0xFF for b in raw[len(raw) // 2:len(raw) // 2 + 16])
    data.write_bytes(bytes(raw))
    for argv in (["dcp-to-hf", str(tiny_run), str(tmp_path / "o")], ["inspect", str(tiny_run)],
                 ["diff", str(tiny_run), str(tiny_run / "checkpoints" / "step_000003")]):
        err = run_error(capsys, argv)
        assert f"{data}: checksum mismatch" in err and "damaged tensor: model." in err, err
    assert not (tmp_path / "o").exists()


def test_inspect_checks_every_file_conversion_only_the_model(tiny_run, tmp_path, capsys):
    rng = tiny_run / "checkpoints" / "step_000005" / "rng.pt"
    rng.write_bytes(rng.read_bytes()[:10])
    assert f"{rng}: 10 bytes" in run_error(capsys, ["inspect", str(tiny_run)])
    assert main(["dcp-to-hf", str(tiny_run), str(tmp_path / "o")]) == 0  # the weights are intact
    (tiny_run / "checkpoints" / "step_000005" / "manifest.json").write_text("{garbage")
    assert "corrupt checkpoint manifest" in run_error(capsys, ["dcp-to-hf", str(tiny_run), str(tmp_path / "p")])
