"""Image datasets on disk: JSONL / JSON / parquet files and ``datasets`` directories, read as chats.

``load_image_chats(path)`` reads every row and turns it into an :class:`~rl_core.images.ImageChat`
(:func:`rl_core.images.row_to_chat`): a bad row stops the load with an
:class:`~rl_core.images.ImageDataError` naming the file and the row. ``write_image_jsonl`` writes chats
back as a JSONL file and PNG files beside it (paths relative to the JSONL file), the layout
``load_image_chats`` reads.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from rl_core.data_files import RESAVE_DATASET, REWRITE_PARQUET, is_saved_dataset, unreadable
from rl_core.images import BadImage, ImageChat, ImageDataError, row_to_chat

Row = tuple[str, dict[str, Any]]
"""``(where, record)``: ``file, line N`` and the row's fields."""


def load_image_chats(path: str | Path, *, split: str | None = None, messages_field: str = "messages",
                     prompt_field: str = "problem", images_field: str = "images",
                     limit: int | None = None) -> list[ImageChat]:
    """The rows of ``path`` as chats with decoded images (``split``: the split of a saved DatasetDict)."""
    path = Path(path)
    base_dir = path.parent if path.is_file() else path
    chats = []
    for where, record in read_image_rows(path, split=split):
        if limit is not None and len(chats) >= limit:
            break
        try:
            messages, rest = row_to_chat(record, base_dir, messages_field=messages_field,
                                         prompt_field=prompt_field, images_field=images_field)
        except BadImage as bad:
            raise ImageDataError(where, str(bad)) from None
        chats.append(ImageChat(messages, rest, where))
    if not chats:
        raise ImageDataError(str(path), "the dataset has no rows")
    return chats


def read_image_rows(path: str | Path, *, split: str | None = None) -> Iterator[Row]:
    """Every row of a ``.jsonl`` / ``.json`` / ``.parquet`` file or a ``save_to_disk`` directory."""
    path = Path(path)
    if path.is_dir():
        yield from _read_saved_dataset(path, split)
        return
    if not path.is_file():
        raise ImageDataError(str(path), "the dataset file does not exist")
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".ndjson"):
        yield from _read_jsonl(path)
    elif suffix == ".json":
        yield from _read_json_list(path)
    elif suffix in (".parquet", ".pq"):
        yield from _read_parquet(path)
    else:
        raise ImageDataError(str(path), f"unsupported dataset format {suffix!r}: use .jsonl, .json, .parquet "
                             "or a directory written by datasets' save_to_disk")


def _read_jsonl(path: Path) -> Iterator[Row]:
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{path}, line {number}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise ImageDataError(where, f"invalid JSON ({err.msg} at column {err.colno})") from None
            yield where, _object(record, where)


def _read_json_list(path: Path) -> Iterator[Row]:
    try:
        records = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ImageDataError(str(path), f"invalid JSON ({err.msg} at line {err.lineno})") from None
    if not isinstance(records, list):
        raise ImageDataError(str(path), "a .json dataset must hold a list of objects")
    for number, record in enumerate(records, start=1):
        yield f"{path}, row {number}", _object(record, f"{path}, row {number}")


def _object(record: Any, where: str) -> dict[str, Any]:
    if not isinstance(record, dict):
        raise ImageDataError(where, f"expected a JSON object, got {type(record).__name__}")
    return record


def _read_parquet(path: Path) -> Iterator[Row]:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise ImageDataError(str(path), 'reading parquet needs pyarrow: pip install "rl-core[parquet]"') from None
    # Batches keep memory bounded; binary columns (image bytes) stay bytes.
    number = 0
    try:
        for batch in pq.ParquetFile(path).iter_batches(batch_size=256):
            for record in batch.to_pylist():
                number += 1
                yield f"{path}, row {number}", record
    except (pa.ArrowException, OSError) as err:
        raise unreadable(path, "parquet file", err, REWRITE_PARQUET) from None


def _read_saved_dataset(path: Path, split: str | None) -> Iterator[Row]:
    try:
        import datasets
        import pyarrow as pa
    except ImportError:
        raise ImageDataError(str(path), 'reading a saved HF dataset needs datasets: pip install "rl-core[datasets]"') \
            from None
    try:
        dataset = datasets.load_from_disk(str(path))
    except FileNotFoundError as err:
        if is_saved_dataset(path):  # one of its data files is gone
            raise unreadable(path, "datasets save_to_disk directory", err, RESAVE_DATASET) from None
        raise ImageDataError(str(path), f"not a dataset written by save_to_disk ({err})") from None
    except (pa.ArrowException, OSError, ValueError) as err:  # a truncated .arrow file, a broken state.json
        raise unreadable(path, "datasets save_to_disk directory", err, RESAVE_DATASET) from None
    name = str(path)
    if isinstance(dataset, datasets.DatasetDict):
        if split is None or split not in dataset:
            raise ImageDataError(str(path), f"the dataset has the splits {sorted(dataset)}: choose one"
                                 + (f" (no split {split!r})" if split is not None else ""))
        dataset, name = dataset[split], f"{path} ({split})"
    # Undecoded images ({bytes, path}): each is decoded by row_to_chat, so a bad one names its row.
    for column, feature in dataset.features.items():
        if isinstance(feature, datasets.Image):
            dataset = dataset.cast_column(column, datasets.Image(decode=False))
        elif isinstance(feature, datasets.List | datasets.Sequence) and isinstance(feature.feature, datasets.Image):
            dataset = dataset.cast_column(column, datasets.List(datasets.Image(decode=False)))
    for number, record in enumerate(dataset, start=1):
        yield f"{name}, row {number}", record


def write_image_jsonl(path: str | Path, chats: Iterable[ImageChat | dict[str, Any]],
                      image_dir: str = "images") -> Path:
    """Write chats as JSONL with each image saved as a PNG under ``<path's dir>/<image_dir>/`` and referred to
    by its path relative to the JSONL file. A chat is an :class:`ImageChat` (its fields go beside
    ``messages``) or a dict with ``messages``. Every file is written to a temporary name and renamed; the
    JSONL last, so it never names an image that is not there. Returns ``path``."""
    path = Path(path)
    images = path.parent / image_dir
    images.mkdir(parents=True, exist_ok=True)
    lines = []
    for number, chat in enumerate(chats, start=1):
        record = {"messages": chat.messages, **chat.fields} if isinstance(chat, ImageChat) else dict(chat)
        record["messages"] = _save_images(record["messages"], path.parent, f"{image_dir}/{path.stem}-{number:06d}")
        lines.append(json.dumps(record, ensure_ascii=False) + "\n")
    _atomic_write(path, lambda f: f.write("".join(lines).encode("utf-8")))
    return path


def _save_images(messages: list[dict[str, Any]], root: Path, prefix: str) -> list[dict[str, Any]]:
    """``messages`` with each image saved as ``<root>/<prefix>-<k>.png`` and replaced by that relative path."""
    saved = 0
    out = []
    for message in messages:
        if isinstance(message["content"], str):
            out.append(message)
            continue
        parts = []
        for part in message["content"]:
            if part.get("type") == "image":
                saved += 1
                name = f"{prefix}-{saved}.png"
                _atomic_write(root / name, lambda f, image=part["image"]: image.save(f, format="PNG"))
                part = {"type": "image", "image": name}
            parts.append(part)
        out.append({**message, "content": parts})
    return out


def _atomic_write(target: Path, write) -> None:
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
