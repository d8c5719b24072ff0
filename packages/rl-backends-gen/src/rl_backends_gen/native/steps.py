"""What one forward of the engine is: which cache rows it reads and writes, at which positions.

The engine passes a step object down through the model's ``forward`` kwargs (``rl_step=...``) to
every token mixer; the mixers (``attention.py``, ``latent.py``, ``recurrent.py``) read the geometry
here and their layer's entry of the cache. Masks are built once per step and shared by the layers.
"""

from __future__ import annotations

import torch

from rl_backends_gen.native.cache import EngineCache


class PrefillStep:
    """Right-padded prompts ``[P, width]`` whose state goes to cache rows.

    ``slots`` [A]: the destination rows; ``row_of_slot`` [A]: the prefill row each copies (the n
    samples of one prompt share its prefill); ``lengths`` [P]: real tokens of each prefill row.

    ``start > 0``: the rows continue a prefix of ``start`` tokens that an earlier ``PrefillStep``
    wrote to every destination row (prompts that share it); ``first_slot_of_row`` [P] is a row
    holding each prefill row's prefix. Queries see the cached prefix and, causally, their own tokens.
    """

    def __init__(self, cache: EngineCache, slots: torch.Tensor, row_of_slot: torch.Tensor, lengths: torch.Tensor,
                 width: int, start: int = 0, first_slot_of_row: torch.Tensor | None = None):
        self.cache, self.slots, self.row_of_slot = cache, slots, row_of_slot
        self.lengths, self.width, self.start = lengths, width, start
        self.first_slot_of_row = first_slot_of_row
        self._masks: dict[int | None, torch.Tensor] = {}
        cache.ensure_clean(start + width)  # before any write: every written position stays below clean_length

    def mask(self, window: int | None) -> torch.Tensor:
        """[width, start + width] bool over (cached prefix, new tokens), True = may attend: causal,
        and within ``window`` when set (key position > query position - window)."""
        if window not in self._masks:
            device = self.slots.device
            q = torch.arange(self.start, self.start + self.width, device=device)[:, None]
            k = torch.arange(self.start + self.width, device=device)[None, :]
            allowed = k <= q
            if window is not None:
                allowed &= k > q - window
            self._masks[window] = allowed
        return self._masks[window]

    def real_tokens(self) -> torch.Tensor:
        """[P, width] bool: True at each row's real (non-padding) tokens."""
        return torch.arange(self.width, device=self.lengths.device)[None, :] < self.lengths[:, None]


class DecodeStep:
    """New tokens of the active rows ``0 .. R-1``: one per row at ``positions`` [R], or ``q`` consecutive
    ones per row at ``positions`` [R, q] (a speculative verification: the last token and the proposals;
    each query attends causally to its row's cache and to the earlier queries of its row).

    ``length`` given (a CUDA graph's static shapes, ``graphs.py``): attention reads positions ``:length``
    of every layer, sliding ones included, and nothing is read back to the host; the caller has made
    those positions clean (``EngineCache.ensure_clean``). None: ``max(positions) + 1``, made clean here."""

    def __init__(self, cache: EngineCache, positions: torch.Tensor, length: int | None = None):
        self.cache = cache
        # [R, 1] is one query per row: the [R] form, whose cache writes index one entry per row.
        self.positions = positions[:, 0] if positions.dim() == 2 and positions.shape[1] == 1 else positions
        self.rows = torch.arange(positions.shape[0], device=positions.device)
        self.static = length is not None
        self.length = length if self.static else int(positions.max()) + 1
        # The grouped-matmul attention (attention.py), which takes an additive bias: on CPU, and float32 anywhere.
        self.float_bias = cache.dtype == torch.float32 or positions.device.type == "cpu"
        self._masks: dict[int | None, tuple[int, torch.Tensor]] = {}
        if not self.static:
            cache.ensure_clean(self.length)

    def mask(self, window: int | None) -> tuple[int, torch.Tensor]:
        """``(first, mask)``: only positions ``first .. length - 1`` can be seen by any row; ``mask``
        covers them: ``[R, 1, q, length - first]``, an additive float32 bias (0 / -inf) for the grouped-matmul
        path (``float_bias``: on CPU, or a float32 cache), else bool (True = may attend, for SDPA)."""
        if window not in self._masks:
            first = 0 if window is None or self.static else max(0, int(self.positions.min()) - window + 1)
            k = torch.arange(first, self.length, device=self.positions.device)[None, None, :]
            query_positions = self.positions.view(self.positions.shape[0], -1, 1)  # [R, q, 1]
            keep = k <= query_positions  # [R, q, L']
            if window is not None:
                keep &= k > query_positions - window
            if self.float_bias:
                keep = torch.zeros(keep.shape, dtype=torch.float32, device=keep.device).masked_fill(~keep, float("-inf"))
            self._masks[window] = (first, keep[:, None])
        return self._masks[window]


class SequenceStep:
    """Whole right-padded sequences ``[B, length]`` in one causal forward that reads and writes no cache
    (the online draft's training: teacher and student forwards, ``draft_training.py``). ``cache`` only
    tells each layer its kind and window; a real token never sees a pad (pads come after it)."""

    def __init__(self, cache: EngineCache, length: int, device: torch.device):
        self.cache, self.length, self.device = cache, length, device
        self._masks: dict[int | None, torch.Tensor] = {}

    def mask(self, window: int | None) -> torch.Tensor:
        """[length, length] bool, True = may attend: causal, within ``window`` when set."""
        if window not in self._masks:
            q = torch.arange(self.length, device=self.device)[:, None]
            k = torch.arange(self.length, device=self.device)[None, :]
            allowed = k <= q
            if window is not None:
                allowed &= k > q - window
            self._masks[window] = allowed
        return self._masks[window]
