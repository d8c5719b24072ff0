"""Prompts with images through the native engine and the HF reference backend, on the three tiny VLM families:
greedy equals HF ``generate`` token for token, logprobs equal the training forward (fp32, <= 1e-5), the vision
tower runs once per prompt, continuous batching and refit (vision weights included) keep it so."""

from __future__ import annotations

import pytest
import torch
from PIL import Image

from rl_backends_gen.hf import HFGenerationBackend
from rl_backends_gen.native import NativeEngine
from rl_core.types import SamplingParams
from rl_core.vision_inputs import encode_chat

FAMILIES = ["qwen2_5_vl", "qwen3_vl", "idefics3"]
GREEDY = SamplingParams(max_new_tokens=12, temperature=0.0)
SYSTEM = {"role": "system", "content": "You look at pictures carefully and answer in one word."}


def image(colour, size=(32, 32)):
    return Image.new("RGB", size, colour)


def chats(first=(255, 0, 0)):
    """One image; two images of other sizes between text; no image. A shared system prompt (a prefix of >= 8
    tokens the engine may compute once) comes first."""
    return [
        [SYSTEM, {"role": "user", "content": [{"type": "image", "image": image(first)},
                                              {"type": "text", "text": "colour?"}]}],
        [SYSTEM, {"role": "user", "content": [{"type": "image", "image": image((0, 0, 255), (40, 24))},
                                              {"type": "text", "text": "and"},
                                              {"type": "image", "image": image((0, 160, 0), (20, 30))},
                                              {"type": "text", "text": "these two, please?"}]}],
        [SYSTEM, {"role": "user", "content": "no image here, just words"}],
    ]


@pytest.fixture(scope="module", params=FAMILIES)
def vlm(request, tiny_vlm_dir):
    from transformers import AutoModelForImageTextToText

    from rl_core.models.processor import load_processor

    path = tiny_vlm_dir(request.param)
    processor = load_processor(path)
    prompts = [encode_chat(processor, chat, add_generation_prompt=True) for chat in chats()]
    model = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32).eval()
    return request.param, path, processor, prompts, model


def hf_generate(model, prompt, max_new_tokens=12) -> list[int]:
    """HF ``generate`` on one prompt alone (no padding): the reference."""
    inputs = {"input_ids": torch.tensor([prompt.input_ids]), **prompt.image_inputs}
    if prompt.mm_token_type_ids is not None:
        inputs["mm_token_type_ids"] = torch.tensor([prompt.mm_token_type_ids])
    out = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)
    return out[0, len(prompt.input_ids):].tolist()


def test_greedy_equals_hf_generate_and_logprobs_equal_training(vlm, vlm_training_logprobs):
    family, path, processor, prompts, model = vlm
    engine = NativeEngine(path, max_batch_size=8, max_seq_len=256)
    results = engine.generate(prompts, GREEDY)
    tokens = [r[0].token_ids for r in results]
    for prompt, got in zip(prompts, tokens):
        assert got == hf_generate(model, prompt)[: len(got)]
    assert sum(map(len, tokens)) > 2 * len(prompts)  # not trivially short
    expected = vlm_training_logprobs(model, prompts, tokens)
    assert max((torch.tensor(r[0].logprobs) - want).abs().max().item() for r, want in zip(results, expected)) <= 1e-5
    # The HF reference backend (left-padded batches with the image tensors) gives the same tokens.
    reference = HFGenerationBackend(path, batch_size=3).generate(prompts, GREEDY)
    assert [r[0].token_ids for r in reference] == tokens
    assert max(abs(a - b) for r, n in zip(reference, results) for a, b in zip(r[0].logprobs, n[0].logprobs)) <= 1e-5


def test_sampled_logprobs_equal_training_forward(vlm, vlm_training_logprobs):
    family, path, processor, prompts, model = vlm
    engine = NativeEngine(path, max_batch_size=16, max_seq_len=256)
    sampling = SamplingParams(max_new_tokens=10, temperature=0.8, top_p=0.95, n=3, seed=5)
    results = engine.generate(prompts, sampling)
    flat = [(prompt, c) for prompt, samples in zip(prompts, results) for c in samples]
    expected = vlm_training_logprobs(model, [p for p, _ in flat], [c.token_ids for _, c in flat], 0.8)
    assert max((torch.tensor(c.logprobs) - want).abs().max().item() for (_, c), want in zip(flat, expected)) <= 1e-5
    assert len({tuple(c.token_ids) for _, c in flat}) > 3  # really sampled


