"""`rl distill` and `rl xtoken-distill` end to end from their packaged recipes (CPU, tiny models): each
runs, lowers the held-out student-teacher KL, and writes a checkpoint that converts to HF."""

from __future__ import annotations

import json
from pathlib import Path

from safetensors.torch import load_file, save_file

from rl_apps import recipe_path
from rl_apps.cli import main
from rl_apps.commands import distill, xtoken_distill
from rl_core.config import load_config
from rl_core.models import save_tiny_model


def run_recipe(module, recipe: str, out: Path, *overrides: str) -> list[dict]:
    """Load a packaged recipe with overrides, run it in-process, return its metrics.jsonl records."""
    cfg = load_config(module.CONFIG_CLASS, recipe_path(recipe), [f"output_dir={out}", *overrides])
    assert module.run(cfg) == 0
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def sharp_teacher(path: Path, **kwargs) -> str:
    """A tiny Qwen2 with a scaled-up output layer: a peaked teacher worth distilling."""
    save_tiny_model(path, family="qwen2", seed=0, **kwargs)  # seed 0: the student's tokenizer
    weights = load_file(str(path / "model.safetensors"))
    weights["lm_head.weight"] = weights["lm_head.weight"] * 40.0
    save_file(weights, str(path / "model.safetensors"), metadata={"format": "pt"})
    return str(path)


def converts_to_hf(out: Path, step: int, target: Path) -> bool:
    from rl_checkpoint import to_hf

    to_hf(out / "checkpoints" / f"step_{step:06d}" / "policy", target)
    return bool(list(target.glob("*.safetensors"))) and (target / "config.json").is_file()


def test_distill_recipe_lowers_held_out_kl(tmp_path):
    out = tmp_path / "run"
    teacher = sharp_teacher(tmp_path / "teacher")
    metrics = run_recipe(distill, "distill_tiny.yaml", out, f"teacher.model={teacher}", "distill.max_steps=4",
                         "distill.val_every=4", "distill.max_new_tokens=8", "policy.optimizer.lr=5e-3")
    val = [m for m in metrics if "val/distill_kl" in m]
    assert [m["step"] for m in val] == [0, 4]
    assert val[-1]["val/distill_kl"] < 0.9 * val[0]["val/distill_kl"]
    assert converts_to_hf(out, 4, tmp_path / "converted")


def test_distill_refuses_a_teacher_with_another_tokenizer(tmp_path, capsys):
    teacher = save_tiny_model(tmp_path / "teacher", family="qwen2", tokenizer_variant="char")
    code = main(["distill", "--config", recipe_path("distill_tiny.yaml"), f"output_dir={tmp_path / 'run'}",
                 f"teacher.model={teacher}"])
    assert code == 2
    assert "rl xtoken-distill" in capsys.readouterr().err


def test_xtoken_recipe_with_a_character_level_teacher(tmp_path):
    out = tmp_path / "run"
    teacher = sharp_teacher(tmp_path / "teacher", tokenizer_variant="char")
    metrics = run_recipe(xtoken_distill, "xtoken_tiny.yaml", out, f"teacher.model={teacher}", "xtoken.max_steps=4",
                         "xtoken.val_every=4", "xtoken.loss.ce_coef=0.0",
                         "policy.optimizer.lr=1e-2")
    val = [m for m in metrics if "val/xtoken_kl" in m]
    assert [m["step"] for m in val] == [0, 4]
    assert val[-1]["val/xtoken_kl"] < 0.9 * val[0]["val/xtoken_kl"]
    assert converts_to_hf(out, 4, tmp_path / "converted")
