"""How one worker's shard of a batch is cut into micro-batches, and the global loss denominators.

Three layouts, all giving the loss the same padded ``[b, t]`` view of its samples:

* padded: consecutive groups of ``micro_batch_size`` rows, trailing padding trimmed;
* dynamic: rows sorted by length, grouped while rows x longest <= the token budget;
* packed: first-fit-decreasing of the real tokens of each row into rows of a token budget; the
  model sees one ``[1, L]`` row with position ids restarting per sequence and a block-diagonal
  causal mask, and ``forward.py`` scatters its outputs back to the padded view.

Preference batches (an ``is_chosen`` key: rows 2i / 2i+1 are a pair) are planned in groups of two
rows, so a pair is never split or reordered.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rl_backends_train.config import TrainBackendConfig
from rl_core.batch import Batch, select, trim_padding
from rl_core.types import Normalizer


@dataclass
class MicroBatch:
    """Rows ``rows`` of the local batch, trimmed to their longest sequence."""

    rows: torch.Tensor
    batch: Batch
    packed: bool = False
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
    if cfg.packing.enabled:
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
        out.append(MicroBatch(rows=index, batch=trim_padding(select(batch, index)), packed=cfg.packing.enabled))
    return out


def dummy_micro_batch(batch: Batch, packed: bool) -> MicroBatch:
    """One row, two tokens: the cheapest forward/backward that still runs every FSDP collective."""
    row = {k: (v[:1, :2] if v.dim() >= 2 else v[:1]) for k, v in batch.items()}
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


def pack_rows(batch: Batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Pack the real tokens of each row of a (right-padded) micro-batch end to end.

    Returns ``input_ids [1, L]``, ``position_ids [1, L]``, a block-diagonal causal
    ``attention_mask [1, 1, L, L]`` (bool, True = may attend) and ``unpack_index [b, t]``, the
    packed position of each padded position (padding points at 0; callers mask it)."""
    lengths = sequence_lengths(batch)
    ids = batch["input_ids"]
    segments = [ids[i, :n] for i, n in enumerate(lengths.tolist())]
    packed_ids = torch.cat(segments)[None, :]
    position_ids = torch.cat([torch.arange(n) for n in lengths.tolist()])[None, :]
    segment_of = torch.repeat_interleave(torch.arange(len(segments)), lengths)
    total = int(lengths.sum())
    causal = torch.ones(total, total, dtype=torch.bool).tril()
    mask = (segment_of[:, None] == segment_of[None, :]) & causal
    offsets = torch.cumsum(lengths, 0) - lengths
    t = torch.arange(ids.shape[1])[None, :]
    unpack_index = torch.where(t < lengths[:, None], offsets[:, None] + t, torch.zeros_like(t))
    return packed_ids, position_ids, mask[None, None], unpack_index


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
