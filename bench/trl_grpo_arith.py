"""trl-grpo-arith: TRL's GRPOTrainer on an `rl grpo` recipe's task, for the learning curves of docs/learning.md.

    python bench/trl_grpo_arith.py --out runs/learning/main/trl-s0 --seed 0 grpo.max_steps=70
    python bench/trl_grpo_arith.py --recipe grpo_arithmetic3_smollm2.yaml --out runs/learning/arith3/trl-s0

The recipe (default: the main job, grpo_arithmetic_smollm2.yaml, with the dotted overrides given) sets both
sides: the model (fp32, CPU), the training prompts, the reward (the recipe's ``env``: the same environment
code), prompts x generations per step, temperature, top-p, max new tokens, learning rate, AdamW settings,
gradient clipping, clip epsilons, one optimizer step per batch, the loss reduction (token: TRL's ``dapo``,
sequence: ``grpo``, constant: ``dr_grpo``), the std normalisation of the group advantages, the KL term to the
initial model (``loss.kl_coef``: TRL's ``beta``, both the k3 estimator added to each token's loss; TRL's
bias correction of the KL, a factor that is 1 but carries a gradient, is turned off so the gradient is ours)
and the lr schedule (``policy.scheduler``: the trainer's scheduler is rl-backends-train's own warmup / cosine,
counted in optimizer steps; TRL steps on every batch, where `rl grpo` skips a batch without signal and its
schedule with it, which with a KL term never happens). Our KL clamps the log ratio to +-20 and each token's
estimate to 10, TRL's does not: the two differ only for tokens that far from the reference.
Held-out accuracy is measured as `rl grpo` measures it: greedy answers to the recipe's validation prompts
(``grpo.val_num_prompts``, the same prompts), graded by ``val_env`` and counted by rl-eval's rule (the
``correct`` component >= 0.5), before the first step and every ``grpo.val_every`` steps; after the last step
the test split (``grpo.test_num_prompts``) likewise. Greedy answers come from HF ``generate`` on the model
being trained; that evaluation is timed apart (``train/time/validate``) and left out of the wall time the
report compares, as on our side. TRL samples its own prompt order (its seeded shuffle).

Writes ``<out>/metrics.jsonl`` in `rl grpo`'s format (``train/*`` per step with ``train/time/total``,
``val/*``, ``test/*``), ``metrics.png`` and ``trl_config.json``. ``grpo.max_minutes`` ends the run as it ends
`rl grpo`'s: after the step at which the training time (validation left out) reaches the budget. Needs ``pip install trl`` (the ``bench``
extra of rl-apps).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

REDUCTION_TO_TRL = {"token": "dapo", "sequence": "grpo", "constant": "dr_grpo"}
EVAL_BATCH = 32


def load_recipe(recipe: str, overrides: list[str]):
    from rl_apps import recipe_path
    from rl_apps.commands.grpo import GRPORunConfig
    from rl_core.config import load_config

    path = recipe if Path(recipe).is_file() else recipe_path(recipe)
    return load_config(GRPORunConfig, path, overrides)


def unsupported(cfg) -> list[str]:
    """Settings of the recipe this TRL mirror does not reproduce (it refuses them rather than differ)."""
    checks = {
        "loss.kind=gspo": cfg.loss.kind != "clipped_pg", "loss.objective": cfg.loss.objective != "clipped",
        "loss.kl_estimator (TRL's is k3)": cfg.loss.kl_coef > 0 and cfg.loss.kl_estimator != "k3",
        "loss.kl_in_reward": cfg.loss.kl_in_reward, "loss.positive_nll_coef": cfg.loss.positive_nll_coef > 0,
        "loss.importance_sampling": cfg.loss.importance_sampling is not None,
        "loss.dual_clip": cfg.loss.dual_clip is not None,
        "grpo.advantage (only estimator=grpo, baseline=mean, no clipping)": (
            cfg.grpo.advantage.estimator != "grpo" or cfg.grpo.advantage.baseline != "mean"
            or cfg.grpo.advantage.clip_low is not None or cfg.grpo.advantage.clip_high is not None),
        "grpo.dapo.*": cfg.grpo.dapo.dynamic_sampling or cfg.grpo.dapo.overlong_buffer_length is not None
        or cfg.grpo.dapo.overlong_filtering,
        "grpo.num_epochs / num_minibatches": not cfg.grpo.single_update, "grpo.max_turns": cfg.grpo.max_turns != 1,
        "policy.lora": cfg.policy.lora is not None, "policy.optimizer.name": cfg.policy.optimizer.name != "adamw",
    }
    return [name for name, bad in checks.items() if bad]


def trl_config(cfg, out: Path, seed: int):
    """TRL's GRPOConfig mirroring the recipe."""
    from trl import GRPOConfig

    grpo, opt = cfg.grpo, cfg.policy.optimizer
    return GRPOConfig(
        output_dir=str(out / "trl"), use_cpu=True, bf16=False, fp16=False, seed=seed, report_to=[],
        save_strategy="no", logging_steps=1, max_steps=grpo.max_steps, gradient_accumulation_steps=1,
        per_device_train_batch_size=grpo.batch_size * grpo.num_generations_per_prompt,
        num_generations=grpo.num_generations_per_prompt, max_completion_length=grpo.max_new_tokens,
        temperature=grpo.temperature, top_p=grpo.top_p, top_k=grpo.top_k, learning_rate=opt.lr,
        adam_beta1=opt.betas[0], adam_beta2=opt.betas[1], adam_epsilon=opt.eps, weight_decay=opt.weight_decay,
        max_grad_norm=cfg.policy.max_grad_norm or 0.0, lr_scheduler_type="constant", beta=cfg.loss.kl_coef,
        use_bias_correction_kl=False,
        epsilon=cfg.loss.ratio_clip_low, epsilon_high=cfg.loss.ratio_clip_high, num_iterations=1,
        loss_type=REDUCTION_TO_TRL[cfg.loss.reduction],
        scale_rewards="group" if cfg.grpo.advantage.normalize_std else "none",
        dataloader_num_workers=0, disable_dropout=True,
    )


