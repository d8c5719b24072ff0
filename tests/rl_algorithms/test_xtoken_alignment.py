"""Cross-tokenizer pieces: exact alignments between two tokenizers that really differ, the vocabulary
projection on hand-checked tokens, and the loss."""

from __future__ import annotations

import math

import pytest
import torch

from rl_algorithms.losses.masking import make_normalizer
from rl_algorithms.losses.xtoken_kl import CrossTokenizerKLLoss
from rl_algorithms.xtoken import (
    XTokenTokenizers,
    align_positions,
    attach_teacher_topk,
    build_vocab_projection,
    build_xtoken_batches,
    project_probs,
    tokenize_with_char_starts,
)
from rl_core.batch import split
from rl_core.models import build_tiny_tokenizer
from rl_core.types import ModelOutputs


@pytest.fixture(scope="module")
def bpe():
    return build_tiny_tokenizer(variant="bpe")


@pytest.fixture(scope="module")
def char():
    return build_tiny_tokenizer(variant="char")


def tokens(tokenizer, tokenized):
    return tokenizer.convert_ids_to_tokens(tokenized.input_ids)


def test_alignment_bpe_vs_char_exact(bpe, char):
    text = "What is 12 + 7?"
    student = tokenize_with_char_starts(bpe, text)
    teacher = tokenize_with_char_starts(char, text)
    assert tokens(bpe, student) == ["What", "Ġis", "Ġ1", "2", "Ġ+", "Ġ7", "?"]
    assert student.char_starts == [0, 4, 7, 9, 10, 12, 14]
    assert tokens(char, teacher) == ["W", "h", "a", "t", "Ġ", "i", "s", "Ġ", "1", "2", "Ġ", "+", "Ġ", "7", "?"]
    assert teacher.char_starts == list(range(15))
    # Every BPE token starts where some character token starts; position 0 has no prediction.
    assert align_positions(student, teacher) == [(1, 4), (2, 7), (3, 9), (4, 10), (5, 12), (6, 14)]
    assert align_positions(teacher, student) == [(4, 1), (7, 2), (9, 3), (10, 4), (12, 5), (14, 6)]


def test_alignment_skips_positions_inside_multibyte_characters(bpe, char):
    text = "sum 😀 ok"  # the emoji is 4 UTF-8 bytes, 4 byte tokens in both tokenizers
    student = tokenize_with_char_starts(bpe, text)
    teacher = tokenize_with_char_starts(char, text)
    assert tokens(bpe, student) == ["s", "um", "Ġ", "ð", "Ł", "ĺ", "Ģ", "Ġo", "k"]
    assert student.char_starts == [0, 1, 3, 4, None, None, None, 5, 7]
    assert teacher.char_starts == [0, 1, 2, 3, 4, None, None, None, 5, 6, 7]
    assert align_positions(student, teacher) == [(1, 1), (2, 3), (3, 4), (7, 8), (8, 10)]


def test_projection_on_hand_checked_tokens(bpe, char):
    to_char = build_vocab_projection(bpe, char)
    def mapped(token):
        return char.convert_ids_to_tokens(int(to_char.student_to_teacher[bpe.convert_tokens_to_ids(token)]))
    assert mapped("a") == "a" and mapped("Ġ") == "Ġ"           # exact byte matches
    assert mapped("<|im_end|>") == "<|im_end|>"                 # special tokens by content
    assert mapped("Ġthe") == "Ġ" and mapped("What") == "W"      # multi-token span -> its first token
    assert mapped("boxed") == "b"
    # The char vocabulary is the byte alphabet + specials: 260 exact, every other BPE token split.
    assert (to_char.num_exact, to_char.num_first_token, to_char.num_unmapped) == (260, len(bpe) - 260, 0)
    back = build_vocab_projection(char, bpe)
    assert (back.num_exact, back.num_first_token, back.num_unmapped) == (len(char), 0, 0)
    ids = torch.arange(len(char))
    assert bpe.convert_ids_to_tokens(back.student_to_teacher[ids].tolist()) == char.convert_ids_to_tokens(ids.tolist())


def test_project_probs_sums_mass_into_teacher_tokens():
    mapping = torch.tensor([0, 0, 2, -1])
    probs = torch.tensor([[0.1, 0.2, 0.3, 0.4]])
    assert torch.allclose(project_probs(probs, mapping, 3), torch.tensor([[0.3, 0.0, 0.3]]))


