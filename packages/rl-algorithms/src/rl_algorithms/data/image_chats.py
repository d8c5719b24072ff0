"""SFT samples with images, for vision-language models: rows read with their images decoded
(:mod:`rl_core.image_files`), rendered by the model's own processor (its chat template and image-token
expansion, :func:`rl_core.vision_inputs.encode_chat`), loss on the assistant turns.

The loss mask comes from the rendered text as for text chats (:mod:`.tokenize`: character spans of the
trained assistant turns), tokenised without the image expansion; the processor's tokens are that same
sequence with each image placeholder grown into the image's tokens (special tokens only), so the mask
is carried over token by token, and an image token never carries loss.

Rows (the layouts of :mod:`rl_core.images`): ``messages`` whose content lists text and image parts (or
``{"type": "image"}`` placeholders filled from the row's ``data.images_key`` field); or a prompt row: its
``data.prompt_key`` text and ``data.images_key`` images as the user turn and ``data.response_key`` as
the assistant's reply. A row without images is a text chat (:func:`.rows.parse_chat_row`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rl_algorithms.data.config import ChatDataConfig
from rl_algorithms.data.loading import _split_of
from rl_algorithms.data.rows import RESPONSE_ALIASES, ChatSample, PlainSample, parse_chat_row
from rl_algorithms.data.tokenize import TokenizedSample, chat_text_and_spans, tokenize_with_spans
from rl_core.data_files import BadRow, DataError, Loaded, convert_rows
from rl_core.image_files import read_image_rows
from rl_core.images import message_images, row_to_chat
from rl_core.vision_inputs import encode_chat


def load_image_chat_dataset(path: str, cfg: ChatDataConfig, processor) -> Loaded[TokenizedSample]:
    """SFT samples of a vision-language model: each row with its images through ``processor``; a missing or
    undecodable image is a bad row naming the file, the row and the image (``data.on_bad_row``)."""
    if path is None:
        raise DataError("no dataset file given: set data.train_path (or use the command's synthetic_data section)")
    base_dir = Path(path).parent if Path(path).is_file() else Path(path)

    def convert(record: dict[str, Any]) -> TokenizedSample:
        return tokenize_image_chat(processor, parse_image_chat_row(record, cfg, base_dir), cfg.max_length)

    return convert_rows(str(path), read_image_rows(path, split=_split_of(path, cfg)), convert,
                        on_bad_row=cfg.on_bad_row)


def parse_image_chat_row(record: dict[str, Any], cfg: ChatDataConfig, base_dir: Path) -> ChatSample:
    """The chat of one row, images decoded into its messages (see the module doc); raises BadRow."""
    if not _has_images(record, cfg):
        sample = parse_chat_row(record, cfg)
        if isinstance(sample, PlainSample):
            raise BadRow("a vision-language model trains on chats: set data.use_chat_template=true")
        return sample
    messages, rest = row_to_chat(record, base_dir, messages_field=cfg.messages_key, prompt_field=cfg.prompt_key,
                                 images_field=cfg.images_key)
    if cfg.messages_key not in record:  # a prompt row: the reply follows the prompt and its images
        key = next((k for k in (cfg.response_key, *RESPONSE_ALIASES.get(cfg.response_key, ())) if k in rest),
                   cfg.response_key)
        reply = rest.get(key)
        if not isinstance(reply, str) or not reply.strip():
            raise BadRow(f"field {key!r} (the reply, data.response_key) must be a non-empty string")
        messages.append({"role": "assistant", "content": reply})
    if cfg.system_prompt is not None and messages[0]["role"] != "system":
        messages.insert(0, {"role": "system", "content": cfg.system_prompt})
    assistant = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    if not assistant:
        raise BadRow(f"field {cfg.messages_key!r} has no assistant message to train on")
    trainable = assistant if cfg.train_on == "all_assistant" else assistant[-1:]
    for i in trainable:
        if message_images(messages[i:i + 1]) or not _text(messages[i]["content"]).strip():
            raise BadRow(f"{cfg.messages_key}[{i}] (an assistant reply) must be non-empty text without images")
    return ChatSample(messages, trainable)


def tokenize_image_chat(processor, sample: ChatSample, max_length: int) -> TokenizedSample:
    """``sample`` through the processor (token ids, image tensors, ``mm_token_type_ids``) with its loss mask."""
    encoded = encode_chat(processor, sample.messages)
    text, spans = chat_text_and_spans(processor, sample)
    ids, mask = tokenize_with_spans(processor.tokenizer, text, spans)
    loss_mask = expand_mask(ids, mask, encoded.input_ids, _special_ids(processor.tokenizer))
    if len(encoded.input_ids) > max_length:
        raise BadRow(f"{len(encoded.input_ids)} tokens (images included), longer than data.max_length={max_length}")
    if not any(loss_mask):
        raise BadRow("no response token to train on after tokenisation")
    return TokenizedSample(encoded.input_ids, loss_mask, encoded.image_inputs, encoded.mm_token_type_ids)


def expand_mask(ids: list[int], mask: list[float], expanded: list[int], inserted: set[int]) -> list[float]:
    """``mask`` of ``ids`` carried over to ``expanded``: ``ids`` with special tokens (``inserted``: the image
    tokens an image placeholder grows into) added; an added token gets 0."""
    out: list[float] = []
    i = 0
    for token in expanded:
        if i < len(ids) and token == ids[i]:
            out.append(mask[i])
            i += 1
        elif token in inserted:
            out.append(0.0)
        else:
            break
    if i != len(ids) or len(out) != len(expanded):
        raise DataError("the processor's tokens are not the chat template's tokens with image tokens added, so the "
                        "loss mask cannot be carried over; this processor is not supported for SFT")
    return out


def _special_ids(tokenizer) -> set[int]:
    """Ids of the tokenizer's special tokens, the added ones (image tokens) included."""
    added = {index for index, token in tokenizer.added_tokens_decoder.items() if token.special}
    return added | set(tokenizer.all_special_ids)


def _has_images(record: dict[str, Any], cfg: ChatDataConfig) -> bool:
    """Whether a row is an image row: it has images, or messages whose content is a list of parts."""
    if record.get(cfg.images_key) not in (None, [], ()):
        return True
    messages = record.get(cfg.messages_key)
    return isinstance(messages, list) and any(isinstance(m, dict) and isinstance(m.get("content"), list)
                                              for m in messages)


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content if isinstance(part, dict))