class Grader:
    """The recipe's environments: the training reward for TRL, and held-out accuracy as rl-eval counts it."""

    def __init__(self, cfg):
        from rl_apps.commands.grpo import build_env

        self.env = build_env(cfg.env, "env")
        self.val_env = build_env(cfg.val_env, "val_env") if cfg.val_env is not None else self.env
        self.step_components: list[dict[str, float]] = []

    def reward(self, prompts, completions, answer, **_) -> list[float]:
        """TRL's reward function: the recipe's ``env`` reward of each completion (components kept for logging)."""
        results = [self.env.step([{"role": "assistant", "content": c[-1]["content"]}], {"answer": a}, None)
                   for c, a in zip(completions, answer)]
        self.step_components += [r.reward_components for r in results]
        return [r.reward for r in results]

    def pop_train_metrics(self) -> dict[str, float]:
        parts, self.step_components = self.step_components, []
        if not parts:
            return {}
        out = {f"reward/{k}": sum(p[k] for p in parts) / len(parts) for k in parts[0]}
        if "reward/correct" in out:
            out["accuracy"] = out["reward/correct"]
        return out

    def held_out(self, model, tokenizer, samples, max_new_tokens: int) -> dict[str, float]:
        """Greedy accuracy (and mean reward, length) on ``samples``."""
        from rl_eval import graded_sample

        correct, rewards, lengths = [], [], []
        was_training = model.training
        model.eval()
        for i in range(0, len(samples), EVAL_BATCH):
            chunk = samples[i:i + EVAL_BATCH]
            texts = [tokenizer.apply_chat_template(s.messages, add_generation_prompt=True, tokenize=False) for s in chunk]
            inputs = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
            with torch.no_grad():
                out = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False,
                                     pad_token_id=tokenizer.pad_token_id)
            for sample, row in zip(chunk, out[:, inputs["input_ids"].shape[1]:]):
                tokens = row[row != tokenizer.pad_token_id]
                text = tokenizer.decode(tokens, skip_special_tokens=True)
                result = self.val_env.step([{"role": "assistant", "content": text}], sample.metadata, None)
                graded = graded_sample(text, result.reward, result.reward_components, len(tokens), "stop")
                correct.append(graded.correct)
                rewards.append(result.reward)
                lengths.append(len(tokens))
        model.train(was_training)
        n = max(len(samples), 1)
        return {"accuracy": sum(correct) / n, "reward_mean": sum(rewards) / n, "response_length_mean": sum(lengths) / n}


def scheduled_trainer_class():
    """GRPOTrainer whose lr scheduler is the recipe's (rl_backends_train.optim.lr_multiplier per optimizer step)."""
    from trl import GRPOTrainer

    from rl_backends_train.optim import lr_multiplier

    class ScheduledGRPOTrainer(GRPOTrainer):
        def __init__(self, schedule, *args, **kwargs):
            self.schedule = schedule
            super().__init__(*args, **kwargs)

        def create_scheduler(self, num_training_steps, optimizer=None):
            if self.lr_scheduler is None:
                self.lr_scheduler = torch.optim.lr_scheduler.LambdaLR(
                    optimizer or self.optimizer, lambda step: lr_multiplier(step, self.schedule))
                self._created_lr_scheduler = True
            return self.lr_scheduler

    return ScheduledGRPOTrainer


