"""Small data types exchanged between packages.

Conventions shared by every backend and loss (docs/design.md has the long form):

* Token tensors are right-padded ``[B, T]``. ``input_ids`` holds prompt + response tokens.
* ``logprobs[b, t]`` is ``log p(input_ids[b, t] | input_ids[b, :t])``; position 0 has no
  prediction and holds 0. Logprobs are aligned with the token they score, never shifted.
* ``loss_mask[b, t]`` is 1.0 where ``input_ids[b, t]`` is a model-generated token that the loss
  sees, else 0.0. Prompt tokens, observations from environments and padding are 0.
* Logprob convention (generation == training): ``log_softmax(logits / temperature)`` over the full
  vocabulary, before any top-k / top-p / min-p masking. Greedy decoding (temperature 0) reports
  logprobs at temperature 1.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch

FinishReason = Literal["stop", "length"]


@dataclass(frozen=True)
class SamplingParams:
    """How to sample. ``temperature == 0`` means greedy."""

    max_new_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    """0 disables top-k."""
    min_p: float = 0.0
    n: int = 1
    """Samples per prompt; they share the prompt's prefill."""
    stop_token_ids: tuple[int, ...] = ()
    stop_strings: tuple[str, ...] = ()
    seed: int | None = None
    """Base seed. Sample j of prompt i uses a generator derived from (seed + i, j), so a request's
    samples do not depend on batching. ``None`` draws fresh randomness."""

    def validate(self) -> None:
        """Raise ValueError with a clear message for impossible settings."""
        if self.max_new_tokens <= 0:
            raise ValueError(f"max_new_tokens must be > 0, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 disables it), got {self.top_k}")
        if not (0.0 <= self.min_p < 1.0):
            raise ValueError(f"min_p must be in [0, 1), got {self.min_p}")
        if self.n < 1:
            raise ValueError(f"n must be >= 1, got {self.n}")
        for s in self.stop_strings:
            if not isinstance(s, str) or not s:
                raise ValueError(f"stop_strings must be non-empty strings, got {s!r}")
        for t in self.stop_token_ids:
            if not isinstance(t, int) or isinstance(t, bool) or t < 0:
                raise ValueError(f"stop_token_ids must be non-negative ints, got {t!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass
class Completion:
    """One generated sample for one prompt."""

    prompt_token_ids: list[int]
    token_ids: list[int]
    """Generated tokens, including the stop token when one ended the sample (a stop string is cut
    at the token that completed it)."""
    logprobs: list[float]
    """Logprob of each generated token under the documented convention; len == len(token_ids)."""
    finish_reason: FinishReason
    text: str | None = None
    routed_experts: torch.Tensor | None = None
    """MoE router replay (``generation.record_routing``): the experts each MoE layer chose for every
    token the engine ran through the model (the prompt and every generated token but the last),
    ``[len(prompt_token_ids) + len(token_ids) - 1, moe_layers, k]`` int16 (``rl_core.models.moe``)."""

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


@dataclass
class StepResult:
    """What an environment returns after one model turn."""

    observation: str | None = None
    """Text of the environment's reply (appended as a message with ``observation_role``), or None."""
    reward: float = 0.0
    """Total scalar reward for this step."""
    reward_components: dict[str, float] = field(default_factory=dict)
    """Named parts of the reward (for GDPO and per-component metrics)."""
    done: bool = True
    metrics: dict[str, float] = field(default_factory=dict)
    observation_role: str = "user"
    state: dict | None = None
    """Updated environment state for the next step (multi-turn)."""


@dataclass
class PromptSample:
    """One dataset item: the chat messages to prompt with, and what the environment needs to grade."""

    messages: list[dict[str, str]]
    metadata: dict = field(default_factory=dict)
    env: str | None = None
    """Name of the environment that grades it (None: the recipe's default)."""


@dataclass(frozen=True)
class Normalizer:
    """Global denominators for one optimizer step, so micro-batch losses sum to the batch loss."""

    num_valid_tokens: float
    num_valid_sequences: float


@dataclass
class ModelOutputs:
    """What a training backend hands to a loss function for one micro-batch."""

    logprobs: torch.Tensor
    """[B, T] logprobs of ``input_ids`` under the documented convention (position 0 is 0)."""
    logits: torch.Tensor | None = None
    """[B, T, V] logits already divided by temperature, when the loss asks for them. Aligned like
    logprobs: ``logits[b, t]`` is the distribution that scored ``input_ids[b, t]`` (row 0 is zero)."""
    entropy: torch.Tensor | None = None
    """[B, T] entropy of the predictive distribution that scored token t, when computed."""
    scores: torch.Tensor | None = None
    """[B] scalar scores of a sequence-classification (reward model) head, read at each sequence's
    last real token, when the backend trains a reward model."""
