"""`rl grpo` on every model family (tiny random models of ``rl_core.models.tiny.FAMILIES``): 3 steps of
the smoke recipe with the native engine and the DTensor trainer in float32, refit after each step, and
the engine's logprobs equal to the trainer's (``mismatch/token_mult_prob_error``) at every step, so on
weights refitted twice. MoE families run with router replay on (the engine records, the trainer
replays)."""

from __future__ import annotations

import pytest

from rl_core.logging import read_jsonl_metrics
from rl_core.models.tiny import FAMILIES

MOE = {"mixtral", "qwen3_moe", "qwen3_5_moe_text", "glm4_moe_lite", "nemotron_h", "gpt_oss"}
SHORT = ("grpo.max_steps=3", "grpo.val_every=0", "grpo.batch_size=2", "grpo.num_generations_per_prompt=4",
         "grpo.max_new_tokens=8", "grpo.log_samples=0", "grpo.prev_logprobs=recompute",
         "checkpointing.save_at_end=false", "logger.progress_bar=false")
REPLAY = ("generation.record_routing=true", "policy.moe.router_replay=true")


@pytest.mark.parametrize("family", FAMILIES)
def test_three_grpo_steps_refit_and_agree(family, rl, tiny_family_dir, tmp_path):
    out = tmp_path / "run"
    result = rl("grpo", "--config", "grpo_smoke_tiny", f"model={tiny_family_dir(family)}", f"output_dir={out}",
                *SHORT, *(REPLAY if family in MOE else ()))
    assert result.code == 0, result.err[-2000:]
    train = [r for r in read_jsonl_metrics(out / "metrics.jsonl") if "train/skipped" in r]
    assert [r["step"] for r in train] == [1, 2, 3]
    assert any(r["train/skipped"] == 0.0 for r in train[:2]), "no step before the last trained"
    for r in train:
        assert r["train/mismatch/token_mult_prob_error"] == pytest.approx(1.0, abs=1e-5), (family, r["step"])
        assert r["train/mismatch/token_mult_prob_error_max"] < 1 + 1e-4, (family, r["step"])


@pytest.mark.parametrize("command,config", [("grpo", "grpo_smoke_tiny"), ("distill", "distill_tiny")])
def test_vllm_refit_of_a_moe_model_is_refused_before_anything_is_written(command, config, rl, tiny_family_dir,
                                                                          tmp_path):
    """A MoE family whose expert names ``rl_backends_gen.moe_names`` does not translate for vLLM (gpt_oss)
    would be refit with wrong weights: the run is refused up front, exit 2, one line naming the key."""
    out = tmp_path / "run"
    model = f"teacher.model={tiny_family_dir('gpt_oss')}" if command == "distill" else None
    result = rl(command, "--config", config, f"model={tiny_family_dir('gpt_oss')}", f"output_dir={out}",
                "generation.backend=vllm", *([model] if model else ()))
    assert result.code == 2, result.err[-2000:]
    [line] = result.error_lines(command)
    assert "generation.backend" in line and "gpt_oss is a mixture-of-experts model (4 experts)" in line
    assert "use generation.backend=native" in line
    assert not out.exists()
