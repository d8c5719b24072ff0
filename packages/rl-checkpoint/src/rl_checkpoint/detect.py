"""Guess what kind of checkpoint a path holds, and open it as a tensor source under HF names."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch

from rl_checkpoint.dcp_io import DCPReader, is_dcp_dir
from rl_checkpoint.errors import CheckpointError
from rl_checkpoint.integrity import Verified, verify
from rl_checkpoint.layout import POLICY_DIR, checkpoint_root, model_dir
from rl_checkpoint.sources import (
    CastSource,
    DCPModelSource,
    LoraMergedSource,
    MegatronSource,
    SafetensorsSource,
    TensorSource,
    lora_pairs,
    read_json,
)

FORMATS = ("hf", "rl-dcp", "dcp", "megatron", "gguf", "peft")
# (asked, detected) pairs a --format may override: a bare DCP's HF names read as such though one looks
# like Megatron's (``model.decoder.*`` of an encoder-decoder), and a training checkpoint holding Megatron
# names (``hf-to-dcp --megatron``; checked against its keys when opened).
_FORMATS_FORCED = {("dcp", "megatron"), ("megatron", "rl-dcp")}
_FORMAT_NAMES = {"hf": "an HF safetensors model", "rl-dcp": "a training checkpoint with HF tensor names",
                 "dcp": "a DCP checkpoint with HF tensor names", "megatron": "a Megatron checkpoint",
                 "gguf": "a GGUF file", "peft": "a PEFT LoRA adapter"}
_COMMAND_FOR = {"hf": "to-hf", "rl-dcp": "dcp-to-hf", "dcp": "dcp-to-hf", "megatron": "megatron-to-hf",
                "gguf": "gguf-to-hf", "peft": "merge-lora"}
_MEGATRON_MARKERS = ("embedding.word_embeddings.weight", "decoder.", "output_layer.weight")


@dataclass
class Opened:
    """A checkpoint opened for reading: its tensors under HF names and where its config lives."""

    format: str
    source: TensorSource
    config_dir: Path | None
    """Directory holding config.json / tokenizer files to copy, when known."""
    path: Path
    """What was opened: for a run or step directory, the ``policy/`` of its (latest complete) checkpoint."""
    verified: Verified | None = None
    """The integrity check of a training checkpoint (None for other formats)."""


def resolve_megatron_dir(path: Path) -> Path:
    """A Megatron save root (``latest_checkpointed_iteration.txt``) -> its latest ``iter_*`` directory."""
    tracker = path / "latest_checkpointed_iteration.txt"
    if tracker.is_file() and not is_dcp_dir(path):
        it = tracker.read_text().strip()
        candidate = path / ("release" if it == "release" else f"iter_{int(it):07d}")
        if not candidate.is_dir():
            raise CheckpointError(f"{tracker} points to {candidate.name}, which does not exist")
        return candidate
    return path


def _is_megatron_keys(keys) -> bool:
    from rl_checkpoint.megatron_mapping import strip_prefixes

    return any(strip_prefixes(k).startswith(_MEGATRON_MARKERS) for k in keys)


def detect_format(path: str | Path) -> str:
    """One of FORMATS, or a CheckpointError saying what was found. A run, ``checkpoints/`` or step
    directory is the training checkpoint it holds (see rl_checkpoint.layout)."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path}: no such file or directory")
    path = model_dir(path)
    if not path.exists():
        raise CheckpointError(f"{path}: no such file or directory")
    if path.is_file():
        if path.suffix == ".gguf":
            return "gguf"
        if path.suffix == ".safetensors":
            return "hf"
        raise CheckpointError(f"{path}: unknown checkpoint file type (expected .gguf or .safetensors)")
    if (path / "meta.json").is_file() and (path / "dcp").is_dir():
        return "rl-dcp"
    path = resolve_megatron_dir(path)
    if is_dcp_dir(path):
        return "megatron" if _is_megatron_keys(DCPReader(path).infos) else "dcp"
    if (path / "adapter_config.json").is_file():
        return "peft"
    if any(path.glob("*.safetensors")):
        return "hf"
    if any(path.glob("*.bin")) or any(path.glob("*.pt")):
        raise CheckpointError(f"{path}: holds only pickle weights (*.bin/*.pt), which this tool never loads; "
                              "re-save the model with safetensors (save_pretrained(safe_serialization=True))")
    raise CheckpointError(f"{path}: unknown checkpoint format (no safetensors, DCP .metadata, meta.json or GGUF); "
                          f"pass one of: {', '.join(FORMATS)}")


