"""One ``generate`` call of the native engine: admission of waiting samples into free rows (prefill,
a shared prompt prefix run once, the prompt's cache rows copied to its n samples), the decode steps,
and the rows that finish. ``speculative.py`` subclasses it.
"""

from __future__ import annotations

from collections import deque

import torch

from rl_backends_gen.native.rows import ActiveRows, RowInfo
from rl_backends_gen.native.sampling import draw_uniforms, sample_seed, sample_tokens
from rl_backends_gen.native.steps import PrefillStep
from rl_backends_gen.stop_strings import RowText, StopStringMatcher
from rl_core.types import Completion, SamplingParams
from rl_core.vision_inputs import EncodedChat

MIN_SHARED_PREFIX = 8  # shorter common prefixes are not worth a forward of their own


class GenerateCall:
    """The scheduling loop of one ``generate`` call."""

    def __init__(self, engine,  # the NativeEngine (engine.py imports this module)
                 prompts: list[list[int]], sampling: SamplingParams,
                 images: list[EncodedChat | None] | None = None):
        self.engine, self.prompts, self.sampling = engine, prompts, sampling
        self.images = images  # per prompt: its EncodedChat when it has images
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
        rows.rope_delta[slot] = 0
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
        encoded = None if self.images is None else [self.images[i] for i in prompt_indices]
        if encoded is not None and any(encoded):  # the image tokens' features differ: never shared
            start = min(start, engine.vision.shareable_prefix(prompts))
        else:
            encoded = None
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
        if encoded is None:
            hidden = engine._forward(input_ids.to(device), positions, step)  # [P, width, hidden]
        else:  # the vision tower runs here, once per prompt; M-RoPE deltas carry into decode
            hidden, rope_deltas = engine.vision.prefill(prompts, encoded, input_ids.to(device), start, step)
            self.rows.rope_delta[slots_t] = rope_deltas[row_of_slot_t]
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
        rotary = position + rows.rope_delta[:count]  # M-RoPE positions of a VLM's rows (vision.py); else position
        logits = self.engine._decode_logits(rows.last_token[:count], position, rotary)  # [R, V]
        rows.position[:count] += 1
        self._sample_and_record(torch.arange(count, device=self.device), logits)
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
