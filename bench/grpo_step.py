"""grpo-step: wall time of one GRPO step, ours (`rl grpo`) vs TRL's GRPOTrainer, same run.

    python bench/grpo_step.py                 # the main job's settings at 8 prompts a step, 3 timed steps each
    python bench/grpo_step.py --prompts 16    # the recipe's 16 prompts a step (since 2026-12-06)
    python bench/grpo_step.py --steps 2 --prompts 4

Both sides get the same model (SmolLM2-135M-Instruct, fp32, CPU), the same arithmetic prompts and
the same reward (both taken from the main recipe, grpo_arithmetic_smollm2.yaml), the same
number of prompts x generations per step, max new tokens, temperature, learning rate, clip epsilons
(0.2 / 0.28), no KL term (the main recipe's is turned off) and one optimizer step per batch (so neither computes pi_old separately).
A step is everything: generate, score, logprobs, train, and (ours) the refit into the engine.
The first step of each side is a warm-up and not counted; the median of the rest is compared.
Sampling makes completion lengths differ between the two sides: both are printed next to the times,
with the time per generated token. Needs `pip install trl` (the bench nox session installs it).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def ours(args, out_dir: Path) -> list[dict[str, float]]:
    """Run `rl grpo` on the default recipe for ``args.steps + 1`` steps; per-step times from its JSONL."""
    from rl_apps import recipe_path
    from rl_apps.commands import grpo
    from rl_core.config import load_config
    from rl_core.logging import read_jsonl_metrics

    overrides = [
        f"output_dir={out_dir}", f"grpo.max_steps={args.steps + 1}", "grpo.val_every=0", "checkpointing.enabled=false",
        f"grpo.batch_size={args.prompts}", f"grpo.num_generations_per_prompt={args.generations}",
        f"grpo.max_new_tokens={args.new_tokens}", f"grpo.temperature={args.temperature}",
        f"policy.optimizer.lr={args.lr}", "logger.tensorboard=false", "grpo.skip_steps_without_signal=false",
        "loss.kl_coef=0.0",  # the recipe's KL term adds a reference forward; TRL's side runs without one
    ]
    cfg = load_config(grpo.CONFIG_CLASS, recipe_path("grpo_arithmetic_smollm2.yaml"), overrides)
    grpo.run(cfg)
    steps = [r for r in read_jsonl_metrics(out_dir / "metrics.jsonl") if "train/time/total" in r]
    return [{"seconds": r["train/time/total"], "completion_tokens": r["train/generated_tokens"],
             "generate": r["train/time/generate"], "train": r["train/time/train"]} for r in steps]


def trl_run(args, out_dir: Path) -> list[dict[str, float]]:
    """TRL's GRPOTrainer on CPU with the same settings; per-step wall times from a callback."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from rl_apps import recipe_path
    from rl_apps.commands import grpo
    from rl_core.config import load_config
    from rl_core.models import resolve_model

    recipe = load_config(grpo.CONFIG_CLASS, recipe_path("grpo_arithmetic_smollm2.yaml"), [])
    model_path = resolve_model(recipe.model)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    samples = recipe.data.build("train")  # the recipe's prompts and reward, as on our side
    rows = [{"prompt": s.messages, "answer": s.metadata["answer"]} for s in samples[: args.prompts * (args.steps + 2)]]
    env = grpo.build_env(recipe.env, "env")

    def reward(prompts, completions, answer, **_):
        return [env.step([{"role": "assistant", "content": c[-1]["content"]}], {"answer": a}, None).reward
                for c, a in zip(completions, answer)]

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.times: list[float] = []
            self.start = 0.0

        def on_step_begin(self, *_, **__):
            self.start = time.perf_counter()

        def on_step_end(self, *_, **__):
            self.times.append(time.perf_counter() - self.start)

    batch = args.prompts * args.generations
    config = GRPOConfig(
        output_dir=str(out_dir), use_cpu=True, bf16=False, fp16=False, seed=0, report_to=[], save_strategy="no",
        logging_steps=1, max_steps=args.steps + 1, per_device_train_batch_size=batch, gradient_accumulation_steps=1,
        num_generations=args.generations, max_completion_length=args.new_tokens, temperature=args.temperature,
        learning_rate=args.lr, beta=0.0, epsilon=0.2, epsilon_high=0.28, num_iterations=1, loss_type="dapo",
        lr_scheduler_type="constant", weight_decay=0.0, max_grad_norm=1.0, dataloader_num_workers=0,
        shuffle_dataset=False, disable_dropout=True,
    )
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    timer = StepTimer()
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=config, train_dataset=Dataset.from_list(rows),
                          processing_class=tokenizer, callbacks=[timer])
    trainer.train()
    lengths = [r["completions/mean_length"] for r in trainer.state.log_history if "completions/mean_length" in r]
    return [{"seconds": t, "completion_tokens": n * batch} for t, n in zip(timer.times, lengths)]


def summarize(name: str, steps: list[dict[str, float]]) -> tuple[float, float]:
    timed = steps[1:] or steps  # step 1 warms up allocators and caches
    median = statistics.median(s["seconds"] for s in timed)
    tokens = statistics.mean(s["completion_tokens"] for s in timed)
    per_token = statistics.mean(s["seconds"] / max(s["completion_tokens"], 1) for s in timed)
    runs = " ".join(f"{s['seconds']:.1f}" for s in steps)
    print(f"{name:>5}  median step {median:7.1f} s   completion tokens/step {tokens:7.0f}   "
          f"s per completion token {per_token:.4f}   steps (s): {runs}", flush=True)
    return median, per_token


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=3, help="timed steps per side (after one warm-up step)")
    parser.add_argument("--prompts", type=int, default=8, help="prompts a step (docs/benchmarks.md measured 8; the recipe has 16)")
    parser.add_argument("--generations", type=int, default=6)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--lr", type=float, default=3e-5)
    args = parser.parse_args()
    try:
        import trl  # noqa: F401
    except ImportError:
        print("grpo-step needs TRL as the peer: pip install trl", file=sys.stderr)
        return 2
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    print(f"# grpo-step  SmolLM2-135M fp32  {args.prompts} prompts x {args.generations} generations  "
          f"max_new_tokens={args.new_tokens}  torch threads={torch.get_num_threads()}  cores={os.cpu_count()}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        ours_steps = ours(args, Path(tmp) / "ours")
        trl_steps = trl_run(args, Path(tmp) / "trl")
    our_median, our_per_token = summarize("ours", ours_steps)
    trl_median, trl_per_token = summarize("trl", trl_steps)
    print(f"ratio ours/TRL: step time {our_median / trl_median:.2f}x   per completion token "
          f"{our_per_token / trl_per_token:.2f}x   (target <= 0.5x)")
    print(f"# load average at end={os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
