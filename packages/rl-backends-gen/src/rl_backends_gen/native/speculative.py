"""Speculative decoding in the native engine: propose, verify in one forward, keep a prefix.

One decode step of a speculative generate call::

    if active rows x (k + 1) > max_batch_rows:       # wide: a verify forward would be compute bound
        a plain step                                 # (an own-cache draft still reads the last tokens)
    else:
        proposals = proposer.propose(rows, k)        # n-gram lookup, or k forwards of a draft model
        logits    = target forward of [last token, proposals] at each row's next positions   # [R, 1 + k, V]
        emitted   = verify(logits, proposals)        # accepted prefix + one correction / bonus token
        cut each row at a stop token / stop string / its length limit; record; finished rows leave

Adaptive: on the CPU (and on a GPU at small batch) a decode step of few rows is bound by reading the
weights, so a (k + 1)-query verify costs little more than a plain step; with many rows it is bound by
compute and costs up to k + 1 plain steps. An RL rollout starts wide (every sample decoding) and ends
with a long tail of few long rows: the tail speculates, the wide phase runs plain steps (as vLLM and
SGLang disable speculation above a batch size). Switching is invisible in the output: verification
emits exactly the plain sampler's tokens (``verify.py``).

Rows accept different numbers of tokens. Rollback is free for every cache of the target and the draft:
a row's entries past its new length are never read (the per-row mask) and are overwritten when the row
gets there. Recurrent layers (whose state is the whole history) are refused. Admission, prefill,
continuous batching, stop handling and the Completion records are the plain engine's.

Randomness: token index t of a sample uses the plain engine's uniform ``u[t]``, so a sample depends only
on its seed and the logits, never on the batch or on which steps speculated.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, fields

import torch

from rl_backends_gen.config import SpeculativeConfig
from rl_backends_gen.native.call import GenerateCall
from rl_backends_gen.native.proposers import (
    DraftProposer,
    NgramProposer,
    build_draft,
    proposal_uniforms,
    refuse_recurrent,
)
from rl_backends_gen.native.rows import ActiveRows
from rl_backends_gen.native.steps import DecodeStep
from rl_backends_gen.native.verify import verify


@dataclass
class SpeculativeStats:
    """Counters of speculative steps (since the last ``pop_metrics``; ``last_call``: one generate call)."""

    verify_steps: int = 0
    plain_steps: int = 0  # steps that did not speculate: too many active rows (max_batch_rows)
    row_steps: int = 0  # (row, step) pairs verified
    drafted_row_steps: int = 0  # of which had at least one proposal
    proposed_tokens: int = 0
    accepted_tokens: int = 0
    emitted_tokens: int = 0
    draft_seconds: float = 0.0
    total_seconds: float = 0.0
    vocab_tokens: int = 0  # draft_vocab_size: completion tokens, and of them those in the draft vocabulary
    vocab_covered: int = 0

    def add(self, other: SpeculativeStats) -> None:
        for field in fields(self):
            setattr(self, field.name, getattr(self, field.name) + getattr(other, field.name))

    def metrics(self) -> dict[str, float]:
        """``acceptance_rate``: accepted / proposed tokens; ``mean_accepted_length``: proposals accepted per
        row and step that proposed any (0 .. num_tokens); ``tokens_per_row_step``: tokens a row emits per
        verify forward (plain decoding: 1); ``draft_time_share``: time proposing / generate time;
        ``speculative_step_share``: decode steps that speculated / all decode steps; with a draft vocabulary,
        ``draft_vocab_coverage``: the completions' tokens it held / all of them."""
        coverage = {} if not self.vocab_tokens else {"draft_vocab_coverage": self.vocab_covered / self.vocab_tokens}
        return coverage | {
            "acceptance_rate": self.accepted_tokens / max(self.proposed_tokens, 1),
            "mean_accepted_length": self.accepted_tokens / max(self.drafted_row_steps, 1),
            "tokens_per_row_step": self.emitted_tokens / max(self.row_steps, 1),
            "draft_time_share": self.draft_seconds / max(self.total_seconds, 1e-9),
            "speculative_step_share": self.verify_steps / max(self.verify_steps + self.plain_steps, 1),
            "proposed_tokens": float(self.proposed_tokens),
            "accepted_tokens": float(self.accepted_tokens),
        }


