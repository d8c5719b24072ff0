"""``rl <command> --help``: what the command does, its default recipe and the others it can run, its main
keys with their defaults (from the config class, and the default recipe's value where it differs) and
examples that run. The keys and examples are checked by tests/integration/test_help.py."""

from __future__ import annotations

import textwrap
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from rl_apps.config_comments import inherited_doc
from rl_core.config import config_to_dict


@dataclass(frozen=True)
class CommandHelp:
    description: str
    main_keys: tuple[str, ...]
    examples: tuple[str, ...]
    """Arguments after ``rl <command>``, each a command line that runs."""


WIDTH = 110
_RUN_KEYS = ("model", "output_dir", "seed")
_SUPERVISED_DATA = ("synthetic_data", "data.train_path", "data.validation_path", "data.max_length")

HELP: dict[str, CommandHelp] = {
    "grpo": CommandHelp(
        "Trains a policy with GRPO (and the DAPO, GSPO, GDPO presets): prompts from `data`, samples from the "
        "generation backend, rewards from the environment `env`, group-relative advantages, a clipped policy "
        "gradient loss. Your own prompts: data.kind=file data.train_path=FILE (docs/grpo.md).",
        (*_RUN_KEYS, "grpo.max_steps", "grpo.batch_size", "grpo.num_generations_per_prompt", "grpo.max_new_tokens",
         "grpo.val_every", "policy.optimizer.lr", "loss.kind", "env.name", "data.kind", "generation.backend",
         "checkpointing.resume"),
        ("--config grpo_smoke_tiny", "--config dapo grpo.max_steps=20",
         "data.kind=file data.train_path=train.jsonl grpo.val_every=0 env.name=math",
         "--config grpo_smoke_tiny --dry-run")),
    "sft": CommandHelp(
        "Supervised fine-tuning (full or LoRA) on chats (`messages`) or prompt/completion rows, loss on the "
        "assistant tokens only (docs/sft.md).",
        (*_RUN_KEYS, "sft.max_steps", "sft.batch_size", "sft.val_every", "policy.optimizer.lr", "policy.lora",
         *_SUPERVISED_DATA),
        ("--config sft_tiny_lora", "synthetic_data=null data.train_path=train.jsonl data.validation_path=val.jsonl",
         "synthetic_data=null data.train_path=train.parquet --dry-run")),
    "dpo": CommandHelp(
        "Direct preference optimisation on prompt/chosen/rejected pairs against the frozen initial policy "
        "(docs/dpo.md).",
        (*_RUN_KEYS, "dpo.max_steps", "dpo.batch_size", "dpo.loss.beta", "policy.optimizer.lr", *_SUPERVISED_DATA),
        ("dpo.loss.beta=0.2", "synthetic_data=null data.train_path=prefs.jsonl --dry-run")),
    "rm": CommandHelp(
        "Trains a Bradley-Terry reward model (a scalar head on a causal-LM backbone) on prompt/chosen/rejected "
        "pairs; <output_dir>/hf is what the reward_model environment loads (docs/reward_model.md).",
        (*_RUN_KEYS, "rm.max_steps", "rm.batch_size", "policy.optimizer.lr", *_SUPERVISED_DATA),
        ("rm.max_steps=50", "synthetic_data=null data.train_path=prefs.jsonl --dry-run")),
    "distill": CommandHelp(
        "On-policy distillation: the student samples, a frozen teacher with the same tokenizer scores the "
        "samples, the student learns the teacher's top-k distribution (docs/distillation.md).",
        (*_RUN_KEYS, "teacher.model", "distill.max_steps", "distill.batch_size", "distill.max_new_tokens",
         "distill.teacher_top_k", "policy.optimizer.lr", *_SUPERVISED_DATA),
        ("teacher.model=tiny-qwen2 distill.max_steps=20", "synthetic_data=null data.train_path=prompts.jsonl --dry-run")),
    "xtoken-distill": CommandHelp(
        "Off-policy distillation on fixed texts from a teacher with a different tokenizer: positions aligned by "
        "character offsets, the student's distribution projected into the teacher's vocabulary "
        "(docs/distillation.md).",
        (*_RUN_KEYS, "teacher.model", "xtoken.max_steps", "xtoken.batch_size", "data.text_key",
         "policy.optimizer.lr", *_SUPERVISED_DATA),
        ("xtoken.max_steps=20", "synthetic_data=null data.train_path=texts.jsonl --dry-run")),
    "eval": CommandHelp(
        "pass@k / cons@k / mean@k of a model or checkpoint on one or more datasets, graded by environments; "
        "the same computation as GRPO's validation (docs/eval.md).",
        ("model", "sampling.n", "sampling.temperature", "sampling.max_new_tokens", "k_values", "greedy",
         "report_path", "generation.backend"),
        ("--config eval_tiny", "--config eval_tiny sampling.n=8 k_values=[1,4,8] report_path=report.json",
         "--config eval_tiny --dry-run")),
}


