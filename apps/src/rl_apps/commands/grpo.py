"""`rl grpo`: GRPO (and DAPO, GSPO, GDPO presets) on an environment's prompts.

Wires the concrete pieces: a model resolved by name, the training backend (DTensor by default), the
generation backend (native engine by default), an environment and its dataset splits, a metrics
logger and a checkpoint manager; then calls ``rl_algorithms.grpo.grpo_train``.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from pydantic import Field

from rl_algorithms.checkpointing import CheckpointConfig, CheckpointManager
from rl_algorithms.grpo import GRPOConfig, LossConfig, grpo_train
from rl_apps import recipe_path
from rl_backends_gen import GenerationConfig, build_generation_backend
from rl_backends_train import TrainBackendConfig, build_training_backend
from rl_core.cluster import ClusterConfig
from rl_core.config import ConfigError, ConfigProblem, StrictModel, dump_config
from rl_core.logging import LoggerConfig, MetricsLogger
from rl_core.types import PromptSample, SamplingParams
from rl_environments import ArithmeticDatasetConfig, DatasetConfig, EnvConfig, build_dataset

log = logging.getLogger(__name__)

DEFAULT_RECIPE = recipe_path("grpo_arithmetic_smollm2.yaml")


class GRPORunConfig(StrictModel):
    """The whole `rl grpo` config."""

    seed: int = 0
    """Seeds the driver, the workers, the data order and every generation call."""
    model: str = "smollm2-135m-instruct"
    """A short name (smollm2-135m-instruct, tiny-llama, tiny-qwen2) or a local HF model directory."""
    output_dir: str = "runs/grpo"
    """Metrics (JSONL, TensorBoard, PNG), the resolved config and checkpoints go here."""
    cluster: ClusterConfig = Field(default_factory=ClusterConfig)
    policy: TrainBackendConfig = Field(default_factory=TrainBackendConfig)
    generation: GenerationConfig = Field(default_factory=GenerationConfig)
    grpo: GRPOConfig = Field(default_factory=GRPOConfig)
    loss: LossConfig = Field(default_factory=LossConfig)
    env: EnvConfig = Field(default_factory=EnvConfig)
    """The environment that grades every sample."""
    val_env: EnvConfig | None = None
    """The grader of validation (default: ``env``): e.g. a strict answer format while training uses a
    shaped reward."""
    data: DatasetConfig = Field(default_factory=ArithmeticDatasetConfig)
    """Training prompts (train split) and held-out validation prompts (validation split)."""
    logger: LoggerConfig = Field(default_factory=LoggerConfig)
    checkpointing: CheckpointConfig = Field(default_factory=CheckpointConfig)


CONFIG_CLASS = GRPORunConfig


def run(cfg: GRPORunConfig) -> int:
    """Build everything ``cfg`` names and train. Returns 0."""
    from transformers import AutoTokenizer

    from rl_core.models import resolve_model
    from rl_core.seed import set_seed

    set_seed(cfg.seed)
    # Environments first: a bad kwarg is a config error, reported before anything is written.
    environment = build_env(cfg.env, "env")
    val_environment = build_env(cfg.val_env, "val_env") if cfg.val_env is not None else environment
    model_path = resolve_model(cfg.model)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    train_data = build_dataset(cfg.data, "train")
    val_data = build_dataset(cfg.data, "validation", size=cfg.grpo.val_num_prompts) if cfg.grpo.val_every > 0 else []

    output_dir = Path(cfg.output_dir).absolute()
    output_dir.mkdir(parents=True, exist_ok=True)
    _write_atomically(output_dir / "config.yaml", dump_config(cfg))

    if _needs_ray(cfg):
        from rl_core.cluster import init_ray

        init_ray(cfg.cluster)
    policy_cfg = cfg.policy.model_copy(update={"reference_model": cfg.loss.needs_reference})
    policy = build_training_backend(policy_cfg, model_path, seed=cfg.seed)
    # The KV cache is sized by max_seq_len: no longer than an episode can get.
    generation_cfg = cfg.generation.model_copy(update={"max_seq_len": cfg.generation.max_seq_len or cfg.grpo.max_total_length})
    generation = build_generation_backend(generation_cfg, model_path)
    checkpoint_dir = cfg.checkpointing.dir or str(output_dir / "checkpoints")
    checkpointer = CheckpointManager(cfg.checkpointing, checkpoint_dir) if cfg.checkpointing.enabled else None
    # One runner for the whole run: Ray actors or worker processes start once, not every step.
    env_runner = cfg.grpo.env_runner.build(environment)
    val_runner = env_runner if val_environment is environment else None  # a separate val_env runs in threads
    validate_fn = make_validate_fn(cfg, generation, tokenizer, val_data, val_environment, val_runner) if val_data else None

    metrics_logger = MetricsLogger(cfg.logger, output_dir, total_steps=cfg.grpo.max_steps,
                                   hparams=cfg.model_dump(mode="json"))
    try:
        grpo_train(cfg.grpo, cfg.loss, policy, generation, tokenizer, train_data, environment,
                   logger=metrics_logger, checkpointer=checkpointer, validate_fn=validate_fn, seed=cfg.seed,
                   env_runner=env_runner)
    finally:
        env_runner.shutdown()
        plot = metrics_logger.close()
        generation.shutdown()
        policy.shutdown()
    if plot is not None:
        print(f"metrics plot: {plot}")
    print(f"metrics: {metrics_logger.jsonl_path}")
    return 0


def build_env(env_cfg: EnvConfig, key: str) -> Any:
    """``env_cfg.build()``, with a bad name or kwarg reported as a config error at ``key``."""
    try:
        return env_cfg.build()
    except (TypeError, ValueError, KeyError, ImportError) as err:
        message = err.args[0] if isinstance(err, KeyError) and err.args else str(err)
        raise ConfigError(ConfigProblem(where="config", key=key, message=str(message))) from err


def make_validate_fn(cfg: GRPORunConfig, generation: Any, tokenizer: Any, val_data: list[PromptSample], environment: Any,
                     env_runner: Any = None):
    """``validate(step) -> metrics`` on the held-out prompts: greedy accuracy, and pass@k from k
    samples at the training temperature when ``grpo.val_pass_k > 1``. ``env_runner``: where the
    environment runs (built from ``environment``); None: threads."""
    from rl_algorithms.rollout import run_rollouts
    from rl_eval import pass_at_k  # the estimator `rl eval` reports, so the two numbers agree

    grpo = cfg.grpo

    def episodes(sampling: SamplingParams, n: int):
        return run_rollouts(generation, tokenizer, val_data, environment, sampling, num_generations_per_prompt=n,
                            max_turns=grpo.max_turns, max_total_length=grpo.max_total_length,
                            env_timeout_s=grpo.env_runner.timeout_s, env_runner=env_runner)

    def validate(step: int) -> dict[str, float]:
        stop = tuple(t for t in [tokenizer.eos_token_id] if t is not None)
        greedy = episodes(SamplingParams(max_new_tokens=grpo.max_new_tokens, temperature=0.0, stop_token_ids=stop,
                                         stop_strings=tuple(grpo.stop_strings)), 1)
        metrics = {
            "accuracy": _mean(_correct(ep) for ep in greedy),
            "reward_mean": _mean(ep.reward for ep in greedy),
            "response_length_mean": _mean(ep.response_length for ep in greedy),
            "truncated_fraction": _mean(float(ep.truncated) for ep in greedy),
        }
        for name in sorted({k for ep in greedy for k in ep.reward_components}):
            metrics[f"reward/{name}"] = _mean(ep.reward_components.get(name, 0.0) for ep in greedy)
        k = grpo.val_pass_k
        if k > 1:
            sampled = episodes(SamplingParams(max_new_tokens=grpo.max_new_tokens, temperature=grpo.temperature,
                                              top_p=grpo.top_p, top_k=grpo.top_k, stop_token_ids=stop,
                                              stop_strings=tuple(grpo.stop_strings), seed=cfg.seed + 31337 * (step + 1)), k)
            correct_per_prompt = [sum(_correct(ep) for ep in sampled[i * k:(i + 1) * k]) for i in range(len(val_data))]
            metrics[f"pass@{k}"] = _mean(pass_at_k(k, int(c), k) for c in correct_per_prompt)
        return metrics

    return validate


def smoke_reward(prompt: list[dict[str, str]], completion: str, **metadata: Any) -> dict[str, float]:
    """A reward with signal even for a randomly initialised model, for smoke runs on tiny models:
    the fraction of the completion's characters that are digits (``digits``) and whether it holds any
    (``any_digit``). Use as ``env: {name: reward_function, kwargs: {fn: "rl_apps.commands.grpo:smoke_reward"}}``."""
    digits = sum(ch.isdigit() for ch in completion)
    return {"digits": digits / max(len(completion), 1), "any_digit": float(digits > 0)}


def _correct(episode: Any) -> float:
    """The ``correct`` reward component when the environment reports one, else reward > 0."""
    if "correct" in episode.reward_components:
        return float(episode.reward_components["correct"])
    return float(episode.reward > 0)


def _mean(values) -> float:
    values = list(values)
    return sum(values) / len(values) if values else 0.0


def _needs_ray(cfg: GRPORunConfig) -> bool:
    return cfg.policy.use_ray or cfg.generation.num_replicas > 0 or cfg.grpo.env_runner.kind == "ray"


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
