"""Cross-tokenizer distillation with the real training backend: a byte-level BPE student learns from a
teacher whose tokenizer is character-level; the held-out KL falls."""

from __future__ import annotations

import pytest
from safetensors.torch import load_file, save_file

from rl_algorithms.data import synthetic_rows
from rl_algorithms.xtoken import XTokenConfig, XTokenTokenizers, build_vocab_projection, xtoken_distill_train
from rl_core.models import build_tiny_tokenizer, save_tiny_model


@pytest.fixture(scope="module")
def char_teacher_dir(tmp_path_factory):
    """A tiny Qwen2 with the character-level tokenizer and a scaled-up (peaked) output layer."""
    path = tmp_path_factory.mktemp("char-teacher")
    save_tiny_model(path, family="qwen2", tokenizer_variant="char")
    weights = load_file(str(path / "model.safetensors"))
    weights["lm_head.weight"] = weights["lm_head.weight"] * 40.0
    save_file(weights, str(path / "model.safetensors"), metadata={"format": "pt"})
    return str(path)


def test_xtoken_distillation_lowers_held_out_kl(tiny_model_dir, char_teacher_dir):
    from rl_backends_train import TrainBackendConfig, build_training_backend

    student_tokenizer = build_tiny_tokenizer()
    teacher_tokenizer = build_tiny_tokenizer(variant="char")
    tokenizers = XTokenTokenizers.build(student_tokenizer, teacher_tokenizer)
    projection = build_vocab_projection(student_tokenizer, teacher_tokenizer)
    texts = [row["text"] for row in synthetic_rows("text", 24, seed=0)]
    cfg = XTokenConfig(max_steps=4, batch_size=8, teacher_top_k=16, loss={"kl_coef": 1.0, "ce_coef": 0.0},
                       val_every=4)
    student_cfg = TrainBackendConfig(use_ray=False, reference_model=False, micro_batch_size=8, optimizer={"lr": 1e-2})
    teacher_cfg = TrainBackendConfig(use_ray=False, reference_model=False, micro_batch_size=8, optimizer={"lr": 0.0})
    with build_training_backend(student_cfg, tiny_model_dir) as student, \
            build_training_backend(teacher_cfg, char_teacher_dir, name="teacher") as teacher:
        history = xtoken_distill_train(cfg, student, teacher, texts[:16], tokenizers, projection,
                                       val_texts=texts[16:], student_vocab_size=len(student_tokenizer), seed=0)
    before, after = history[0], history[-1]
    assert before["step"] == 0 and after["step"] == 4
    # Every BPE boundary is also a character boundary: all student positions align, but most student
    # tokens are multi-character and project onto the first character of their span.
    assert before["val/aligned_fraction"] == 1.0 and projection.num_first_token > projection.num_exact / 2
    assert after["val/xtoken_kl"] < 0.9 * before["val/xtoken_kl"]
