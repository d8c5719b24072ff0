"""`rl grpo` on the smoke recipe with the Megatron backend generating on its own model
(``policy.backend=megatron generation.backend=megatron``): three steps train, and the generation
logprobs agree with the trainer's (fp32) as the native engine's do; config errors exit 2."""

from __future__ import annotations

import os

import pytest

from rl_apps import recipe_path
from rl_apps.cli import main
from rl_core.logging import read_jsonl_metrics

pytest.importorskip("megatron.core")

SMOKE = recipe_path("grpo_smoke_tiny.yaml")
MEGATRON = ["policy.backend=megatron", "generation.backend=megatron"]


def test_grpo_smoke_recipe_generates_on_megatron(tmp_path_factory):
    out = tmp_path_factory.mktemp("grpo-megatron")
    os.environ.setdefault("RL_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "rl-cache"))
    code = main(["grpo", "--config", SMOKE, *MEGATRON, f"output_dir={out}", "grpo.max_steps=3", "grpo.val_every=3",
                 "grpo.prev_logprobs=recompute", "logger.progress_bar=false"])
    assert code == 0
    records = read_jsonl_metrics(out / "metrics.jsonl")
    train = [r for r in records if "train/skipped" in r]
    assert [r["step"] for r in train] == [1, 2, 3]
    trained = [r for r in train if r["train/skipped"] == 0.0]
    assert trained, "no step had a learning signal"
    for r in trained:
        assert r["train/mismatch/gen_kl_error"] < 1e-6
        assert abs(r["train/mismatch/token_mult_prob_error"] - 1.0) < 1e-5
        assert r["train/generated_tokens"] > 0 and r["train/grad_norm"] > 0
    assert [r["step"] for r in records if "val/reward_mean" in r] == [0, 3]


@pytest.mark.parametrize(("overrides", "message"), [
    (["generation.backend=megatron"], "generation.backend=megatron decodes on the Megatron training workers: set "
                                      "policy.backend=megatron"),
    ([*MEGATRON, "generation.dtype=bfloat16"], "generation.dtype='bfloat16' differs from policy.dtype='float32'"),
])
def test_megatron_generation_config_errors(tmp_path, capsys, overrides, message):
    assert main(["grpo", "--config", SMOKE, *overrides, f"output_dir={tmp_path / 'run'}"]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
