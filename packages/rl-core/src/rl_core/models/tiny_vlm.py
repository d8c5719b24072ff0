"""Tiny vision-language models built offline: Qwen2.5-VL, Qwen3-VL and Idefics3 (the SmolVLM architecture).

Each family is the transformers 5 model class with a randomly initialised (seeded) config of a few hundred
thousand parameters: a language model of head_dim 32 (vLLM's CPU kernels need >= 32), a vision tower of
1-2 layers, and a processor made here: the family's image processor sized for small square images, and
the tiny byte-level BPE tokenizer of :mod:`rl_core.models.tiny` with the family's image special tokens
and a chat template that renders ``{"type": "image"}`` content parts the way the family's real template
does (no default system prompt, to keep sequences short). ``save_tiny_vlm`` writes a normal HF directory
that ``AutoModelForImageTextToText`` and :func:`rl_core.models.processor.load_processor` (``AutoProcessor``
where torchvision is installed) load back.

Image size and tokens: every image is resized to ``image_size`` x ``image_size`` pixels and cut into
``patch_size`` patches; groups of 2 x 2 patches become one image token, so an image costs
``(image_size // patch_size) ** 2 // 4`` tokens (4 at the defaults).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from rl_core.models.tiny import build_tiny_tokenizer

VLM_FAMILIES = ("qwen2_5_vl", "qwen3_vl", "idefics3")
SIZES: dict[str, dict[str, Any]] = {
    "xs": {},  # the defaults: 32 px images, language model hidden 64 x 2 layers
    "s": {"image_size": 64, "patch_size": 8,
          "text": {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4},
          "vision": {"hidden_size": 64, "intermediate_size": 128}},
}
"""``save_tiny_vlm`` arguments of the named sizes (docs/vlm.md): ``s`` is the CPU recipe's (about 0.9M parameters,
64 px images in 8 px patches, 16 image tokens)."""
_QWEN_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
# Idefics3's processor looks these up by name (the row/column tags mark the tiles of a split image).
_IDEFICS3_TOKENS = ["<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>"] + [
    f"<row_{row}_col_{col}>" for row in range(1, 7) for col in range(1, 7)]
# 2 x 2 patches merge into one token (Qwen's spatial merge, Idefics3's pixel shuffle).
MERGE = 2

_CONTENT = (  # a message's content: a string, or a list of text and image parts ({image} renders an image part)
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}{image}{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
)
QWEN_CHAT_TEMPLATE = (  # ChatML, an image as <|vision_start|><|image_pad|><|vision_end|> (as Qwen2.5-VL / Qwen3-VL)
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' }}"
    + _CONTENT.replace("{image}", "<|vision_start|><|image_pad|><|vision_end|>")
    + "{{ '<|im_end|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
IDEFICS3_CHAT_TEMPLATE = (  # SmolVLM's: "User:<image>question<end_of_utterance>\nAssistant:"
    "{{ '<|im_start|>' }}{% for message in messages %}{{ message['role'] | capitalize }}"
    "{% if message['content'] is not string and message['content'][0]['type'] == 'image' %}{{ ':' }}"
    "{% else %}{{ ': ' }}{% endif %}"
    + _CONTENT.replace("{image}", "<image>")
    + "{{ '<end_of_utterance>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
)


def _check(family: str, image_size: int, patch_size: int) -> None:
    if family not in VLM_FAMILIES:
        raise ValueError(f"unknown tiny VLM family {family!r}; use one of {', '.join(VLM_FAMILIES)}")
    if image_size % (patch_size * MERGE):
        raise ValueError(f"image_size {image_size} must be a multiple of 2 * patch_size ({2 * patch_size})")


def build_tiny_vlm_processor(family: str = "qwen2_5_vl", image_size: int = 32, patch_size: int = 8,
                             vocab_size: int = 512, seed: int = 0):
    """The family's processor for ``image_size``-pixel square images, with the tiny tokenizer.

    Qwen families with torchvision get their full processor class, video processor included (same patch
    and merge sizes as the image processor); without it, the image-only form of the class
    (:func:`rl_core.models.processor.image_only_processor_class`), which saves as the full one.
    """
    _check(family, image_size, patch_size)
    tokenizer = build_tiny_tokenizer(vocab_size=vocab_size, seed=seed)
    # Mean/std 0.5: the procedural images are flat colours, and a symmetric range keeps their pixels in [-1, 1].
    norm = {"image_mean": [0.5] * 3, "image_std": [0.5] * 3}
    if family == "idefics3":
        from transformers import Idefics3Processor
        from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil

        tokenizer.add_special_tokens({"additional_special_tokens": _IDEFICS3_TOKENS})
        tokenizer.eos_token = "<end_of_utterance>"
        image_processor = Idefics3ImageProcessorPil(
            size={"longest_edge": image_size}, max_image_size={"longest_edge": image_size},
            do_image_splitting=False, **norm)
        seq_len = (image_size // patch_size) ** 2 // MERGE**2
        return Idefics3Processor(image_processor=image_processor, tokenizer=tokenizer, image_seq_len=seq_len,
                                 chat_template=IDEFICS3_CHAT_TEMPLATE)
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    tokenizer.add_special_tokens({"additional_special_tokens": _QWEN_TOKENS})
    pixels = image_size * image_size  # min = max pixels: every image is resized to about image_size^2
    image_processor = Qwen2VLImageProcessorPil(
        size={"shortest_edge": pixels, "longest_edge": pixels}, patch_size=patch_size, merge_size=MERGE,
        temporal_patch_size=2, **norm)
    parts = {"image_processor": image_processor, "tokenizer": tokenizer}
    if _has_torchvision():  # the full processor class, which needs its video processor too
        parts["video_processor"] = _qwen_video_processor(family)(
            size={"shortest_edge": pixels, "longest_edge": pixels}, patch_size=patch_size, merge_size=MERGE,
            temporal_patch_size=2, **norm)
    return _qwen_processor_class(family)(**parts, chat_template=QWEN_CHAT_TEMPLATE)


def _has_torchvision() -> bool:
    from transformers.utils import is_torchvision_available

    return is_torchvision_available()


def _qwen_video_processor(family: str) -> type:
    if family == "qwen2_5_vl":
        from transformers.models.qwen2_vl.video_processing_qwen2_vl import Qwen2VLVideoProcessor

        return Qwen2VLVideoProcessor
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor

    return Qwen3VLVideoProcessor


def _qwen_processor_class(family: str) -> type:
    import transformers

    from rl_core.models.processor import image_only_processor_class

    cls = transformers.Qwen2_5_VLProcessor if family == "qwen2_5_vl" else transformers.Qwen3VLProcessor
    return cls if _has_torchvision() else image_only_processor_class(cls)


def tiny_vlm_config(processor, family: str = "qwen2_5_vl", image_size: int = 32, patch_size: int = 8,
                    text: dict[str, Any] | None = None, vision: dict[str, Any] | None = None):
    """Config of a tiny ``family`` model; ``text`` / ``vision`` override fields of the text / vision config."""
    from transformers import AutoConfig

    _check(family, image_size, patch_size)
    tokenizer = processor.tokenizer
    token = tokenizer.convert_tokens_to_ids
    text_config = dict(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=32, max_position_embeddings=1024,
        rms_norm_eps=1e-6, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None, tie_word_embeddings=False)
    vision_config = dict(hidden_size=64, intermediate_size=128, num_attention_heads=2)
    tokens: dict[str, Any] = {}
    if family == "idefics3":
        text_config["model_type"] = "llama"
        vision_config |= dict(num_hidden_layers=2, image_size=image_size, patch_size=patch_size)
        tokens = {"scale_factor": MERGE, "image_token_id": token("<image>"), "pad_token_id": tokenizer.pad_token_id}
    else:
        # M-RoPE: the 16 rotary frequencies of head_dim 32 split over (time, height, width).
        text_config["rope_parameters"] = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [4, 6, 6]}
        vision_config |= dict(depth=2, patch_size=patch_size, spatial_merge_size=MERGE, temporal_patch_size=2)
        if family == "qwen2_5_vl":
            text_config.pop("head_dim")  # Qwen2.5-VL derives it (hidden_size / heads = 32)
            # Windowed attention in the first block over 2 x 2 merged tokens, full attention in the last.
            vision_config |= dict(window_size=2 * MERGE * patch_size, fullatt_block_indexes=[1])
        else:
            text_config["rope_parameters"]["mrope_interleaved"] = True
            # Learned position embeddings over the patch grid; DeepStack feeds block 0's features to the LM.
            vision_config |= dict(num_position_embeddings=(image_size // patch_size) ** 2,
                                  deepstack_visual_indexes=[0])
        tokens = {"image_token_id": token("<|image_pad|>"), "video_token_id": token("<|video_pad|>"),
                  "vision_start_token_id": token("<|vision_start|>"), "vision_end_token_id": token("<|vision_end|>")}
    text_config |= text or {}
    vision_config |= vision or {}
    if family != "idefics3":  # Qwen vision configs name the head count num_heads; the merger projects to the LM
        vision_config["num_heads"] = vision_config.pop("num_attention_heads")
        vision_config["out_hidden_size"] = text_config["hidden_size"]
    config = AutoConfig.for_model(family, text_config=text_config, vision_config=vision_config,
                                  tie_word_embeddings=False, dtype="float32", **tokens)
    config.eos_token_id = tokenizer.eos_token_id  # generate() reads it from the top-level config
    return config


def build_tiny_vlm(processor, family: str = "qwen2_5_vl", seed: int = 0, image_size: int = 32,
                   patch_size: int = 8, text: dict[str, Any] | None = None, vision: dict[str, Any] | None = None):
    """A randomly initialised ``AutoModelForImageTextToText`` model (seeded, fp32, eval mode)."""
    from transformers import AutoModelForImageTextToText

    config = tiny_vlm_config(processor, family, image_size, patch_size, text, vision)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = AutoModelForImageTextToText.from_config(config, dtype=torch.float32)
    model.generation_config.eos_token_id = processor.tokenizer.eos_token_id
    model.generation_config.pad_token_id = processor.tokenizer.pad_token_id
    return model.eval()


def save_tiny_vlm(path: str | Path, family: str = "qwen2_5_vl", seed: int = 0, image_size: int = 32,
                  patch_size: int = 8, vocab_size: int = 512, text: dict[str, Any] | None = None,
                  vision: dict[str, Any] | None = None) -> Path:
    """Build a tiny VLM and its processor and save them as one HF directory (safetensors). Returns the path."""
    path = Path(path)
    processor = build_tiny_vlm_processor(family, image_size, patch_size, vocab_size, seed)
    model = build_tiny_vlm(processor, family, seed, image_size, patch_size, text, vision)
    model.save_pretrained(path, safe_serialization=True)
    processor.save_pretrained(path)
    if family != "idefics3":
        _add_video_processor(path / "processor_config.json", family)
    return path


def _add_video_processor(processor_config: Path, family: str) -> None:
    """Write the video processor's settings next to the image processor's, as a full Qwen processor saves them,
    so ``AutoProcessor`` on an install with torchvision builds a video processor of the same patch sizes."""
    config = json.loads(processor_config.read_text(encoding="utf-8"))
    if "video_processor" in config:
        return
    image = config["image_processor"]
    names = {"qwen2_5_vl": "Qwen2VLVideoProcessor", "qwen3_vl": "Qwen3VLVideoProcessor"}
    config["video_processor"] = {"video_processor_type": names[family]} | {
        key: image[key] for key in ("patch_size", "merge_size", "temporal_patch_size", "image_mean", "image_std")}
    processor_config.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
