"""Images in chat messages: rows of image datasets as chats whose content holds decoded PIL images.

A chat follows the HF processor style: a message's ``content`` is a string, or a list of parts
``{"type": "text", "text": ...}`` and ``{"type": "image", "image": <PIL.Image>}``. Resizing is the
processor's job; this module only finds and decodes the images. A row gives its images

- inside its messages, as HF parts (``{"type": "image", "image" | "url" | "path": REF}``) or OpenAI parts
  (``{"type": "image_url", "image_url": {"url": REF}}``);
- as ``{"type": "image"}`` placeholders in its messages, filled in order from the row's ``images`` field
  (the layout of HF vision datasets and TRL);
- or, for a prompt row without messages, as its ``images`` field (one REF or a list) next to its text:
  one user turn with the images first, then the text.

A REF is a file path (relative to the dataset file), a ``data:image/...;base64,`` URL, raw bytes, HF's
``{"bytes": ..., "path": ...}`` struct, or an already decoded PIL image (HF datasets' ``Image`` feature).
Remote ``http(s)://`` URLs are refused: nothing is downloaded. A missing or undecodable image is an
:class:`ImageDataError` naming the file, the row and the image.

Files: JSONL (``.jsonl``), JSON lists (``.json``), parquet (image bytes or HF's image structs) and
``datasets`` directories written by ``save_to_disk`` (``Image`` features; pass the split of a DatasetDict).
"""

from __future__ import annotations

import base64
import binascii
import io
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from PIL import Image

from rl_core.data_files import BadRow, DataError

ImageRef = Any
"""A path, ``data:`` URL, bytes, ``{"bytes", "path"}`` struct or PIL image."""


class BadImage(BadRow):
    """One image reference that cannot be turned into an image (the reader adds the file and row)."""


class ImageDataError(DataError):
    """A row of an image dataset is unusable: the message names the file and the row and says what to do."""

    def __init__(self, where: str, problem: str):
        super().__init__(f"{where}: {problem}; fix or remove the row")
        self.where = where
        self.problem = problem


@dataclass
class ImageChat:
    """One row as a chat with decoded images, its other fields and where it came from."""

    messages: list[dict[str, Any]]
    fields: dict[str, Any] = field(default_factory=dict)
    """The row's fields other than the messages, prompt and images (e.g. ``answer``)."""
    where: str = ""
    """``file, line N`` / ``file, row N`` / ``dataset dir (split), row N``."""


def decode_image(ref: ImageRef, base_dir: str | Path | None = None) -> Image.Image:
    """The image ``ref`` points to, fully decoded (a truncated file fails here, not in the processor)."""
    if isinstance(ref, Image.Image):
        return ref
    if isinstance(ref, dict) and ("bytes" in ref or "path" in ref):  # HF datasets' / parquet image struct
        ref = ref.get("bytes") or ref.get("path")
    if isinstance(ref, bytes | bytearray):
        return _open(io.BytesIO(ref), f"the image bytes ({len(ref)} bytes)")
    if not isinstance(ref, str) or not ref:
        raise BadImage(f"an image must be a path, a data: URL, bytes or {{bytes, path}}, got {_kind(ref)}")
    if ref.startswith("data:"):
        return _open(io.BytesIO(_data_url_bytes(ref)), "the data: URL image")
    if ref.startswith(("http://", "https://")):
        raise BadImage(f"image {ref!r} is a remote URL: images are not downloaded; save it and give its path")
    path = Path(ref)
    if not path.is_absolute() and base_dir is not None:
        path = Path(base_dir) / path
    if path.is_dir():
        raise BadImage(f"image {path} is a directory, not an image file; point the row at an image file")
    if not path.is_file():
        raise BadImage(f"image file {path} does not exist")
    return _open(path, f"image file {path}")


def _data_url_bytes(url: str) -> bytes:
    header, sep, data = url.partition(",")
    if not sep or not header.endswith(";base64"):
        raise BadImage(f"data: URL {url[:40]!r}... is not a base64 image (data:image/png;base64,...)")
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as err:
        raise BadImage(f"data: URL image is not valid base64 ({err})") from None


def _open(source: Any, name: str) -> Image.Image:
    try:
        image = Image.open(source)
        image.load()
    except (OSError, ValueError, Image.DecompressionBombError) as err:
        raise BadImage(f"cannot decode {name} ({type(err).__name__}: {err})") from None
    return image


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def image_part(image: Image.Image) -> dict[str, Any]:
    return {"type": "image", "image": image}


