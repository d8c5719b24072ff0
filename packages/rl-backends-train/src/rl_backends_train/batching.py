"""How one worker's shard of a batch is cut into micro-batches, and the global loss denominators.

Three layouts, all giving the loss the same padded ``[b, t]`` view of its samples:

* padded: consecutive groups of ``micro_batch_size`` rows, trailing padding trimmed;
* dynamic: rows sorted by length, grouped while rows x longest <= the token budget;
* packed: first-fit-decreasing of the real tokens of each row into rows of a token budget; the
  model sees one ``[1, L]`` row with position ids restarting per sequence and a block-diagonal
  causal mask, and ``forward.py`` scatters its outputs back to the padded view. With
  ``share_prompts``, rows with the same prompt (GRPO's generations of one prompt) are planned
  together and packed as the prompt once followed by each row's answer; an answer attends to the
  prompt and to itself, and its positions continue from the prompt's.

Preference batches (an ``is_chosen`` key: rows 2i / 2i+1 are a pair) are planned in groups of two
rows, so a pair is never split or reordered.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rl_backends_train.config import TrainBackendConfig
from rl_core.batch import IMAGE_KEYS, Batch, select, trim_padding
from rl_core.types import Normalizer


@dataclass
class MicroBatch:
    """Rows ``rows`` of the local batch, trimmed to their longest sequence."""

    rows: torch.Tensor
    batch: Batch
    packed: bool = False
    share_prompts: bool = False
    """Packed with one copy of each prompt its rows share (``pack_rows``)."""
    dummy: bool = False
    """A stand-in that keeps FSDP collectives in step on a rank with fewer micro-batches; its loss
    is multiplied by zero."""


def sequence_lengths(batch: Batch) -> torch.Tensor:
    """[B] number of real tokens of each right-padded row."""
    mask = batch["attention_mask"]
    lengths = mask.sum(dim=1)
    positions = torch.arange(mask.shape[1])[None, :]
    if not torch.equal(mask.bool(), positions < lengths[:, None]):
        raise ValueError("attention_mask must be right-padded (ones, then zeros) in every row")
    return lengths


def rows_per_group(batch: Batch) -> int:
    """Rows that must stay together, in order, in one micro-batch: 2 for preference pairs."""
    return 2 if "is_chosen" in batch else 1


def plan_micro_batches(batch: Batch, cfg: TrainBackendConfig) -> list[MicroBatch]:
    """Micro-batches of ``batch`` in the layout the config asks for."""
    lengths = sequence_lengths(batch)
    size = rows_per_group(batch)
    if lengths.shape[0] % size:
        raise ValueError(f"a preference batch needs an even number of rows, got {lengths.shape[0]}")
    group_lengths = lengths.view(-1, size)
    share = cfg.packing.enabled and cfg.packing.share_prompts and "loss_mask" in batch
    if share:
        plan = shared_prompt_bins(batch, lengths, size, cfg.packing.max_tokens_per_micro_batch)
    elif cfg.packing.enabled:
        plan = first_fit_decreasing(group_lengths.sum(1).tolist(), cfg.packing.max_tokens_per_micro_batch)
    elif cfg.dynamic_batching.enabled:
        budget = cfg.dynamic_batching.max_tokens_per_micro_batch // size
        plan = length_sorted_groups(group_lengths.max(1).values.tolist(), budget)
    else:
        n, per = group_lengths.shape[0], max(1, cfg.micro_batch_size // size)
        plan = [list(range(i, min(i + per, n))) for i in range(0, n, per)]
    out = []
    for groups in plan:
        rows = [g * size + j for g in groups for j in range(size)]
        index = torch.tensor(rows, dtype=torch.long)
        out.append(MicroBatch(rows=index, batch=trim_padding(select(batch, index)), packed=cfg.packing.enabled,
                              share_prompts=share))
    return out


def dummy_micro_batch(batch: Batch, packed: bool) -> MicroBatch:
    """One row, two tokens: the cheapest forward/backward that still runs every FSDP collective (without
    images: a vision-language model then runs its vision tower on a dummy image, see ``vision.py``)."""
    row = {k: (v[:1, :2] if v.dim() >= 2 else v[:1]) for k, v in batch.items() if k not in IMAGE_KEYS}
    return MicroBatch(rows=torch.zeros(1, dtype=torch.long), batch=row, packed=packed, dummy=True)


def first_fit_decreasing(lengths: list[int], budget: int) -> list[list[int]]:
    """Bins of row indices whose lengths sum to <= ``budget`` (a longer row gets its own bin)."""
    bins: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        for b, free in enumerate(room):
            if lengths[i] <= free:
                bins[b].append(i)
                room[b] -= lengths[i]
                break
        else:
            bins.append([i])
            room.append(budget - lengths[i])
    return bins


def length_sorted_groups(lengths: list[int], budget: int) -> list[list[int]]:
    """Rows sorted by length (longest first), grouped while rows x longest <= ``budget``."""
    groups: list[list[int]] = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        if groups and (len(groups[-1]) + 1) * lengths[groups[-1][0]] <= budget:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def prompt_lengths(batch: Batch) -> torch.Tensor:
    """[B] tokens before each row's first ``loss_mask`` token (the row's length when it has none)."""
    lengths = sequence_lengths(batch)
    covered = batch["loss_mask"].bool() & batch["attention_mask"].bool()
    first = torch.where(covered.any(dim=1), covered.int().argmax(dim=1), lengths)
    return first


def _prompt_keys(batch: Batch, prompts: list[int] | None = None) -> list[tuple[int, bytes] | None]:
    """A hashable key per row for its prompt (None: nothing to share, the prompt is empty).

    ``prompts``: the rows' prompt lengths when the caller already has them."""
    ids = batch["input_ids"]
    prompts = prompt_lengths(batch).tolist() if prompts is None else prompts
    return [(p, ids[i, :p].numpy().tobytes()) if p > 0 else None for i, p in enumerate(prompts)]


