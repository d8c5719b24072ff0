"""Reading and streaming-writing safetensors files without holding a whole model in memory.

The writer lays out a shard's header from shapes and dtypes known in advance, then appends each
tensor's bytes as soon as it is loaded, so peak memory is one tensor (or one read group), not one
shard. Files are the standard format: ``u64 header length | JSON header | data``.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import torch

from rl_checkpoint.errors import CheckpointError

DTYPE_TO_ST = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
    torch.bool: "BOOL", torch.float8_e4m3fn: "F8_E4M3", torch.float8_e5m2: "F8_E5M2",
}
ST_TO_DTYPE = {v: k for k, v in DTYPE_TO_ST.items()}
MAX_HEADER_BYTES = 100 * 1024 * 1024


@dataclass(frozen=True)
class TensorInfo:
    """Shape and dtype of one tensor, known before its data is read."""

    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def nbytes(self) -> int:
        numel = 1
        for d in self.shape:
            numel *= d
        return numel * self.dtype.itemsize


def st_dtype(dtype: torch.dtype, where: str) -> str:
    """The safetensors dtype code of ``dtype``, or a clear error."""
    if dtype not in DTYPE_TO_ST:
        raise CheckpointError(
            f"dtype {dtype} of {where} cannot be stored in safetensors; supported: "
            f"{', '.join(str(d).removeprefix('torch.') for d in DTYPE_TO_ST)} (cast it first, e.g. --dtype bf16)"
        )
    return DTYPE_TO_ST[dtype]


def read_header(path: str | Path) -> dict[str, dict]:
    """The JSON header of a safetensors file, after checking that the file holds all its data.

    Raises CheckpointError for a file too short, a corrupt header or a truncated data section."""
    path = Path(path)
    size = path.stat().st_size
    with path.open("rb") as f:
        raw = f.read(8)
        if len(raw) < 8:
            raise CheckpointError(f"{path}: truncated safetensors file ({size} bytes, no header); re-copy or re-save it")
        (header_len,) = struct.unpack("<Q", raw)
        if header_len > MAX_HEADER_BYTES or 8 + header_len > size:
            raise CheckpointError(
                f"{path}: corrupt or truncated safetensors header (claims {header_len} bytes, file has {size}); "
                "re-copy or re-save the file"
            )
        try:
            header = json.loads(f.read(header_len))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise CheckpointError(f"{path}: corrupt safetensors header ({e}); re-copy or re-save the file") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: corrupt safetensors header (not a JSON object); re-copy or re-save the file")
    data_end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
    if 8 + header_len + data_end > size:
        raise CheckpointError(
            f"{path}: truncated safetensors shard: header needs {8 + header_len + data_end} bytes, file has {size}; "
            "the copy or the save was interrupted, re-copy or re-save it"
        )
    return header


def header_infos(path: str | Path) -> dict[str, TensorInfo]:
    """Name -> TensorInfo for every tensor of a safetensors file (validated, no data read)."""
    out = {}
    for name, entry in read_header(path).items():
        if name == "__metadata__":
            continue
        if entry["dtype"] not in ST_TO_DTYPE:
            raise CheckpointError(f"{path}: tensor {name} has dtype {entry['dtype']}, which this tool does not support")
        out[name] = TensorInfo(tuple(entry["shape"]), ST_TO_DTYPE[entry["dtype"]])
    return out


def tensor_bytes(tensor: torch.Tensor) -> memoryview:
    """A zero-copy byte view of a (made contiguous) CPU tensor, in safetensors' little-endian layout."""
    flat = tensor.detach().cpu().contiguous().reshape(-1)
    return memoryview(flat.view(torch.uint8).numpy())


def plan_shards(infos: dict[str, TensorInfo], max_shard_bytes: int) -> list[list[str]]:
    """Split names (in order) into shards of at most ``max_shard_bytes`` (a bigger tensor gets its own)."""
    shards: list[list[str]] = [[]]
    size = 0
    for name, info in infos.items():
        if shards[-1] and size + info.nbytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += info.nbytes
    return shards if shards[0] else []


def _shard_header(names: list[str], infos: dict[str, TensorInfo]) -> bytes:
    header: dict[str, dict] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name in names:
        info = infos[name]
        header[name] = {"dtype": st_dtype(info.dtype, name), "shape": list(info.shape),
                        "data_offsets": [offset, offset + info.nbytes]}
        offset += info.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # data starts 8-byte aligned, like the reference writer
    return struct.pack("<Q", len(raw)) + raw


def write_sharded(out_dir: str | Path, infos: dict[str, TensorInfo],
                  load: Callable[[list[str]], dict[str, torch.Tensor]], *,
                  max_shard_bytes: int, read_group_bytes: int, prefix: str = "model") -> list[str]:
    """Write ``infos`` as ``<prefix>-0000i-of-0000N.safetensors`` + ``<prefix>.safetensors.index.json``.

    ``load(names)`` returns those tensors (shapes/dtypes as in ``infos``); it is called with groups of
    about ``read_group_bytes``, and each tensor is freed once written. Returns the shard file names."""
    out_dir = Path(out_dir)
    shards = plan_shards(infos, max_shard_bytes)
    files = [f"{prefix}-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    weight_map = {}
    for names, fname in zip(shards, files):
        with open(out_dir / fname, "wb") as f:
            f.write(_shard_header(names, infos))
            for group in _groups(names, infos, read_group_bytes):
                tensors = load(group)
                for name in group:
                    tensor = tensors.pop(name)
                    info = infos[name]
                    if tuple(tensor.shape) != info.shape or tensor.dtype != info.dtype:
                        raise CheckpointError(
                            f"tensor {name}: expected {list(info.shape)} {info.dtype}, got "
                            f"{list(tensor.shape)} {tensor.dtype} (the checkpoint's metadata and data disagree)"
                        )
                    f.write(tensor_bytes(tensor))
                    weight_map[name] = fname
                    del tensor  # free it before the next group is read
                del tensors
    total = sum(info.nbytes for info in infos.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out_dir / f"{prefix}.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    return files


def _groups(names: list[str], infos: dict[str, TensorInfo], group_bytes: int) -> Iterable[list[str]]:
    group: list[str] = []
    size = 0
    for name in names:
        if group and size + infos[name].nbytes > group_bytes:
            yield group
            group, size = [], 0
        group.append(name)
        size += infos[name].nbytes
    if group:
        yield group


def write_file(path: str | Path, tensors: dict[str, torch.Tensor]) -> None:
    """One safetensors file from an in-memory dict (small outputs such as adapters), atomically."""
    path = Path(path)
    infos = {k: TensorInfo(tuple(v.shape), v.dtype) for k, v in tensors.items()}
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        f.write(_shard_header(list(infos), infos))
        for name in infos:
            f.write(tensor_bytes(tensors[name]))
    os.replace(tmp, path)