class Speculator:
    """What an engine built with ``speculative=`` holds: the proposer, its buffers and statistics."""

    def __init__(self, engine, cfg: SpeculativeConfig):
        refuse_recurrent(engine.cache.layers, f"{engine.model.config.model_type}")
        self.cfg = cfg
        self.num_tokens = cfg.num_tokens
        self.max_batch_rows = cfg.max_batch_rows
        if cfg.method == "ngram":
            self.proposer: NgramProposer | DraftProposer = NgramProposer(cfg.ngram.min_n, cfg.ngram.max_n)
        else:
            self.proposer = build_draft(engine, cfg.draft_model, cfg.policy_layers, trained=cfg.train_draft,
                                        vocab_size=cfg.draft_vocab_size)
        self.trainer = None  # train_draft: the caller's training loop calls trainer.train(rollouts, loss)
        if cfg.train_draft:
            from rl_backends_gen.native.draft_training import DraftTrainer

            self.trainer = DraftTrainer(engine, self.proposer, cfg.draft_lr, cfg.draft_steps, cfg.draft_top_k)
        self.stats = SpeculativeStats()  # since the last pop_metrics
        self.last_call = SpeculativeStats()
        self._logits = self._work = None  # [max_rows x (k + 1), V] float32, made on first use

    def call(self, engine, prompts, sampling) -> SpeculativeCall:
        return SpeculativeCall(engine, prompts, sampling, self)

    def pop_metrics(self) -> dict[str, float]:
        """Metrics of every generate call since the last pop (GRPO logs them per step as ``spec/*``)."""
        out, self.stats = self.stats.metrics(), SpeculativeStats()
        return out

    def logits(self, engine, hidden: torch.Tensor) -> torch.Tensor:
        """``[N, hidden] -> [N, V]`` float32 target logits into a buffer reused by every step."""
        if self._logits is None:
            shape = (engine.max_batch_size * (self.num_tokens + 1), engine.head.weight.shape[0])
            self._logits = torch.empty(shape, dtype=torch.float32, device=engine.device)
            self._work = torch.empty_like(self._logits)
        out = self._logits[: hidden.shape[0]]
        return out.copy_(engine.head(hidden))

    def free(self) -> None:
        for cache in self.proposer.caches:
            cache.free()
        if isinstance(self.proposer, DraftProposer):
            self.proposer._work = None
            if self.proposer.vocab is not None:  # its head rows: copied again at the next call
                self.proposer.vocab.weight = self.proposer.vocab.bias = None
        self._logits = self._work = None

    def allocate(self) -> None:
        for cache in self.proposer.caches:
            if not cache.allocated:
                cache.allocate()

    def move_weights(self, device: torch.device | str) -> None:
        """The engine's sleep / wake on CUDA: the draft's weights (a path's model, or a trained draft's own
        layers; what it shares with the policy moves with the policy anyway) and its trainer's AdamW moments
        follow the policy's weights to ``device``. AdamW's step counters stay on the CPU, where it keeps them."""
        if isinstance(self.proposer, DraftProposer):
            self.proposer.decoder.to(device)
            self.proposer.head.to(device)
        if self.trainer is not None:
            for state in self.trainer.optimizer.state.values():
                for key, value in state.items():
                    if key != "step" and isinstance(value, torch.Tensor):
                        state[key] = value.to(device)


class SpeculativeRows(ActiveRows):
    """The plain rows plus what speculation needs per row; the draft's cache rows move with them."""

    def __init__(self, max_rows: int, max_new_tokens: int, device: torch.device, followers: list):
        super().__init__(max_rows, max_new_tokens, device)
        self.prompt_last = torch.zeros(max_rows, dtype=torch.long, device=device)  # the token before the first
        self.followers = followers

    def compact(self, finished, cache) -> None:
        super().compact(finished, _MovedTogether([cache, *self.followers], [self.prompt_last]))


class _MovedTogether:
    """Stands in for the cache in ``ActiveRows.compact``: moves several caches and extra row tensors."""

    def __init__(self, caches: list, tensors: list[torch.Tensor]):
        self.caches, self.tensors = caches, tensors

    def move_rows(self, src: torch.Tensor, dst: torch.Tensor, length: int) -> None:
        for cache in self.caches:
            cache.move_rows(src, dst, length)
        for tensor in self.tensors:
            tensor[dst] = tensor[src]


