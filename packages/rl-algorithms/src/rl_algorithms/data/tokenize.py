"""Tokenise samples with the chat template and a loss mask on assistant tokens only.

The mask comes from templated prefixes, so it is right for any append-only chat template: for a
trained assistant message i, the text of ``messages[:i]`` rendered with the generation prompt ends
where the message's content starts, and ``messages[:i + 1]`` rendered (trailing whitespace removed)
ends after its end-of-turn token. Tokens of the full rendering whose character offset starts inside
that span get loss mask 1. The end-of-turn token (``<|im_end|>`` in ChatML) is trained, so the model
learns to stop; the newline after it is not.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from rl_algorithms.data.rows import ChatSample, Message, PlainSample, Sample
from rl_core.data_files import BadRow, DataError


@dataclass
class TokenizedSample:
    """One tokenised sample: ``input_ids`` and a same-length ``loss_mask`` (1.0 on trained tokens); for a
    vision-language model also its processor outputs (:mod:`.image_chats`)."""

    input_ids: list[int]
    loss_mask: list[float]
    image_inputs: dict[str, torch.Tensor] = field(default_factory=dict)
    """The sample's image tensors as the processor gives them (``{}``: no image)."""
    mm_token_type_ids: list[int] | None = None
    """Qwen-VL: 1 on image tokens, 0 elsewhere (same length as ``input_ids``)."""

    def __len__(self) -> int:
        return len(self.input_ids)


def tokenize_sample(tokenizer, sample: Sample, max_length: int) -> TokenizedSample:
    """Tokenise ``sample``; raises :class:`BadRow` if it is longer than ``max_length`` or trains nothing."""
    if isinstance(sample, ChatSample):
        text, spans = chat_text_and_spans(tokenizer, sample)
    else:
        text, spans = plain_text_and_spans(tokenizer, sample)
    input_ids, loss_mask = tokenize_with_spans(tokenizer, text, spans)
    if len(input_ids) > max_length:
        raise BadRow(f"{len(input_ids)} tokens, longer than data.max_length={max_length}")
    if not any(loss_mask):
        raise BadRow("no response token to train on after tokenisation")
    return TokenizedSample(input_ids, loss_mask)


def render_chat(tokenizer, messages: list[Message], add_generation_prompt: bool = False) -> str:
    """The chat template's text for ``messages``."""
    if getattr(tokenizer, "chat_template", None) is None:
        raise DataError("the tokenizer has no chat template; set data.use_chat_template=false for plain text")
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)


def chat_text_and_spans(tokenizer, sample: ChatSample) -> tuple[str, list[tuple[int, int]]]:
    """The rendered chat and the character spans ``[start, end)`` of its trained assistant turns."""
    full = render_chat(tokenizer, sample.messages)
    spans = []
    for i in sample.trainable:
        prefix = render_chat(tokenizer, sample.messages[:i], add_generation_prompt=True)
        through = render_chat(tokenizer, sample.messages[: i + 1]).rstrip()
        if not (full.startswith(prefix) and full.startswith(through) and len(through) > len(prefix)):
            raise DataError(
                "the chat template is not append-only (the rendering of the first messages is not a prefix "
                f"of the whole conversation at message {i}), so assistant tokens cannot be located; use a "
                "template that renders earlier turns unchanged"
            )
        spans.append((len(prefix), len(through)))
    return full, spans


def plain_text_and_spans(tokenizer, sample: PlainSample) -> tuple[str, list[tuple[int, int]]]:
    """``prompt + response + eos`` with the span of the response and the eos token."""
    eos = tokenizer.eos_token or ""
    text = sample.prompt + sample.response + eos
    return text, [(len(sample.prompt), len(text))]


def tokenize_with_spans(tokenizer, text: str, spans: list[tuple[int, int]]) -> tuple[list[int], list[float]]:
    """Token ids of ``text`` and a mask of the tokens that start inside one of ``spans``."""
    if not getattr(tokenizer, "is_fast", False):
        raise DataError("loss masks need character offsets: use a fast (Rust) tokenizer")
    encoding = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    mask = [0.0] * len(encoding["input_ids"])
    for j, (token_start, _) in enumerate(encoding["offset_mapping"]):
        if any(start <= token_start < end for start, end in spans):
            mask[j] = 1.0
    return list(encoding["input_ids"]), mask


def prompt_token_ids(tokenizer, messages: list[Message]) -> list[int]:
    """Token ids of ``messages`` with the generation prompt (what a policy completes)."""
    text = render_chat(tokenizer, messages, add_generation_prompt=True)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])
