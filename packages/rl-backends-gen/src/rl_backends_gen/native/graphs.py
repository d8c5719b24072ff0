"""CUDA graphs of the native engine's decode forward (decoder and LM head), one per pair of buckets.

An eager decode step of a small model on a GPU is bound by kernel launches and the HF modules' Python
(~18 ms per step for SmolLM2-135M's 30 layers, whatever the batch); a captured graph replays the same
kernels at once. A graph has fixed shapes, so a step runs at its buckets' shapes:

* rows: the R active rows padded to the next row bucket (1, 2, 4, 8, 16, then multiples of 32, and
  max_batch_size). Padded rows are free cache rows: they run token 0 at position 0, which writes a finite
  key/value at position 0 of their own rows (a later prefill of the row overwrites it) and nothing a live
  row reads;
* keys: every layer attends over cache positions ``:L``, L the next multiple of ``length_step`` above
  every row's position (at most max_seq_len), masked per row on the device (``DecodeStep(..., length=L)``).

The static inputs (last tokens, cache positions, rotary positions ``[max_batch_size]``) are the same
tensors in every graph, filled before each replay; a graph writes the engine's logits buffer ``[R_bucket,
V]`` float32, which the eager sampler reads before the next replay. Graphs are captured the first time
their buckets are needed (warm-up forwards on a side stream first, as ``torch.cuda.graphs`` documents) and
share one memory pool: one replays at a time and keeps nothing alive past its replay but the logits buffer,
which lives outside the pool. ``update_weights`` copies into the same storage, so graphs stay valid;
``sleep`` moves the weights and frees the cache, so it drops them (``wake`` recaptures lazily).

``mode="static"`` runs the same padded shapes eagerly, without capture: the CPU tests hold it to the plain
decode step, token for token.
"""

from __future__ import annotations

import bisect
import logging

import torch

from rl_backends_gen.native.cache import AttentionKV
from rl_backends_gen.native.steps import DecodeStep

logger = logging.getLogger(__name__)

MODES = ("auto", "off", "static")
LENGTH_STEP = 256  # key-length buckets: a few graphs per row bucket, at most 255 masked keys read per row
WARMUP_FORWARDS = 2
MOE_CONFIG_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")


def build_decode_graphs(engine, mode: str) -> DecodeGraphs | None:
    """The engine's ``DecodeGraphs`` for ``mode`` (module docstring), or None: eager decode steps.

    auto: CUDA graphs on CUDA for an eligible model (``ineligibility``), else None; off: None; static:
    the graphs' shapes without capture (on any device), refused for a model that is not eligible."""
    if mode not in MODES:
        raise ValueError(f"decode_graphs must be one of {', '.join(MODES)}, got {mode!r}")
    if mode == "off" or (mode == "auto" and engine.device.type != "cuda"):
        return None
    reason = ineligibility(engine)
    if reason is not None:
        if mode == "static":
            raise ValueError(f"decode_graphs='static' needs a model whose decode forward has static shapes: {reason}")
        logger.info("NativeEngine: decode steps run eagerly, without CUDA graphs: %s", reason)
        return None
    return DecodeGraphs(engine, capture=mode == "auto")


def ineligibility(engine) -> str | None:
    """Why the engine's decode forward cannot be captured as it is (None: it can)."""
    if engine.vision is not None:
        return "a vision-language model"
    if engine.speculative is not None:
        return "speculative decoding"
    if engine.routing is not None:
        return "record_routing"
    if not all(isinstance(layer, AttentionKV) for layer in engine.cache.layers):
        return "a layer other than softmax attention (latent, recurrent or a block without a token mixer)"
    config = engine.model.config.get_text_config()
    if any(getattr(config, key, None) for key in MOE_CONFIG_KEYS):
        return "a mixture of experts"  # transformers' experts forwards size their work from the routing
    if any(_reads_positions_on_host(module) for module in engine.model.modules()):
        return "a dynamic or longrope rotary embedding (it reads the longest position on the host)"
    return None


def _reads_positions_on_host(module) -> bool:
    kinds = getattr(module, "rope_type", None)  # a rotary embedding's: a str, or {layer type: str}
    kinds = kinds.values() if isinstance(kinds, dict) else [kinds]
    return any(isinstance(kind, str) and ("dynamic" in kind or kind == "longrope") for kind in kinds)


_SIDE_STREAMS: dict[torch.device, torch.cuda.Stream] = {}


def _side_stream(device: torch.device) -> torch.cuda.Stream:
    """One warm-up stream per device for the process: cuBLAS keeps a workspace (32 MiB on Hopper) for every
    stream it has run on, never freed, so a fresh stream per capture would leak one per capture."""
    if device not in _SIDE_STREAMS:
        _SIDE_STREAMS[device] = torch.cuda.Stream(device)
    return _SIDE_STREAMS[device]


