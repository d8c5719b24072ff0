"""``rl rm``: a Bradley-Terry reward model (scalar head on an HF causal-LM backbone).

The exported ``<output_dir>/hf`` is an HF sequence-classification model with one label, which the
reward-model environment loads.
"""

from __future__ import annotations

from pydantic import Field, model_validator

from rl_algorithms.checkpointing import CheckpointConfig
from rl_algorithms.data import PreferenceDataConfig, load_preference_dataset, pad_token_id_of
from rl_algorithms.rm import RMConfig, rm_train
from rl_apps import recipe_path
from rl_apps.run_config import SupervisedRunConfig, check_pair_batching
from rl_apps.run_setup import items, load_splits, open_run, start_run
from rl_backends_train import TrainBackendConfig


class RMRunConfig(SupervisedRunConfig):
    """Everything ``rl rm`` needs."""

    LOOP_SECTION = "rm"
    SYNTHETIC_KIND = "preference"

    model: str = "tiny-llama"
    """The backbone: a model name or a local HF directory (causal LM; a score head is added)."""
    output_dir: str = "runs/rm"
    policy: TrainBackendConfig = Field(default_factory=lambda: TrainBackendConfig(task="reward_model"))
    """The reward model's backend; ``task`` must be ``reward_model``."""
    checkpointing: CheckpointConfig = Field(default_factory=lambda: CheckpointConfig(best_metric="val/accuracy"))
    data: PreferenceDataConfig = Field(default_factory=PreferenceDataConfig)
    rm: RMConfig = Field(default_factory=RMConfig)

    @model_validator(mode="after")
    def _check(self) -> RMRunConfig:
        if self.policy.task != "reward_model":
            raise ValueError("policy.task must be reward_model for rl rm")
        check_pair_batching(self.policy, self.rm.batch_size, "rm")
        return self


CONFIG_CLASS = RMRunConfig
DEFAULT_RECIPE = recipe_path("rm_tiny.yaml")


def run(cfg: RMRunConfig) -> int:
    model_path, tokenizer = start_run(cfg)
    train, val = load_splits(cfg, lambda path: load_preference_dataset(path, cfg.data, tokenizer))
    with open_run(cfg) as run:
        policy = run.backend(cfg.policy.model_copy(update={"reference_model": False}), model_path, name="reward_model")
        rm_train(cfg.rm, policy, train.items, pad_token_id=pad_token_id_of(tokenizer), val_pairs=items(val),
                 logger=run.logger, checkpointer=run.checkpointer, seed=cfg.seed)
        run.finish(policy)
    return 0
