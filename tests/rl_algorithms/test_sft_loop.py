"""The SFT loop with the real training backend: checkpoint + resume continues exactly."""

from __future__ import annotations

import torch

from rl_algorithms.checkpointing import CheckpointConfig, CheckpointManager
from rl_algorithms.data import ChatDataConfig, load_chat_dataset, synthetic_rows, write_jsonl
from rl_algorithms.sft import SFTConfig, sft_train


def test_sft_resume_reproduces_an_uninterrupted_run(tiny_model_dir, tiny_tokenizer, tmp_path):
    from rl_backends_train import TrainBackendConfig, build_training_backend

    path = write_jsonl(synthetic_rows("sft", 12, seed=0), tmp_path / "train.jsonl")
    samples = load_chat_dataset(path, ChatDataConfig(train_path=path), tiny_tokenizer).items
    backend_cfg = TrainBackendConfig(use_ray=False, reference_model=False, micro_batch_size=4, optimizer={"lr": 3e-3})
    pad = tiny_tokenizer.pad_token_id

    def train(max_steps: int, checkpointer=None):
        with build_training_backend(backend_cfg, tiny_model_dir) as policy:
            history = sft_train(SFTConfig(max_steps=max_steps, batch_size=5), policy, samples, pad_token_id=pad,
                                checkpointer=checkpointer, seed=1)
            return history, dict(policy.named_weights())

    straight_history, straight = train(4)
    ckpt_dir = tmp_path / "ckpt"
    train(2, CheckpointManager(CheckpointConfig(save_at_end=True), ckpt_dir))  # 12 // 5: crosses an epoch at step 3
    resumed_history, resumed = train(4, CheckpointManager(CheckpointConfig(resume=True), ckpt_dir))

    assert [m["step"] for m in resumed_history] == [1.0, 2.0, 3.0, 4.0]
    assert [m["train/loss"] for m in resumed_history] == [m["train/loss"] for m in straight_history]
    for name, tensor in straight.items():
        assert torch.equal(resumed[name], tensor), name
    assert sorted(p.name for p in ckpt_dir.iterdir()) == ["step_000002", "step_000004"]
