"""Tokenised samples -> right-padded training batches (``rl_core.batch`` conventions).

Preference pairs are interleaved in ONE batch: row ``2i`` is the chosen and row ``2i + 1`` the rejected
response of pair ``i``. ``is_chosen`` [B] and ``pair_index`` [B] record the layout; every split of a
batch into an even number of rows (micro-batches, data-parallel shards) keeps pairs together.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from rl_algorithms.data.tokenize import TokenizedSample
from rl_core.batch import Batch
from rl_core.vision_batch import image_rows


def collate_samples(samples: Sequence[TokenizedSample], pad_token_id: int) -> Batch:
    """``input_ids`` [B, T] long, ``attention_mask`` [B, T] long, ``loss_mask`` [B, T] float; samples with
    images add their image rows and ``mm_token_type_ids`` [B, T] (:mod:`rl_core.vision_batch`)."""
    if not samples:
        raise ValueError("collate_samples needs at least one sample")
    length = max(len(s) for s in samples)
    input_ids = torch.full((len(samples), length), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(samples), length), dtype=torch.long)
    loss_mask = torch.zeros((len(samples), length), dtype=torch.float32)
    for row, sample in enumerate(samples):
        n = len(sample)
        input_ids[row, :n] = torch.tensor(sample.input_ids, dtype=torch.long)
        attention_mask[row, :n] = 1
        loss_mask[row, :n] = torch.tensor(sample.loss_mask, dtype=torch.float32)
    batch = {"input_ids": input_ids, "attention_mask": attention_mask, "loss_mask": loss_mask}
    if any(sample.mm_token_type_ids is not None for sample in samples):
        batch["mm_token_type_ids"] = torch.zeros((len(samples), length), dtype=torch.long)
        for row, sample in enumerate(samples):
            if sample.mm_token_type_ids is not None:
                batch["mm_token_type_ids"][row, : len(sample)] = torch.tensor(sample.mm_token_type_ids)
    return batch | image_rows([sample.image_inputs for sample in samples])


def collate_pairs(pairs: Sequence[tuple[TokenizedSample, TokenizedSample]], pad_token_id: int) -> Batch:
    """Interleaved pairs (rows 2i chosen, 2i+1 rejected) plus ``is_chosen`` [B] float, ``pair_index`` [B] long."""
    batch = collate_samples([sample for pair in pairs for sample in pair], pad_token_id)
    batch["is_chosen"] = torch.tensor([1.0, 0.0] * len(pairs))
    batch["pair_index"] = torch.arange(len(pairs)).repeat_interleave(2)
    return batch


def split_pairs(batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """Row indices ``(chosen [P], rejected [P])`` of an interleaved pair batch; checks the layout."""
    is_chosen = batch["is_chosen"]
    if is_chosen.shape[0] % 2 or not (bool((is_chosen[0::2] == 1).all()) and bool((is_chosen[1::2] == 0).all())):
        raise ValueError(
            "preference batch rows must alternate chosen, rejected (rows 2i, 2i+1): a micro-batch or shard "
            "split a pair; use an even micro_batch_size and no length-sorting (packing/dynamic batching)"
        )
    rows = torch.arange(is_chosen.shape[0])
    return rows[0::2], rows[1::2]


def pad_token_id_of(tokenizer) -> int:
    """The tokenizer's pad id (its eos id, or 0, when it has none)."""
    for token_id in (tokenizer.pad_token_id, tokenizer.eos_token_id):
        if token_id is not None:
            return int(token_id)
    return 0
