"""``rl sft``: supervised fine-tuning (full or LoRA) on chat or prompt/response data."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from rl_algorithms.checkpointing import CheckpointConfig
from rl_algorithms.data import ChatDataConfig, DataError, SyntheticDataConfig, load_chat_dataset, pad_token_id_of
from rl_algorithms.sft import SFTConfig, sft_train
from rl_apps import recipe_path
from rl_apps.run_setup import build_backend, export, fail, items, load_splits, open_run, resolve_with_tokenizer
from rl_backends_train import TrainBackendConfig
from rl_core.cluster import ClusterConfig
from rl_core.config import StrictModel
from rl_core.logging import LoggerConfig
from rl_core.seed import set_seed


class SFTRunConfig(StrictModel):
    """Everything ``rl sft`` needs."""

    model: str = "tiny-llama"
    """A model name (``smollm2-135m-instruct``, ``tiny-llama``, ``tiny-qwen2``) or a local HF directory."""
    output_dir: str = "runs/sft"
    """Metrics, checkpoints (``checkpoints/``), the final HF model (``hf/``) and LoRA adapter (``adapter/``)."""
    seed: int = 0
    cluster: ClusterConfig = Field(default_factory=ClusterConfig)
    policy: TrainBackendConfig = Field(default_factory=TrainBackendConfig)
    """The trained model's backend (``policy.lora`` for LoRA)."""
    data: ChatDataConfig = Field(default_factory=ChatDataConfig)
    synthetic_data: SyntheticDataConfig | None = None
    """Generate a memorisable arithmetic dataset into ``<output_dir>/data`` instead of reading ``data.train_path``."""
    sft: SFTConfig = Field(default_factory=SFTConfig)
    logger: LoggerConfig = Field(default_factory=LoggerConfig)
    checkpointing: CheckpointConfig = Field(default_factory=CheckpointConfig)
    export_hf: bool = True
    """Write the final model as an HF directory to ``<output_dir>/hf`` (LoRA: merged, plus ``adapter/``)."""


CONFIG_CLASS = SFTRunConfig
DEFAULT_RECIPE = recipe_path("sft_tiny.yaml")


def run(cfg: SFTRunConfig) -> int:
    set_seed(cfg.seed)
    out = Path(cfg.output_dir)
    model_path, tokenizer = resolve_with_tokenizer(cfg.model)
    try:
        train, val = load_splits(cfg.data, cfg.synthetic_data, "sft", out,
                                 lambda path: load_chat_dataset(path, cfg.data, tokenizer))
    except DataError as e:
        return fail("sft", e)

    policy_cfg = cfg.policy.model_copy(update={"reference_model": False})
    with open_run(cfg, out, cfg.sft.max_steps) as (logger, checkpointer):
        policy = build_backend(policy_cfg, model_path, cfg.cluster, seed=cfg.seed)
        try:
            sft_train(cfg.sft, policy, train.items, pad_token_id=pad_token_id_of(tokenizer),
                      val_data=items(val), logger=logger, checkpointer=checkpointer, seed=cfg.seed)
            if cfg.export_hf:
                export(policy, out, lora=cfg.policy.lora is not None)
        finally:
            policy.shutdown()
    return 0
