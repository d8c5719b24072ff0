"""Align two tokenisations of the same text by character offsets.

Each token starts at a byte offset of the UTF-8 text (the running sum of its predecessors' bytes, see
:mod:`.token_bytes`); a start that falls on a character boundary is the token's character offset,
one inside a multi-byte character is no boundary at all (``None``). Student position i and teacher
position j are ALIGNED when both tokens start at the same character offset c: both models then predict
the next token from the same text ``text[:c]``, so their next-token distributions are comparable.
Position 0 has no prediction (rl_core.types) and is never aligned.
"""

from __future__ import annotations

from dataclasses import dataclass

from rl_algorithms.xtoken.token_bytes import token_bytes_table


@dataclass
class Tokenized:
    """A text tokenised with its token start offsets (characters; None inside a character)."""

    input_ids: list[int]
    char_starts: list[int | None]


def tokenize_with_char_starts(tokenizer, text: str, table: list[bytes] | None = None,
                              add_bos: bool = True) -> Tokenized:
    """Token ids of ``text`` (a BOS first when the tokenizer has one and ``add_bos``) and their starts."""
    table = table if table is not None else token_bytes_table(tokenizer)
    ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    data = text.encode("utf-8")
    char_at_byte = {}
    offset = 0
    for index, ch in enumerate(text):
        char_at_byte[offset] = index
        offset += len(ch.encode("utf-8"))
    char_at_byte[offset] = len(text)

    starts: list[int | None] = []
    position = 0
    for token_id in ids:
        starts.append(char_at_byte.get(position))
        position += len(table[token_id])
    if b"".join(table[i] for i in ids) != data:
        raise ValueError(
            f"cannot align: the tokens of {type(tokenizer).__name__} do not spell the text byte for byte "
            "(a normalizer changes it); cross-tokenizer distillation needs tokenizers that keep the text"
        )
    bos = getattr(tokenizer, "bos_token_id", None)
    if add_bos and bos is not None:
        ids, starts = [bos, *ids], [None, *starts]
    return Tokenized(ids, starts)


def align_positions(student: Tokenized, teacher: Tokenized) -> list[tuple[int, int]]:
    """``(student position, teacher position)`` pairs whose tokens start at the same character offset."""
    teacher_at: dict[int, int] = {}
    for j, start in enumerate(teacher.char_starts):
        if j > 0 and start is not None:
            teacher_at.setdefault(start, j)
    return [
        (i, teacher_at[start])
        for i, start in enumerate(student.char_starts)
        if i > 0 and start is not None and start in teacher_at
    ]
