"""Model resolution errors are one ConfigError line listing the known names; hub names resolve offline;
training checkpoints resolve through an injected converter."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from rl_core.config import ConfigError
from rl_core.models import ModelResolutionError, resolve_model, save_tiny_model
from rl_core.models import resolve as resolve_module


def _one_line(info) -> str:
    message = str(info.value)
    assert isinstance(info.value, ConfigError) and "\n" not in message
    return message


def test_unknown_and_hub_names_list_what_is_available(tmp_path):
    with pytest.raises(ModelResolutionError) as info:
        resolve_model("meta-llama/Llama-3-8B", cache_dir=tmp_path)
    message = _one_line(info)
    assert "Nothing is downloaded" in message
    assert "Use one of: smollm2-135m-instruct, tiny-llama, tiny-qwen2, " in message
    assert "(or as on the hub: HuggingFaceTB/SmolLM2-135M-Instruct)" in message


def test_hub_name_resolves_to_the_packaged_model(tmp_path, monkeypatch):
    built = []
    monkeypatch.setitem(resolve_module.SHORT_NAMES, "smollm2-135m-instruct",
                        lambda out: built.append(out) or save_tiny_model(out))
    path = resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct", cache_dir=tmp_path)
    assert Path(path) == tmp_path / "smollm2-135m-instruct" and len(built) == 1
    assert resolve_model("smollm2-135m-instruct", cache_dir=tmp_path) == path and len(built) == 1
    assert resolve_model("Tiny-Llama", cache_dir=tmp_path) == str(tmp_path / "tiny-llama")


def test_a_non_model_directory_or_file(tmp_path):
    (tmp_path / "notes").mkdir()
    with pytest.raises(ModelResolutionError) as info:
        resolve_model(str(tmp_path / "notes"))
    assert "without config.json" in _one_line(info) and "tiny-llama" in str(info.value)
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    with pytest.raises(ModelResolutionError, match="looks like a training run or checkpoint.*rl-checkpoint dcp-to-hf"):
        resolve_model(str(tmp_path / "run"))
    (tmp_path / "w.bin").write_bytes(b"x")
    with pytest.raises(ModelResolutionError, match="is a file"):
        resolve_model(str(tmp_path / "w.bin"))


@pytest.mark.parametrize("damage", ["truncated", "garbage", "config", "no-model-type", "no-weights", "index"])
def test_a_corrupt_model_is_one_line(tiny_model_dir, tmp_path, damage):
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    weights = model / "model.safetensors"
    if damage == "truncated":
        weights.write_bytes(weights.read_bytes()[:-1000])
    elif damage == "garbage":
        weights.write_bytes(b"garbage" * 100)
    elif damage == "config":
        (model / "config.json").write_text("{oops")
    elif damage == "no-model-type":
        (model / "config.json").write_text("{}")
    elif damage == "no-weights":
        weights.unlink()
    else:
        (model / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": "model-2.safetensors"}}))
    with pytest.raises(ModelResolutionError) as info:
        resolve_model(str(model))
    message = _one_line(info)
    assert str(model) in message and "re-save or re-copy" in message


def test_a_checkpoint_resolves_through_the_converter(tiny_model_dir, tmp_path):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    assert resolve_model(str(run), checkpoint_to_hf=lambda p: tiny_model_dir) == tiny_model_dir

    def damaged(path):
        raise ValueError(f"{path}/policy/dcp/__0_0.distcp: checksum mismatch")

    with pytest.raises(ModelResolutionError, match="checksum mismatch"):
        resolve_model(str(run), checkpoint_to_hf=damaged)
    with pytest.raises(ModelResolutionError, match="without config.json"):
        resolve_model(str(run), checkpoint_to_hf=lambda p: None)

    def read_only(path):
        raise PermissionError(13, "Permission denied", str(path / "hf"))

    with pytest.raises(ModelResolutionError, match="Permission denied.*rl-checkpoint dcp-to-hf"):
        resolve_model(str(run), checkpoint_to_hf=read_only)
