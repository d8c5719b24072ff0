"""torch.distributed.checkpoint (DCP) directories, read chunk by chunk and without unpickling code.

DCP's ``.metadata`` file is a pickle. It is read here with an unpickler that only builds DCP's own
metadata dataclasses, torch dtypes/sizes and paths, so a crafted file cannot run code. Tensor data
(``*.distcp``) is read with ``torch.load(weights_only=True)``, one stored chunk at a time, straight from
the byte range the metadata names: peak memory is the tensors asked for, not the checkpoint.
Non-tensor entries (optimizer hyper-parameters, Megatron ``_extra_state``) are pickles and are skipped.
"""

from __future__ import annotations

import enum
import io
import os
import pickle
import warnings
from pathlib import Path

import torch

from rl_checkpoint.errors import CheckpointError
from rl_checkpoint.safetensors_io import TensorInfo

_ALLOWED_MODULE_PREFIX = "torch.distributed.checkpoint."
_ALLOWED_GLOBALS = {
    ("torch", "Size"), ("torch.serialization", "_get_layout"), ("collections", "OrderedDict"),
    ("pathlib", "PosixPath"), ("pathlib", "PurePosixPath"), ("pathlib", "WindowsPath"),
    ("pathlib", "PureWindowsPath"), ("builtins", "set"), ("builtins", "frozenset"),
}


def _enum_member(cls: object, name: str):
    """``getattr`` as some Pythons (3.11.0-3.11.3) pickle enum members (``getattr(EnumClass, "NAME")``),
    limited to members of DCP's own enums: a crafted ``getattr(os, "system")`` is refused."""
    if (isinstance(cls, type) and issubclass(cls, enum.Enum) and cls.__module__.startswith(_ALLOWED_MODULE_PREFIX)
            and isinstance(name, str) and name in cls.__members__):
        return cls[name]
    raise pickle.UnpicklingError(f"getattr({cls!r}, {name!r}) is not allowed in DCP metadata")


class _MetadataUnpickler(pickle.Unpickler):
    """Builds only DCP metadata classes, torch dtypes/sizes/layouts and paths; refuses anything else."""

    def find_class(self, module: str, name: str):
        if (module, name) in _ALLOWED_GLOBALS:
            return super().find_class(module, name)
        if (module, name) == ("builtins", "getattr"):
            return _enum_member
        if module == "torch" and isinstance(getattr(torch, name, None), (torch.dtype, torch.layout, torch.memory_format)):
            return getattr(torch, name)
        if module.startswith(_ALLOWED_MODULE_PREFIX) and not name.startswith("__"):
            obj = super().find_class(module, name)
            if isinstance(obj, type):
                return obj
        raise pickle.UnpicklingError(f"global {module}.{name} is not allowed in DCP metadata")


def is_dcp_dir(path: str | Path) -> bool:
    return (Path(path) / ".metadata").is_file()


