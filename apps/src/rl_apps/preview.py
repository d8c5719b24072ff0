"""Text a person reads to check a run before it starts (``--dry-run``): the model, the data, one sample
as the model will see it with the tokens that carry loss marked."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rl_core.data_files import Loaded

TRAINED_OPEN, TRAINED_CLOSE = "⟦", "⟧"
"""Marks around the tokens that carry loss in a rendered sample."""
IMAGE_OPEN, IMAGE_CLOSE = "⟨", "⟩"
"""Marks around the note that stands for an image's tokens."""
RULE = "-" * 72


def out(line: str = "") -> None:
    print(line, file=sys.stdout)


def describe_model(label: str, name: str, path: str, tokenizer) -> None:
    """``model <name> -> <dir> (<type>, N parameters, vocab V)`` and what the tokenizer brings."""
    out(f"{label:<10}{name} -> {path} ({_architecture(path)})")
    template = "yes" if getattr(tokenizer, "chat_template", None) else "no (plain text only)"
    out(f"{'':<10}tokenizer: {len(tokenizer)} tokens, chat template: {template}, eos {tokenizer.eos_token!r}, "
        f"pad {tokenizer.pad_token!r}")


def _architecture(path: str) -> str:
    """Model type, parameter count (the model built on the meta device: no weights are read) and vocabulary."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

    config = AutoConfig.from_pretrained(path)
    vision = getattr(config, "vision_config", None) is not None
    with torch.device("meta"):
        model = (AutoModelForImageTextToText if vision else AutoModelForCausalLM).from_config(config)
    parameters = sum(p.numel() for p in model.parameters())
    kind = ", vision-language" if vision else ""
    return f"{config.model_type}{kind}, {parameters / 1e6:.2f}M parameters, vocab {config.get_text_config().vocab_size}"


def describe_splits(train: Loaded, val: Loaded | None, synthetic: bool) -> None:
    """Rows used and skipped of each split."""
    where = "synthetic (a real run writes it to <output_dir>/data)" if synthetic else train.report.path
    out(f"{'data':<10}train: {_rows(train)} from {where}")
    if val is not None:
        out(f"{'':<10}validation: {_rows(val)}" + ("" if synthetic else f" from {val.report.path}"))
    else:
        out(f"{'':<10}validation: none")


def _rows(loaded: Loaded) -> str:
    skipped = f", {loaded.report.num_skipped} bad rows skipped" if loaded.report.num_skipped else ""
    return f"{len(loaded)} rows{skipped}"


@dataclass
class ImageTokens:
    """How a sample's image tokens are shown: each run of ``token_id`` as one note."""

    token_id: int
    notes: list[str]
    """One per run of image tokens, in order (``image 64x64 px: 16 tokens``)."""


def image_notes(model_path: str, input_ids: Sequence[int], image_inputs: dict[str, Any]) -> ImageTokens | None:
    """The notes of a vision-language sample's images: each image's size as the model sees it (after the
    processor's resizing) and its token count; None without images."""
    if not image_inputs:
        return None
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_path)
    runs = _runs(input_ids, config.image_token_id)
    if "image_grid_thw" in image_inputs:  # Qwen-VL: a (t, h, w) grid of patches per image
        patch = config.vision_config.patch_size
        sizes = [(int(w) * patch, int(h) * patch) for _, h, w in image_inputs["image_grid_thw"].tolist()]
    else:  # [1, images, channels, H, W]
        pixels = image_inputs["pixel_values"]
        sizes = [(pixels.shape[-1], pixels.shape[-2])] * pixels.shape[1]
    if len(sizes) != len(runs):  # e.g. an image split into tiles: token counts only
        return ImageTokens(config.image_token_id, [f"image: {n} tokens" for n in runs])
    return ImageTokens(config.image_token_id, [f"image {w}x{h} px: {n} tokens" for (w, h), n in zip(sizes, runs)])


def _runs(input_ids: Sequence[int], token_id: int) -> list[int]:
    """Lengths of the runs of ``token_id``."""
    runs, previous = [], None
    for token in input_ids:
        if token == token_id:
            if previous == token_id:
                runs[-1] += 1
            else:
                runs.append(1)
        previous = token
    return runs


def masked_text(tokenizer, input_ids: Sequence[int], loss_mask: Sequence[float],
                images: ImageTokens | None = None) -> str:
    """The decoded tokens, with each run of tokens that carry loss between ⟦ and ⟧ and each run of image tokens
    as its note between ⟨ and ⟩."""
    pieces, run, trained = [], [], None
    notes = iter(images.notes) if images is not None else iter(())
    previous = None
    for token, mask in zip(input_ids, loss_mask):
        if images is not None and token == images.token_id:
            if previous != token:
                if run:
                    pieces.append(_piece(tokenizer, run, trained))
                    run = []
                pieces.append(f"{IMAGE_OPEN}{next(notes, 'image')}{IMAGE_CLOSE}")
            previous = token
            continue
        previous = token
        if bool(mask) != trained and run:
            pieces.append(_piece(tokenizer, run, trained))
            run = []
        trained = bool(mask)
        run.append(token)
    if run:
        pieces.append(_piece(tokenizer, run, trained))
    return "".join(pieces)


def _piece(tokenizer, ids: list[int], trained: bool | None) -> str:
    text = tokenizer.decode(ids)
    return f"{TRAINED_OPEN}{text}{TRAINED_CLOSE}" if trained else text


def show_sample(title: str, tokenizer, input_ids: Sequence[int], loss_mask: Sequence[float] | None = None,
                images: ImageTokens | None = None) -> None:
    """A tokenised sample between rules, with its token counts (and loss mask when it has one); ``images``: each
    image's tokens shown as one note."""
    counts = f"{len(input_ids)} tokens"
    if images is not None:
        counts += f" ({sum(_runs(input_ids, images.token_id))} image tokens, {IMAGE_OPEN} {IMAGE_CLOSE})"
    if loss_mask is not None:
        counts += f", {int(sum(1 for m in loss_mask if m))} carry loss (between {TRAINED_OPEN} {TRAINED_CLOSE})"
    out(f"{title}: {counts}")
    out(RULE)
    if loss_mask is None and images is not None:
        loss_mask = [0.0] * len(input_ids)
    text = masked_text(tokenizer, input_ids, loss_mask, images) if loss_mask is not None else tokenizer.decode(list(input_ids))
    out(text.rstrip("\n"))
    out(RULE)


def show_prompt(title: str, tokenizer, prompt, model_path: str | None = None) -> None:
    """A generation prompt: token ids, or an ``EncodedChat`` whose images are shown as their notes."""
    if hasattr(prompt, "image_inputs"):  # a vision-language model's chat with images
        show_sample(title, tokenizer, prompt.input_ids, images=image_notes(model_path, prompt.input_ids,
                                                                           prompt.image_inputs))
    else:
        show_sample(title, tokenizer, prompt)


def show_messages_prompt(title: str, tokenizer, messages: list[dict[str, str]], note: str,
                         metadata: dict[str, Any] | None = None, model_path: str | None = None) -> None:
    """A chat prompt rendered with the generation prompt, the text the policy continues (with a vision-language
    model's tokenizer, its images expanded into their tokens)."""
    encode = getattr(tokenizer, "encode_image_chat", None)
    show_prompt(title, tokenizer, encode(messages) if encode is not None else
                tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True, return_dict=False),
                model_path)
    if metadata:
        out(f"{'':<10}metadata: {metadata}")
    out(f"{'':<10}{note}")
