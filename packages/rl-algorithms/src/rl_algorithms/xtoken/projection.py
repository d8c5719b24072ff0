"""A sparse projection from the student's vocabulary into the teacher's.

Every student token s is sent to at most one teacher token (a 0/1 matrix with one 1 per mapped row,
stored as ``student_to_teacher[s]``, -1 when unmapped):

1. exact: a teacher token with the same bytes (special tokens: the same content, e.g. ``<|im_end|>``);
2. first token of a span: otherwise the teacher tokenises the student token's string into several
   tokens, and s maps to the FIRST of them. Emitting s means the text continues with that string, and
   a teacher that writes the same text starts with that first token: the student's probability of s
   is mass the teacher would put on its first token (an approximation, since the teacher's
   tokenisation of a longer text may merge differently). For a student token that is only part of a
   UTF-8 character (byte-level BPE), the longest teacher token that is a byte prefix of it is used;
3. unmapped: special tokens with no teacher counterpart.

The projected student distribution is ``P(v) = sum_{s -> v} q(s)`` on the teacher's vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rl_algorithms.losses.xtoken_kl import project_probs
from rl_algorithms.xtoken.token_bytes import special_token_ids, token_bytes_table

__all__ = ["VocabProjection", "build_vocab_projection", "project_probs"]


@dataclass
class VocabProjection:
    """Student -> teacher token map and how each row was mapped."""

    student_to_teacher: torch.Tensor
    """[V_student] long; the teacher id of each student token, -1 if unmapped."""
    teacher_vocab_size: int
    num_exact: int
    num_first_token: int
    num_unmapped: int

    def project(self, student_probs: torch.Tensor) -> torch.Tensor:
        """``[N, V_student]`` probabilities -> ``[N, teacher_vocab_size]`` projected probabilities."""
        return project_probs(student_probs, self.student_to_teacher, self.teacher_vocab_size)


def build_vocab_projection(student_tokenizer, teacher_tokenizer) -> VocabProjection:
    """Map every student token id to a teacher id (exact bytes first, then first token of the span)."""
    student_table = token_bytes_table(student_tokenizer)
    teacher_table = token_bytes_table(teacher_tokenizer)
    student_special = special_token_ids(student_tokenizer)
    teacher_special = special_token_ids(teacher_tokenizer)

    teacher_by_bytes: dict[bytes, int] = {}
    teacher_special_by_bytes: dict[bytes, int] = {}
    for token_id, data in enumerate(teacher_table):
        target = teacher_special_by_bytes if token_id in teacher_special else teacher_by_bytes
        if data:
            target.setdefault(data, token_id)

    mapping = torch.full((len(student_table),), -1, dtype=torch.long)
    exact = first = 0
    need_split: list[tuple[int, str]] = []
    for token_id, data in enumerate(student_table):
        if token_id in student_special:
            if data in teacher_special_by_bytes:
                mapping[token_id] = teacher_special_by_bytes[data]
                exact += 1
        elif data in teacher_by_bytes:
            mapping[token_id] = teacher_by_bytes[data]
            exact += 1
        elif data:
            try:
                need_split.append((token_id, data.decode("utf-8")))
            except UnicodeDecodeError:  # part of a multi-byte character
                prefix = _longest_prefix(data, teacher_by_bytes)
                if prefix is not None:
                    mapping[token_id] = prefix
                    first += 1
    if need_split:
        encoded = teacher_tokenizer([text for _, text in need_split], add_special_tokens=False)["input_ids"]
        for (token_id, _), teacher_ids in zip(need_split, encoded):
            if teacher_ids:
                mapping[token_id] = teacher_ids[0]
                first += 1
    unmapped = int((mapping < 0).sum().item())
    return VocabProjection(mapping, len(teacher_table), exact, first, unmapped)


def _longest_prefix(data: bytes, vocabulary: dict[bytes, int]) -> int | None:
    for end in range(len(data), 0, -1):
        if data[:end] in vocabulary:
            return vocabulary[data[:end]]
    return None