def row_buckets(max_rows: int) -> list[int]:
    """Row counts a graph is captured for: 1, 2, 4, 8, 16, multiples of 32, and ``max_rows``."""
    return [b for b in (1, 2, 4, 8, 16) if b < max_rows] + list(range(32, max_rows, 32)) + [max_rows]


class DecodeGraphs:
    """Captured decode forwards keyed by (row bucket, key-length bucket); ``capture=False``: the same
    shapes run eagerly."""

    def __init__(self, engine, capture: bool, length_step: int = LENGTH_STEP):
        self.engine, self.capture, self.length_step = engine, capture, length_step
        self.row_buckets = row_buckets(engine.max_batch_size)
        self.graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self.pool = None  # one memory pool for every graph of this engine
        self.inputs: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None  # tokens, positions, rotary
        self.failed = False

    def logits(self, tokens: torch.Tensor, positions: torch.Tensor, rotary: torch.Tensor) -> torch.Tensor | None:
        """``[R, V]`` float32 logits of one decode step of rows ``0 .. R-1`` (``tokens``, cache ``positions``
        and ``rotary`` positions, each [R]); their keys/values written to the cache. None when a capture
        failed: the caller runs the eager step."""
        if self.failed:
            return None
        count = tokens.shape[0]
        rows = self.row_buckets[bisect.bisect_left(self.row_buckets, count)]
        needed = int(positions.max()) + 1  # on the host, outside the graph
        length = min(-(-needed // self.length_step) * self.length_step, self.engine.max_seq_len)
        self.engine.cache.ensure_clean(length)  # never inside a capture: it would zero live entries at replay
        self._fill(rows, tokens, positions, rotary)
        stats = self.engine.stats
        if not self.capture:
            stats.static_decode_steps += 1
            return self._forward(rows, length)[:count]
        graph = self.graphs.get((rows, length)) or self._capture(rows, length)
        if graph is None:
            return None
        graph.replay()
        stats.static_decode_steps += 1
        stats.graph_replays += 1
        return self.engine._logits_buffer[:count]

    def drop(self) -> None:
        """Release every graph, the pool and the static inputs (``sleep``: weights and cache move)."""
        self.graphs.clear()
        self.pool = self.inputs = None

    def _fill(self, rows: int, tokens: torch.Tensor, positions: torch.Tensor, rotary: torch.Tensor) -> None:
        if self.inputs is None:
            size, device = self.engine.max_batch_size, self.engine.device
            self.inputs = tuple(torch.zeros(size, dtype=torch.long, device=device) for _ in range(3))
        count = tokens.shape[0]
        for static, value in zip(self.inputs, (tokens, positions, rotary)):
            static[:count].copy_(value)
            static[count:rows].zero_()  # padded rows: token 0 at position 0 of their own free cache row

    def _forward(self, rows: int, length: int) -> torch.Tensor:
        """The step at static shapes: logits ``[rows, V]`` in the engine's logits buffer."""
        tokens, positions, rotary = (t[:rows] for t in self.inputs)
        step = DecodeStep(self.engine.cache, positions, length=length)
        hidden = self.engine._forward(tokens[:, None], rotary[:, None], step)  # [rows, 1, hidden]
        return self.engine._logits(hidden[:, -1])

    def _capture(self, rows: int, length: int) -> torch.cuda.CUDAGraph | None:
        """Capture the step at (rows, length) with the inputs just filled. The warm-up forwards are the
        step itself (they write the same keys/values the replay writes). On failure: a warning, and this
        engine's decode steps run eagerly from now on."""
        engine = self.engine
        try:
            engine._allocate_logits_buffers()  # outside the pool: the graphs write it, the sampler reads it
            if self.pool is None:
                self.pool = torch.cuda.graph_pool_handle()
            side = _side_stream(engine.device)
            side.wait_stream(torch.cuda.current_stream(engine.device))
            with torch.cuda.stream(side):
                for _ in range(WARMUP_FORWARDS):
                    self._forward(rows, length)
            torch.cuda.current_stream(engine.device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                self._forward(rows, length)
        except Exception as err:  # noqa: BLE001 - graphs only save time: never fail generation for them
            logger.warning("NativeEngine: capturing the decode step as a CUDA graph failed (%s: %s); decode "
                           "steps run eagerly from now on", type(err).__name__, err)
            self.drop()
            self.failed = True
            return None
        self.graphs[(rows, length)] = graph
        engine.stats.graph_captures += 1
        return graph
