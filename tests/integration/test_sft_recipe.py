"""`rl sft` end to end from its packaged recipes on the tiny Llama (CPU): the loss falls, the checkpoint
converts to HF, and under LoRA only the adapted weights change."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rl_apps import recipe_path
from rl_apps.cli import main
from rl_apps.commands import sft
from rl_core.config import load_config
from rl_core.models import resolve_model


def load_hf_weights(folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor of an HF directory (one file or shards)."""
    tensors = {}
    for path in sorted(folder.glob("*.safetensors")):
        tensors.update(load_file(str(path)))
    return tensors


def metrics_of(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def run_recipe(module, recipe: str, out: Path, *overrides: str) -> list[dict]:
    cfg = load_config(module.CONFIG_CLASS, recipe_path(recipe), [f"output_dir={out}", *overrides])
    assert module.run(cfg) == 0
    return metrics_of(out)


def test_sft_recipe_loss_falls_and_checkpoint_converts_to_hf(tmp_path):
    from rl_checkpoint import to_hf

    out = tmp_path / "run"
    metrics = run_recipe(sft, "sft_tiny.yaml", out, "sft.max_steps=12", "sft.val_every=12")
    losses = [m["train/loss"] for m in metrics if "train/loss" in m]
    assert len(losses) == 12 and losses[-1] < 0.6 * losses[0]
    val = [m["val/nll"] for m in metrics if "val/nll" in m]
    assert len(val) == 2 and val[-1] < val[0]

    checkpoint = out / "checkpoints" / "step_000012" / "policy"
    assert checkpoint.is_dir()
    to_hf(checkpoint, tmp_path / "converted")
    converted = load_hf_weights(tmp_path / "converted")
    exported = load_hf_weights(out / "hf")
    assert converted.keys() == exported.keys()
    for name, tensor in exported.items():
        assert torch.equal(converted[name], tensor), name


def test_sft_lora_recipe_changes_only_adapted_weights(tmp_path):
    out = tmp_path / "run"
    metrics = run_recipe(sft, "sft_tiny_lora.yaml", out, "sft.max_steps=6", "sft.val_every=0")
    losses = [m["train/loss"] for m in metrics if "train/loss" in m]
    assert losses[-1] < losses[0]

    base = load_file(str(Path(resolve_model("tiny-llama")) / "model.safetensors"))
    merged = load_hf_weights(out / "hf")
    adapted = ("q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight", "gate_proj.weight",
               "up_proj.weight", "down_proj.weight")
    changed = {name for name in base if not torch.equal(base[name], merged[name])}
    assert changed == {name for name in base if name.endswith(adapted)}
    adapter = load_file(str(out / "adapter" / "adapter_model.safetensors"))
    assert adapter and all("lora_A" in name or "lora_B" in name for name in adapter)
    assert (out / "adapter" / "adapter_config.json").is_file()


@pytest.mark.parametrize("bad_line", [b'{"prompt": "hi"}', b'{"prompt": "caf\xe9", "response": "x"}'])
def test_sft_bad_row_stops_with_file_and_line(tmp_path, capsys, bad_line):
    data = tmp_path / "train.jsonl"
    data.write_bytes(b'{"prompt": "1 + 1?", "response": "2"}\n' + bad_line + b"\n")
    code = main(["sft", "--config", recipe_path("sft_tiny.yaml"), f"output_dir={tmp_path / 'run'}",
                 "synthetic_data=null", f"data.train_path={data}"])
    assert code == 2
    assert f"{data}, line 2: " in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