def shared_prompt_bins(batch: Batch, lengths: torch.Tensor, size: int, budget: int) -> list[list[int]]:
    """Bins of row-group indices (groups of ``size`` rows) for ``share_prompts`` packing.

    Groups whose rows share one prompt are chunked so that the prompt plus their answers fits the
    budget (a chunk holds at least one group), then the chunks are placed first-fit-decreasing by
    the tokens they pack to."""
    prompts = prompt_lengths(batch).tolist()
    keys = _prompt_keys(batch, prompts)
    lengths = lengths.tolist()
    by_prompt: dict[object, list[int]] = {}
    for g in range(len(lengths) // size):
        rows = range(g * size, (g + 1) * size)
        key = keys[g * size] if all(keys[r] == keys[g * size] for r in rows) else None
        by_prompt.setdefault(key if key is not None else ("alone", g), []).append(g)
    chunks: list[list[int]] = []
    costs: list[int] = []
    for key, groups in by_prompt.items():
        prompt = prompts[groups[0] * size] if key[0] != "alone" else 0
        for g in groups:
            answers = sum(lengths[r] - prompt for r in range(g * size, (g + 1) * size))
            if chunks and chunks[-1][0] in groups and costs[-1] + answers <= budget:
                chunks[-1].append(g)
                costs[-1] += answers
            else:
                chunks.append([g])
                costs.append(prompt + answers)
    return [[g for c in b for g in chunks[c]] for b in first_fit_decreasing(costs, budget)]


def pack_rows(batch: Batch, share_prompts: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Pack the real tokens of each row of a (right-padded) micro-batch end to end.

    Returns ``input_ids [1, L]``, ``position_ids [1, L]``, a block-diagonal causal
    ``attention_mask [1, 1, L, L]`` (bool, True = may attend) and ``unpack_index [b, t]``, the
    packed position of each padded position (padding points at 0; callers mask it).

    ``share_prompts`` (needs ``loss_mask``): a prompt several rows share is packed once, where its
    first row needs it; each row's answer follows as its own segment that may attend to the prompt's
    segment, with positions continuing from the prompt's length."""
    lengths = sequence_lengths(batch).tolist()
    ids = batch["input_ids"]
    keys = _prompt_keys(batch) if share_prompts else [None] * len(lengths)
    pieces: list[torch.Tensor] = []  # packed token ids, segment by segment
    positions: list[torch.Tensor] = []
    parent: list[int] = []  # per segment: the segment it may also attend to (-1: none)
    placed: dict[tuple[int, bytes], tuple[int, int]] = {}  # prompt key -> (segment, packed offset)
    unpack_index = torch.zeros(ids.shape, dtype=torch.long)
    offset = 0

    def add_segment(tokens: torch.Tensor, start: int, attends_to: int) -> int:
        nonlocal offset
        pieces.append(tokens)
        positions.append(torch.arange(start, start + tokens.numel()))
        parent.append(attends_to)
        offset += tokens.numel()
        return len(parent) - 1

    for i, n in enumerate(lengths):
        key = keys[i]
        if key is None:
            here = offset
            add_segment(ids[i, :n], 0, -1)
            unpack_index[i, :n] = torch.arange(here, here + n)
            continue
        p = key[0]
        if key not in placed:
            placed[key] = (len(parent), offset)
            add_segment(ids[i, :p], 0, -1)
        prompt_segment, prompt_offset = placed[key]
        unpack_index[i, :p] = torch.arange(prompt_offset, prompt_offset + p)
        if n > p:
            here = offset
            add_segment(ids[i, p:n], p, prompt_segment)
            unpack_index[i, p:n] = torch.arange(here, here + n - p)
    packed_ids = torch.cat(pieces)[None, :]
    position_ids = torch.cat(positions)[None, :]
    sizes = torch.tensor([len(x) for x in pieces])
    segment_of = torch.repeat_interleave(torch.arange(len(pieces)), sizes)
    parent_of = torch.tensor(parent)[segment_of]
    causal = torch.ones(offset, offset, dtype=torch.bool).tril()
    same = segment_of[:, None] == segment_of[None, :]
    to_prompt = parent_of[:, None] == segment_of[None, :]
    return packed_ids, position_ids, (causal & (same | to_prompt))[None, None], unpack_index


def valid_token_mask(batch: Batch) -> torch.Tensor:
    """[B, T] loss_mask times sample_mask (when present): the tokens a loss counts."""
    mask = batch["loss_mask"].float()
    if "sample_mask" in batch:
        mask = mask * batch["sample_mask"].float()[:, None]
    return mask


def local_normalizer_counts(batch: Batch) -> torch.Tensor:
    """[2] (valid tokens, valid sequences) of this shard; all-reduce-summed into a Normalizer."""
    mask = valid_token_mask(batch)
    return torch.tensor([mask.sum().item(), (mask.sum(dim=1) > 0).sum().item()], dtype=torch.float64)


def normalizer_from_counts(counts: torch.Tensor) -> Normalizer:
    # max(., 1): an all-masked batch gives a zero loss, not a division by zero.
    return Normalizer(num_valid_tokens=max(float(counts[0]), 1.0), num_valid_sequences=max(float(counts[1]), 1.0))
