"""Batches for cross-tokenizer distillation: the same texts tokenised for the student and the teacher.

The student batch carries, per student position, the teacher position aligned with it
(``xtoken_teacher_position`` [B, T_s] long, 0 where none) and ``xtoken_aligned_mask`` [B, T_s]. After the
teacher's forward pass, :func:`attach_teacher_topk` copies the teacher's top-k at the aligned positions
into the student batch (``teacher_topk_logits`` / ``teacher_topk_indices`` [B, T_s, k]), which is what
:class:`rl_algorithms.losses.xtoken_kl.CrossTokenizerKLLoss` reads.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from rl_algorithms.data.collate import pad_token_id_of
from rl_algorithms.xtoken.alignment import Tokenized, align_positions, tokenize_with_char_starts
from rl_algorithms.xtoken.token_bytes import token_bytes_table
from rl_core.batch import Batch


@dataclass
class XTokenTokenizers:
    """Both tokenizers with their byte tables (computed once)."""

    student: object
    teacher: object
    student_table: list[bytes]
    teacher_table: list[bytes]

    @classmethod
    def build(cls, student_tokenizer, teacher_tokenizer) -> XTokenTokenizers:
        return cls(student_tokenizer, teacher_tokenizer, token_bytes_table(student_tokenizer),
                   token_bytes_table(teacher_tokenizer))


def build_xtoken_batches(texts: Sequence[str], tokenizers: XTokenTokenizers) -> tuple[Batch, Batch]:
    """``(student_batch, teacher_batch)`` for ``texts``.

    Student batch: ``input_ids``, ``attention_mask``, ``loss_mask`` (every predicted text token:
    positions >= 1), ``xtoken_aligned_mask``, ``xtoken_teacher_position``. Teacher batch: ``input_ids``,
    ``attention_mask``, ``loss_mask``.
    """
    student_rows: list[Tokenized] = []
    teacher_rows: list[Tokenized] = []
    alignments: list[list[tuple[int, int]]] = []
    for text in texts:
        student = tokenize_with_char_starts(tokenizers.student, text, tokenizers.student_table)
        teacher = tokenize_with_char_starts(tokenizers.teacher, text, tokenizers.teacher_table)
        student_rows.append(student)
        teacher_rows.append(teacher)
        alignments.append(align_positions(student, teacher))

    student_batch = _pad([row.input_ids for row in student_rows], pad_token_id_of(tokenizers.student))
    teacher_batch = _pad([row.input_ids for row in teacher_rows], pad_token_id_of(tokenizers.teacher))
    aligned = torch.zeros_like(student_batch["loss_mask"])
    teacher_position = torch.zeros_like(student_batch["input_ids"])
    for row, pairs in enumerate(alignments):
        for i, j in pairs:
            aligned[row, i] = 1.0
            teacher_position[row, i] = j
    student_batch["xtoken_aligned_mask"] = aligned
    student_batch["xtoken_teacher_position"] = teacher_position
    return student_batch, teacher_batch


def attach_teacher_topk(student_batch: Batch, teacher_values: torch.Tensor, teacher_indices: torch.Tensor) -> Batch:
    """Copy the teacher's top-k ``[B, T_t, k]`` to the aligned student positions ``[B, T_s, k]``."""
    position = student_batch["xtoken_teacher_position"].long()  # [B, T_s]
    k = teacher_values.shape[-1]
    gather_index = position.unsqueeze(-1).expand(-1, -1, k)  # [B, T_s, k]
    out = dict(student_batch)
    out["teacher_topk_logits"] = teacher_values.float().gather(1, gather_index)
    out["teacher_topk_indices"] = teacher_indices.long().gather(1, gather_index)
    return out


def _pad(rows: list[list[int]], pad_token_id: int) -> Batch:
    length = max(len(r) for r in rows)
    input_ids = torch.full((len(rows), length), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(rows), length), dtype=torch.long)
    for b, ids in enumerate(rows):
        input_ids[b, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        attention_mask[b, : len(ids)] = 1
    loss_mask = attention_mask.float()
    loss_mask[:, 0] = 0.0  # position 0 has no prediction
    return {"input_ids": input_ids, "attention_mask": attention_mask, "loss_mask": loss_mask}
