"""`rl grpo` with FP8 generation (the native engine, `generation.quantization: fp8`) and training in
higher precision (fp32, or bf16 with fp32 masters), the importance-sampling correction on: the mismatch FP8 creates is
reported every step and stays within NeMo RL's bound for FP8-class rollouts."""

from __future__ import annotations

import os

import pytest

from rl_apps import recipe_path
from rl_apps.cli import main
from rl_core.logging import read_jsonl_metrics

GEN_KL_BOUND = 0.05  # NeMo RL's published bound for FP8-class rollouts


@pytest.mark.parametrize(("scheme", "train_dtype"), [("per_channel", "float32"), ("block", "bfloat16")])
def test_grpo_with_fp8_generation_reports_and_corrects_the_mismatch(scheme, train_dtype, tmp_path, tmp_path_factory):
    os.environ.setdefault("RL_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "rl-cache"))
    code = main(["grpo", "--config", str(recipe_path("grpo_smoke_tiny.yaml")), f"output_dir={tmp_path / 'run'}",
                 "grpo.max_steps=2", "grpo.val_every=0", "logger.progress_bar=false",
                 f"policy.dtype={train_dtype}", "generation.quantization=fp8", f"generation.fp8_scheme={scheme}",
                 "loss.importance_sampling={level: token, truncation: clamp, weight_max: 2.0}"])
    assert code == 0
    train = [r for r in read_jsonl_metrics(tmp_path / "run" / "metrics.jsonl") if "train/gen_kl_error" in r]
    assert [r["step"] for r in train] == [1, 2]  # step 2 generates with weights re-quantized at the refit
    for r in train:
        # Without FP8 the same run reports gen_kl_error < 1e-6 and token_mult_prob_error 1 +- 1e-5
        # (tests/integration/test_grpo_smoke.py): here the rounding shows, within the bound.
        assert 1e-6 < r["train/gen_kl_error"] < GEN_KL_BOUND  # measured 6e-6 to 1.1e-5 (a near-uniform tiny model)
        assert 1.0 + 1e-4 < r["train/token_mult_prob_error"] < 1.5
        assert "train/is_weight_mean" in r and abs(r["train/is_weight_mean"] - 1.0) < 0.05
