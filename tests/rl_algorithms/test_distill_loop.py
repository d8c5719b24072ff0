"""On-policy distillation with the real backends (in-process DTensor workers, the native engine): the loop
trains on the teacher's top-k, validates, and refits the student's weights into the generation engine.
(That the held-out KL falls is checked end to end in tests/integration/test_distill_recipe.py.)"""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file

from rl_algorithms.data import PromptDataConfig, load_prompt_dataset, synthetic_rows, write_jsonl
from rl_algorithms.distill import DistillConfig, distill_train
from rl_core.models import build_tiny_tokenizer, save_tiny_model


def save_sharp_teacher(path, scale: float = 40.0, family: str = "qwen2", **kwargs) -> str:
    """A tiny model whose output layer is scaled up: a peaked distribution worth distilling."""
    save_tiny_model(path, family=family, seed=0, **kwargs)  # seed 0: the student's tokenizer
    weights = load_file(str(path / "model.safetensors"))
    weights["lm_head.weight"] = weights["lm_head.weight"] * scale
    save_file(weights, str(path / "model.safetensors"), metadata={"format": "pt"})
    return str(path)


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory):
    return save_sharp_teacher(tmp_path_factory.mktemp("sharp-teacher"))


def test_on_policy_distillation_loop_trains_validates_and_refits(tiny_model_dir, teacher_dir, tmp_path):
    from rl_backends_gen.native import NativeEngine
    from rl_backends_train import TrainBackendConfig, build_training_backend

    tokenizer = build_tiny_tokenizer()
    path = write_jsonl(synthetic_rows("prompts", 24, seed=0), tmp_path / "prompts.jsonl")
    prompts = load_prompt_dataset(path, PromptDataConfig(train_path=path), tokenizer).items
    cfg = DistillConfig(max_steps=2, batch_size=8, max_new_tokens=8, teacher_top_k=16, val_every=2,
                        val_batch_size=8)
    student_cfg = TrainBackendConfig(use_ray=False, reference_model=False, micro_batch_size=8, optimizer={"lr": 5e-3})
    teacher_cfg = TrainBackendConfig(use_ray=False, reference_model=False, micro_batch_size=8, optimizer={"lr": 0.0})
    with build_training_backend(student_cfg, tiny_model_dir) as student, \
            build_training_backend(teacher_cfg, teacher_dir, name="teacher") as teacher:
        engine = NativeEngine(tiny_model_dir, tokenizer=tokenizer)
        history = distill_train(cfg, student, teacher, engine, prompts[:16], pad_token_id=tokenizer.pad_token_id,
                                stop_token_ids=(tokenizer.eos_token_id,), val_prompts=prompts[16:],
                                vocab_size=len(tokenizer), seed=3)
        student_weights = dict(student.named_weights())
        engine_weights = dict(engine.model.named_parameters())
        engine.shutdown()
    before, after = history[0], history[-1]
    assert [m["step"] for m in history] == [0, 1, 2]
    assert before["val/distill_kl"] > 0.5 and after["val/distill_kl"] != before["val/distill_kl"]
    assert before["val/response_length_mean"] <= 8
    assert all(m["train/distill_kl"] > 0 for m in history[1:])
    for name in ("model.layers.0.self_attn.q_proj.weight", "lm_head.weight"):  # refit reached the engine
        assert torch.equal(engine_weights[name], student_weights[name])
