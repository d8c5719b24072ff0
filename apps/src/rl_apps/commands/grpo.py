"""`rl grpo`: GRPO (and DAPO, GSPO, GDPO presets) on an environment's prompts.

Wires the concrete pieces: a model resolved by name, the training backend (DTensor by default), the
generation backend (native engine by default), an environment and its dataset splits (every prompt
checked before the run starts), a metrics logger and a checkpoint manager; then calls
``rl_algorithms.grpo.grpo_train``. Validation is rl-eval's (``rl_apps.validation``).
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from rl_algorithms.grpo import GRPOConfig, LossConfig, grpo_train, prompt_length_check
from rl_apps import recipe_path
from rl_apps.run_config import RunConfig
from rl_apps.run_setup import check_fits_context, open_run, report_loaded, start_run
from rl_apps.validation import make_validate_fn
from rl_apps.vision_setup import image_chat_tokenizer
from rl_backends_gen import GenerationConfig, build_generation_backend
from rl_core.config import ConfigError, ConfigProblem
from rl_environments import ArithmeticDatasetConfig, DatasetConfig, EnvConfig

DEFAULT_RECIPE = recipe_path("grpo_arithmetic_smollm2.yaml")


class GRPORunConfig(RunConfig):
    """The whole `rl grpo` config."""

    LOOP_SECTION = "grpo"

    model: str = "smollm2-135m-instruct"
    """A short name (smollm2-135m-instruct, tiny-llama, tiny-qwen2) or a local HF model directory."""
    output_dir: str = "runs/grpo"
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

    def uses_ray(self) -> bool:
        return super().uses_ray() or self.generation.num_replicas > 0 or self.grpo.env_runner.kind == "ray"

    @model_validator(mode="after")
    def _megatron_generation_has_a_megatron_policy(self) -> GRPORunConfig:
        if self.generation.backend == "megatron":
            if self.policy.backend != "megatron":
                raise ValueError("generation.backend=megatron decodes on the Megatron training workers: set "
                                 f"policy.backend=megatron (got {self.policy.backend!r})")
            from rl_backends_train.megatron.generation import check_generation_config

            check_generation_config(self.policy, dtype=self.generation.dtype, num_replicas=self.generation.num_replicas)
        return self

    @model_validator(mode="after")
    def _validation_split_exists(self) -> GRPORunConfig:
        if self.grpo.val_every > 0 and not self.data.has_split("validation"):
            raise ValueError("grpo.val_every > 0 needs held-out prompts: set data.validation_path "
                             "(or grpo.val_every=0)")
        if self.grpo.test_at_end and not self.data.has_split("test"):
            raise ValueError("grpo.test_at_end needs test prompts: set data.test_path (or grpo.test_at_end=false)")
        return self

    @model_validator(mode="after")
    def _constant_normalizer_default(self) -> GRPORunConfig:
        """Dr. GRPO's fixed length defaults to the max response length, as TRL's ``dr_grpo``."""
        if self.loss.reduction == "constant" and self.loss.constant_normalizer is None:
            self.loss.constant_normalizer = self.grpo.max_new_tokens
        return self


CONFIG_CLASS = GRPORunConfig


def run(cfg: GRPORunConfig) -> int:
    """Build everything ``cfg`` names and train. Returns 0."""
    # Environments first: a bad kwarg is a config error, reported before anything is loaded or written.
    environment = build_env(cfg.env, "env")
    val_environment = build_env(cfg.val_env, "val_env") if cfg.val_env is not None else environment
    model_path, tokenizer = start_run(cfg)
    # A vision-language model's prompts hold images: its processor renders them (docs/vlm.md).
    tokenizer = image_chat_tokenizer(model_path, tokenizer)
    check_fits_context(model_path, {"grpo.max_new_tokens": cfg.grpo.max_new_tokens,
                                    "grpo.max_total_length": cfg.grpo.max_total_length,
                                    "generation.max_seq_len": cfg.generation.max_seq_len})
    check = prompt_length_check(tokenizer, cfg.grpo.max_total_length, cfg.generation.max_seq_len)
    train = cfg.data.load("train", check=check)
    val = cfg.data.load("validation", cfg.grpo.val_num_prompts, check) if cfg.grpo.val_every > 0 else None
    test = cfg.data.load("test", cfg.grpo.test_num_prompts, check) if cfg.grpo.test_at_end else None
    report_loaded(train, val, test)

    with open_run(cfg) as run:
        policy = run.backend(cfg.policy.model_copy(update={"reference_model": cfg.loss.needs_reference}), model_path)
        # The KV cache is sized by max_seq_len: no longer than an episode can get.
        max_seq_len = cfg.generation.max_seq_len or cfg.grpo.max_total_length
        # generation.backend=megatron decodes on the policy's own workers: the policy is passed along.
        generation = run.closing(build_generation_backend(cfg.generation.model_copy(update={"max_seq_len": max_seq_len}),
                                                          model_path, policy=policy))
        # One runner for the whole run: Ray actors or worker processes start once, not every step.
        env_runner = run.closing(cfg.grpo.env_runner.build(environment))
        val_runner = env_runner if val_environment is environment else None  # a separate val_env runs in threads

        def evaluate_on(split, name):  # validation and the test at the end are graded alike
            return None if split is None else make_validate_fn(cfg.grpo, cfg.seed, generation, tokenizer,
                                                               split.items, val_environment, val_runner,
                                                               split=name, log=run.logger.log_validation)

        validate, test_fn = evaluate_on(val, "validation"), evaluate_on(test, "test")
        grpo_train(cfg.grpo, cfg.loss, policy, generation, tokenizer, train.items, environment, logger=run.logger,
                   checkpointer=run.checkpointer, validate_fn=validate, seed=cfg.seed, env_runner=env_runner,
                   test_fn=test_fn)
        run.finish(policy, generation)
    return 0


def build_env(env_cfg: EnvConfig, key: str) -> Any:
    """``env_cfg.build()``, with a bad name or kwarg reported as a config error at ``key``."""
    try:
        return env_cfg.build()
    except (TypeError, ValueError, KeyError, ImportError) as err:
        message = err.args[0] if isinstance(err, KeyError) and err.args else str(err)
        raise ConfigError(ConfigProblem(where="config", key=key, message=str(message))) from err


def smoke_reward(prompt: list[dict[str, str]], completion: str, **metadata: Any) -> dict[str, float]:
    """A reward with signal even for a randomly initialised model, for smoke runs on tiny models:
    the fraction of the completion's characters that are digits (``digits``) and whether it holds any
    (``any_digit``). Use as ``env: {name: reward_function, kwargs: {fn: "rl_apps.commands.grpo:smoke_reward"}}``."""
    digits = sum(ch.isdigit() for ch in completion)
    return {"digits": digits / max(len(completion), 1), "any_digit": float(digits > 0)}
