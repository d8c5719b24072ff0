"""Rollouts of prompts with images (a tiny Qwen2.5-VL, the native engine): every generate call gets the episode's
tokens with its prompt's images, a second turn included; the training batch carries each row's image tensors
and ``mm_token_type_ids``; a turn ends before a generated image placeholder token."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from rl_algorithms.rollout import episodes_to_batch, run_rollouts
from rl_core.types import SamplingParams, StepResult
from rl_core.vision_inputs import EncodedChat

SAMPLING = SamplingParams(max_new_tokens=5, temperature=1.0, seed=4)


class TwoTurns:
    """Asks once more after the first turn; rewards the second."""

    def step(self, messages, metadata, state):
        if state is None:
            return StepResult(observation="Once more.", done=False, state={"turn": 1})
        return StepResult(reward=1.0, done=True)


class Recording:
    """The native engine, keeping every call's prompts; ``placeholder_at`` puts an image token into each
    completion at that index (what a random VLM may sample)."""

    def __init__(self, inner, placeholder: int | None = None, placeholder_at: int = 2):
        self.inner, self.placeholder, self.placeholder_at = inner, placeholder, placeholder_at
        self.prompts: list[list] = []

    def generate(self, prompts, sampling):
        self.prompts.append(list(prompts))
        results = self.inner.generate(prompts, sampling)
        if self.placeholder is None:
            return results
        at = self.placeholder_at
        return [[dataclasses.replace(c, token_ids=[*c.token_ids[:at], self.placeholder, *c.token_ids[at + 1:]])
                 for c in samples] for samples in results]


@pytest.fixture(scope="module")
def vlm(tiny_vlm_dir):
    from rl_backends_gen.native import NativeEngine
    from rl_core.image_chat_tokenizer import ImageChatTokenizer
    from rl_core.models.processor import load_processor
    from rl_environments.shapes import ShapesDatasetConfig

    path = tiny_vlm_dir("qwen2_5_vl")
    tokenizer = ImageChatTokenizer(load_processor(path))
    samples = ShapesDatasetConfig(image_size=32, train_size=2).generate("train", None)
    return NativeEngine(path, max_batch_size=8, max_seq_len=256), tokenizer, samples


def test_turns_carry_the_images_and_the_batch_their_tensors(vlm):
    engine, tokenizer, samples = vlm
    backend = Recording(engine)
    episodes = run_rollouts(backend, tokenizer, samples, TwoTurns(), SAMPLING, num_generations_per_prompt=2,
                            max_turns=2, max_total_length=200)
    assert len(backend.prompts) == 2 and [len(p) for p in backend.prompts] == [2, 4]  # 2 prompts x n=2, then 4 rows
    first = backend.prompts[0][0]
    assert isinstance(first, EncodedChat) and first.has_images
    assert first.input_ids == tokenizer.encode_image_chat(samples[0].messages).input_ids
    for ep, again in zip(episodes, backend.prompts[1]):  # the second turn: the whole episode so far, same images
        assert ep.num_turns == 2 and again.input_ids == ep.token_ids[: len(again.input_ids)]
        assert torch.equal(again.image_inputs["pixel_values"], ep.prompt_inputs.image_inputs["pixel_values"])
        assert again.mm_token_type_ids == ep.prompt_inputs.mm_token_type_ids + [0] * (
            len(again.input_ids) - ep.prompt_length)
    batch = episodes_to_batch(episodes, tokenizer.pad_token_id)
    width = batch["input_ids"].shape[1]
    for row, ep in enumerate(episodes):
        prompt = ep.prompt_inputs
        patches = prompt.image_inputs["pixel_values"]
        assert torch.equal(batch["pixel_values"][row, : patches.shape[0]], patches)
        assert torch.equal(batch["image_grid_thw"][row], prompt.image_inputs["image_grid_thw"])
        types = prompt.mm_token_type_ids + [0] * (width - ep.prompt_length)
        assert batch["mm_token_type_ids"][row].tolist() == types
        # image tokens are only in the prompt
        assert int((batch["input_ids"][row] == tokenizer.processor.image_token_id).sum()) == sum(prompt.mm_token_type_ids)


def test_a_turn_ends_before_a_generated_image_token(vlm):
    engine, tokenizer, samples = vlm
    placeholder = tokenizer.processor.image_token_id
    backend = Recording(engine, placeholder=placeholder, placeholder_at=2)
    episodes = run_rollouts(backend, tokenizer, samples, TwoTurns(), SAMPLING, num_generations_per_prompt=2,
                            max_turns=1)
    for ep in episodes:
        generated = ep.token_ids[ep.prompt_length:]
        assert len(generated) == 2 and placeholder not in generated and len(ep.gen_logprobs) == len(ep.token_ids)
        assert ep.truncated
