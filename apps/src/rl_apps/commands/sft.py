"""``rl sft``: supervised fine-tuning (full or LoRA) on chat or prompt/response data."""

from __future__ import annotations

from pydantic import Field

from rl_algorithms.data import ChatDataConfig, load_chat_dataset, pad_token_id_of
from rl_algorithms.sft import SFTConfig, sft_train
from rl_apps import recipe_path
from rl_apps.run_config import SupervisedRunConfig
from rl_apps.run_setup import items, load_splits, open_run, start_run


class SFTRunConfig(SupervisedRunConfig):
    """Everything ``rl sft`` needs."""

    LOOP_SECTION = "sft"
    SYNTHETIC_KIND = "sft"

    output_dir: str = "runs/sft"
    data: ChatDataConfig = Field(default_factory=ChatDataConfig)
    sft: SFTConfig = Field(default_factory=SFTConfig)


CONFIG_CLASS = SFTRunConfig
DEFAULT_RECIPE = recipe_path("sft_tiny.yaml")


def run(cfg: SFTRunConfig) -> int:
    model_path, tokenizer = start_run(cfg)
    train, val = load_splits(cfg, lambda path: load_chat_dataset(path, cfg.data, tokenizer))
    with open_run(cfg) as run:
        policy = run.backend(cfg.policy.model_copy(update={"reference_model": False}), model_path)
        sft_train(cfg.sft, policy, train.items, pad_token_id=pad_token_id_of(tokenizer), val_data=items(val),
                  logger=run.logger, checkpointer=run.checkpointer, seed=cfg.seed)
        run.finish(policy)
    return 0
