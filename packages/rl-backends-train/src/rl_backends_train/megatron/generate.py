"""Decoding on a Megatron worker's own GPTModel (``generation.backend: megatron``): a decode loop over the
training model with a static KV cache (``kv_cache.py``), no weight conversion or copy.

Each data-parallel rank decodes a contiguous slice of the prompts; the ranks of its model-parallel group
(tensor-parallel ranks, pipeline stages) run every forward together. One ``generate_slice`` call::

    for each batch of up to max_batch_size samples:        # n samples of a prompt share one prefill
        allocate the cache, prefill the distinct prompts   # keys/values written into every sample's row
        while samples of the batch are unfinished:
            sample a token per row (last stage), share it with the model-parallel group
            finished rows leave the batch (their cache rows too)
            one forward of [R, 1] new tokens at per-row positions
        drop the cache

The library's conventions, shared with the native engine (``rl_backends_gen.native.sampling``,
``stop_strings``): the logprob of a token is ``log_softmax(logits / T)`` over the full vocabulary
before any masking (greedy reports T = 1); sample j of prompt i draws its uniforms from a seed mixed
from ``(base_seed + i, j)`` (i: the prompt's index in the whole call), so results depend neither on
the batch nor on the data-parallel split; stop tokens are kept; a stop string ends a sample at the
token that completes it. Finished rows are compacted out of the batch (an index copy of the cache),
but a batch is not refilled while it runs (no continuous batching).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from rl_backends_gen.native.sampling import draw_uniforms, sample_seed, sample_tokens
from rl_backends_gen.stop_strings import RowText, StopStringMatcher
from rl_backends_train.megatron.kv_cache import (
    DecodeStep,
    GenerationCache,
    PrefillStep,
    Steps,
    attention_modules,
    cached_attention,
)
from rl_core.types import Completion, SamplingParams


@dataclass
class GenerationStats:
    """Counters of one ``generate_slice`` call on this rank."""

    prefill_forwards: int = 0
    decode_steps: int = 0
    generated_tokens: int = 0
    peak_cache_bytes: int = 0


class StageRunner:
    """Forwards of this rank's part of the model: through every pipeline stage (activations sent point to
    point, model chunk by model chunk around the ring) to the logits on the last; each sampled token
    sent from the last stage's first tensor-parallel rank to the whole model-parallel group."""

    def __init__(self, model, device: torch.device) -> None:
        from megatron.core import parallel_state as ps

        self.chunks = model.model_chunks
        self.device = device
        self.pp = ps.get_pipeline_model_parallel_world_size()
        self.prev_rank = ps.get_pipeline_model_parallel_prev_rank() if self.pp > 1 else None
        self.next_rank = ps.get_pipeline_model_parallel_next_rank() if self.pp > 1 else None
        tp, self.tp_rank = ps.get_tensor_model_parallel_world_size(), ps.get_tensor_model_parallel_rank()
        self.group = ps.get_model_parallel_group() if tp * self.pp > 1 else None
        # Rank order tp-cp-ep-dp-pp (cp = 1 here): a pipeline stage is world / pp ranks further on.
        rank, stride = dist.get_rank(), dist.get_world_size() // self.pp
        self.sampler = rank - self.tp_rank + (self.pp - 1 - ps.get_pipeline_model_parallel_rank()) * stride
        self.hidden_size = model.config.hidden_size
        self.dtype = self.chunks[0].gpt.config.params_dtype

    @property
    def samples(self) -> bool:
        """This rank computes the logits."""
        return self.chunks[-1].stage.last

    def logits(self, input_ids: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor | None:
        """``[b, t, V]`` logits of ``input_ids [b, t]`` at ``position_ids`` on the last stage (None elsewhere)."""
        b, t = input_ids.shape
        input_ids, position_ids = input_ids.to(self.device), position_ids.to(self.device)
        out = None
        for chunk in self.chunks:
            if not chunk.stage.first:
                hidden = torch.empty(t, b, self.hidden_size, dtype=self.dtype, device=self.device)
                dist.recv(hidden, src=self.prev_rank)
                chunk.gpt.set_input_tensor(hidden)
            out = chunk(input_ids, position_ids=position_ids)
            if not chunk.stage.last:
                dist.send(out.hidden_states.contiguous(), dst=self.next_rank)
        return out.logits if self.samples else None

    def share(self, values: torch.Tensor) -> torch.Tensor:
        """The sampling rank's ``values`` on every rank of the model-parallel group."""
        if self.group is None:
            return values
        values = values.to(self.device)
        dist.broadcast(values, src=self.sampler, group=self.group)
        return values


@dataclass
class _Row:
    prompt_index: int  # in the slice
    sample_index: int
    limit: int  # tokens this sample may generate
    text: RowText | None
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)


