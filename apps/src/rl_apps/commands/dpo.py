"""``rl dpo``: direct preference optimisation on (prompt, chosen, rejected) pairs.

The reference is the frozen initial policy: a second copy of the weights, or under LoRA the base
weights with the adapters switched off (no copy).
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
from rl_algorithms.dpo import DPOConfig, dpo_train
from rl_apps import recipe_path
from rl_apps.run_setup import build_backend, export, fail, items, load_splits, open_run, resolve_with_tokenizer
from rl_backends_train import TrainBackendConfig
from rl_core.cluster import ClusterConfig
from rl_core.config import StrictModel
from rl_core.logging import LoggerConfig
from rl_core.seed import set_seed


def check_pair_batching(policy: TrainBackendConfig, pairs_per_step: int, section: str) -> None:
    """Pairs are interleaved rows (2i chosen, 2i+1 rejected): every split of the batch must keep them together."""
    if policy.packing.enabled or policy.dynamic_batching.enabled:
        raise ValueError("preference training needs policy.packing.enabled=false and "
                         "policy.dynamic_batching.enabled=false (they reorder rows and would split pairs)")
    if policy.micro_batch_size % 2:
        raise ValueError(f"policy.micro_batch_size must be even (pairs of rows), got {policy.micro_batch_size}")
    if pairs_per_step % policy.data_parallel_size:
        raise ValueError(f"{section}.pairs_per_step={pairs_per_step} must be a multiple of the data-parallel size "
                         f"{policy.data_parallel_size}, so that no worker's shard splits a pair")


class DPORunConfig(StrictModel):
    """Everything ``rl dpo`` needs."""

    model: str = "tiny-llama"
    """A model name (``smollm2-135m-instruct``, ``tiny-llama``, ``tiny-qwen2``) or a local HF directory."""
    output_dir: str = "runs/dpo"
    seed: int = 0
    cluster: ClusterConfig = Field(default_factory=ClusterConfig)
    policy: TrainBackendConfig = Field(default_factory=TrainBackendConfig)
    data: PreferenceDataConfig = Field(default_factory=PreferenceDataConfig)
    synthetic_data: SyntheticDataConfig | None = None
    """Generate synthetic preference pairs with a clear signal into ``<output_dir>/data``."""
    dpo: DPOConfig = Field(default_factory=DPOConfig)
    logger: LoggerConfig = Field(default_factory=LoggerConfig)
    checkpointing: CheckpointConfig = Field(default_factory=CheckpointConfig)
    export_hf: bool = True
    """Write the final model as an HF directory to ``<output_dir>/hf``."""

    @model_validator(mode="after")
    def _pairs_stay_together(self) -> DPORunConfig:
        check_pair_batching(self.policy, self.dpo.pairs_per_step, "dpo")
        return self


CONFIG_CLASS = DPORunConfig
DEFAULT_RECIPE = recipe_path("dpo_tiny.yaml")


def run(cfg: DPORunConfig) -> int:
    set_seed(cfg.seed)
    out = Path(cfg.output_dir)
    model_path, tokenizer = resolve_with_tokenizer(cfg.model)
    try:
        train, val = load_splits(cfg.data, cfg.synthetic_data, "preference", out,
                                 lambda path: load_preference_dataset(path, cfg.data, tokenizer))
    except DataError as e:
        return fail("dpo", e)

    # Under LoRA the reference is the base (adapters off); otherwise a frozen copy of the initial weights.
    policy_cfg = cfg.policy.model_copy(update={"reference_model": cfg.policy.lora is None})
    with open_run(cfg, out, cfg.dpo.max_steps) as (logger, checkpointer):
        policy = build_backend(policy_cfg, model_path, cfg.cluster, seed=cfg.seed)
        try:
            dpo_train(cfg.dpo, policy, train.items, pad_token_id=pad_token_id_of(tokenizer),
                      val_pairs=items(val), logger=logger, checkpointer=checkpointer, seed=cfg.seed)
            if cfg.export_hf:
                export(policy, out, lora=cfg.policy.lora is not None)
        finally:
            policy.shutdown()
    return 0
