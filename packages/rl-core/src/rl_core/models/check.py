"""Is a local directory a loadable Hugging Face model? Cheap checks (JSON and safetensors headers, no
weights read) so that a bad model fails as one line before any worker starts; and ``meta_model``, the
model of a directory's config on the meta device, for checks that need its modules and shapes."""

from __future__ import annotations

import json
from pathlib import Path


def model_dir_problem(path: Path) -> str | None:
    """What is wrong with HF model directory ``path`` (which holds config.json), or None."""
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError, UnicodeDecodeError) as e:
        return f"{path / 'config.json'} is unreadable ({type(e).__name__}: {e})"
    if not isinstance(config, dict) or "model_type" not in config:
        return f"{path / 'config.json'} is not a model config (no model_type)"
    shards = sorted(path.glob("*.safetensors"))
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            named = set(json.loads(index.read_text())["weight_map"].values())
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            return f"{index} is unreadable ({type(e).__name__}: {e})"
        if missing := sorted(n for n in named if not (path / n).is_file()):
            return f"{path / missing[0]} is missing (named in {index.name})"
    if not shards:
        if any(path.glob("*.bin")):
            return None  # pickle weights: transformers loads (and checks) them itself
        return f"{path} holds no weights (*.safetensors)"
    from safetensors import SafetensorError, safe_open

    for shard in shards:
        try:
            with safe_open(str(shard), framework="pt"):
                pass
        except (SafetensorError, OSError) as e:  # header, length and coverage are checked, no data read
            return f"{shard} is corrupt ({e})"
    return None


def meta_model(path: str | Path):
    """The model of HF directory ``path`` as the library loads it (``AutoModelForImageTextToText`` for a
    vision-language model, else ``AutoModelForCausalLM``), built on the meta device from its config: its
    modules, names and shapes, no weights read or allocated."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

    from rl_core.models.processor import is_vision_language_model

    model_class = AutoModelForImageTextToText if is_vision_language_model(path) else AutoModelForCausalLM
    with torch.device("meta"):
        return model_class.from_config(AutoConfig.from_pretrained(path))