def message_images(messages: list[dict[str, Any]]) -> list[Image.Image]:
    """The images of a chat in the order they appear: what the processor takes next to the rendered text."""
    return [part["image"] for message in messages if not isinstance(message["content"], str)
            for part in message["content"] if part.get("type") == "image"]


def jsonable_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The chat with each image replaced by ``{"type": "image", "size": [w, h]}`` (for logs and sample files)."""
    def part(p: dict[str, Any]) -> dict[str, Any]:
        return {"type": "image", "size": list(p["image"].size)} if p.get("type") == "image" else p

    return [m if isinstance(m["content"], str) else {**m, "content": [part(p) for p in m["content"]]}
            for m in messages]


def row_to_chat(row: dict[str, Any], base_dir: str | Path | None = None, *, messages_field: str = "messages",
                prompt_field: str = "problem", images_field: str = "images") -> tuple[list[dict[str, Any]], dict]:
    """``(messages, other fields)`` of one row (see the module doc); raises :class:`BadImage` for a bad row."""
    images = row.get(images_field)
    images = [] if images is None else list(images) if isinstance(images, list | tuple) else [images]
    if messages_field in row:
        messages = _chat_messages(row[messages_field], images, base_dir, messages_field, images_field)
    elif prompt_field in row:
        text = row[prompt_field]
        if not isinstance(text, str) or not text.strip():
            raise BadImage(f"field {prompt_field!r} must be a non-empty string, got {_kind(text)}")
        parts = [image_part(_decode(ref, base_dir, f"{images_field}[{i}]")) for i, ref in enumerate(images)]
        messages = [{"role": "user", "content": [*parts, {"type": "text", "text": text}]}]
    else:
        raise BadImage(f"the row has neither {messages_field!r} nor {prompt_field!r} (fields: {sorted(row)})")
    if not message_images(messages):
        raise BadImage(f"the row has no image (give image parts in {messages_field!r} or a {images_field!r} field)")
    rest = {k: v for k, v in row.items() if k not in (messages_field, prompt_field, images_field)}
    return messages, rest


def _decode(ref: ImageRef, base_dir, label: str) -> Image.Image:
    try:
        return decode_image(ref, base_dir)
    except BadImage as bad:
        raise BadImage(f"{label}: {bad}") from None


def _chat_messages(value: Any, images: list, base_dir, name: str, images_field: str) -> list[dict[str, Any]]:
    if not isinstance(value, list) or not value:
        raise BadImage(f"{name!r} must be a non-empty list of {{role, content}} objects, got {_kind(value)}")
    pending = iter(enumerate(images))
    messages = []
    for m, message in enumerate(value):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise BadImage(f"{name}[{m}] must be an object with a string 'role'")
        content = message.get("content")
        if isinstance(content, str):
            messages.append({"role": message["role"], "content": content})
            continue
        if not isinstance(content, list):
            raise BadImage(f"{name}[{m}].content must be a string or a list of parts, got {_kind(content)}")
        parts = [_part(p, f"{name}[{m}].content[{k}]", pending, base_dir, images_field) for k, p in enumerate(content)]
        messages.append({"role": message["role"], "content": parts})
    left = sum(1 for _ in pending)
    if left:
        raise BadImage(f"{images_field!r} holds {len(images)} images but the messages have only "
                       f"{len(images) - left} image placeholders ({{\"type\": \"image\"}} parts)")
    return messages


def _part(part: Any, label: str, pending: Iterator, base_dir, images_field: str) -> dict[str, Any]:
    kind = part.get("type") if isinstance(part, dict) else None
    if kind == "text" and isinstance(part.get("text"), str):
        return {"type": "text", "text": part["text"]}
    if kind == "image_url":  # OpenAI: {"image_url": {"url": REF}} or {"image_url": REF}
        url = part.get("image_url")
        return image_part(_decode(url.get("url") if isinstance(url, dict) else url, base_dir, label))
    if kind == "image":
        ref = next((part[key] for key in ("image", "url", "path") if part.get(key) is not None), None)
        if ref is None:  # a placeholder: the row's next image
            index, ref = next(pending, (None, None))
            if index is None:
                raise BadImage(f"{label} is an image placeholder but {images_field!r} has no image left for it")
            label = f"{images_field}[{index}]"
        return image_part(_decode(ref, base_dir, label))
    raise BadImage(f"{label} must be a text part {{type: text, text}} or an image part {{type: image, image}}"
                   f" / {{type: image_url, image_url}}, got {json.dumps(part, default=str)[:80]}")
