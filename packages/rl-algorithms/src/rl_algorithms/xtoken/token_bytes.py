"""The exact bytes each token id stands for, for byte-level BPE and SentencePiece-style vocabularies.

Character offsets reported by fast tokenizers are ambiguous for byte-level BPE: the byte tokens of one
multi-byte character all report that character's span, and ``trim_offsets`` moves starts past spaces.
Working from each token's own bytes is exact: the bytes of a tokenisation concatenate to the UTF-8 text.
"""

from __future__ import annotations

import re
from functools import lru_cache


@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """Inverse of GPT-2's ``bytes_to_unicode`` (printable stand-ins for the 256 byte values)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    codes = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            codes.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, codes)}


_HEX_BYTE = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


def is_byte_level(tokenizer) -> bool:
    decoder = getattr(tokenizer, "backend_tokenizer", None) and tokenizer.backend_tokenizer.decoder
    return decoder is not None and type(decoder).__name__ == "ByteLevel"


def token_bytes_table(tokenizer) -> list[bytes]:
    """``table[id]`` = the bytes token ``id`` adds to the text (special tokens: their content)."""
    added = {token_id: token.content for token_id, token in tokenizer.added_tokens_decoder.items()}
    byte_level = is_byte_level(tokenizer)
    decoder = _byte_decoder()
    table: list[bytes] = []
    for token_id, token in enumerate(tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))):
        if token_id in added:
            table.append(added[token_id].encode("utf-8"))
        elif token is None:
            table.append(b"")
        elif byte_level:
            table.append(bytes(decoder[ch] for ch in token) if all(ch in decoder for ch in token) else token.encode())
        elif match := _HEX_BYTE.match(token):  # SentencePiece byte fallback
            table.append(bytes([int(match.group(1), 16)]))
        else:
            table.append(token.replace("\u2581", " ").encode("utf-8"))  # SentencePiece marks spaces with U+2581
    return table


def special_token_ids(tokenizer) -> set[int]:
    return {token_id for token_id, token in tokenizer.added_tokens_decoder.items() if token.special}