def wrong_format(path: Path, found: str, asked: str) -> str:
    """The error for a checkpoint given as format ``asked`` (``megatron-to-hf``, ``--format``) that is ``found``."""
    asked_name = "Megatron" if asked == "megatron" else asked
    detecting = "`rl-checkpoint to-hf` without --format (it detects the format)"
    use = {"to-hf": detecting, "merge-lora": "`rl-checkpoint merge-lora`"}.get(
        _COMMAND_FOR[found], f"`rl-checkpoint {_COMMAND_FOR[found]}`, or {detecting}")
    return f"{path}: is {_FORMAT_NAMES[found]}, not in {asked_name} format; use {use}"


def lora_scale(meta: dict, config_dir: Path | None, alpha: float | None, rank: int | None, *,
               meta_file: str | Path = "meta.json") -> float | None:
    """alpha / rank (alpha / sqrt(rank) with rsLoRA), None while either is unknown.

    Each comes from its flag, else ``meta["lora"]`` (``rank``, ``alpha``; ``meta_file`` names it in errors),
    else ``config_dir/adapter_config.json`` (``r``, ``lora_alpha``). The values PEFT accepts are accepted:
    a rank is an integer >= 1, alpha any finite number (PEFT does not check its sign, so neither does the
    merge, which must equal PEFT's); anything else is a CheckpointError naming the flag, or file and key."""
    records: list[tuple[str, dict, dict[str, str]]] = []  # (where, record, its keys): the first holding a key wins
    if isinstance(meta.get("lora"), dict):
        records.append((f"{meta_file}: lora.", meta["lora"], {"rank": "rank", "alpha": "alpha"}))
    if config_dir is not None and (config_dir / "adapter_config.json").is_file():
        adapter_config = read_json(config_dir / "adapter_config.json", "PEFT adapter config")
        if isinstance(adapter_config, dict):
            records.append((f"{config_dir / 'adapter_config.json'}: ", adapter_config, {"rank": "r", "alpha": "lora_alpha"}))

    def lookup(what: str, flag_value: object) -> tuple[str, object]:
        if flag_value is not None:
            return f"--lora-{what}", flag_value
        for where, record, keys in records:
            if record.get(keys[what]) is not None:
                return f"{where}{keys[what]}", record[keys[what]]
        return f"--lora-{what}", None

    rank_where, rank = lookup("rank", rank)
    alpha_where, alpha = lookup("alpha", alpha)
    rank = checked_lora_rank(rank, rank_where) if rank is not None else None
    alpha = checked_lora_alpha(alpha, alpha_where) if alpha is not None else None
    if alpha is None or rank is None:
        return None
    rslora = next((r["use_rslora"] for _, r, _ in records if r.get("use_rslora") is not None), False)
    return alpha / (rank ** 0.5 if rslora else rank)


def checked_lora_rank(value: object, where: str) -> int:
    """``value`` when it is a LoRA rank PEFT accepts (an integer >= 1), else a CheckpointError naming ``where``
    (a flag, or a file and key)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        fix = "pass the rank the adapter was trained with" if where.startswith("--") else "correct it or pass --lora-rank"
        raise CheckpointError(f"{where} is {value!r}, but a LoRA rank (PEFT's r) must be an integer >= 1; {fix}")
    return value


def checked_lora_alpha(value: object, where: str) -> float:
    """``value`` as a float when it is a LoRA alpha PEFT accepts (a finite number), else a CheckpointError."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        fix = "pass the alpha the adapter was trained with" if where.startswith("--") else "correct it or pass --lora-alpha"
        raise CheckpointError(f"{where} is {value!r}, but LoRA alpha must be a finite number; {fix}")
    return float(value)