def command_epilog(name: str, config_class: type[BaseModel], default_recipe: str | None) -> str:
    """The text after the options in ``rl <name> --help``."""
    from rl_apps.listing import recipes_of

    about = HELP[name]
    lines = [textwrap.fill(about.description, WIDTH), ""]
    recipe_name = Path(default_recipe).name if default_recipe else None
    lines.append(f"default recipe: {recipe_name or 'none (the config class defaults)'}")
    others = [r for r in recipes_of(name) if r != recipe_name]
    if others:
        lines.append(textwrap.fill(f"other recipes (--config NAME): {', '.join(others)}", WIDTH,
                                   subsequent_indent="  "))
    lines += ["", "main keys (default; the default recipe's value where it differs):"]
    lines += main_key_lines(about.main_keys, config_class, default_recipe)
    lines += ["", "examples:"] + [f"  rl {name} {example}" for example in about.examples]
    lines += ["",
              "Overrides are dotted keys with YAML values, applied after the config file:",
              "  policy.optimizer.lr=1e-5  logger.tags=[a,b]  logger.wandb=null",
              "Every key with its default and meaning: --print-config --comments, or docs/config_reference.md.",
              "Every config problem is reported at once (exit code 2) before anything is written."]
    return "\n".join(lines)


def main_key_lines(keys: tuple[str, ...], config_class: type[BaseModel], default_recipe: str | None) -> list[str]:
    from rl_core.config import load_config

    defaults = config_to_dict(config_class())
    recipe = config_to_dict(load_config(config_class, default_recipe)) if default_recipe else defaults
    rows = []
    for key in keys:
        default, in_recipe = _at(defaults, key), _at(recipe, key)
        value = _show(default) + (f" (recipe: {_show(in_recipe)})" if in_recipe != default else "")
        rows.append((key, value, field_doc(config_class, key)))
    key_width = max(len(k) for k, _, _ in rows) + 2
    lines = []
    for key, value, doc in rows:
        lines.append(f"  {key:<{key_width}}{value}")
        if doc:
            lines.append(f"      {_clip(doc, WIDTH - 6)}")
    return lines


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3].rstrip() + "..."


def field_doc(model: type[BaseModel], dotted: str) -> str:
    """The first sentence of the docstring of the field at ``dotted`` (any member of a union)."""
    from rl_core.config.validation import _flatten, _is_model

    candidates: list[Any] = [model]
    doc = ""
    for part in dotted.split("."):
        owners = [c for c in candidates if _is_model(c) and part in c.model_fields]
        if not owners:
            raise KeyError(f"{dotted!r} is not a key of {model.__name__}")
        doc = inherited_doc(owners[0], part)
        candidates = [m for owner in owners for m in _flatten(owner.model_fields[part].annotation)]
    if not doc:  # an undocumented choice: its values
        choices = [v for c in candidates if typing.get_origin(c) is typing.Literal for v in typing.get_args(c)]
        doc = f"one of: {', '.join(map(str, choices))}" if choices else ""
    return " ".join(doc.replace("``", "`").split(". ")[0].split()).rstrip(".")


def _at(data: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        data = data.get(part) if isinstance(data, dict) else None
    return data


def _show(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, dict):
        return "{...}"
    return str(value)
