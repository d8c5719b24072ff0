"""Episodes whose prompt holds images (a vision-language model's rollouts).

Such an episode keeps its prompt's ``EncodedChat`` (``Episode.prompt_inputs``: the processor's token ids with
each image's tokens expanded, the image tensors, Qwen-VL's ``mm_token_type_ids``). Every generate call of the
episode passes the episode's tokens so far with those images (:func:`generation_prompt`), and its training row
carries them (:func:`episode_image_rows`): the prompt's image tensors as batch rows (``rl_core.vision_batch``)
and ``mm_token_type_ids`` (the prompt's, 0 on everything after it and on padding).

A model turn ends before a generated image placeholder token (:func:`cut_at_placeholders`): the model's forward
takes every such token as the slot of an image's features, so a sequence holding one more of them than its
images fill cannot be trained on (a random tiny VLM samples them; a trained one practically never does).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

from rl_algorithms.rollout.episode import Episode
from rl_core.protocols import Prompt
from rl_core.vision_batch import image_rows


def generation_prompt(episode: Episode) -> Prompt:
    """What to generate the episode's next turn from: its tokens, with its prompt's images when it has any."""
    encoded = episode.prompt_inputs
    if encoded is None:
        return episode.token_ids
    types = encoded.mm_token_type_ids
    if types is not None:  # tokens after the prompt (model turns, observations) are text
        types = types + [0] * (len(episode.token_ids) - len(types))
    return dataclasses.replace(encoded, input_ids=list(episode.token_ids), mm_token_type_ids=types)


def cut_at_placeholders(tokenizer, tokens: list[int], logprobs: list[float]) -> tuple[list[int], list[float], bool]:
    """``(tokens, logprobs, cut)``: a turn's tokens up to its first image placeholder token (a vision-language
    model's ``ImageChatTokenizer.placeholder_token_ids``); ``cut`` when one was found."""
    placeholders = getattr(tokenizer, "placeholder_token_ids", ())
    first = next((i for i, token in enumerate(tokens) if token in placeholders), None)
    if first is None:
        return tokens, logprobs, False
    return tokens[:first], logprobs[:first], True


def episode_image_rows(episodes: Sequence[Episode], width: int) -> dict[str, torch.Tensor]:
    """The image keys of the training batch of ``episodes`` (right-padded to ``width`` tokens); ``{}`` when no
    episode has images."""
    prompts = [ep.prompt_inputs for ep in episodes]
    rows = image_rows([p.image_inputs if p is not None else {} for p in prompts])
    if rows and any(p is not None and p.mm_token_type_ids is not None for p in prompts):
        token_types = torch.zeros(len(episodes), width, dtype=torch.long)
        for row, prompt in enumerate(prompts):
            if prompt is not None and prompt.mm_token_type_ids is not None:
                token_types[row, : len(prompt.mm_token_type_ids)] = torch.tensor(prompt.mm_token_type_ids)
        rows["mm_token_type_ids"] = token_types
    return rows
