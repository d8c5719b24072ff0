"""Resumable shuffled batches of dataset indices (the data position of a checkpoint)."""

from __future__ import annotations

import torch


class EpochSampler:
    """Batches of ``batch_size`` indices from a fresh seeded permutation each epoch.

    The permutation of epoch ``e`` is ``randperm(n)`` under seed ``seed + e``, so the state is just
    ``(epoch, position)``: saving and restoring it resumes at exactly the next batch. The last
    incomplete batch of an epoch is dropped (every step sees ``batch_size`` samples).
    """

    def __init__(self, num_items: int, batch_size: int, seed: int = 0, shuffle: bool = True):
        if batch_size <= 0:
            raise ValueError(f"batch_size must be > 0, got {batch_size}")
        if num_items < batch_size:
            raise ValueError(f"the dataset has {num_items} usable items, fewer than one batch of {batch_size}; "
                             "lower the batch size or add data")
        self.num_items = num_items
        self.batch_size = batch_size
        self.seed = seed
        self.shuffle = shuffle
        self.epoch = 0
        self.position = 0
        self._order = self._permutation(0)

    def _permutation(self, epoch: int) -> list[int]:
        if not self.shuffle:
            return list(range(self.num_items))
        generator = torch.Generator().manual_seed(self.seed + epoch)
        return torch.randperm(self.num_items, generator=generator).tolist()

    def next_batch(self) -> list[int]:
        if self.position + self.batch_size > self.num_items:
            self.epoch += 1
            self.position = 0
            self._order = self._permutation(self.epoch)
        batch = self._order[self.position : self.position + self.batch_size]
        self.position += self.batch_size
        return batch

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position, "num_items": self.num_items}

    def load_state_dict(self, state: dict[str, int]) -> None:
        if state.get("num_items", self.num_items) != self.num_items:
            raise ValueError(f"the checkpoint was written for {state['num_items']} training items but the data now "
                             f"holds {self.num_items}: resume with the same data settings")
        self.epoch = int(state["epoch"])
        self.position = int(state["position"])
        self._order = self._permutation(self.epoch)
