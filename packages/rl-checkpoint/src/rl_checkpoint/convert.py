"""The conversions behind each CLI command. Each one streams a tensor source into an atomic output."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from rl_checkpoint.detect import open_checkpoint
from rl_checkpoint.errors import CheckpointError
from rl_checkpoint.integrity import Verified, write_manifest
from rl_checkpoint.layout import checkpoint_root
from rl_checkpoint.output import atomic_output_dir, check_output, copy_config_files
from rl_checkpoint.safetensors_io import TensorInfo, write_file, write_sharded
from rl_checkpoint.sources import (
    LoraMergedSource,
    SafetensorsSource,
    TensorSource,
    lora_pairs,
    read_json,
    sorted_infos,
)

DEFAULT_SHARD_BYTES = 2 << 30
DEFAULT_READ_GROUP_BYTES = 64 << 20
DTYPES = {"fp32": torch.float32, "float32": torch.float32, "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
          "fp16": torch.float16, "float16": torch.float16}


def parse_dtype(name: str | None) -> torch.dtype | None:
    if name is None:
        return None
    if name not in DTYPES:
        raise CheckpointError(f"dtype {name!r} is not supported; use one of {', '.join(DTYPES)}")
    return DTYPES[name]


def write_hf(source: TensorSource, out: str | Path, *, config_dir: Path | None = None,
             config: dict | None = None, force: bool = False, max_shard_bytes: int = DEFAULT_SHARD_BYTES,
             read_group_bytes: int = DEFAULT_READ_GROUP_BYTES, dtype: torch.dtype | None = None,
             check_config_of: str | Path | None = None) -> Path:
    """Stream ``source`` into an HF directory: sharded safetensors + index, config and tokenizer files.

    With ``tie_word_embeddings`` in the config, ``lm_head.weight`` (the embedding again) is left out, as
    ``save_pretrained`` does; ``dtype`` (the cast ``source`` applies) is written into config.json.
    ``check_config_of``: the checkpoint ``source`` reads, whose tensors must be the model of
    ``config_dir``'s config.json (a user's ``--config-dir``); checked before anything is written."""
    out = Path(out)
    if config is None and config_dir is not None and (config_dir / "config.json").is_file():
        config = read_json(config_dir / "config.json", "HF config")
    infos = source.infos
    if config is not None and config.get("tie_word_embeddings") and "model.embed_tokens.weight" in infos:
        infos = {n: i for n, i in infos.items() if n != "lm_head.weight"}
    if check_config_of is not None and config_dir is not None and (config_dir / "config.json").is_file():
        from rl_checkpoint.config_check import check_config_fits

        check_config_fits(infos, config_dir, check_config_of)
    with atomic_output_dir(out, force) as tmp:
        write_sharded(tmp, infos, source.load, max_shard_bytes=max_shard_bytes, read_group_bytes=read_group_bytes)
        copy_config_files(config_dir, tmp)
        if config is not None:
            write_config(tmp, config, dtype)
    return out


def write_config(out_dir: Path, config: dict, dtype: torch.dtype | None) -> None:
    """config.json, its dtype fields (``torch_dtype``, and ``dtype`` as transformers 5 names it) set to ``dtype``."""
    if dtype is not None:
        name = str(dtype).removeprefix("torch.")
        keys = [k for k in ("torch_dtype", "dtype") if k in config] or ["torch_dtype", "dtype"]
        config = config | dict.fromkeys(keys, name)
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")


def to_hf(path: str | Path, out: str | Path, *, fmt: str | None = None, config_dir: str | Path | None = None,
          dtype: torch.dtype | None = None, force: bool = False, max_shard_bytes: int = DEFAULT_SHARD_BYTES,
          lora_alpha: float | None = None, lora_rank: int | None = None) -> Path:
    """Any supported checkpoint (format guessed unless ``fmt``) -> an HF directory."""
    opened = open_checkpoint(path, fmt=fmt, config_dir=config_dir, dtype=dtype, lora_alpha=lora_alpha,
                             lora_rank=lora_rank)
    check_output(out, checkpoint_root(opened.path), around=(path,))
    if opened.format == "gguf":
        return gguf_to_hf(path, out, dtype=dtype or torch.float32, force=force, max_shard_bytes=max_shard_bytes)
    if opened.format == "peft":
        raise CheckpointError(f"{path}: is a LoRA adapter, not a model; use merge-lora --base BASE {path} OUT")
    return write_hf(opened.source, out, config_dir=opened.config_dir, force=force, max_shard_bytes=max_shard_bytes,
                    dtype=dtype, check_config_of=path if config_dir is not None else None)


def gguf_to_hf(path: str | Path, out: str | Path, *, dtype: torch.dtype = torch.float32, force: bool = False,
               max_shard_bytes: int = DEFAULT_SHARD_BYTES, tokenizer: bool = True) -> Path:
    """A GGUF file -> dequantised HF safetensors + config.json (+ tokenizer when transformers is installed)."""
    import importlib.util

    from rl_checkpoint.gguf_io import GGUFSource, save_gguf_tokenizer

    if tokenizer and importlib.util.find_spec("transformers") is None:
        raise CheckpointError(f'{path}: writing its tokenizer needs transformers: pip install "rl-checkpoint[hf]", '
                              "or pass --no-tokenizer for the weights and config alone")
    check_output(out, path)
    source = GGUFSource(path, dtype)
    out = Path(out)
    with atomic_output_dir(out, force) as tmp:
        write_sharded(tmp, source.infos, source.load, max_shard_bytes=max_shard_bytes,
                      read_group_bytes=DEFAULT_READ_GROUP_BYTES)
        if tokenizer:
            save_gguf_tokenizer(Path(path), tmp)
        write_config(tmp, source.hf_config(), dtype)
    return out


def _mmap_safetensors(path: Path, keep: list) -> dict[str, torch.Tensor]:
    """Tensors that are views of the file's pages (copy-on-write mmap): nothing is read until used."""
    import mmap

    from rl_checkpoint.safetensors_io import read_header

    header = read_header(path)
    with path.open("rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    keep.append(mm)
    data_start = 8 + int.from_bytes(mm[:8], "little")
    out = {}
    source_infos = SafetensorsSource(path).infos
    for name, info in source_infos.items():
        begin, end = header[name]["data_offsets"]
        if end == begin:
            out[name] = torch.empty(info.shape, dtype=info.dtype)
            continue
        raw = torch.frombuffer(mm, dtype=torch.uint8, count=end - begin, offset=data_start + begin)
        out[name] = raw.view(info.dtype).reshape(info.shape)
    return out


def hf_to_dcp(hf_dir: str | Path, out: str | Path, *, force: bool = False, megatron: bool = False,
              layer_spec: str = "local") -> Path:
    """An HF directory -> a training checkpoint: ``dcp/`` (``{"model": {name: tensor}}``), ``hf_config/``,
    ``meta.json``. With ``megatron=True`` the DCP holds megatron-core names (layers stacked, as
    megatron-core's distributed checkpoints do) and meta.json says ``rl-megatron``."""
    from rl_checkpoint.dcp_io import save_dcp
    from rl_checkpoint.megatron_mapping import hf_to_megatron

    hf_dir = Path(hf_dir)
    source = SafetensorsSource(hf_dir)  # validates every shard header first
    out = Path(out)
    check_output(out, hf_dir)
    keep: list = []
    with atomic_output_dir(out, force) as tmp:
        tensors: dict[str, torch.Tensor] = {}
        for file in sorted(hf_dir.glob("*.safetensors")):
            tensors |= _mmap_safetensors(file, keep)
        tensors = {k: tensors[k] for k in source.infos}
        if megatron:
            config = read_json(hf_dir / "config.json", "HF config")
            tensors = stack_layers(hf_to_megatron(tensors, config, layer_spec=layer_spec))
        save_dcp({"model": tensors}, tmp / "dcp")
        (tmp / "hf_config").mkdir()
        copy_config_files(hf_dir, tmp / "hf_config")
        # weights only: no optimizer, trainer state or task, so a start point (model=OUT), not a resume point
        meta = {"format": "rl-megatron" if megatron else "rl-dcp", "source": str(hf_dir), "step": 0,
                "weights_only": True}
        (tmp / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
        del tensors
        write_manifest(tmp)
    return out


def stack_layers(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``decoder.layers.{i}.<name>`` -> ``decoder.layers.<name>`` [L, ...] (megatron-core's on-disk layout)."""
    import re

    stacked: dict[str, dict[int, torch.Tensor]] = {}
    out = {}
    for name, tensor in state_dict.items():
        m = re.match(r"^decoder\.layers\.(\d+)\.(.+)$", name)
        if m:
            stacked.setdefault(f"decoder.layers.{m.group(2)}", {})[int(m.group(1))] = tensor
        else:
            out[name] = tensor
    for name, per_layer in stacked.items():
        out[name] = torch.stack([per_layer[i] for i in sorted(per_layer)])
    return out


def merge_lora(adapter: str | Path, out: str | Path, *, base: str | Path | None = None, adapter_only: bool = False,
               lora_alpha: float | None = None, lora_rank: int | None = None, force: bool = False,
               max_shard_bytes: int = DEFAULT_SHARD_BYTES) -> Path:
    """Base + LoRA adapter (PEFT dir or a training checkpoint with ``lora_A``/``lora_B`` tensors) -> merged HF.

    ``adapter_only``: write the adapter alone in PEFT format (adapter_model.safetensors + adapter_config.json)."""
    from rl_checkpoint.detect import detect_format, lora_scale, verify_training_checkpoint
    from rl_checkpoint.layout import model_dir
    from rl_checkpoint.sources import DCPModelSource

    given = Path(adapter)
    adapter = model_dir(given)
    fmt = detect_format(adapter)
    check_output(out, checkpoint_root(adapter), *([base] if base is not None else []), around=(given,))
    if fmt == "rl-dcp":
        verify_training_checkpoint(adapter)
    meta: dict = {}
    if fmt == "peft":
        adapter_src: TensorSource = SafetensorsSource(adapter / "adapter_model.safetensors")
        adapter_cfg = read_json(adapter / "adapter_config.json", "PEFT adapter config")
        config_dir = adapter
    elif fmt in ("rl-dcp", "dcp"):
        dcp_dir = adapter / "dcp" if fmt == "rl-dcp" else adapter
        meta = read_json(adapter / "meta.json", "meta.json") if fmt == "rl-dcp" else {}
        adapter_src = DCPModelSource(dcp_dir)
        config_dir = adapter / "hf_config" if fmt == "rl-dcp" else None
        adapter_cfg = {}
    else:
        raise CheckpointError(f"{adapter}: is a {fmt} checkpoint, not a LoRA adapter (PEFT dir or training checkpoint)")
    pairs = lora_pairs(list(adapter_src.infos))
    if not pairs:
        raise CheckpointError(f"{adapter}: holds no lora_A/lora_B tensors")
    scale = lora_scale(meta, config_dir, lora_alpha, lora_rank, meta_file=adapter / "meta.json")
    if scale is None:
        raise CheckpointError(f"{adapter}: LoRA alpha/rank unknown; pass --lora-alpha and --lora-rank")
    if adapter_only:
        return _write_peft_adapter(adapter_src, pairs, out, adapter_cfg, meta, scale, lora_alpha, lora_rank, force)
    if base is None:
        raise CheckpointError("merge-lora needs --base BASE (the HF model the adapter was trained on), or --adapter-only")
    opened = open_checkpoint(base)
    merged = LoraMergedSource(opened.source, adapter_src, scale)
    return write_hf(merged, out, config_dir=opened.config_dir, force=force, max_shard_bytes=max_shard_bytes)


def _write_peft_adapter(src: TensorSource, pairs: dict, out, adapter_cfg: dict, meta: dict, scale: float,
                        alpha: float | None, rank: int | None, force: bool) -> Path:
    names = [n for pair in pairs.values() for n in pair.values()]
    loaded = src.load(names)
    tensors = {}
    for module, pair in pairs.items():
        for ab, name in sorted(pair.items()):
            tensors[f"base_model.model.{module}.lora_{ab}.weight"] = loaded[name]
    first = next(iter(pairs.values()))
    r = int(rank or adapter_cfg.get("r") or (meta.get("lora") or {}).get("rank") or src.infos[first["A"]].shape[0])
    config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": r, "lora_alpha": scale * r,
              "target_modules": sorted({m.rsplit(".", 1)[-1] for m in pairs}), "lora_dropout": 0.0,
              "bias": "none", "fan_in_fan_out": False, "inference_mode": True,
              "base_model_name_or_path": adapter_cfg.get("base_model_name_or_path", meta.get("source"))}
    config |= {k: v for k, v in adapter_cfg.items() if k not in config or k in ("lora_alpha", "use_rslora")}
    with atomic_output_dir(Path(out), force) as tmp:
        write_file(tmp / "adapter_model.safetensors", tensors)
        (tmp / "adapter_config.json").write_text(json.dumps(config, indent=2) + "\n")
    return Path(out)


def inspect(path: str | Path, *, fmt: str | None = None, config_dir: str | Path | None = None) -> dict:
    """Format, tensor names/shapes/dtypes and total size of a checkpoint (no tensor data read)."""
    opened = open_checkpoint(path, fmt=fmt, config_dir=config_dir, verify_whole=True)
    infos = sorted_infos(opened.source.infos)
    return {
        "format": opened.format,
        "path": str(opened.path),
        "checksums": checksum_note(opened.verified),
        "num_tensors": len(infos),
        "total_bytes": sum(i.nbytes for i in infos.values()),
        "num_parameters": sum(i.nbytes // i.dtype.itemsize for i in infos.values()),
        "tensors": {n: {"shape": list(i.shape), "dtype": str(i.dtype).removeprefix("torch.")} for n, i in infos.items()},
    }


def checksum_note(verified: Verified | None) -> str | None:
    """One line on what the integrity check of a training checkpoint covered (None: not one)."""
    if verified is None:
        return None
    if not verified.manifest:
        return "no manifest.json (saved before checksums): structure not verified"
    return f"sha256 verified: {verified.files} files, {verified.bytes / 2**20:.1f} MiB"


def diff(a: str | Path, b: str | Path, *, config_dir_a=None, config_dir_b=None) -> dict:
    """Tensor-by-tensor comparison (in fp64 for floats) of two checkpoints of any formats.

    Returns ``{"max_abs_diff": {name: float}, "nonfinite_mismatch": {name: int}, "nonfinite_same": {name: int},
    "only_in_a": [...], "only_in_b": [...], "shape_mismatch": {...}}``; see ``compare_tensors`` for the
    NaN/inf counts (tensors without any are left out of them)."""
    src_a = open_checkpoint(a, config_dir=config_dir_a).source
    src_b = open_checkpoint(b, config_dir=config_dir_b).source
    common = [n for n in src_a.infos if n in src_b.infos]
    report: dict = {"max_abs_diff": {}, "nonfinite_mismatch": {}, "nonfinite_same": {},
                    "only_in_a": sorted(set(src_a.infos) - set(src_b.infos)),
                    "only_in_b": sorted(set(src_b.infos) - set(src_a.infos)), "shape_mismatch": {}}
    for name in common:
        ia, ib = src_a.infos[name], src_b.infos[name]
        if ia.shape != ib.shape:
            report["shape_mismatch"][name] = [list(ia.shape), list(ib.shape)]
            continue
        max_abs_diff, mismatch, same = compare_tensors(src_a.load([name])[name], src_b.load([name])[name])
        report["max_abs_diff"][name] = max_abs_diff
        if mismatch:
            report["nonfinite_mismatch"][name] = mismatch
        if same:
            report["nonfinite_same"][name] = same
    return report


def compare_tensors(a: torch.Tensor, b: torch.Tensor) -> tuple[float, int, int]:
    """``(max |a - b| where both are finite, NaN/inf mismatches, NaN/inf matches)`` of two same-shape tensors.

    A mismatch is a position where one is NaN or infinite and the other is not the same: a number, the
    other infinity, or (for a NaN) anything but NaN. NaN in both, or the same infinity in both, is a match:
    equal, as a conversion that keeps a NaN has kept the checkpoint, and counted so it can be reported."""
    a, b = a.double(), b.double()
    finite = a.isfinite() & b.isfinite()
    if finite.all():
        return ((a - b).abs().max().item() if a.numel() else 0.0), 0, 0
    max_abs_diff = (a[finite] - b[finite]).abs().max().item() if finite.any() else 0.0
    nonfinite = ~finite
    equal = (a == b) | (a.isnan() & b.isnan())
    return max_abs_diff, int((nonfinite & ~equal).sum()), int((nonfinite & equal).sum())


def tensor_infos(tensors: dict[str, torch.Tensor]) -> dict[str, TensorInfo]:
    return {k: TensorInfo(tuple(v.shape), v.dtype) for k, v in tensors.items()}
