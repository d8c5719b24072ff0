"""GRPO logs a speculative native engine's acceptance metrics with each step's rollout metrics."""

from __future__ import annotations

from rl_algorithms.grpo import GRPOConfig, PromptStream
from rl_algorithms.grpo.rollouts import generate_rollouts
from rl_environments import ArithmeticDatasetConfig, ArithmeticEnvironment


def test_rollout_metrics_carry_the_speculative_metrics(tiny_model_dir, tokenizer):
    from rl_backends_gen.config import SpeculativeConfig
    from rl_backends_gen.native import NativeEngine

    engine = NativeEngine(tiny_model_dir, max_batch_size=8, max_seq_len=256, seed=0,
                          speculative=SpeculativeConfig(method="draft", num_tokens=2, draft_model="policy_layers:1"))
    cfg = GRPOConfig(batch_size=2, num_generations_per_prompt=2, max_new_tokens=8)
    prompts = PromptStream(ArithmeticDatasetConfig().build("train", 4), seed=0)
    _, metrics = generate_rollouts(cfg, engine, tokenizer, prompts, ArithmeticEnvironment(), step=0, seed=0)
    assert metrics["speculative/proposed_tokens"] > 0
    assert 0 <= metrics["speculative/acceptance_rate"] <= 1
    assert 0 < metrics["speculative/draft_time_share"] < 1
    assert engine.speculative.pop_metrics()["proposed_tokens"] == 0  # the step popped them
