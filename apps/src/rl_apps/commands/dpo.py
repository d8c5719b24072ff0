"""``rl dpo``: direct preference optimisation on (prompt, chosen, rejected) pairs.

The reference is the frozen initial policy: a second copy of the weights, or under LoRA the base
weights with the adapters switched off (no copy).
"""

from __future__ import annotations

from pydantic import Field, model_validator

from rl_algorithms.data import PreferenceDataConfig, load_preference_dataset, pad_token_id_of
from rl_algorithms.dpo import DPOConfig, dpo_train
from rl_apps import recipe_path
from rl_apps.run_config import SupervisedRunConfig, check_pair_batching
from rl_apps.run_setup import items, load_splits, open_run, start_run


class DPORunConfig(SupervisedRunConfig):
    """Everything ``rl dpo`` needs."""

    LOOP_SECTION = "dpo"
    SYNTHETIC_KIND = "preference"

    output_dir: str = "runs/dpo"
    data: PreferenceDataConfig = Field(default_factory=PreferenceDataConfig)
    dpo: DPOConfig = Field(default_factory=DPOConfig)

    @model_validator(mode="after")
    def _pairs_stay_together(self) -> DPORunConfig:
        check_pair_batching(self.policy, self.dpo.batch_size, "dpo")
        return self


CONFIG_CLASS = DPORunConfig
DEFAULT_RECIPE = recipe_path("dpo_tiny.yaml")


def run(cfg: DPORunConfig) -> int:
    model_path, tokenizer = start_run(cfg)
    train, val = load_splits(cfg, lambda path: load_preference_dataset(path, cfg.data, tokenizer))
    with open_run(cfg) as run:
        # Under LoRA the reference is the base (adapters off); otherwise a frozen copy of the initial weights.
        policy = run.backend(cfg.policy.model_copy(update={"reference_model": cfg.policy.lora is None}), model_path)
        dpo_train(cfg.dpo, policy, train.items, pad_token_id=pad_token_id_of(tokenizer), val_pairs=items(val),
                  logger=run.logger, checkpointer=run.checkpointer, seed=cfg.seed)
        run.finish(policy)
    return 0
