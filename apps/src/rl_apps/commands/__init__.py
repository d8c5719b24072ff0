"""The registry of `rl` subcommands.

Each subcommand lives in ``rl_apps/commands/<module>.py`` and exposes:

* ``CONFIG_CLASS``: a StrictModel subclass, the whole config of the command;
* ``DEFAULT_RECIPE``: path of a YAML in ``rl_apps/recipes/`` used when ``--config`` is omitted
  (``rl_apps.recipe_path("name.yaml")``), or None to start from CONFIG_CLASS's defaults;
* ``run(cfg) -> int``: runs the command on a validated config and returns the exit code (a
  ``ConfigError`` or ``DataError`` it raises is reported on one line with exit code 2).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CommandSpec:
    """One `rl` subcommand."""

    name: str
    """The name typed on the command line, e.g. ``xtoken-distill``."""
    module: str
    """Import path of the module implementing it."""
    summary: str
    """One line for ``rl --help``."""


COMMANDS: dict[str, CommandSpec] = {
    spec.name: spec
    for spec in [
        CommandSpec("grpo", "rl_apps.commands.grpo", "GRPO and its variants (DAPO, GSPO, GDPO)"),
        CommandSpec("sft", "rl_apps.commands.sft", "supervised fine-tuning (full or LoRA)"),
        CommandSpec("dpo", "rl_apps.commands.dpo", "direct preference optimisation"),
        CommandSpec("rm", "rl_apps.commands.rm", "train a Bradley-Terry reward model"),
        CommandSpec("distill", "rl_apps.commands.distill", "on-policy distillation from a teacher"),
        CommandSpec("xtoken-distill", "rl_apps.commands.xtoken_distill", "cross-tokenizer off-policy distillation"),
        CommandSpec("eval", "rl_apps.commands.eval", "pass@k evaluation of a checkpoint"),
    ]
}

__all__ = ["COMMANDS", "CommandSpec"]
