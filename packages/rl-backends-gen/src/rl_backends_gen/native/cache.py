"""The engine's cache: allocated once, one entry per decoder layer, of the kind that layer needs.

Kinds (every buffer's first axis is the cache row; the active rows of a batch are rows ``0 .. R-1``):

* ``AttentionKV``: keys and values ``[rows, kv_heads, max_seq_len, head_dim]`` of a full-attention
  layer, or of a sliding-window layer (``window`` set: every position is stored and the mask applies
  the window; a decode step reads only the positions some row's window still covers);
* ``LatentKV``: multi-head latent attention (DeepSeek-V2 / GLM-4.7-Flash): the normalised latent
  ``[rows, 1, max_seq_len, kv_lora_rank]`` and the shared rotary key ``[rows, 1, max_seq_len, rope_dim]``,
  instead of per-head keys and values (a decode step attends in the latent space);
* ``RecurrentState``: linear attention (gated delta-net) and Mamba-2 layers: the last
  ``conv_kernel - 1`` inputs of the causal convolution ``[rows, kernel - 1, channels]`` (channels last) and the
  recurrent state (``[rows, heads, key_dim, value_dim]`` / ``[rows, heads, head_dim, state_size]``),
  constant in size whatever the length: a decode step costs O(1) per token.

Positional kinds (the first two) hold position ``p`` of a row at index ``p`` of axis 2; a recurrent
state is the whole row. Layers without a token mixer of their own (Nemotron-H MLP / MoE blocks) have
no entry (None).
"""

from __future__ import annotations

import torch


class LayerCache:
    """Named buffers ``[max_rows, ...]`` of one layer; ``positional``: axis 2 is the position."""

    positional = True

    def __init__(self, shapes: dict[str, tuple[int, ...]], dtypes: dict[str, torch.dtype], device: torch.device):
        self.shapes, self.dtypes, self.device = shapes, dtypes, device
        self.buffers: dict[str, torch.Tensor] = {}

    def allocate(self) -> None:
        # torch.empty: on CPU the pages are only committed when they are first written.
        self.buffers = {name: torch.empty(shape, dtype=self.dtypes[name], device=self.device)
                        for name, shape in self.shapes.items()}

    def free(self) -> None:
        self.buffers = {}

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.buffers[name]

    def zero_positions(self, start: int, end: int) -> None:
        for buffer in self.buffers.values():
            buffer[:, :, start:end].zero_()

    def move_rows(self, src: torch.Tensor, dst: torch.Tensor, length: int) -> None:
        for buffer in self.buffers.values():
            if self.positional:
                buffer[dst, :, :length] = buffer[src, :, :length]
            else:
                buffer[dst] = buffer[src]


class AttentionKV(LayerCache):
    """Keys and values of a softmax-attention layer; ``window``: sliding-window size (None: full)."""

    def __init__(self, rows: int, max_seq_len: int, kv_heads: int, head_dim: int, dtype: torch.dtype,
                 device: torch.device, window: int | None = None):
        shape = (rows, kv_heads, max_seq_len, head_dim)
        super().__init__({"keys": shape, "values": shape}, {"keys": dtype, "values": dtype}, device)
        self.window = window


class LatentKV(LayerCache):
    """Multi-head latent attention: the compressed key/value latent and the shared rotary key."""

    def __init__(self, rows: int, max_seq_len: int, latent_dim: int, rope_dim: int, dtype: torch.dtype,
                 device: torch.device):
        shapes = {"latent": (rows, 1, max_seq_len, latent_dim), "rope_key": (rows, 1, max_seq_len, rope_dim)}
        super().__init__(shapes, {"latent": dtype, "rope_key": dtype}, device)


class RecurrentState(LayerCache):
    """The causal convolution's last inputs and the recurrent (delta-rule / SSM) state of one layer."""

    positional = False

    def __init__(self, rows: int, conv_channels: int, conv_kernel: int, state_shape: tuple[int, ...],
                 dtype: torch.dtype, state_dtype: torch.dtype, device: torch.device):
        shapes = {"conv": (rows, conv_kernel - 1, conv_channels), "state": (rows, *state_shape)}  # conv: channels last
        super().__init__(shapes, {"conv": dtype, "state": state_dtype}, device)


class EngineCache:
    """The per-layer caches of one engine (``layers[i]`` belongs to decoder layer i, None: no cache), and
    ``extras``: per-row entries beside them (a routing record) that move, sleep and wake with the rows."""

    def __init__(self, layers: list[LayerCache | None], max_rows: int, max_seq_len: int, dtype: torch.dtype):
        self.layers, self.max_rows, self.max_seq_len, self.dtype = layers, max_rows, max_seq_len, dtype
        self.extras: list[LayerCache] = []
        self.clean_length = 0
        self.allocate()

    def _present(self) -> list[LayerCache]:
        return [layer for layer in self.layers if layer is not None] + self.extras

    @property
    def allocated(self) -> bool:
        return all(layer.buffers for layer in self._present())

    def allocate(self) -> None:
        for layer in self._present():
            layer.allocate()
        self.clean_length = 0

    def free(self) -> None:
        for layer in self._present():
            layer.free()
        self.clean_length = 0

    def buffers(self) -> list[torch.Tensor]:
        return [t for layer in self._present() for t in layer.buffers.values()]

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.buffers())

    def ensure_clean(self, length: int) -> None:
        """Make positions ``:length`` of every positional buffer finite.

        A decode step attends over ``[:R, :, :L]`` and masks what a row has not written; masking
        zeroes the weight of a key, but ``0 * NaN`` is still NaN, so never-written memory must not
        hold NaN/inf. Positions are zeroed once, the first time any step reaches them; after that
        they only ever hold real (finite) entries of earlier rows. Every step calls this before it
        writes, so written positions are always below ``clean_length`` and zeroing never touches live
        data. (A recurrent state is written whole by the prefill of its row before any read.)
        """
        if length <= self.clean_length:
            return
        for layer in self._present():
            if layer.positional:
                layer.zero_positions(self.clean_length, length)
        self.clean_length = length

    def move_rows(self, src: torch.Tensor, dst: torch.Tensor, length: int) -> None:
        """Copy rows ``src`` to rows ``dst`` (positions ``:length``; recurrent states whole) in every layer."""
        for layer in self._present():
            layer.move_rows(src, dst, length)
