"""Tiny VLM directories and image batches for the training-backend tests of vision-language models."""

from __future__ import annotations

import torch
from PIL import Image

from rl_core.vision_batch import image_rows
from rl_core.vision_inputs import encode_chat

FAMILIES = ["qwen2_5_vl", "qwen3_vl", "idefics3"]
REPLY_TOKENS = 6
"""The loss sees the last tokens of each row (the assistant's reply and its end of turn)."""


def chats() -> list[list[dict]]:
    """Three chats: one image, two images, none; each with an assistant reply."""
    red, blue = Image.new("RGB", (32, 32), (220, 30, 30)), Image.new("RGB", (48, 24), (30, 60, 220))
    green = Image.new("RGB", (20, 30), (30, 160, 50))
    reply = {"role": "assistant", "content": "\\boxed{red}"}
    return [
        [{"role": "user", "content": [{"type": "image", "image": red}, {"type": "text", "text": "colour?"}]}, reply],
        [{"role": "user", "content": [{"type": "image", "image": blue}, {"type": "text", "text": "and"},
                                      {"type": "image", "image": green}, {"type": "text", "text": "these two?"}]},
         reply],
        [{"role": "user", "content": "no image here, just words"}, reply],
    ]


def vlm_batch(processor, conversations: list[list[dict]]) -> dict[str, torch.Tensor]:
    """Right-padded rows of ``conversations`` with their image rows (rl_core.vision_batch) and
    ``mm_token_type_ids`` when the family has them; loss on each row's last ``REPLY_TOKENS`` tokens."""
    encoded = [encode_chat(processor, chat) for chat in conversations]
    width = max(len(e.input_ids) for e in encoded)
    batch = {"input_ids": torch.zeros(len(encoded), width, dtype=torch.long),
             "attention_mask": torch.zeros(len(encoded), width, dtype=torch.long),
             "loss_mask": torch.zeros(len(encoded), width)}
    if encoded[0].mm_token_type_ids is not None:
        batch["mm_token_type_ids"] = torch.zeros(len(encoded), width, dtype=torch.long)
    for row, e in enumerate(encoded):
        n = len(e.input_ids)
        batch["input_ids"][row, :n] = torch.tensor(e.input_ids)
        batch["attention_mask"][row, :n] = 1
        batch["loss_mask"][row, n - REPLY_TOKENS:n] = 1.0
        if e.mm_token_type_ids is not None:
            batch["mm_token_type_ids"][row, :n] = torch.tensor(e.mm_token_type_ids)
    return batch | image_rows([e.image_inputs for e in encoded])


def image_module_prefixes(family: str) -> tuple[str, ...]:
    """Qualified-name prefixes of the image-only parameters of ``family``."""
    return ("model.vision_model.", "model.connector.") if family == "idefics3" else ("model.visual.",)