def verify_training_checkpoint(model: Path, *, whole: bool = False) -> Verified:
    """Check the manifest covering training checkpoint ``model`` (its ``policy/`` files only, unless
    ``whole``: then every file of the step directory, RNG and trainer state included)."""
    root = checkpoint_root(model)
    prefix = f"{POLICY_DIR}/" if root != model and not whole else ""
    return verify(root, prefix=prefix)


def open_checkpoint(path: str | Path, *, fmt: str | None = None, config_dir: str | Path | None = None,
                    dtype: torch.dtype | None = None, lora_alpha: float | None = None,
                    lora_rank: int | None = None, verify_whole: bool = False) -> Opened:
    """Open any supported checkpoint as HF-named tensors (LoRA adapters of a training checkpoint merged).

    A training checkpoint is verified against its manifest first (``verify_whole``: every file of it)."""
    path = model_dir(path)
    try:
        found = detect_format(path)
    except CheckpointError:
        if fmt is None or not Path(path).exists():
            raise
        found = fmt  # --format names what detection could not tell: the reader of that format says the rest
    if fmt is not None and fmt != found and (fmt, found) not in _FORMATS_FORCED:
        raise CheckpointError(wrong_format(path, found, fmt))
    fmt = fmt or found
    config = Path(config_dir) if config_dir else None
    meta: dict = {}
    verified = None
    if found == "rl-dcp":
        verified = verify_training_checkpoint(path, whole=verify_whole)
        meta = read_json(path / "meta.json", "meta.json of the training checkpoint")
        if meta.get("format") not in ("rl-dcp", "rl-megatron"):
            raise CheckpointError(f"{path / 'meta.json'}: format is {meta.get('format')!r}, expected 'rl-dcp'")
        config = config or (path / "hf_config")
        dcp_path = path / "dcp"
        keys = "megatron" if _is_megatron_keys(DCPReader(dcp_path).infos) else "rl-dcp"
        if fmt == "megatron" and keys != "megatron":
            raise CheckpointError(wrong_format(path, "rl-dcp", fmt))
        fmt = keys
    else:
        dcp_path = resolve_megatron_dir(path)
    if fmt == "gguf":
        if config is not None:
            raise CheckpointError(f"--config-dir {config}: a GGUF file carries its own config and tokenizer, so "
                                  f"{path} takes no --config-dir; leave the flag out")
        from rl_checkpoint.gguf_io import GGUFSource

        return Opened("gguf", GGUFSource(path, dtype or torch.float32), None, path)
    if fmt == "hf":
        source: TensorSource = SafetensorsSource(path)
        config = config or (path if path.is_dir() else path.parent)
    elif fmt == "peft":
        source = SafetensorsSource(path / "adapter_model.safetensors")
        config = config or path
    elif fmt == "megatron":
        if config is None or not (config / "config.json").is_file():
            raise CheckpointError(f"{path}: a Megatron checkpoint needs the HF config of its model; "
                                  "pass --config-dir DIR (a directory with config.json and tokenizer files)")
        source = MegatronSource(dcp_path, read_json(config / "config.json", "HF config"))
    elif fmt in ("dcp", "rl-dcp"):
        source = DCPModelSource(dcp_path)
        if lora_pairs(list(source.infos)):
            scale = lora_scale(meta, config, lora_alpha, lora_rank, meta_file=path / "meta.json")
            if scale is None:
                raise CheckpointError(f"{path}: holds LoRA adapters but no LoRA alpha/rank (meta.json 'lora' or "
                                      "adapter_config.json); pass --lora-alpha and --lora-rank")
            source = LoraMergedSource(source, source, scale)
    else:
        raise CheckpointError(f"{path}: unknown format {fmt!r}; use one of {', '.join(FORMATS)}")
    if dtype is not None:
        source = CastSource(source, dtype)
    return Opened(fmt, source, config, path, verified)
