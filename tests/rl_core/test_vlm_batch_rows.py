"""Image tensors as batch rows (rl_core.vision_batch): any subset of rows gives the forward inputs of those
sequences, and trimming token padding leaves image tensors whole."""

from __future__ import annotations

import torch

from rl_core.batch import select, shard, trim_padding
from rl_core.vision_batch import forward_image_inputs, image_rows
from rl_core.vision_inputs import collate_image_inputs

FLAT = [{"pixel_values": torch.arange(16 * 4.0).view(16, 4), "image_grid_thw": torch.tensor([[1, 4, 4]])},
        {},
        {"pixel_values": torch.arange(24 * 4.0).view(24, 4) + 1000,
         "image_grid_thw": torch.tensor([[1, 2, 4], [1, 4, 4]])}]
BATCHED = [{"pixel_values": torch.ones(1, 2, 3, 8, 8), "pixel_attention_mask": torch.ones(1, 2, 8, 8, dtype=torch.bool)},
           {},
           {"pixel_values": torch.full((1, 1, 3, 8, 8), 2.0),
            "pixel_attention_mask": torch.ones(1, 1, 8, 8, dtype=torch.bool)}]


def test_flat_rows_give_each_subset_its_collated_inputs():
    rows = image_rows(FLAT)
    assert rows["pixel_values"].shape == (3, 24, 4) and rows["image_grid_thw"].shape == (3, 2, 3)
    for subset in ([0, 1, 2], [2, 0], [1, 2], [0]):
        got = forward_image_inputs(select(rows, subset))
        expected = collate_image_inputs([FLAT[i] for i in subset])
        assert got.keys() == expected.keys()
        assert all(torch.equal(got[k], expected[k]) for k in expected), subset
    assert forward_image_inputs(select(rows, [1])) == {}


def test_batched_rows_are_trimmed_to_the_most_real_images():
    rows = image_rows(BATCHED)
    assert rows["pixel_values"].shape == (3, 2, 3, 8, 8)
    got = forward_image_inputs(select(rows, [2, 1]))
    assert got["pixel_values"].shape == (2, 1, 3, 8, 8) and got["pixel_attention_mask"].shape == (2, 1, 8, 8)
    assert torch.equal(got["pixel_values"][0], BATCHED[2]["pixel_values"][0])
    assert forward_image_inputs(select(rows, [1])) == {}
    assert image_rows([{}, {}]) == {}


def test_trim_padding_and_shards_keep_image_tensors_whole():
    width = 24  # as many token columns as the longest row has patches: trimming must still leave the patches
    batch = {"input_ids": torch.ones(3, width, dtype=torch.long), "attention_mask": torch.zeros(3, width, dtype=torch.long)}
    batch["attention_mask"][:, :10] = 1
    batch |= image_rows(FLAT)
    trimmed = trim_padding(batch)
    assert trimmed["input_ids"].shape == (3, 10) and trimmed["pixel_values"].shape == (3, 24, 4)
    last = shard(select(trimmed, [0, 1, 2, 2]), 1, 2)
    assert torch.equal(forward_image_inputs(last)["image_grid_thw"], torch.tensor([[1, 2, 4], [1, 4, 4]] * 2))
