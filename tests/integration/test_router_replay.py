"""MoE router replay end to end, in bfloat16 on the tiny Qwen3-MoE: the native engine records the
experts of real multi-turn rollouts and ``episodes_to_batch`` carries them; the DTensor trainer replays
them; generation/training agreement (``token_mult_prob_error``) with and without replay. The numbers
are the ones docs/models.md shows."""

from __future__ import annotations

import shutil

import pytest
import torch

from rl_algorithms.distill import completions_to_batch
from rl_algorithms.losses.importance_sampling import mismatch_metrics
from rl_algorithms.rollout import episodes_to_batch, run_rollouts
from rl_backends_gen.native import NativeEngine
from rl_backends_train import build_training_backend
from rl_backends_train.config import TrainBackendConfig
from rl_core.models import save_tiny_model
from rl_core.models.moe import NOT_RECORDED
from rl_core.types import SamplingParams
from rl_environments import SlidingPuzzleDatasetConfig, SlidingPuzzleEnvironment


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory) -> str:
    """The tiny Qwen3-MoE with Qwen3-MoE's routing shape: 64 experts, 8 per token (the real model: 128 and
    8), whose close top-k choices bfloat16 rounding flips on some tokens (with 4 experts, 2 per token it
    hardly ever does)."""
    return str(save_tiny_model(tmp_path_factory.mktemp("moe64"), family="qwen3_moe", num_experts=64,
                               num_experts_per_tok=8, moe_intermediate_size=16))


@pytest.fixture(scope="module")
def bf16_engine(moe_dir):
    return NativeEngine(moe_dir, dtype="bfloat16", max_batch_size=16, max_seq_len=512, record_routing=True)


def test_multi_turn_rollouts_carry_the_routing_of_every_token_the_engine_ran(bf16_engine, moe_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(moe_dir)
    samples = SlidingPuzzleDatasetConfig(scramble_moves=6).build("train", 2)
    episodes = run_rollouts(bf16_engine, tokenizer, samples, SlidingPuzzleEnvironment(),
                            SamplingParams(max_new_tokens=8, temperature=1.0, seed=3), num_generations_per_prompt=2,
                            max_turns=2)
    batch = episodes_to_batch(episodes, pad_token_id=tokenizer.pad_token_id)
    routing = batch["routed_experts"]
    assert routing.dtype == torch.int16 and routing.shape == (*batch["input_ids"].shape, 2, 8)
    # every token but the last of each episode (its final turn's prompt covered the earlier turns)
    recorded = (routing[..., 0, 0] != NOT_RECORDED).sum(1)
    assert torch.equal(recorded, batch["attention_mask"].sum(1) - 1) and batch["num_turns"].min() == 2


def test_replay_brings_bf16_training_logprobs_closer_to_generation(bf16_engine, moe_dir, tmp_path):
    """16 sampled completions of random prompts (~1300 token-layers routed), as on-policy distillation batches
    them: bfloat16 rounding flips a router's top-k between generation and training on a few; replay removes
    those differences."""
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(4, 400, (n,), generator=g).tolist() for n in (5, 11, 17, 8, 23, 9, 14, 6)]
    samples = SamplingParams(max_new_tokens=32, temperature=1.0, n=2, seed=3)
    completions = [c for group in bf16_engine.generate(prompts, samples) for c in group]
    batch = completions_to_batch(completions, pad_token_id=0)  # on-policy distillation's batch of the samples
    assert batch["routed_experts"].shape[:2] == batch["input_ids"].shape

    # Same weights: where the engine's and the trainer's bfloat16 kernels differ (CPUs with avx512_bf16 / AMX),
    # rounding flips a few top-k choices and replay removes them; where they compute the router alike (e.g. an
    # AMD EPYC without bf16 instructions) the two agree exactly. Replay must never make it worse.
    errors = errors_with_and_without_replay(moe_dir, batch)
    assert errors[True]["token_mult_prob_error"] <= errors[False]["token_mult_prob_error"]
    assert errors[True]["gen_kl_error"] <= errors[False]["gen_kl_error"]
    # A trainer whose router drifted from the generator's (its gate weights nudged by 5% of their spread: what a
    # stale or differently rounded router does on any hardware) picks other experts on some tokens; replaying
    # the generator's choices brings its logprobs back towards generation.
    errors = errors_with_and_without_replay(nudged_router_copy(moe_dir, tmp_path), batch)
    assert errors[True]["token_mult_prob_error"] < errors[False]["token_mult_prob_error"]
    assert errors[True]["gen_kl_error"] < errors[False]["gen_kl_error"]


def errors_with_and_without_replay(model_dir: str, batch: dict) -> dict[bool, dict[str, float]]:
    errors = {}
    for replay in (False, True):
        cfg = TrainBackendConfig(use_ray=False, reference_model=False, dtype="bfloat16",
                                 moe={"router_replay": replay})
        with build_training_backend(cfg, model_dir) as policy:
            logprobs = policy.logprobs(batch)
        errors[replay] = mismatch_metrics(logprobs, batch["gen_logprobs"], batch["loss_mask"])
    print({replay: {k: f"{v:.3e}" if 'kl' in k else round(v, 8) for k, v in m.items()} for replay, m in errors.items()})
    return errors


def nudged_router_copy(model_dir: str, tmp_path) -> str:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        gates = [p for name, p in model.named_parameters() if name.endswith("mlp.gate.weight")]
        assert gates
        for p in gates:
            p.add_(torch.randn(p.shape, generator=g) * 0.05 * p.std())
    out = tmp_path / "nudged"
    shutil.copytree(model_dir, out)
    model.save_pretrained(out)
    return str(out)


def test_grpo_refuses_replay_without_the_engines_record(rl, tmp_path):
    result = rl("grpo", "--config", "grpo_smoke_tiny", f"output_dir={tmp_path}/run", "policy.moe.router_replay=true")
    assert result.code == 2 and not (tmp_path / "run").exists()
    [line] = result.error_lines("grpo")
    assert "policy.moe.router_replay=true replays the experts the generation engine records: set " \
           "generation.record_routing=true" in line


def test_commands_that_generate_nothing_refuse_replay(rl, tmp_path):
    result = rl("sft", "--config", "sft_tiny", f"output_dir={tmp_path}/run", "policy.moe.router_replay=true")
    assert result.code == 2 and not (tmp_path / "run").exists()
    [line] = result.error_lines("sft")
    assert "the sft loop generates nothing: set policy.moe.router_replay=false" in line
