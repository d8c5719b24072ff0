"""Checkpoint layout and the file-writing halves of save / export (rank 0 side).

A checkpoint directory (the contract with rl-checkpoint)::

    <path>/dcp/                     torch.distributed.checkpoint of {"model": {hf_name: tensor},
                                    "optimizer": ...}; flattened weight keys are "model.<hf name>"
                                    (LoRA adapters as "model.<...>.q_proj.lora_A.weight")
    <path>/hf_config/               config.json, generation_config.json, tokenizer and processor files
    <path>/trainer_state/rank_<r>.pt  scheduler states, RNG states and step of each rank
    <path>/meta.json                {"format": "rl-dcp", "step", "task", "lora": {...} | null, ...}

Directories are written under ``<path>.partial`` and renamed into place when complete.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch
from torch import nn

CHECKPOINT_FORMAT = "rl-dcp"
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".msgpack", ".h5")
_MODEL_FILE_DIRS = ("additional_chat_templates",)
"""Folders of an HF model directory that belong to its tokenizer / processor files."""
_NOT_CONFIG = ("model.safetensors.index.json", "pytorch_model.bin.index.json", "manifest.json",
               "rl_checkpoint_source.json")


def staging_dir(path: str | Path) -> Path:
    return Path(f"{os.fspath(path).rstrip('/')}.partial")


def publish(staging: Path, path: str | Path) -> None:
    """Atomically replace ``path`` by the complete ``staging`` directory (an old one is removed)."""
    path = Path(path)
    old = Path(f"{path}.old")
    if old.exists():
        shutil.rmtree(old)
    if path.exists():
        os.replace(path, old)
    os.replace(staging, path)
    if old.exists():
        shutil.rmtree(old)


def copy_model_files(model_path: str | Path, dest: Path, *, include_config: bool = True) -> None:
    """Copy config, generation config, tokenizer and processor files (everything but weights) of an HF dir,
    and its ``additional_chat_templates/`` folder (the extra named chat templates)."""
    dest.mkdir(parents=True, exist_ok=True)
    for item in Path(model_path).iterdir():
        if item.is_dir() and item.name in _MODEL_FILE_DIRS:
            shutil.copytree(item, dest / item.name, dirs_exist_ok=True)
            continue
        if not item.is_file() or item.name.endswith(_WEIGHT_SUFFIXES) or item.name in _NOT_CONFIG:
            continue
        if item.name == "config.json" and not include_config:
            continue
        shutil.copy2(item, dest / item.name)


def write_json(path: Path, data: dict) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True))
    os.replace(tmp, path)


def read_meta(path: str | Path) -> dict:
    """meta.json of a checkpoint that ``load`` can resume, or one clear error saying why not."""
    meta_path = Path(path) / "meta.json"
    if not meta_path.is_file():
        raise FileNotFoundError(f"{path} is not a training checkpoint: {meta_path} is missing")
    try:
        meta = json.loads(meta_path.read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"{meta_path}: corrupt ({e}); use an earlier checkpoint") from None
    if not isinstance(meta, dict) or meta.get("format") != CHECKPOINT_FORMAT:
        found = meta.get("format") if isinstance(meta, dict) else meta
        raise ValueError(f"{meta_path}: format {found!r} is not {CHECKPOINT_FORMAT!r}")
    if meta.get("weights_only") or "task" not in meta:
        # rl-checkpoint hf-to-dcp writes weights alone: a start point, not a run to continue
        raise ValueError(f"{path}: holds model weights only (written by `rl-checkpoint hf-to-dcp`), no optimizer, "
                         f"scheduler or trainer state to resume; start a run from it with model={path}")
    return meta


def rng_state() -> dict:
    import random

    state = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    import random

    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def write_hf_model(model_cls: type[nn.Module], config, tensors: dict[str, torch.Tensor], model_path: str,
                   dest: str | Path) -> None:
    """Save ``tensors`` (full, HF names) as a from_pretrained-loadable directory, atomically.

    The model is materialised on the meta device and the tensors assigned (no second copy)."""
    staging = staging_dir(dest)
    if staging.exists():
        shutil.rmtree(staging)
    with torch.device("meta"):
        model = model_cls(config)
    missing, unexpected = model.load_state_dict(tensors, strict=False, assign=True)
    missing = [k for k in missing if not _is_tied(model, k)]
    if missing or unexpected:
        raise RuntimeError(f"export: weights do not fit {model_cls.__name__}: missing {missing}, unexpected {unexpected}")
    if getattr(config, "tie_word_embeddings", False):
        model.tie_weights()
    model.save_pretrained(staging, safe_serialization=True)
    copy_model_files(model_path, staging, include_config=False)
    publish(staging, dest)


def _is_tied(model: nn.Module, key: str) -> bool:
    return bool(getattr(model.config, "tie_word_embeddings", False)) and key == "lm_head.weight"