class SliceDecoder:
    """``generate_slice`` for one model and call settings."""

    def __init__(self, model, runner: StageRunner, *, sampling: SamplingParams, base_seed: int, first_index: int,
                 stop_ids: tuple[int, ...], tokenizer, max_batch_size: int, max_seq_len: int) -> None:
        self.model, self.runner, self.sampling = model, runner, sampling
        self.base_seed, self.first_index = base_seed, first_index
        self.stop_ids, self.tokenizer = set(stop_ids), tokenizer
        self.matcher = StopStringMatcher(tokenizer, sampling.stop_strings) if sampling.stop_strings else None
        self.max_batch_size, self.max_seq_len = max_batch_size, max_seq_len
        self.device = runner.device
        self.steps = Steps()
        self.stats = GenerationStats()

    def generate_slice(self, prompts: list[list[int]]) -> list[list[Completion]]:
        """``sampling.n`` completions of each prompt; ``result[i][j]`` is sample j of ``prompts[i]``."""
        samples = [(i, j) for i in range(len(prompts)) for j in range(self.sampling.n)]
        results: list[list[Completion | None]] = [[None] * self.sampling.n for _ in prompts]
        with cached_attention(self.model, self.steps):
            for start in range(0, len(samples), self.max_batch_size):
                for row, completion in self._run_batch(prompts, samples[start:start + self.max_batch_size]):
                    results[row.prompt_index][row.sample_index] = completion
        return results  # type: ignore[return-value]

    def _run_batch(self, prompts: list[list[int]], samples: list[tuple[int, int]]):
        """Yield ``(row, Completion)`` for every sample of one batch."""
        rows = [self._new_row(prompts[i], i, j) for i, j in samples]
        distinct = sorted({i for i, _ in samples})
        cache = self._new_cache(len(rows), max(len(prompts[i]) + row.limit for (i, _), row in zip(samples, rows)))
        uniforms = self._uniforms(samples)  # [R, max_new_tokens] float64, unused when greedy
        lengths = torch.tensor([len(prompts[i]) for i in distinct])
        ids = torch.zeros(len(distinct), int(lengths.max()), dtype=torch.long)
        for p, i in enumerate(distinct):
            ids[p, : lengths[p]] = torch.tensor(prompts[i])
        row_of_slot = torch.tensor([distinct.index(i) for i, _ in samples], device=self.device)
        self.steps.current = PrefillStep(cache, torch.arange(len(rows), device=self.device), row_of_slot)
        logits = self.runner.logits(ids, torch.arange(ids.shape[1]).expand_as(ids))
        self.stats.prefill_forwards += 1
        if logits is not None:  # each prompt's last position, for each of its samples
            logits = logits[torch.arange(len(distinct), device=self.device), lengths.to(self.device) - 1][row_of_slot]
        position = torch.tensor([len(prompts[i]) for i, _ in samples], device=self.device)
        for step in range(self.sampling.max_new_tokens):  # every row of the batch has made `step` tokens
            tokens = self._sample(logits, uniforms[:, step], rows)
            keep = []
            for k, row in enumerate(rows):
                reason = self._finish_reason(row)
                if reason is None:
                    keep.append(k)
                else:
                    yield row, self._completion(prompts[row.prompt_index], row, reason)
            if not keep:
                break
            if len(keep) < len(rows):
                index = torch.tensor(keep, device=self.device)
                cache.keep_rows(index)
                rows, uniforms = [rows[k] for k in keep], uniforms[index.to(uniforms.device)]
                tokens, position = tokens[index], position[index]
            self.steps.current = DecodeStep(cache, position)
            logits = self.runner.logits(tokens[:, None], position[:, None])
            logits = logits[:, -1] if logits is not None else None
            position = position + 1
            self.stats.decode_steps += 1
        self.steps.current = None

    def _new_row(self, prompt: list[int], prompt_index: int, sample_index: int) -> _Row:
        limit = min(self.sampling.max_new_tokens, self.max_seq_len - len(prompt))
        return _Row(prompt_index, sample_index, limit, RowText() if self.matcher else None)

    def _new_cache(self, rows: int, length: int) -> GenerationCache:
        modules = attention_modules(self.model)
        first = modules[0]
        cache = GenerationCache(len(modules), rows, first.num_query_groups_per_partition, length,
                                first.hidden_size_per_attention_head, self.runner.dtype, self.device)
        self.stats.peak_cache_bytes = max(self.stats.peak_cache_bytes, cache.nbytes())
        return cache

    def _uniforms(self, samples: list[tuple[int, int]]) -> torch.Tensor:
        count = self.sampling.max_new_tokens
        if self.sampling.greedy:
            return torch.zeros(len(samples), count, dtype=torch.float64, device=self.device)
        return torch.stack([draw_uniforms(sample_seed(self.base_seed, self.first_index + i, j), count)
                            for i, j in samples]).to(self.device)

    def _sample(self, logits: torch.Tensor | None, uniforms: torch.Tensor, rows: list[_Row]) -> torch.Tensor:
        """Each row's next token (appended with its logprob to the row); returns the tokens ``[R]``."""
        picked = torch.zeros(len(rows), 2, dtype=torch.float64, device=self.device)  # token id, logprob
        if logits is not None:
            tokens, logprobs = sample_tokens(logits.float(), self.sampling, uniforms)
            picked = torch.stack([tokens.double(), logprobs.double()], dim=1)
        picked = self.runner.share(picked).cpu()
        for row, (token, logprob) in zip(rows, picked.tolist()):
            row.tokens.append(int(token))
            row.logprobs.append(float(logprob))
        self.stats.generated_tokens += len(rows)
        return picked[:, 0].long().to(self.device)

    def _finish_reason(self, row: _Row) -> str | None:
        token = row.tokens[-1]
        stopped = token in self.stop_ids
        if self.matcher is not None and self.matcher.push(row.text, token):
            stopped = True
        if stopped:
            return "stop"
        return "length" if len(row.tokens) >= row.limit else None

    def _completion(self, prompt: list[int], row: _Row, reason: str) -> Completion:
        text = self.tokenizer.decode(row.tokens, skip_special_tokens=True) if self.tokenizer is not None else None
        return Completion(prompt_token_ids=list(prompt), token_ids=row.tokens, logprobs=row.logprobs,
                          finish_reason=reason, text=text)  # type: ignore[arg-type]
