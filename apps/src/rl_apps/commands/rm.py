"""``rl rm``: a Bradley-Terry reward model (scalar head on an HF causal-LM backbone).

The exported ``<output_dir>/hf`` is an HF sequence-classification model with one label, which the
reward-model environment loads.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, model_validator

from rl_algorithms.checkpointing import CheckpointConfig
from rl_algorithms.data import (
    DataError,
    PreferenceDataConfig,
    SyntheticDataConfig,
    load_preference_dataset,
    pad_token_id_of,
)
from rl_algorithms.rm import RMConfig, rm_train
from rl_apps import recipe_path
from rl_apps.commands.dpo import check_pair_batching
from rl_apps.run_setup import build_backend, export, fail, items, load_splits, open_run, resolve_with_tokenizer
from rl_backends_train import TrainBackendConfig
from rl_core.cluster import ClusterConfig
from rl_core.config import StrictModel
from rl_core.logging import LoggerConfig
from rl_core.seed import set_seed


class RMRunConfig(StrictModel):
    """Everything ``rl rm`` needs."""

    model: str = "tiny-llama"
    """The backbone: a model name or a local HF directory (causal LM; a score head is added)."""
    output_dir: str = "runs/rm"
    seed: int = 0
    cluster: ClusterConfig = Field(default_factory=ClusterConfig)
    policy: TrainBackendConfig = Field(default_factory=lambda: TrainBackendConfig(task="reward_model"))
    """The reward model's backend; ``task`` must be ``reward_model``."""
    data: PreferenceDataConfig = Field(default_factory=PreferenceDataConfig)
    synthetic_data: SyntheticDataConfig | None = None
    """Generate a separable synthetic preference set into ``<output_dir>/data``."""
    rm: RMConfig = Field(default_factory=RMConfig)
    logger: LoggerConfig = Field(default_factory=LoggerConfig)
    checkpointing: CheckpointConfig = Field(default_factory=lambda: CheckpointConfig(best_metric="val/accuracy"))
    export_hf: bool = True
    """Write the final reward model as an HF sequence-classification directory to ``<output_dir>/hf``."""

    @model_validator(mode="after")
    def _check(self) -> RMRunConfig:
        if self.policy.task != "reward_model":
            raise ValueError("policy.task must be reward_model for rl rm")
        check_pair_batching(self.policy, self.rm.pairs_per_step, "rm")
        return self


CONFIG_CLASS = RMRunConfig
DEFAULT_RECIPE = recipe_path("rm_tiny.yaml")


def run(cfg: RMRunConfig) -> int:
    set_seed(cfg.seed)
    out = Path(cfg.output_dir)
    model_path, tokenizer = resolve_with_tokenizer(cfg.model)
    try:
        train, val = load_splits(cfg.data, cfg.synthetic_data, "preference", out,
                                 lambda path: load_preference_dataset(path, cfg.data, tokenizer))
    except DataError as e:
        return fail("rm", e)

    policy_cfg = cfg.policy.model_copy(update={"reference_model": False})
    with open_run(cfg, out, cfg.rm.max_steps) as (logger, checkpointer):
        policy = build_backend(policy_cfg, model_path, cfg.cluster, seed=cfg.seed, name="reward_model")
        try:
            rm_train(cfg.rm, policy, train.items, pad_token_id=pad_token_id_of(tokenizer),
                     val_pairs=items(val), logger=logger, checkpointer=checkpointer, seed=cfg.seed)
            if cfg.export_hf:
                export(policy, out, lora=cfg.policy.lora is not None)
        finally:
            policy.shutdown()
    return 0
