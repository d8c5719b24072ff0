"""The stream of training prompts (seeded shuffled epochs, with a position that checkpoints can store),
and the check every prompt passes before a run starts."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

from rl_core.data_files import BadRow
from rl_core.types import PromptSample


class PromptStream:
    """Endless epochs over ``samples``; epoch ``e`` visits them in an order drawn from ``(seed, e)``.

    The whole state is the number of prompts consumed, so resuming a run only needs that number.
    """

    def __init__(self, samples: Sequence[PromptSample], seed: int):
        if not samples:
            raise ValueError("the training data holds no prompts")
        self.samples = list(samples)
        self.seed = seed
        self.consumed = 0
        self._epoch = -1
        self._order: list[int] = []

    def _order_of(self, epoch: int) -> list[int]:
        if epoch != self._epoch:
            self._order = list(range(len(self.samples)))
            random.Random(f"{self.seed}-{epoch}").shuffle(self._order)
            self._epoch = epoch
        return self._order

    def take(self, n: int) -> list[PromptSample]:
        """The next ``n`` prompts (crossing into the next epoch when this one runs out)."""
        out = []
        for _ in range(n):
            epoch, index = divmod(self.consumed, len(self.samples))
            out.append(self.samples[self._order_of(epoch)[index]])
            self.consumed += 1
        return out

    @property
    def epoch(self) -> int:
        return self.consumed // len(self.samples)

    def state_dict(self) -> dict:
        return {"consumed": self.consumed, "num_samples": len(self.samples), "seed": self.seed}

    def load_state_dict(self, state: dict) -> None:
        if state.get("num_samples", len(self.samples)) != len(self.samples):
            raise ValueError(f"the checkpoint was written for {state['num_samples']} training prompts but the data "
                             f"now holds {len(self.samples)}: resume with the same data settings")
        self.consumed = int(state["consumed"])


def prompt_length_check(tokenizer: Any, max_total_length: int,
                        max_seq_len: int | None = None) -> Callable[[PromptSample], None]:
    """A check for dataset loaders: a prompt whose chat-templated tokens leave no room for a generated
    token under ``grpo.max_total_length``, or under ``generation.max_seq_len`` (the generation engine's
    context) where that is set and smaller, is a bad row (it would silently generate nothing, or stop the
    engine mid-run)."""
    from rl_algorithms.rollout.chat_tokens import ChatTokens

    chat = ChatTokens(tokenizer)

    def check(sample: PromptSample) -> None:
        length = len(chat.prompt_tokens(sample.messages))
        if max_seq_len is not None and max_seq_len < max_total_length and length >= max_seq_len:
            raise BadRow(f"the prompt is {length} tokens, which leaves no room to generate under "
                         f"generation.max_seq_len={max_seq_len}; shorten it or raise generation.max_seq_len")
        if length >= max_total_length:
            raise BadRow(f"the prompt is {length} tokens, which leaves no room to generate under "
                         f"grpo.max_total_length={max_total_length}; shorten it or raise grpo.max_total_length")

    return check
