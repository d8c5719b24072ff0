"""Tensor sources: a uniform "names, shapes, dtypes, then load these names" view of any checkpoint.

Every converter is ``source -> write_sharded``: shapes and dtypes are known before any data is read
(from headers, DCP metadata, or by running a mapping on ``meta`` tensors), and ``load(names)`` reads
only what it is asked for, so a conversion streams.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Protocol

import torch

from rl_checkpoint.dcp_io import DCPReader
from rl_checkpoint.errors import CheckpointError
from rl_checkpoint.safetensors_io import TensorInfo, header_infos


class TensorSource(Protocol):
    infos: dict[str, TensorInfo]
    """Output name -> shape/dtype, in output order."""

    def load(self, names: list[str]) -> dict[str, torch.Tensor]: ...


def natural_key(name: str) -> list:
    """Sort ``layers.10`` after ``layers.9``."""
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]


def sorted_infos(infos: dict[str, TensorInfo]) -> dict[str, TensorInfo]:
    return {k: infos[k] for k in sorted(infos, key=natural_key)}


class SafetensorsSource:
    """An HF directory (sharded or not) or a single ``.safetensors`` file."""

    def __init__(self, path: str | Path):
        path = Path(path)
        if path.is_file():
            files = [path]
        else:
            files = sorted(path.glob("*.safetensors"))
            if not files:
                raise CheckpointError(f"{path}: no *.safetensors files; pass an HF model directory saved with safetensors")
        self.path = path
        self._file_of: dict[str, Path] = {}
        infos: dict[str, TensorInfo] = {}
        for file in files:
            for name, info in header_infos(file).items():
                infos[name] = info
                self._file_of[name] = file
        self.infos = sorted_infos(infos)

    def load(self, names: list[str]) -> dict[str, torch.Tensor]:
        from safetensors import safe_open

        by_file: dict[Path, list[str]] = {}
        for name in names:
            by_file.setdefault(self._file_of[name], []).append(name)
        out = {}
        for file, file_names in by_file.items():
            with safe_open(str(file), framework="pt") as f:
                for name in file_names:
                    out[name] = f.get_tensor(name)
        return out


class DCPModelSource:
    """The model weights of a DCP directory under HF names.

    Keys ``model.<hf name>`` (the training backend's layout) lose their prefix; optimizer and other
    non-model entries are left out. A bare DCP of HF names (no prefix) is accepted as is."""

    def __init__(self, path: str | Path, prefix: str = "model."):
        self.reader = DCPReader(path)
        names = [n for n in self.reader.infos if not n.startswith(("optimizer.", "optim.", "lr_scheduler."))]
        # HF names may themselves start with "model.": the wrapper prefix is there when a stripped key
        # still looks like an HF top-level name; then keys without it (rng states, counters) are not weights.
        stripped = [n[len(prefix):] for n in names if n.startswith(prefix)]
        if any(n.startswith(("model.", "lm_head.", "score.")) for n in stripped):
            self._raw = {n[len(prefix):]: n for n in names if n.startswith(prefix)}
        else:
            self._raw = {n: n for n in names}
        if not self._raw:
            raise CheckpointError(f"{path}: the DCP checkpoint holds no model tensors (keys: {names[:5]}...)")
        self.infos = sorted_infos({n: self.reader.infos[raw] for n, raw in self._raw.items()})

    def load(self, names: list[str]) -> dict[str, torch.Tensor]:
        loaded = self.reader.load([self._raw[n] for n in names])
        return {n: loaded[self._raw[n]] for n in names}


_LORA_RE = re.compile(r"^(?:base_model\.model\.)?(.+)\.lora_([AB])(?:\.[A-Za-z0-9_]+)?\.weight$")


def lora_pairs(names: list[str]) -> dict[str, dict[str, str]]:
    """Adapter tensor names grouped by the module they adapt: ``{module: {"A": name, "B": name}}``."""
    pairs: dict[str, dict[str, str]] = {}
    for name in names:
        m = _LORA_RE.match(name)
        if m:
            pairs.setdefault(m.group(1), {})[m.group(2)] = name
    for module, pair in pairs.items():
        if set(pair) != {"A", "B"}:
            raise CheckpointError(f"LoRA adapter for {module} has only lora_{''.join(pair)}; the adapter is incomplete")
    return pairs


class LoraMergedSource:
    """``base`` with every LoRA pair folded in: ``W + scale * B @ A`` (fp32 math, cast back).

    ``adapter`` may be the same source as ``base`` (a training checkpoint holding both)."""

    def __init__(self, base: TensorSource, adapter: TensorSource, scale: float):
        self.base, self.adapter, self.scale = base, adapter, scale
        self.pairs = lora_pairs(list(adapter.infos))
        adapter_names = {n for pair in self.pairs.values() for n in pair.values()}
        self.infos = {n: i for n, i in base.infos.items() if n not in adapter_names and ".base_layer." not in n}
        self._base_name: dict[str, str] = {}  # output weight name -> name in base
        for module, pair in self.pairs.items():
            target = f"{module}.weight"
            for candidate in (target, f"{module}.base_layer.weight"):
                if candidate in base.infos:
                    self._base_name[target] = candidate
                    self.infos[target] = base.infos[candidate]
                    break
            else:
                raise CheckpointError(f"LoRA adapter targets {module}, but the base checkpoint has no {target}")
            out_f, in_f = base.infos[self._base_name[target]].shape
            a, b = adapter.infos[pair["A"]].shape, adapter.infos[pair["B"]].shape
            if a[1] != in_f or b[0] != out_f or a[0] != b[1]:
                raise CheckpointError(
                    f"LoRA shapes do not fit {target} {[out_f, in_f]}: lora_A {list(a)}, lora_B {list(b)}; "
                    "is the adapter for this base model?"
                )
        self.infos = sorted_infos(self.infos)

    def load(self, names: list[str]) -> dict[str, torch.Tensor]:
        base_names = [self._base_name.get(n, n) for n in names]
        loaded = self.base.load(base_names)
        out = {}
        for name, base_name in zip(names, base_names):
            weight = loaded.pop(base_name)
            module = name.removesuffix(".weight")
            if name in self._base_name:
                pair = self.pairs[module]
                ab = self.adapter.load([pair["A"], pair["B"]])
                delta = (ab[pair["B"]].float() @ ab[pair["A"]].float()) * self.scale
                weight = (weight.float() + delta).to(weight.dtype)
            out[name] = weight
        return out


class CastSource:
    """Floating-point tensors of ``inner`` cast to ``dtype`` (integer tensors unchanged)."""

    def __init__(self, inner: TensorSource, dtype: torch.dtype):
        self.inner, self.dtype = inner, dtype
        self.infos = {n: TensorInfo(i.shape, dtype if i.dtype.is_floating_point else i.dtype)
                      for n, i in inner.infos.items()}

    def load(self, names: list[str]) -> dict[str, torch.Tensor]:
        return {n: t.to(self.infos[n].dtype) for n, t in self.inner.load(names).items()}


class MegatronSource:
    """HF-named tensors of a megatron-core distributed checkpoint, converted one layer at a time."""

    def __init__(self, path: str | Path, hf_config: dict):
        from rl_checkpoint.megatron_mapping import megatron_to_hf, strip_prefixes

        self.reader = DCPReader(path)
        self.hf_config = hf_config
        self._megatron_to_hf = megatron_to_hf
        # megatron name (no prefix) -> raw DCP key, model tensors only
        self._raw = {strip_prefixes(n): n for n in self.reader.infos
                     if not n.endswith("_extra_state") and not n.startswith(("optimizer.", "optim."))}
        meta = {n: torch.empty(self.reader.infos[raw].shape, dtype=self.reader.infos[raw].dtype, device="meta")
                for n, raw in self._raw.items()}
        self.infos = sorted_infos({n: TensorInfo(tuple(t.shape), t.dtype)
                                   for n, t in megatron_to_hf(meta, hf_config).items()})
        self._cache: tuple[int | None, dict[str, torch.Tensor]] = (-1, {})

    def _layer_inputs(self, layer: int | None) -> dict[str, torch.Tensor]:
        """The megatron tensors that HF layer ``layer`` (None: the non-layer tensors) is made from."""
        out = {}
        for name, raw in self._raw.items():
            stacked = name.startswith("decoder.layers.") and not name[len("decoder.layers."):].split(".")[0].isdigit()
            if layer is None:
                if not name.startswith("decoder.layers."):
                    out[name] = self.reader.load([raw])[raw]
            elif stacked:
                rows = self.reader.load_rows(raw, layer, layer + 1)
                out[f"decoder.layers.{layer}.{name[len('decoder.layers.'):]}"] = rows[0]
            elif name.startswith(f"decoder.layers.{layer}."):
                out[name] = self.reader.load([raw])[raw]
        return out

    def _convert(self, layer: int | None) -> dict[str, torch.Tensor]:
        if self._cache[0] != layer:
            self._cache = (layer, self._megatron_to_hf(self._layer_inputs(layer), self.hf_config))
        return self._cache[1]

    def load(self, names: list[str]) -> dict[str, torch.Tensor]:
        out = {}
        for name in names:
            m = re.match(r"^model\.layers\.(\d+)\.", name)
            out[name] = self._convert(int(m.group(1)) if m else None)[name]
        return out


def read_json(path: Path, what: str) -> dict:
    if not path.is_file():
        raise CheckpointError(f"{path}: missing {what}")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{path}: corrupt {what} ({e})") from None
