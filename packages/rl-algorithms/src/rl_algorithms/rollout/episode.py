"""One sampled episode: the whole token sequence of a (possibly multi-turn) conversation."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rl_core.types import PromptSample
from rl_core.vision_inputs import EncodedChat


@dataclass
class Episode:
    """A finished episode. ``token_ids``, ``loss_mask`` and ``gen_logprobs`` have one entry per token.

    Layout: prompt tokens, then for each turn the model's generated tokens (loss_mask 1, their logprobs
    from the generation engine) followed, except after the last turn, by the tokens of the environment's
    reply as the chat template renders it, with the next assistant header (loss_mask 0, logprob 0).
    """

    sample: PromptSample
    token_ids: list[int]
    loss_mask: list[int]
    """1 on model-generated tokens, 0 on prompt and observation tokens."""
    gen_logprobs: list[float]
    """Generation-time logprob of each generated token; 0.0 elsewhere."""
    prompt_length: int
    reward: float = 0.0
    """Sum of the environment's step rewards (0 when the environment failed)."""
    reward_components: dict[str, float] = field(default_factory=dict)
    """Named reward parts, summed over steps."""
    num_turns: int = 0
    """Model turns generated."""
    truncated: bool = False
    """Ended by max_new_tokens or max_total_length rather than by the environment."""
    env_error: bool = False
    """The environment raised, timed out or returned something invalid: reward 0."""
    metrics: dict[str, float] = field(default_factory=dict)
    """The environment's metrics (latest value of each)."""
    group_id: int = 0
    """Index of the prompt in the ``samples`` given to run_rollouts."""
    sample_index: int = 0
    """Which of the prompt's generations this is (0 .. num_generations_per_prompt - 1)."""
    messages: list[dict[str, str]] = field(default_factory=list)
    """The conversation as text (generated turns decoded), for logging and environments."""
    error: str | None = None
    """What went wrong with the environment, when ``env_error``."""
    max_turns_reached: bool = False
    """The environment wanted another turn but ``max_turns`` was reached."""
    prompt_inputs: EncodedChat | None = None
    """A prompt with images: its ``EncodedChat`` (``image_prompts.py``); None for a text prompt."""
    routed_experts: Any = None
    """MoE router replay (``generation.record_routing``): the latest turn's ``Completion.routed_experts``,
    ``[positions, moe_layers, k]`` int16 for the first positions of ``token_ids`` (the engine ran every
    earlier turn and observation again as that turn's prompt); None without a record."""

    @property
    def response_length(self) -> int:
        """Model-generated tokens over all turns."""
        return int(sum(self.loss_mask))