class SpeculativeCall(GenerateCall):
    """The plain scheduling loop with speculative decode steps."""

    def __init__(self, engine, prompts, sampling, speculator: Speculator):
        super().__init__(engine, prompts, sampling)
        self.speculator = speculator
        self.proposer = speculator.proposer
        self.stats = SpeculativeStats()
        self.rows = SpeculativeRows(engine.max_batch_size, sampling.max_new_tokens, self.device,
                                    self.proposer.caches)

    def run(self):
        start = time.perf_counter()
        self.proposer.start_call(self)
        try:
            results = super().run()
            self.proposer.end_call(self, results)
            return results
        finally:
            self.stats.total_seconds = time.perf_counter() - start
            self.speculator.last_call = self.stats
            self.speculator.stats.add(self.stats)

    def _init_row(self, slot: int, prompt_index: int, sample_index: int) -> None:
        super()._init_row(slot, prompt_index, sample_index)
        self.rows.prompt_last[slot] = self.prompts[prompt_index][-1]

    def _prefill(self, prompt_indices: list[int], slots_of_prompt: dict[int, list[int]]) -> None:
        super()._prefill(prompt_indices, slots_of_prompt)
        start = time.perf_counter()
        self.proposer.prefill(self, prompt_indices, slots_of_prompt)
        self.stats.draft_seconds += time.perf_counter() - start

    def _decode_step(self) -> None:
        rows, count, engine = self.rows, self.rows.count, self.engine
        position = rows.position[:count]
        # Every query of the step must fit in the cache: the last one sits at position + k.
        k = min(self.speculator.num_tokens, self.cache.max_seq_len - 1 - int(position.max()))
        if k <= 0 or count * (k + 1) > self.speculator.max_batch_rows:
            return self._plain_step()
        start = time.perf_counter()
        proposals = self.proposer.propose(self, k)
        self.stats.draft_seconds += time.perf_counter() - start
        budget = rows.limit[:count] - rows.num_generated[:count]  # tokens each row may still emit, >= 1
        counts = torch.minimum(proposals.counts, budget - 1)  # the emitted token after the proposals needs room too
        queries = 1 + int(counts.max())
        tokens = proposals.tokens[:, : queries - 1]
        input_ids = torch.cat([rows.last_token[:count, None], tokens], dim=1)  # [R, q]
        offsets = torch.arange(queries, device=self.device)
        positions = position[:, None] + offsets  # [R, q]
        hidden = engine._forward(input_ids, positions, DecodeStep(self.cache, positions))  # [R, q, hidden]
        logits = self.speculator.logits(engine, hidden.reshape(count * queries, -1)).view(count, queries, -1)
        uniforms = proposal_uniforms(rows, queries)  # the draws a plain engine would make at these indices
        verified = verify(logits, tokens, counts, self.sampling, uniforms, self.speculator._work)
        self._count(counts, verified.accepted)
        self._emit(verified.tokens, verified.logprobs, verified.accepted + 1)

    def _plain_step(self) -> None:
        start = time.perf_counter()
        self.proposer.observe(self)
        self.stats.draft_seconds += time.perf_counter() - start
        self.stats.plain_steps += 1
        super()._decode_step()

    def _count(self, counts: torch.Tensor, accepted: torch.Tensor) -> None:
        stats = self.stats
        stats.verify_steps += 1
        stats.row_steps += counts.shape[0]
        stats.drafted_row_steps += int((counts > 0).sum())
        stats.proposed_tokens += int(counts.sum())
        stats.accepted_tokens += int(accepted.sum())
        self.engine.stats.decode_steps += 1

    def _emit(self, tokens: torch.Tensor, logprobs: torch.Tensor, emitted: torch.Tensor) -> None:
        """Record row r's first ``emitted[r]`` tokens, cut after a stop token or stop string; retire the
        rows that finished."""
        rows, count = self.rows, self.rows.count
        offsets = torch.arange(tokens.shape[1], device=self.device)[None, :]
        is_stop = torch.isin(tokens, self.stop_ids) & (offsets < emitted[:, None])
        stopped = is_stop.any(dim=1)
        emitted = torch.where(stopped, is_stop.long().argmax(dim=1) + 1, emitted)
        if self.matcher is not None:
            stopped, emitted = self._stop_strings(tokens, stopped, emitted)
        take = offsets < emitted[:, None]  # [R, q]
        row, offset = take.nonzero(as_tuple=True)
        index = rows.num_generated[row] + offset
        rows.tokens[row, index] = tokens[row, offset]
        rows.logprobs[row, index] = logprobs[row, offset]
        rows.num_generated[:count] += emitted
        rows.position[:count] += emitted
        rows.last_token[:count] = tokens.gather(1, (emitted - 1)[:, None]).squeeze(1)
        total = int(emitted.sum())
        self.stats.emitted_tokens += total
        self.engine.stats.generated_tokens += total
        finished = stopped | (rows.num_generated[:count] >= rows.limit[:count])
        done = finished.nonzero().squeeze(1).tolist()
        if done:
            stopped_list = stopped.tolist()
            for slot in done:
                self._complete(slot, "stop" if stopped_list[slot] else "length")
            rows.compact(done, self.cache)

    def _stop_strings(self, tokens: torch.Tensor, stopped: torch.Tensor, emitted: torch.Tensor):
        """Push each row's emitted tokens through the stop-string matcher in order; cut at the first match."""
        stopped_list, emitted_list = stopped.tolist(), emitted.tolist()
        for slot, row_tokens in enumerate(tokens.tolist()):
            for offset in range(emitted_list[slot]):
                if self.matcher.push(self.rows.info[slot].text, row_tokens[offset]):
                    emitted_list[slot], stopped_list[slot] = offset + 1, True
                    break
        return (torch.tensor(stopped_list, device=self.device), torch.tensor(emitted_list, device=self.device))
