"""The native generation engine: the training code's own HF model, a static cache, continuous batching.

One ``generate`` call runs this loop until every requested sample is done::

    while samples wait or rows are active:
        admit waiting samples into free rows   # one prefill per prompt, its cache rows (keys/values,
                                               # latents, recurrent states) copied to its n samples;
                                               # a prefix the prompts share runs once
        decode one token for all active rows   # one forward over R rows, cache updated in place
        finished rows leave (last rows move into their slots)

Logprobs follow rl_core's convention (``log_softmax(logits / T)`` over the full vocabulary, before
masking; greedy reports T = 1), computed from the same transformers modules the trainer runs.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

from rl_backends_gen.native.attention import ATTENTION_NAME, register_attention
from rl_backends_gen.native.cache import EngineCache
from rl_backends_gen.native.layers import build_layer_caches
from rl_backends_gen.native.routing import RoutingRecorder
from rl_backends_gen.native.rows import ActiveRows, RowInfo
from rl_backends_gen.native.sampling import call_base_seed, draw_uniforms, sample_seed, sample_tokens
from rl_backends_gen.native.steps import DecodeStep, PrefillStep
from rl_backends_gen.requests import default_stop_token_ids, validate_prompts, validate_sampling
from rl_backends_gen.stop_strings import RowText, StopStringMatcher
from rl_backends_gen.weights import copy_weights_in_place
from rl_core.types import Completion, SamplingParams

logger = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DEFAULT_MAX_SEQ_LEN = 2048
MIN_SHARED_PREFIX = 8  # shorter common prefixes are not worth a forward of their own


@dataclass
class EngineStats:
    """Counters since construction (or the last ``reset``)."""

    prefill_forwards: int = 0
    prefill_prompts: int = 0
    prefill_tokens: int = 0  # padded tokens run through prefill (a shared prefix counted once)
    shared_prefix_tokens: int = 0  # prompt tokens not recomputed because a prefix was shared
    decode_steps: int = 0
    generated_tokens: int = 0

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
        record_routing: a mixture-of-experts model's completions carry ``routed_experts``, the experts
            every MoE layer chose for each token (``routing.py``), for the trainer to replay.
    """

    def __init__(self, model_path: str, *, dtype: str = "float32", device: str = "cpu", max_batch_size: int = 64,
                 max_seq_len: int | None = None, seed: int | None = None, tokenizer=None,
                 max_prefill_tokens: int = 16384, share_prompt_prefix: bool = True, record_routing: bool = False):
        from transformers import AutoModelForCausalLM

        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        register_attention()
        self.device = torch.device(device)
        self.dtype = DTYPES[dtype]
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=self.dtype, attn_implementation=ATTENTION_NAME)
        self.model = model.to(self.device).eval().requires_grad_(False)
        self.decoder = self.model.get_decoder()
        self.head = self.model.get_output_embeddings()
        self.tokenizer = _load_tokenizer(tokenizer, model_path)
        config = self.model.config
        self.vocab_size = config.vocab_size
        limit = getattr(config, "max_position_embeddings", None) or DEFAULT_MAX_SEQ_LEN
        self.max_seq_len = int(max_seq_len or min(limit, DEFAULT_MAX_SEQ_LEN))
        self.max_batch_size = max_batch_size
        self.max_prefill_tokens = max_prefill_tokens
        self.share_prompt_prefix = share_prompt_prefix
        self.default_stop_token_ids = default_stop_token_ids(self.tokenizer, config,
                                                             getattr(self.model, "generation_config", None))
        self._seed_generator = torch.Generator().manual_seed(seed) if seed is not None else None
        # One cache per decoder layer, of its kind (see cache.py); refuses layers the engine lacks.
        layers = build_layer_caches(self.model, max_batch_size, self.max_seq_len, self.dtype, self.device)
        self.cache = EngineCache(layers, max_batch_size, self.max_seq_len, self.dtype)
        self.routing = RoutingRecorder(self.model, self.decoder, self.cache, self.device) if record_routing else None
        self.stats = EngineStats()
        self.asleep = False
        self._logits_buffer = self._work_buffer = None  # [max_batch_size, V] float32, made on first use

    # ----------------------------------------------------------------------------------------- API

    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingParams) -> list[list[Completion]]:
        """``sampling.n`` completions per prompt, ``result[i][j]`` for sample j of prompt i."""
        validate_sampling(sampling, has_tokenizer=self.tokenizer is not None)
        prompts = validate_prompts(prompts, vocab_size=self.vocab_size, max_seq_len=self.max_seq_len)
        self._check_ready()
        if not prompts:
            return []
        with torch.inference_mode():
            return _GenerateCall(self, prompts, sampling).run()

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy new weights (HF names, full tensors) into the model in place; the cache is untouched."""
        self._check_alive()
        copy_weights_in_place(self.model, named_tensors)

    def sleep(self) -> None:
        """Free the cache; on CUDA also move the weights to CPU memory."""
        self._check_alive()
        self.cache.free()
        self._logits_buffer = self._work_buffer = None
        if self.device.type == "cuda":
            self.model.to("cpu")
            torch.cuda.empty_cache()
        self.asleep = True

    def wake(self) -> None:
        self._check_alive()
        if self.device.type == "cuda":
            self.model.to(self.device)
        if not self.cache.allocated:
            self.cache.allocate()
        self.asleep = False

    def shutdown(self) -> None:
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
        out = self.decoder(input_ids=input_ids, position_ids=position_ids, use_cache=False, rl_step=step)
        return out.last_hidden_state

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """``[B, hidden] -> [B, V]`` float32 logits, written into a buffer reused by every step (fresh
        [B, V] memory each step costs page faults comparable to the sampling work itself)."""
        if self._logits_buffer is None:
            shape = (self.max_batch_size, self.head.weight.shape[0])
            self._logits_buffer = torch.empty(shape, dtype=torch.float32, device=self.device)
            self._work_buffer = torch.empty_like(self._logits_buffer)
        out = self._logits_buffer[: hidden.shape[0]]
        if self.dtype == torch.float32 and type(self.head) is torch.nn.Linear and self.head.bias is None:
            return torch.mm(hidden, self.head.weight.t(), out=out)
        return out.copy_(self.head(hidden))


class _GenerateCall:
    """The scheduling loop of one ``generate`` call."""

    def __init__(self, engine: NativeEngine, prompts: list[list[int]], sampling: SamplingParams):
        self.engine, self.prompts, self.sampling = engine, prompts, sampling
        self.cache = engine.cache
        self.device = engine.device
        stop_ids = sampling.stop_token_ids or engine.default_stop_token_ids
        self.stop_ids = torch.tensor(stop_ids, dtype=torch.long, device=self.device)
        self.matcher = (StopStringMatcher(engine.tokenizer, sampling.stop_strings)
                        if sampling.stop_strings else None)
        self.base_seed = engine._base_seed(sampling)
        self.rows = ActiveRows(engine.max_batch_size, sampling.max_new_tokens, self.device)
        self.waiting = deque((i, j) for i in range(len(prompts)) for j in range(sampling.n))
        self.results: list[list[Completion | None]] = [[None] * sampling.n for _ in prompts]

    def run(self) -> list[list[Completion]]:
        while self.waiting or self.rows.count:
            if self._should_admit():
                self._admit()
            if self.rows.count:
                self._decode_step()
        return self.results  # type: ignore[return-value]

    # ----------------------------------------------------------------------------------- admission

    def _should_admit(self) -> bool:
        free = self.engine.max_batch_size - self.rows.count
        if not self.waiting or free == 0:
            return False
        # Each prefill is a forward of its own: wait until a worthwhile number of rows is free.
        wanted = min(len(self.waiting), max(1, self.engine.max_batch_size // 4))
        return self.rows.count == 0 or free >= wanted

    def _admit(self) -> None:
        """Move waiting samples into free rows: prefill each distinct prompt once."""
        free = self.engine.max_batch_size - self.rows.count
        admitted = [self.waiting.popleft() for _ in range(min(free, len(self.waiting)))]
        first_slot = self.rows.count
        for offset, (prompt_index, sample_index) in enumerate(admitted):
            self._init_row(first_slot + offset, prompt_index, sample_index)
        self.rows.count += len(admitted)
        # Group the admitted slots by prompt, then cut the prompts into prefill chunks.
        slots_of_prompt: dict[int, list[int]] = {}
        for offset, (prompt_index, _) in enumerate(admitted):
            slots_of_prompt.setdefault(prompt_index, []).append(first_slot + offset)
        for chunk in self._prefill_chunks(sorted(slots_of_prompt, key=lambda i: len(self.prompts[i]))):
            self._prefill(chunk, slots_of_prompt)
        self._retire_finished(list(range(first_slot, first_slot + len(admitted))))

    def _init_row(self, slot: int, prompt_index: int, sample_index: int) -> None:
        rows, prompt, sampling = self.rows, self.prompts[prompt_index], self.sampling
        rows.info[slot] = RowInfo(prompt_index, sample_index, prompt, RowText() if self.matcher else None)
        rows.num_generated[slot] = 0
        rows.position[slot] = len(prompt)
        rows.limit[slot] = min(sampling.max_new_tokens, self.cache.max_seq_len - len(prompt))
        if not sampling.greedy:
            seed = sample_seed(self.base_seed, prompt_index, sample_index)
            rows.uniforms[slot] = draw_uniforms(seed, sampling.max_new_tokens).to(self.device)

    def _prefill_chunks(self, prompt_indices: list[int]) -> list[list[int]]:
        """Consecutive groups whose padded size stays within ``max_prefill_tokens``."""
        chunks: list[list[int]] = []
        for index in prompt_indices:  # sorted by length, so the last one added is the longest
            if chunks and (len(chunks[-1]) + 1) * len(self.prompts[index]) <= self.engine.max_prefill_tokens:
                chunks[-1].append(index)
            else:
                chunks.append([index])
        return chunks

    def _prefill(self, prompt_indices: list[int], slots_of_prompt: dict[int, list[int]]) -> None:
        engine, device = self.engine, self.device
        prompts = [self.prompts[i] for i in prompt_indices]
        lengths = [len(p) for p in prompts]
        slots, row_of_slot = [], []
        for row, index in enumerate(prompt_indices):
            slots += slots_of_prompt[index]
            row_of_slot += [row] * len(slots_of_prompt[index])
        slots_t = torch.tensor(slots, device=device)
        row_of_slot_t = torch.tensor(row_of_slot, device=device)
        # Every prompt keeps at least its last token out of the shared prefix: its logits sample.
        start = common_prefix_length(prompts) if engine.share_prompt_prefix and len(prompts) > 1 else 0
        start = min(start, min(lengths) - 1)
        lengths_t = torch.tensor(lengths, device=device)
        if start >= MIN_SHARED_PREFIX:
            prefix = torch.tensor(prompts[0][:start], device=device)[None]
            prefix_step = PrefillStep(self.cache, slots_t, torch.zeros_like(slots_t),
                                      torch.tensor([start], device=device), start)
            engine._forward(prefix, torch.arange(start, device=device)[None], prefix_step)
            first_slot_of_row = torch.tensor([slots_of_prompt[i][0] for i in prompt_indices], device=device)
        else:
            start, first_slot_of_row = 0, None
        width = max(lengths) - start
        input_ids = torch.zeros(len(prompts), width, dtype=torch.long)
        for row, prompt in enumerate(prompts):
            input_ids[row, : lengths[row] - start] = torch.tensor(prompt[start:])
        positions = torch.arange(start, start + width, device=device).expand(len(prompts), width)
        step = PrefillStep(self.cache, slots_t, row_of_slot_t, lengths_t - start, width, start, first_slot_of_row)
        hidden = engine._forward(input_ids.to(device), positions, step)  # [P, width, hidden]
        last = lengths_t - start - 1
        logits = engine._logits(hidden[torch.arange(len(lengths), device=device), last])  # [P, V]
        self._sample_and_record(slots_t, logits[row_of_slot_t])
        engine.stats.prefill_forwards += 1 + (start > 0)
        engine.stats.prefill_prompts += len(prompt_indices)
        engine.stats.prefill_tokens += start + len(prompt_indices) * width
        engine.stats.shared_prefix_tokens += start * (len(prompt_indices) - 1)

    # -------------------------------------------------------------------------------------- decode

    def _decode_step(self) -> None:
        rows, count = self.rows, self.rows.count
        position = rows.position[:count]
        step = DecodeStep(self.cache, position)
        hidden = self.engine._forward(rows.last_token[:count, None], position[:, None], step)  # [R, 1, hidden]
        logits = self.engine._logits(hidden[:, -1])
        all_rows = step.rows
        rows.position[:count] += 1
        self._sample_and_record(all_rows, logits)
        self.engine.stats.decode_steps += 1
        self._retire_finished(list(range(count)))

    def _sample_and_record(self, slots: torch.Tensor, logits: torch.Tensor) -> None:
        rows = self.rows
        uniforms = rows.uniforms[slots, rows.num_generated[slots]]
        tokens, logprobs = sample_tokens(logits, self.sampling, uniforms, self.engine._work_buffer)
        rows.record(slots, tokens, logprobs)
        self.engine.stats.generated_tokens += slots.shape[0]

    # ---------------------------------------------------------------------------------- finishing

    def _retire_finished(self, candidates: list[int]) -> None:
        """Turn rows among ``candidates`` that just finished into Completions and free their slots."""
        rows = self.rows
        cand = torch.tensor(candidates, device=self.device)
        last = rows.last_token[cand]
        hit_stop = torch.isin(last, self.stop_ids)
        hit_limit = rows.num_generated[cand] >= rows.limit[cand]
        stopped = hit_stop.tolist()
        if self.matcher is not None:
            for k, (slot, token) in enumerate(zip(candidates, last.tolist())):
                if self.matcher.push(rows.info[slot].text, token):
                    stopped[k] = True
        done = [k for k, (s, lim) in enumerate(zip(stopped, hit_limit.tolist())) if s or lim]
        if not done:
            return
        for k in done:
            self._complete(candidates[k], "stop" if stopped[k] else "length")
        rows.compact([candidates[k] for k in done], self.cache)

    def _complete(self, slot: int, finish_reason: str) -> None:
        rows, info = self.rows, self.rows.info[slot]
        count = int(rows.num_generated[slot])
        token_ids = rows.tokens[slot, :count].tolist()
        tokenizer = self.engine.tokenizer
        text = tokenizer.decode(token_ids, skip_special_tokens=True) if tokenizer is not None else None
        self.results[info.prompt_index][info.sample_index] = Completion(
            prompt_token_ids=list(info.prompt),
            token_ids=token_ids,
            logprobs=rows.logprobs[slot, :count].tolist(),
            finish_reason=finish_reason,  # type: ignore[arg-type]
            text=text,
            routed_experts=self.engine.routing.read(slot, len(info.prompt) + count - 1) if self.engine.routing else None,
        )


def common_prefix_length(sequences: list[list[int]]) -> int:
    """Length of the longest prefix all ``sequences`` share."""
    shortest = min(len(s) for s in sequences)
    first = sequences[0]
    for k in range(shortest):
        token = first[k]
        if any(s[k] != token for s in sequences):
            return k
    return shortest


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