def test_batches_and_teacher_topk_copied_to_aligned_positions(bpe, char):
    tokenizers = XTokenTokenizers.build(student_tokenizer=bpe, teacher_tokenizer=char)
    student_batch, teacher_batch = build_xtoken_batches(["What is 12 + 7?", "sum ok"], tokenizers)
    assert student_batch["xtoken_aligned_mask"][0].tolist() == [0, 1, 1, 1, 1, 1, 1]
    assert student_batch["xtoken_teacher_position"][0].tolist() == [0, 4, 7, 9, 10, 12, 14]
    assert student_batch["loss_mask"][1].tolist() == [0, 1, 1, 1, 0, 0, 0]  # "s um Ġok" then padding
    assert teacher_batch["attention_mask"].sum(1).tolist() == [15, 6]
    values = torch.arange(2 * 15 * 2, dtype=torch.float32).reshape(2, 15, 2)
    with_topk = attach_teacher_topk(student_batch, values, values.long())
    assert with_topk["teacher_topk_logits"][0, 3].tolist() == values[0, 9].tolist()
    assert with_topk["teacher_topk_indices"].shape == (2, 7, 2)


def test_xtoken_loss_closed_form_and_micro_batches():
    # Student vocab 4 -> teacher vocab 3: tokens 0 and 1 both project to teacher 0, 2 -> 2, 3 unmapped.
    mapping = torch.tensor([0, 0, 2, -1])
    logits = torch.tensor([[[0.0] * 4, [1.0, 0.0, 2.0, 0.5], [0.0, 0.0, 0.0, 3.0]],
                           [[0.0] * 4, [0.2, 0.2, 0.2, 0.2], [2.0, -1.0, 0.0, 0.0]]])
    logprobs = torch.log_softmax(logits, -1).gather(-1, torch.tensor([[[0], [2], [3]], [[0], [1], [0]]])).squeeze(-1)
    batch = {
        "loss_mask": torch.tensor([[0.0, 1, 1], [0, 1, 1]]),
        "xtoken_aligned_mask": torch.tensor([[0.0, 1, 0], [0, 1, 1]]),
        "teacher_topk_logits": torch.tensor([[[0.0, 0], [1.0, 0.0], [0, 0]], [[0, 0], [0.0, 0.0], [2.0, 1.0]]]),
        "teacher_topk_indices": torch.tensor([[[0, 0], [0, 2], [0, 0]], [[0, 0], [2, 0], [0, 1]]]),
    }
    loss_fn = CrossTokenizerKLLoss(mapping, teacher_vocab_size=3, kl_coef=0.5, ce_coef=2.0)
    normalizer = make_normalizer(batch)
    loss, metrics = loss_fn(ModelOutputs(logprobs=logprobs, logits=logits), batch, normalizer)

    def kl_at(row_logits, teacher_logits, teacher_ids):
        q = torch.softmax(row_logits.double(), -1)
        projected = torch.tensor([q[0] + q[1], 0.0, q[2]], dtype=torch.float64)[teacher_ids]
        projected = projected.clamp(min=1e-30)
        student = projected / projected.sum()
        teacher = torch.softmax(torch.tensor(teacher_logits, dtype=torch.float64), -1)
        return float((teacher * (teacher.log() - student.log())).sum())

    kl = (kl_at(logits[0, 1], [1.0, 0.0], [0, 2]) + kl_at(logits[1, 1], [0.0, 0.0], [2, 0])
          + kl_at(logits[1, 2], [2.0, 1.0], [0, 1]))
    ce = -float(logprobs[batch["loss_mask"].bool()].sum())
    assert metrics["xtoken_kl"] == pytest.approx(kl / 4, rel=1e-5)
    assert metrics["ce"] == pytest.approx(ce / 4, rel=1e-6)
    assert loss.item() == pytest.approx(0.5 * kl / 4 + 2.0 * ce / 4, rel=1e-5)
    assert metrics["aligned_fraction"] == 0.75
    assert not math.isnan(loss.item())

    parts = sum(loss_fn(ModelOutputs(logprobs=logprobs[i : i + 1], logits=logits[i : i + 1]), micro, normalizer)[0].item()
                for i, micro in enumerate(split(batch, 1)))
    assert parts == pytest.approx(loss.item(), rel=1e-6)
