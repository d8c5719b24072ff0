"""Tiny VLMs built offline: each family saves, loads back, renders image parts, runs forward and generate."""

from __future__ import annotations

import json

import pytest
import torch
from PIL import Image

from rl_core.models.processor import image_only_processor_class, load_processor, needs_torchvision
from rl_core.models.tiny_vlm import VLM_FAMILIES, build_tiny_vlm_processor, save_tiny_vlm, tiny_vlm_config

IMAGE_PART = {"qwen2_5_vl": "<|vision_start|><|image_pad|><|vision_end|>", "qwen3_vl":
              "<|vision_start|><|image_pad|><|vision_end|>", "idefics3": "<image>"}
RENDERED = {  # the chat template's text for one user turn with an image and a question
    "qwen2_5_vl": "<|im_start|>user\n{image}What colour?<|im_end|>\n<|im_start|>assistant\n",
    "qwen3_vl": "<|im_start|>user\n{image}What colour?<|im_end|>\n<|im_start|>assistant\n",
    "idefics3": "<|im_start|>User:{image}What colour?<end_of_utterance>\nAssistant:",
}
IMAGE_TOKEN = {"qwen2_5_vl": "<|image_pad|>", "qwen3_vl": "<|image_pad|>", "idefics3": "<image>"}


@pytest.fixture(scope="module", params=VLM_FAMILIES)
def vlm(request, tmp_path_factory):
    """(family, directory, model, processor) of a tiny VLM saved and loaded back."""
    from transformers import AutoModelForImageTextToText

    family = request.param
    path = save_tiny_vlm(tmp_path_factory.mktemp(family), family=family)
    model = AutoModelForImageTextToText.from_pretrained(path).eval()
    return family, path, model, load_processor(path)


def _messages(colour=(255, 0, 0), size=(40, 30)):
    image = Image.new("RGB", size, colour)
    return [{"role": "user", "content": [{"type": "image", "image": image}, {"type": "text", "text": "What colour?"}]}]


def _inputs(processor, messages):
    return processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True,
                                         return_tensors="pt")


def test_loads_back_as_the_family(vlm):
    family, path, model, processor = vlm
    assert model.config.model_type == family
    assert type(model).__name__ == {"qwen2_5_vl": "Qwen2_5_VLForConditionalGeneration", "qwen3_vl":
                                    "Qwen3VLForConditionalGeneration", "idefics3": "Idefics3ForConditionalGeneration"}[family]
    config = json.loads((path / "processor_config.json").read_text())
    assert config["processor_class"] == type(processor).__name__
    assert {"qwen2_5_vl": "Qwen2_5_VLProcessor", "qwen3_vl": "Qwen3VLProcessor",
            "idefics3": "Idefics3Processor"}[family] == type(processor).__name__
    assert (path / "chat_template.jinja").is_file() and (path / "tokenizer.json").is_file()
    vision = model.model.visual if family != "idefics3" else model.model.vision_model
    layers = vision.blocks if family != "idefics3" else vision.encoder.layers
    assert len(layers) == 2
    assert model.config.text_config.head_dim == 32 if family != "qwen2_5_vl" else \
        model.config.text_config.hidden_size // model.config.text_config.num_attention_heads == 32


def test_chat_template_renders_image_parts(vlm):
    family, _, _, processor = vlm
    text = processor.apply_chat_template(_messages(), add_generation_prompt=True, tokenize=False)
    assert text == RENDERED[family].format(image=IMAGE_PART[family])
    # A text-only turn (string content) renders too: the assistant's answers in SFT data are strings.
    both = _messages() + [{"role": "assistant", "content": "\\boxed{red}"}]
    assert processor.apply_chat_template(both, tokenize=False).endswith(
        {"idefics3": "Assistant: \\boxed{red}<end_of_utterance>\n"}.get(family, "assistant\n\\boxed{red}<|im_end|>\n"))


def test_image_becomes_four_image_tokens(vlm):
    family, _, _, processor = vlm
    ids = _inputs(processor, _messages())["input_ids"][0].tolist()
    # 32 x 32 pixels, 8-pixel patches, 2 x 2 patches per token: 4 image tokens, whatever the input size.
    assert ids.count(processor.tokenizer.convert_tokens_to_ids(IMAGE_TOKEN[family])) == 4


def test_forward_sees_the_image_and_generate_is_greedy(vlm):
    family, _, model, processor = vlm
    red, blue = _inputs(processor, _messages((255, 0, 0))), _inputs(processor, _messages((0, 0, 255)))
    with torch.no_grad():
        logits_red, logits_blue = model(**red).logits, model(**blue).logits
    assert logits_red.shape == (1, red["input_ids"].shape[1], len(processor.tokenizer))
    assert torch.isfinite(logits_red).all()
    # Same text, another image: the image tokens change the logits after them.
    assert (logits_red[0, -1] - logits_blue[0, -1]).abs().max() > 1e-4
    out = model.generate(**red, max_new_tokens=5, do_sample=False)
    new = out[0, red["input_ids"].shape[1]:]
    assert len(new) == 5
    # Greedy decoding with the KV cache equals re-running the full sequence and taking each argmax.
    seq = red["input_ids"]
    for token in new.tolist():
        step = dict(red, input_ids=seq, attention_mask=torch.ones_like(seq))
        if "mm_token_type_ids" in red:  # Qwen's M-RoPE needs the kind of every token: generated ones are text (0)
            step["mm_token_type_ids"] = torch.nn.functional.pad(red["mm_token_type_ids"], (0, seq.shape[1] - red["input_ids"].shape[1]))
        with torch.no_grad():
            next_token = model(**step).logits[0, -1].argmax().item()
        assert next_token == token
        seq = torch.cat([seq, torch.tensor([[token]])], dim=1)


def test_qwen_processor_without_torchvision_is_image_only(tmp_path):
    import transformers

    full = transformers.Qwen2_5_VLProcessor
    image_only = image_only_processor_class(full)
    assert needs_torchvision(full) and not needs_torchvision(image_only)
    assert image_only.__name__ == full.__name__ and issubclass(image_only, full)
    tiny = build_tiny_vlm_processor("qwen2_5_vl")
    processor = image_only(image_processor=tiny.image_processor, tokenizer=tiny.tokenizer)
    assert processor.image_token_id == processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    frames = [Image.new("RGB", (32, 32))] * 2
    with pytest.raises(ValueError, match="without its video processor"):
        processor(text=["<|vision_start|><|video_pad|><|vision_end|>"], videos=[frames])


def test_saved_qwen_processor_keeps_video_settings_for_full_loads(tmp_path):
    path = save_tiny_vlm(tmp_path / "q3", family="qwen3_vl", image_size=64, patch_size=16)
    config = json.loads((path / "processor_config.json").read_text())
    assert config["video_processor"]["video_processor_type"] == "Qwen3VLVideoProcessor"
    assert config["video_processor"]["patch_size"] == config["image_processor"]["patch_size"] == 16
    assert config["image_processor"]["size"] == {"shortest_edge": 64 * 64, "longest_edge": 64 * 64}


def test_bad_sizes_and_families_are_refused():
    processor = build_tiny_vlm_processor("idefics3")
    with pytest.raises(ValueError, match="unknown tiny VLM family 'llava'"):
        tiny_vlm_config(processor, "llava")
    with pytest.raises(ValueError, match="multiple of 2 \\* patch_size"):
        build_tiny_vlm_processor("qwen3_vl", image_size=40, patch_size=8)
