"""Stop strings, detected by decoding each completion incrementally.

Rule (the same for every backend of this package): a completion ends at the FIRST token after which
its decoded text (special tokens skipped) contains a stop string. That token is kept, so
``token_ids`` are exactly what the model produced and ``text == decode(token_ids)``: the text
includes the stop string, plus whatever else the completing token spelled after it.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class RowText:
    """The tokens of one completion so far and how much of its text was already searched."""

    tokens: list[int] = field(default_factory=list)
    searched_chars: int = 0


class StopStringMatcher:
    def __init__(self, tokenizer, stop_strings: tuple[str, ...]):
        self.tokenizer = tokenizer
        self.stop_strings = tuple(stop_strings)
        self.longest = max((len(s) for s in self.stop_strings), default=0)

    def push(self, row: RowText, token: int) -> bool:
        """Append ``token``; True when the text now contains a stop string."""
        row.tokens.append(token)
        text = self.tokenizer.decode(row.tokens, skip_special_tokens=True)
        # Only text near the end can hold a new match; a few extra chars cover an incomplete UTF-8
        # character that the new token completed (it decoded as a replacement char before).
        start = max(0, row.searched_chars - self.longest - 4)
        row.searched_chars = len(text)
        tail = text[start:]
        return any(stop in tail for stop in self.stop_strings)


def first_stop_index(tokenizer, token_ids: list[int], stop_strings: tuple[str, ...]) -> int | None:
    """Index of the token that completes the first stop string in ``token_ids``, or None.

    Used by backends whose engine does not cut at stop strings the way this package does."""
    matcher = StopStringMatcher(tokenizer, stop_strings)
    row = RowText()
    for index, token in enumerate(token_ids):
        if matcher.push(row, token):
            return index
    return None
