"""The native generation engine: the training code's own HF model, a static cache, continuous batching.

One ``generate`` call runs this loop until every requested sample is done::

    while samples wait or rows are active:
        admit waiting samples into free rows   # one prefill per prompt, its cache rows (keys/values,
                                               # latents, recurrent states) copied to its n samples;
                                               # a prefix the prompts share runs once
        decode one token for all active rows   # one forward over R rows, cache updated in place (on CUDA a
                                               # replayed graph of it, graphs.py)
        finished rows leave (last rows move into their slots)

Logprobs follow rl_core's convention (``log_softmax(logits / T)`` over the full vocabulary, before
masking; greedy reports T = 1), computed from the same transformers modules the trainer runs.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

from rl_backends_gen.native.attention import ATTENTION_NAME, register_attention
from rl_backends_gen.native.cache import EngineCache
from rl_backends_gen.native.call import GenerateCall
from rl_backends_gen.native.direct import DirectDecode
from rl_backends_gen.native.fp8 import quantize_engine_weights
from rl_backends_gen.native.graphs import build_decode_graphs
from rl_backends_gen.native.layers import build_layer_caches
from rl_backends_gen.native.routing import RoutingRecorder
from rl_backends_gen.native.sampling import call_base_seed
from rl_backends_gen.native.steps import DecodeStep
from rl_backends_gen.native.vision import VisionPrefill, load_model
from rl_backends_gen.requests import default_stop_token_ids, image_prompts, validate_prompts, validate_sampling
from rl_backends_gen.weights import copy_weights_in_place
from rl_core.protocols import Prompt
from rl_core.types import Completion, SamplingParams

logger = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DEFAULT_MAX_SEQ_LEN = 2048


@dataclass
class EngineStats:
    """Counters since construction (or the last ``reset``)."""

    prefill_forwards: int = 0
    prefill_prompts: int = 0
    prefill_tokens: int = 0  # padded tokens run through prefill (a shared prefix counted once)
    shared_prefix_tokens: int = 0  # prompt tokens not recomputed because a prefix was shared
    decode_steps: int = 0
    generated_tokens: int = 0
    static_decode_steps: int = 0  # decode steps at a graph's padded shapes (graphs.py), replayed or eager
    graph_replays: int = 0  # of those, CUDA graph replays
    graph_captures: int = 0

    def reset(self) -> None:
        self.__init__()


class NativeEngine:
    """A ``GenerationBackend`` that runs the HF model itself.

    Args:
        model_path: a local HF directory (config + safetensors, tokenizer optional).
        dtype: weights, activations and KV cache dtype; logits are upcast to float32.
        device: "cpu" or "cuda" (or "cuda:N").
        max_batch_size: rows decoded together; more requests wait and join as rows finish.
        max_seq_len: longest prompt + completion; default ``min(max_position_embeddings, 2048)``.
        seed: draws the base seed of calls whose ``SamplingParams.seed`` is None (None: fresh entropy).
        tokenizer: a tokenizer object or path; default: the one in ``model_path`` when present
            (needed for ``text`` and stop strings).
        max_prefill_tokens: padded tokens per prefill forward (bounds activation memory).
        share_prompt_prefix: the prompts of one prefill that start with the same tokens (a system
            prompt, a template: at least 8) run that prefix once, its keys/values copied to every
            row; the rest of each prompt attends to it. The same function, fewer prefill FLOPs.
        quantization: "fp8": the eligible linears' weights in float8_e4m3fn with ``fp8_scheme`` scales
            ("per_channel", the default, or "block"), re-quantized at every refit (see ``native/fp8.py``).
        speculative: a ``SpeculativeConfig``: decode steps propose and verify several tokens per row
            (``speculative.py``); None: one token per step.
        record_routing: a mixture-of-experts model's completions carry ``routed_experts``, the experts
            every MoE layer chose for each token (``routing.py``), for the trainer to replay.
        decode_graphs: "auto": on CUDA, each decode step (decoder and LM head) replays a CUDA graph
            captured for its padded shapes (``graphs.py``) when the model is eligible (softmax attention
            only, text only, no MoE, no speculative decoding or routing record), else runs eagerly;
            "off": always eagerly; "static": the graphs' padded shapes run eagerly, without capture
            (on any device; tests hold it to the eager step).
        direct_decode: on CPU, decode steps of a Llama, Mistral, Qwen2, Qwen3, Qwen3-MoE, Mixtral or Qwen3.5
            (dense or MoE) model run the engine's own forward over the same weights (``direct.py``,
            ``direct_qwen3_5.py``: packed projections, no per-layer transformers wrappers; the same values,
            tested bitwise; not with ``record_routing``); False: transformers' forward.
    """

    def __init__(self, model_path: str, *, dtype: str = "float32", device: str = "cpu", max_batch_size: int = 64,
                 max_seq_len: int | None = None, seed: int | None = None, tokenizer=None,
                 max_prefill_tokens: int = 16384, share_prompt_prefix: bool = True, quantization: str | None = None,
                 fp8_scheme: str | None = None, speculative=None, record_routing: bool = False,
                 decode_graphs: str = "auto", direct_decode: bool = True):
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        register_attention()
        self.device = torch.device(device)
        self.dtype = DTYPES[dtype]
        model = load_model(model_path, self.dtype, ATTENTION_NAME)  # a vision-language model too (vision.py)
        self.model = model.to(self.device).eval().requires_grad_(False)
        self.vision = VisionPrefill.of(self.model)  # None for a text-only model
        self.decoder = self.model.get_decoder()
        self.head = self.model.get_output_embeddings()
        self.tokenizer = _load_tokenizer(tokenizer, model_path)
        config = self.model.config.get_text_config()
        self.vocab_size = config.vocab_size
        limit = getattr(config, "max_position_embeddings", None) or DEFAULT_MAX_SEQ_LEN
        self.max_seq_len = int(max_seq_len or min(limit, DEFAULT_MAX_SEQ_LEN))
        self.max_batch_size = max_batch_size
        self.max_prefill_tokens = max_prefill_tokens
        self.share_prompt_prefix = share_prompt_prefix
        self.default_stop_token_ids = default_stop_token_ids(self.tokenizer, self.model.config,
                                                             getattr(self.model, "generation_config", None))
        self._seed_generator = torch.Generator().manual_seed(seed) if seed is not None else None
        # One cache per decoder layer, of its kind (see cache.py); refuses layers the engine lacks.
        layers = build_layer_caches(self.model, max_batch_size, self.max_seq_len, self.dtype, self.device)
        self.cache = EngineCache(layers, max_batch_size, self.max_seq_len, self.dtype)
        # After the caches: their construction recognises attention by its nn.Linear projections.
        self.fp8_layers = quantize_engine_weights(self.model, quantization, fp8_scheme)
        self.routing = RoutingRecorder(self.model, self.decoder, self.cache, self.device) if record_routing else None
        # Llama-style and Qwen3.5 decoders on CPU: the engine's own decode forward (direct.py); None: transformers'.
        self.direct_decode = DirectDecode.of(self) if direct_decode else None
        self.stats = EngineStats()
        self.speculative = None
        if speculative is not None:  # the proposer (n-gram or a draft with its own cache) and verification
            from rl_backends_gen.native.speculative import Speculator

            self.speculative = Speculator(self, speculative)
        self.asleep = False
        self._logits_buffer = self._work_buffer = None  # [max_batch_size, V] float32, made on first use
        self.decode_graphs = build_decode_graphs(self, decode_graphs)  # None: every decode step runs eagerly

    # ----------------------------------------------------------------------------------------- API

    def generate(self, prompts: Sequence[Prompt], sampling: SamplingParams) -> list[list[Completion]]:
        """``sampling.n`` completions per prompt, ``result[i][j]`` for sample j of prompt i; a prompt with images
        (an ``EncodedChat``) needs a vision-language model."""
        validate_sampling(sampling, has_tokenizer=self.tokenizer is not None)
        images = image_prompts(prompts)
        if images is not None and self.vision is None:
            raise ValueError("a prompt holds images but this engine's model is text-only (no vision_config)")
        prompts = validate_prompts(prompts, vocab_size=self.vocab_size, max_seq_len=self.max_seq_len)
        self._check_ready()
        if not prompts:
            return []
        with torch.inference_mode():
            if self.speculative is not None:
                if images is not None:
                    raise ValueError("speculative decoding takes text prompts only: a prompt holds images; "
                                     "set generation.speculative=null for a vision-language model")
                return self.speculative.call(self, prompts, sampling).run()
            return GenerateCall(self, prompts, sampling, images).run()

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy new weights (HF names, full tensors) into the model in place; the cache is untouched."""
        self._check_alive()
        copy_weights_in_place(self.model, named_tensors)

    def sleep(self) -> None:
        """Free the cache; on CUDA also move the weights to CPU memory."""
        self._check_alive()
        if self.decode_graphs is not None:  # they hold the weights', cache's and logits buffer's addresses
            self.decode_graphs.drop()
        self.cache.free()
        self._logits_buffer = self._work_buffer = None
        if self.speculative is not None:
            self.speculative.free()
        if self.device.type == "cuda":
            self.model.to("cpu")
            if self.speculative is not None:
                self.speculative.move_weights("cpu")
            torch.cuda.empty_cache()
        self.asleep = True

    def wake(self) -> None:
        self._check_alive()
        if self.device.type == "cuda":
            self.model.to(self.device)
            if self.speculative is not None:
                self.speculative.move_weights(self.device)
        if not self.cache.allocated:
            self.cache.allocate()
        if self.speculative is not None:
            self.speculative.allocate()
        self.asleep = False

    def shutdown(self) -> None:
        if self.decode_graphs is not None:
            self.decode_graphs.drop()
        self.cache.free()
        self._logits_buffer = self._work_buffer = None
        self.model = self.decoder = self.head = None

    # ------------------------------------------------------------------------------------ helpers

    def _check_alive(self) -> None:
        if self.model is None:
            raise RuntimeError("this NativeEngine was shut down; build a new one")

    def _check_ready(self) -> None:
        self._check_alive()
        if self.asleep:
            raise RuntimeError("the engine is asleep (its cache is freed); call wake() before generate()")

    def _base_seed(self, sampling: SamplingParams) -> int:
        return call_base_seed(sampling.seed, self._seed_generator)

    def _forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, step) -> torch.Tensor:
        """Final hidden states ``[B, L, hidden]`` of the decoder, attention routed through ``step``."""
        if self.direct_decode is not None and isinstance(step, DecodeStep):
            return self.direct_decode.forward(input_ids, position_ids, step)
        out = self.decoder(input_ids=input_ids, position_ids=position_ids, use_cache=False, rl_step=step)
        return out.last_hidden_state

    def _decode_logits(self, tokens: torch.Tensor, positions: torch.Tensor, rotary: torch.Tensor) -> torch.Tensor:
        """``[R, V]`` float32 logits of one decode step of rows ``0 .. R-1`` (their last ``tokens``, cache
        ``positions`` and ``rotary`` positions, each [R]): a CUDA graph's replay when there is one."""
        if self.decode_graphs is not None:
            logits = self.decode_graphs.logits(tokens, positions, rotary)
            if logits is not None:
                return logits
        step = DecodeStep(self.cache, positions)
        hidden = self._forward(tokens[:, None], rotary[:, None], step)  # [R, 1, hidden]
        return self._logits(hidden[:, -1])

    def _allocate_logits_buffers(self) -> None:
        if self._logits_buffer is None:
            shape = (self.max_batch_size, self.head.weight.shape[0])
            self._logits_buffer = torch.empty(shape, dtype=torch.float32, device=self.device)
            self._work_buffer = torch.empty_like(self._logits_buffer)

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """``[B, hidden] -> [B, V]`` float32 logits, written into a buffer reused by every step (fresh
        [B, V] memory each step costs page faults comparable to the sampling work itself)."""
        self._allocate_logits_buffers()
        out = self._logits_buffer[: hidden.shape[0]]
        if self.dtype == torch.float32 and type(self.head) is torch.nn.Linear and self.head.bias is None:
            return torch.mm(hidden, self.head.weight.t(), out=out)
        return out.copy_(self.head(hidden))


def _load_tokenizer(tokenizer, model_path: str):
    if tokenizer is not None and not isinstance(tokenizer, str):
        return tokenizer
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(tokenizer or model_path)
    except (OSError, ValueError) as err:
        if tokenizer is not None:
            raise
        logger.warning("no tokenizer in %s (%s): completions carry no text and stop strings are off", model_path, err)
        return None