def read_metadata(path: str | Path):
    """The DCP ``Metadata`` of directory ``path`` (safe unpickling), or a clear CheckpointError."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"{path}: no such directory; pass the DCP checkpoint directory")
    meta_file = path / ".metadata"
    if not meta_file.is_file():
        raise CheckpointError(f"{path}: missing DCP metadata file .metadata; is this a complete DCP checkpoint?")
    try:
        with meta_file.open("rb") as f:
            metadata = _MetadataUnpickler(f).load()
    except pickle.UnpicklingError as e:
        raise CheckpointError(f"{meta_file}: refused or corrupt DCP metadata ({e}); re-save the checkpoint") from None
    except Exception as e:  # a truncated or garbled pickle raises many kinds of errors
        raise CheckpointError(f"{meta_file}: corrupt DCP metadata ({type(e).__name__}: {e}); re-save the checkpoint") from None
    if not hasattr(metadata, "state_dict_metadata") or not hasattr(metadata, "storage_data"):
        raise CheckpointError(f"{meta_file}: not a DCP Metadata object; re-save the checkpoint")
    return metadata


class DCPReader:
    """Reads named tensors (whole, or a range of rows) from a DCP directory."""

    def __init__(self, path: str | Path):
        from torch.distributed.checkpoint.metadata import MetadataIndex, TensorStorageMetadata

        self.path = Path(path)
        self.metadata = read_metadata(self.path)
        self.infos: dict[str, TensorInfo] = {}
        for fqn, md in self.metadata.state_dict_metadata.items():
            if isinstance(md, TensorStorageMetadata):
                self.infos[fqn] = TensorInfo(tuple(md.size), md.properties.dtype)
        # fqn -> [(offsets, sizes, storage info)] of every stored chunk (one per saving rank/shard)
        self._chunks: dict[str, list[tuple[tuple[int, ...], tuple[int, ...], object]]] = {}
        for fqn in self.infos:
            for chunk in self.metadata.state_dict_metadata[fqn].chunks:
                storage = self.metadata.storage_data.get(MetadataIndex(fqn, chunk.offsets))
                if storage is None:
                    raise CheckpointError(f"{self.path}/.metadata: no stored data for a chunk of {fqn}; re-save the checkpoint")
                self._chunks.setdefault(fqn, []).append((tuple(chunk.offsets), tuple(chunk.sizes), storage))
        self._files: dict[str, io.BufferedReader] = {}

    def close(self) -> None:
        for f in self._files.values():
            f.close()
        self._files.clear()

    def load(self, names: list[str]) -> dict[str, torch.Tensor]:
        """The full tensors ``names``."""
        return {name: self.load_rows(name, 0, self.infos[name].shape[0] if self.infos[name].shape else 1)
                for name in names}

    def load_rows(self, name: str, start: int, stop: int) -> torch.Tensor:
        """Rows ``start:stop`` (dim 0) of tensor ``name``, reading only the chunks that overlap them."""
        info = self.infos[name]
        if not info.shape:  # a scalar is one chunk
            return self._read_chunk(name, self._chunks[name][0][2]).reshape(())
        chunks = self._chunks.get(name, [])
        whole = [c for c in chunks if c[0][0] <= start and c[0][0] + c[1][0] >= stop
                 and tuple(c[1][1:]) == tuple(info.shape[1:])]
        if whole:  # one chunk covers the rows: no second buffer (peak memory = that chunk)
            offsets, sizes, storage = whole[0]
            chunk = self._read_chunk(name, storage)
            self._check_chunk(name, chunk, sizes)
            return chunk if (start, stop) == (offsets[0], offsets[0] + sizes[0]) else chunk[start - offsets[0]:stop - offsets[0]].clone()
        out = torch.empty((stop - start, *info.shape[1:]), dtype=info.dtype)
        filled = 0
        for offsets, sizes, storage in chunks:
            lo, hi = max(start, offsets[0]), min(stop, offsets[0] + sizes[0])
            if lo >= hi:
                continue
            chunk = self._read_chunk(name, storage)
            self._check_chunk(name, chunk, sizes)
            index = (slice(lo - start, hi - start), *(slice(o, o + s) for o, s in zip(offsets[1:], sizes[1:])))
            out[index] = chunk[lo - offsets[0]:hi - offsets[0]]
            filled += (hi - lo) * chunk[0].numel()
            del chunk
        if filled != out.numel():
            raise CheckpointError(
                f"{self.path}: tensor {name} is incomplete in the checkpoint (chunks cover {filled} of "
                f"{out.numel()} elements); was every rank's shard saved?"
            )
        return out

    def _check_chunk(self, name: str, chunk: torch.Tensor, sizes: tuple[int, ...]) -> None:
        if tuple(chunk.shape) != tuple(sizes) or chunk.dtype != self.infos[name].dtype:
            raise CheckpointError(f"{self.path}: tensor {name} chunk is {list(chunk.shape)} {chunk.dtype}, the "
                                  f"metadata says {list(sizes)} {self.infos[name].dtype}; re-save the checkpoint")

    def _read_chunk(self, name: str, storage) -> torch.Tensor:
        if getattr(storage, "transform_descriptors", None):
            raise CheckpointError(
                f"{self.path}: tensor {name} is stored with transforms {storage.transform_descriptors} "
                "(compressed DCP), which this tool does not read; re-save without compression"
            )
        file = self._files.get(storage.relative_path)
        if file is None:
            data_path = self.path / storage.relative_path
            if not data_path.is_file():
                raise CheckpointError(f"{data_path}: data file named in the DCP metadata is missing; re-copy the checkpoint")
            file = self._files[storage.relative_path] = data_path.open("rb")
        file_size = os.fstat(file.fileno()).st_size
        if storage.offset + storage.length > file_size:
            raise CheckpointError(
                f"{self.path / storage.relative_path}: truncated DCP data file (tensor {name} needs bytes "
                f"{storage.offset}..{storage.offset + storage.length}, file has {file_size}); "
                "re-copy or re-save the checkpoint"
            )
        try:
            # torch.load reads the records straight from the file range into the tensor's storage
            return torch.load(FileSlice(file, storage.offset, storage.length), map_location="cpu", weights_only=True)
        except Exception as e:
            raise CheckpointError(
                f"{self.path / storage.relative_path}: corrupt data for tensor {name} ({type(e).__name__}); "
                "re-copy or re-save the checkpoint"
            ) from None


class FileSlice(io.RawIOBase):
    """A read-only, seekable window ``[offset, offset + length)`` of an open binary file."""

    def __init__(self, file, offset: int, length: int):
        super().__init__()
        self._file, self._start, self._length, self._pos = file, offset, length, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, pos: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._length}[whence]
        self._pos = max(0, min(self._length, base + pos))
        return self._pos

    def readinto(self, buffer) -> int:
        view = memoryview(buffer).cast("B")
        size = min(len(view), self._length - self._pos)
        if size <= 0:
            return 0
        self._file.seek(self._start + self._pos)
        got = self._file.readinto(view[:size])
        self._pos += got
        return got


def save_dcp(state_dict: dict, path: str | Path) -> None:
    """``dcp.save`` in this single process (no process group needed)."""
    import torch.distributed.checkpoint as dcp

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        dcp.save(state_dict, checkpoint_id=str(path), no_dist=True)