def train(cfg, out: Path, seed: int) -> None:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback

    from rl_core.logging import LoggerConfig, MetricsLogger
    from rl_core.models import resolve_model

    grpo = cfg.grpo
    model_path = resolve_model(cfg.model)
    tokenizer = AutoTokenizer.from_pretrained(model_path, padding_side="left")
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    train_rows = [{"prompt": s.messages, "answer": s.metadata["answer"]} for s in cfg.data.build("train")]
    val = cfg.data.build("validation", grpo.val_num_prompts) if grpo.val_every > 0 else []
    test = cfg.data.build("test", grpo.test_num_prompts)
    grader = Grader(cfg)
    ScheduledGRPOTrainer = scheduled_trainer_class()
    config = trl_config(cfg, out, seed)
    record = {**config.to_dict(), "lr_schedule (rl-backends-train's, replaces lr_scheduler_type)": cfg.policy.scheduler.model_dump()}
    (out / "trl_config.json").write_text(json.dumps(record, indent=2, default=str) + "\n")
    logger = MetricsLogger(LoggerConfig(tensorboard=False, progress_bar=False), out, total_steps=grpo.max_steps)

    class Curves(TrainerCallback):
        """Per step: TRL's logs + our reward components + step time; held-out accuracy when due."""

        def __init__(self):
            self.started = 0.0
            self.seconds = 0.0
            self.validate_s = 0.0
            self.trained_s = 0.0  # training time so far, against grpo.max_minutes as on our side
            self.val: dict[str, float] = {}

        def on_train_begin(self, args, state, control, model=None, **_):
            if val:
                logger.log(grader.held_out(model, tokenizer, val, grpo.max_new_tokens), 0, prefix="val")

        def on_step_begin(self, *_, **__):
            self.started = time.perf_counter()

        def on_step_end(self, args, state, control, model=None, **_):
            self.seconds = time.perf_counter() - self.started
            self.trained_s += self.seconds
            step, self.val, self.validate_s = state.global_step, {}, 0.0
            out_of_time = grpo.max_minutes is not None and self.trained_s >= grpo.max_minutes * 60
            if out_of_time:  # the step that spends the budget is the last, as in rl_algorithms.loop
                control.should_training_stop = True
            if val and (step % grpo.val_every == 0 or step == grpo.max_steps or out_of_time):
                start = time.perf_counter()
                self.val = grader.held_out(model, tokenizer, val, grpo.max_new_tokens)
                self.validate_s = time.perf_counter() - start

        def on_log(self, args, state, control, logs=None, **_):
            if not logs or "train_runtime" in logs:  # the trainer's closing summary
                return
            metrics = {k.replace("completions/mean_length", "response_length_mean"): v for k, v in logs.items()
                       if isinstance(v, int | float)}
            metrics.update(grader.pop_train_metrics())
            metrics.update({"reward_mean": logs.get("reward", float("nan")), "time/train": self.seconds,
                            "time/validate": self.validate_s, "time/total": self.seconds + self.validate_s})
            logger.log(metrics, state.global_step, prefix="train")
            if self.val:
                logger.log(self.val, state.global_step, prefix="val")

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    trainer = ScheduledGRPOTrainer(cfg.policy.scheduler, model=model, reward_funcs=grader.reward, args=config,
                                   train_dataset=Dataset.from_list(train_rows), processing_class=tokenizer,
                                   callbacks=[Curves()])
    try:
        trainer.train()
        logger.log(grader.held_out(trainer.model, tokenizer, test, grpo.max_new_tokens), trainer.state.global_step,
                   prefix="test")
    finally:
        logger.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipe", default="grpo_arithmetic_smollm2.yaml", help="an `rl grpo` recipe (name or path)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True, help="output directory (metrics.jsonl, metrics.png, trl_config.json)")
    parser.add_argument("overrides", nargs="*", metavar="key.subkey=value", help="overrides of the recipe")
    args = parser.parse_args(argv)
    try:
        import trl  # noqa: F401
    except ImportError:
        print('trl-grpo-arith needs TRL: pip install "rl-apps[bench]" (or pip install trl)', file=sys.stderr)
        return 2
    from rl_core.config import ConfigError

    try:
        cfg = load_recipe(args.recipe, args.overrides)
    except ConfigError as e:
        print(f"trl-grpo-arith: {e}", file=sys.stderr)
        return 2
    refused = unsupported(cfg)
    if refused:
        print(f"trl-grpo-arith: the recipe sets what this TRL mirror does not reproduce: {', '.join(refused)}",
              file=sys.stderr)
        return 2
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    train(cfg, out, args.seed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
