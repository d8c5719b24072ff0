"""A bad `model=` is one line and exit 2 on every command, before anything is written."""

from __future__ import annotations

import shutil

import pytest

from rl_apps.cli import main


@pytest.mark.parametrize("command", ["sft", "grpo"])
def test_bad_model_arguments(command, tiny_model_dir, tmp_path, capsys):
    corrupt = tmp_path / "corrupt"
    shutil.copytree(tiny_model_dir, corrupt)
    (corrupt / "model.safetensors").write_bytes(b"\x05\x00")
    (tmp_path / "notes").mkdir()
    cases = {"gpt-7": "unknown model 'gpt-7'", "HuggingFaceTB/SmolLM2-1.7B": "Nothing is downloaded",
             str(tmp_path / "notes"): "without config.json", str(corrupt): "model.safetensors is corrupt"}
    for model, expected in cases.items():
        out = tmp_path / f"run-{len(list(tmp_path.iterdir()))}"
        capsys.readouterr()
        assert main([command, f"model={model}", f"output_dir={out}"]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"rl {command}: ") and "\n" not in err and expected in err, err
        assert "tiny-llama" in err or "re-save" in err
        assert not out.exists()
