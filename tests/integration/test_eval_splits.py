"""`rl eval` on a named split of the main job's data, with its validation grader (docs/learning.md)."""

from __future__ import annotations

import json
import os

import pytest

from rl_apps import recipe_path
from rl_apps.cli import main
from rl_apps.commands import eval as eval_cmd
from rl_apps.commands.grpo import GRPORunConfig
from rl_core.config import load_config

EVAL = recipe_path("eval_arithmetic_smollm2.yaml")
MAIN = recipe_path("grpo_arithmetic_smollm2.yaml")


@pytest.mark.parametrize("split", ["test", "validation"])
def test_eval_recipe_gives_the_main_jobs_prompts_of_a_split(split):
    grpo = load_config(GRPORunConfig, MAIN, [])
    cfg = load_config(eval_cmd.CONFIG_CLASS, EVAL, [f"datasets.0.data.split={split}"])
    dataset = cfg.datasets[0]
    ours = dataset.data.build()
    theirs = grpo.data.build(split, len(ours))
    assert len(ours) == 256
    assert [s.messages for s in ours] == [s.messages for s in theirs]
    assert [s.metadata["answer"] for s in ours] == [s.metadata["answer"] for s in theirs]
    grader = dataset.grader_config()
    assert (grader.name, grader.kwargs) == (grpo.val_env.name, grpo.val_env.kwargs)
    assert cfg.sampling.temperature == 0.0 and cfg.sampling.max_new_tokens == grpo.grpo.max_new_tokens


def test_eval_runs_a_named_split_on_a_tiny_model(tmp_path, tmp_path_factory):
    os.environ.setdefault("RL_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "rl-cache"))
    report = tmp_path / "report.json"
    code = main(["eval", "--config", EVAL, "model=tiny-llama", "datasets.0.data.split=validation",
                 "datasets.0.data.size=3", "sampling.max_new_tokens=4", "progress=false", f"report_path={report}"])
    assert code == 0
    result = json.loads(report.read_text())["results"][0]
    assert result["dataset"] == "arithmetic-main-job" and result["num_items"] == 3
    assert main(["eval", "--config", EVAL, "datasets.0.data.split=holdout", "--print-config"]) == 2