def test_vision_tower_runs_once_per_prompt_and_batching_changes_nothing(vlm):
    family, path, processor, prompts, model = vlm
    engine = NativeEngine(path, max_batch_size=16, max_seq_len=256)
    tower = engine.model.model.visual if family != "idefics3" else engine.model.model.vision_model
    images_seen = []
    counted = tower.register_forward_hook(
        lambda module, args, kwargs, out: images_seen.append(
            len(kwargs["grid_thw"]) if "grid_thw" in kwargs else kwargs["pixel_values"].shape[0]), with_kwargs=True)
    sampling = SamplingParams(max_new_tokens=8, temperature=1.0, n=4, seed=1)
    together = engine.generate(prompts, sampling)
    counted.remove()
    assert sum(images_seen) == 3  # 1 + 2 + 0 images, for 4 samples of each prompt
    # Continuous batching: 2 rows at a time, rows join as others finish; each sample keeps its stream.
    narrow = NativeEngine(path, max_batch_size=2, max_seq_len=256).generate(prompts, sampling)
    for wide_samples, narrow_samples in zip(together, narrow):
        for a, b in zip(wide_samples, narrow_samples):
            assert a.token_ids == b.token_ids
            assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) <= 1e-5


def test_images_and_positions_enter_the_prefill(vlm):
    family, path, processor, prompts, model = vlm
    engine = NativeEngine(path, max_batch_size=8, max_seq_len=256)
    other = encode_chat(processor, chats(first=(0, 0, 0))[0], add_generation_prompt=True)
    assert other.input_ids == prompts[0].input_ids
    a, b = (engine.generate([p], SamplingParams(max_new_tokens=4, temperature=0.0))[0][0] for p in (prompts[0], other))
    assert a.logprobs != b.logprobs  # another image, other logits
    # Together, the two prompts share every token id: the shared prefix stops before the first image token.
    both = engine.generate([prompts[0], other], SamplingParams(max_new_tokens=4, temperature=0.0))
    assert [both[0][0].token_ids, both[1][0].token_ids] == [a.token_ids, b.token_ids]
    assert max(abs(x - y) for got, want in zip(both, (a, b)) for x, y in zip(got[0].logprobs, want.logprobs)) <= 1e-5
    assert engine.stats.shared_prefix_tokens > 0  # the system prompt was shared
    if family != "idefics3":  # M-RoPE: a prompt with images ends at a smaller rotary position than its length
        positions, deltas = engine.vision.positions([prompts[1].input_ids], [prompts[1]], 0, len(prompts[1].input_ids))
        assert deltas.tolist()[0] < 0 and int(positions.max()) + 1 - len(prompts[1].input_ids) == deltas.tolist()[0]


def test_refit_includes_the_vision_tower(vlm, tiny_vlm_dir, tmp_path):
    from transformers import AutoModelForImageTextToText

    from rl_core.models.tiny_vlm import save_tiny_vlm

    family, path, processor, prompts, model = vlm
    other_dir = save_tiny_vlm(tmp_path / "other", family=family, seed=7)
    other = AutoModelForImageTextToText.from_pretrained(other_dir).eval()
    engine = NativeEngine(path, max_batch_size=8, max_seq_len=256)
    before = engine.generate(prompts, GREEDY)
    # Only the image-only modules (vision tower, projector) change: the outputs of image prompts must move.
    image_only = {name: tensor for name, tensor in other.state_dict().items()
                  if not name.startswith(("model.language_model", "model.text_model", "lm_head"))}
    assert image_only
    engine.update_weights(image_only.items())
    after = engine.generate(prompts, GREEDY)
    assert after[0][0].logprobs != before[0][0].logprobs and after[2][0].logprobs == before[2][0].logprobs
    engine.update_weights(other.state_dict().items())
    fresh = NativeEngine(str(other_dir), max_batch_size=8, max_seq_len=256).generate(prompts, GREEDY)
    assert [r[0].token_ids for r in engine.generate(prompts, GREEDY)] == [r[0].token_ids for r in fresh]


def test_text_engine_refuses_image_prompts(vlm, tiny_model_dir):
    family, path, processor, prompts, model = vlm
    with pytest.raises(ValueError, match="prompt holds images but this engine's model is text-only"):
        NativeEngine(tiny_model_dir, max_batch_size=2).generate(prompts[:1], GREEDY)


def test_text_only_backends_refuse_image_prompts(vlm):
    """vLLM, SGLang and Megatron generation take text prompts only: a prompt with images stops with one line
    instead of generating without its images."""
    from rl_backends_gen.requests import validate_prompts

    family, path, processor, prompts, model = vlm
    with pytest.raises(ValueError, match="prompt 0 holds images but the vllm backend takes text prompts only"):
        validate_prompts(prompts[:1], vocab_size=10**6, max_seq_len=None, backend="vllm")
    # A chat without images is its token ids everywhere.
    assert validate_prompts(prompts[2:], vocab_size=10**6, max_seq_len=None, backend="vllm") == [prompts[2].input_ids]
