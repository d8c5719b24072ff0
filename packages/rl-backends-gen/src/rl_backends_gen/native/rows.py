"""State of the rows of one ``generate`` call: tensors for what every step touches, lists for the rest.

Active rows sit in slots ``0 .. R-1`` of the cache; when rows finish, the last active rows move
into the holes (see :meth:`ActiveRows.compact`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rl_backends_gen.native.cache import EngineCache
from rl_backends_gen.stop_strings import RowText


@dataclass
class RowInfo:
    """Per-row facts that no tensor op needs."""

    prompt_index: int
    sample_index: int
    prompt: list[int]
    text: RowText | None  # only when stop strings are in use


class ActiveRows:
    """Tensors of shape [max_rows, ...] on the engine's device; rows ``0 .. count-1`` are live."""

    def __init__(self, max_rows: int, max_new_tokens: int, device: torch.device):
        long = dict(dtype=torch.long, device=device)
        self.last_token = torch.zeros(max_rows, **long)
        self.position = torch.zeros(max_rows, **long)  # where last_token goes in the cache
        self.rope_delta = torch.zeros(max_rows, **long)  # rotary position - cache position (a VLM's M-RoPE prompts)
        self.num_generated = torch.zeros(max_rows, **long)
        self.limit = torch.zeros(max_rows, **long)  # max tokens this row may generate
        self.uniforms = torch.zeros(max_rows, max_new_tokens, dtype=torch.float64, device=device)
        self.tokens = torch.zeros(max_rows, max_new_tokens, **long)
        self.logprobs = torch.zeros(max_rows, max_new_tokens, dtype=torch.float32, device=device)
        self.info: list[RowInfo | None] = [None] * max_rows
        self.count = 0

    def record(self, rows: torch.Tensor, tokens: torch.Tensor, logprobs: torch.Tensor) -> None:
        """Store the token just sampled for each of ``rows``."""
        step = self.num_generated[rows]
        self.tokens[rows, step] = tokens
        self.logprobs[rows, step] = logprobs
        self.num_generated[rows] = step + 1
        self.last_token[rows] = tokens

    def compact(self, finished: list[int], cache: EngineCache) -> None:
        """Remove ``finished`` rows, moving the last live rows into their slots."""
        finished_set = set(finished)
        new_count = self.count - len(finished)
        holes = [row for row in finished if row < new_count]
        movers = [row for row in range(new_count, self.count) if row not in finished_set]
        if movers:
            device = self.position.device
            src = torch.tensor(movers, device=device)
            dst = torch.tensor(holes, device=device)
            cache.move_rows(src, dst, int(self.position[src].max()) + 1)
            for tensor in (self.last_token, self.position, self.rope_delta, self.num_generated, self.limit,
                           self.uniforms, self.tokens, self.logprobs):
                tensor[dst] = tensor[src]
            for s, d in zip(movers, holes):
                self.info[d] = self.info[s]
        for row in range(new_count, self.count):
            self.info[row] = None
        self.count = new_count
