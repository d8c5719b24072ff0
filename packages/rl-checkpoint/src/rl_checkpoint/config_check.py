"""Whether the tensors about to be written are the model that ``--config-dir``'s config.json describes.

A config directory given for a checkpoint is a claim about it; a wrong one (another family, another
vocabulary) used to give an HF directory that transformers loads with random weights where names differ,
or not at all. transformers answers the question itself, without reading tensor data: the config's model
(its ``architectures`` class) is built on the meta device and "loaded" from meta tensors of the
checkpoint's names, shapes and dtypes, through the renaming and conversions ``from_pretrained`` applies to
files (per-expert MoE weights stacked, Qwen2.5-VL's ``model.layers`` read as ``model.language_model.layers``,
tied heads, keys a model declares it ignores). Its missing, unexpected and other-shape keys are what
loading the output would report; any of them refuses the conversion.

Without transformers (the ``[hf]`` extra), or for a config transformers cannot build, nothing is checked
and a warning says so.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
from collections.abc import Iterator
from pathlib import Path

import torch

from rl_checkpoint.errors import CheckpointError
from rl_checkpoint.safetensors_io import TensorInfo
from rl_checkpoint.sources import natural_key

logger = logging.getLogger(__name__)
SHOWN = 3  # names listed per kind of mismatch


def check_config_fits(infos: dict[str, TensorInfo], config_dir: Path, checkpoint: str | Path) -> None:
    """Raise CheckpointError (one line naming ``--config-dir`` and the first mismatching tensors) unless
    the tensors ``infos`` (names as written) load into the model of ``config_dir/config.json`` exactly."""
    if importlib.util.find_spec("transformers") is None:
        _not_checked(config_dir, checkpoint, 'that needs transformers: pip install "rl-checkpoint[hf]"')
        return
    with _quiet_transformers():
        try:
            model_class, config = _model_class_and_config(config_dir)
        except Exception as e:  # a model type or option this transformers does not know
            _not_checked(config_dir, checkpoint, f"transformers cannot build its model ({type(e).__name__}: {_first_line(e)})")
            return
        meta = {name: torch.empty(info.shape, dtype=info.dtype, device="meta") for name, info in infos.items()}
        try:
            _, report = model_class.from_pretrained(None, config=config, state_dict=meta, device_map={"": "meta"},
                                                    ignore_mismatched_sizes=True, output_loading_info=True)
        except Exception as e:
            report = _load_failure(e)
            if report is None:  # not about the tensors (e.g. a quantization config that needs a GPU)
                _not_checked(config_dir, checkpoint, f"transformers cannot build its model ({type(e).__name__}: "
                                                     f"{_first_line(e)})")
                return
    problems = _describe(report)
    if problems:
        raise CheckpointError(
            f"--config-dir {config_dir}: its config.json ({model_class.__name__}) does not describe the tensors of "
            f"{checkpoint}: {'; '.join(problems)}; pass the config directory of the model these weights were saved "
            "from (a training checkpoint needs none: its policy/hf_config/ is used); nothing was written"
        )


def _not_checked(config_dir: Path, checkpoint: str | Path, why: str) -> None:
    logger.warning(f"rl-checkpoint: warning: --config-dir {config_dir} was not checked against the tensors of "
                   f"{checkpoint}: {why}")


def _model_class_and_config(config_dir: Path):
    """The transformers class named by config.json's ``architectures`` (else the causal-LM or image-text-to-text
    class of its ``model_type``) and the config."""
    import transformers

    config = transformers.AutoConfig.from_pretrained(str(config_dir))
    for name in getattr(config, "architectures", None) or []:
        model_class = getattr(transformers, name, None)
        if model_class is not None:
            return model_class, config
    for auto in (transformers.AutoModelForCausalLM, transformers.AutoModelForImageTextToText):
        if type(config) in auto._model_mapping:
            return auto._model_mapping[type(config)], config
    raise ValueError(f"no transformers model class for architectures {config.architectures} "
                     f"(model_type {config.model_type!r})")


def _describe(report: dict) -> list[str]:
    """The loading report as phrases: ``2 of another shape (lm_head.weight [512, 64], config [516, 64], ...)``."""
    problems = []
    # transformers 5: (name, saved shape, config's shape); 4.x: the name alone
    mismatched = sorted(((m, None, None) if isinstance(m, str) else tuple(m) for m in report.get("mismatched_keys") or ()),
                        key=lambda m: natural_key(m[0]))
    if mismatched:
        shown = ", ".join(name if saved is None else f"{name} {list(saved)}, config {list(wanted)}"
                          for name, saved, wanted in mismatched[:SHOWN])
        problems.append(f"{len(mismatched)} of another shape ({shown}{', ...' if len(mismatched) > SHOWN else ''})")
    for kind, what in (("missing_keys", "missing"), ("unexpected_keys", "unexpected")):
        names = sorted(report.get(kind) or (), key=natural_key)
        if names:
            problems.append(f"{len(names)} {what} ({', '.join(names[:SHOWN])}{', ...' if len(names) > SHOWN else ''})")
    problems += [f"transformers: {msg}" for msg in report.get("error_msgs") or ()]
    return problems


def _load_failure(error: Exception) -> dict | None:
    """The report of a load that transformers refused (tensors it cannot convert or copy), else None."""
    message = str(error)
    if isinstance(error, RuntimeError) and "conversion of the weights" in message:  # transformers 5's converters
        return {"error_msgs": ["cannot convert them into the model's tensors (e.g. MoE experts of another number "
                               "or shape)"]}
    if isinstance(error, RuntimeError) and "Error(s) in loading state_dict" in message:
        return {"error_msgs": [" ".join(message.split())]}
    return None


def _first_line(error: BaseException) -> str:
    return next((line.strip() for line in str(error).splitlines() if line.strip()), type(error).__name__)


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    """No loading report, progress bar or import-time warning on stderr: the result is one line or nothing."""
    from transformers.utils import logging as hf_logging

    verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    # torchao, imported while loading: its GPU kernels' libraries fail to load on CPU machines, and it
    # registers enums the way torch 2.13 warns about
    quieted = {name: logging.getLogger(name).level for name in ("torchao", "torch.utils._pytree")}
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    for name in quieted:
        logging.getLogger(name).setLevel(logging.ERROR)
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()
        for name, level in quieted.items():
            logging.getLogger(name).setLevel(level)
