"""`rl <command> [--config FILE] [--print-config] [key.subkey=value ...]`.

The config is loaded and validated before anything else happens: a bad config prints every
problem to stderr and exits 2 without creating an output directory or a log.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import shlex
import sys
from collections.abc import Sequence
from types import ModuleType

from rl_apps import __version__, list_recipes, recipe_path
from rl_apps.commands import COMMANDS, CommandSpec

EXIT_USAGE = 2
"""Exit code for a bad command line or config (as argparse uses)."""

_REQUIRED_ATTRIBUTES = ("CONFIG_CLASS", "DEFAULT_RECIPE", "run")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``rl`` console script. Returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        top = _top_parser().parse_args(argv[:1] if argv and not argv[0].startswith("-") else argv)
    except SystemExit as e:  # --help, --version, or an unknown command
        return _exit_code(e)
    if top.command is None:
        _top_parser().print_help(sys.stderr)
        return EXIT_USAGE
    return run_command(COMMANDS[top.command], argv[1:])


def run_command(spec: CommandSpec, argv: Sequence[str]) -> int:
    """Parse ``argv`` for one command, load and validate its config, then run it."""
    try:
        args = _command_parser(spec).parse_intermixed_args(list(argv))
    except SystemExit as e:
        return _exit_code(e)

    module = _import_command(spec)
    if module is None:
        return EXIT_USAGE

    from rl_core.config import ConfigError, dump_config, load_config

    config_path = _resolve_config_path(args.config, module.DEFAULT_RECIPE)
    if isinstance(config_path, _Missing):
        print(f"rl {spec.name}: {config_path.message}", file=sys.stderr)
        return EXIT_USAGE
    try:
        cfg = load_config(module.CONFIG_CLASS, config_path, args.overrides)
    except ConfigError as e:
        print(f"rl {spec.name}: {e}", file=sys.stderr)
        return EXIT_USAGE

    if args.print_config:
        command = shlex.join(["rl", spec.name, *argv])
        sys.stdout.write(f"# resolved config of: {command}\n{dump_config(cfg)}")
        return 0
    if args.max_restarts:  # the run goes to child processes, restarted from the last checkpoint
        from rl_apps.restarts import supervise

        return supervise(spec.name, cfg, argv, args.max_restarts)
    try:
        return int(module.run(cfg) or 0)
    except ConfigError as e:  # a check that needs more than the schema (e.g. a model path that does not exist)
        print(f"rl {spec.name}: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(f"rl {spec.name}: interrupted", file=sys.stderr)
        return 130


def _top_parser() -> argparse.ArgumentParser:
    lines = [f"  {name:<16}{spec.summary}{_availability(spec)}" for name, spec in COMMANDS.items()]
    recipes = list_recipes()
    epilog = "commands:\n" + "\n".join(lines)
    if recipes:
        epilog += "\n\npackaged recipes (use with --config NAME):\n  " + "\n  ".join(recipes)
    epilog += "\n\nexample:\n  rl grpo --config my.yaml grpo.max_steps=5 policy.optimizer.lr=1e-5"
    parser = argparse.ArgumentParser(
        prog="rl",
        description="RL post-training of language models. `rl <command> --help` describes a command.",
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"rl {__version__}")
    parser.add_argument("command", nargs="?", choices=list(COMMANDS), metavar="command")
    return parser


def _command_parser(spec: CommandSpec) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=f"rl {spec.name}",
        description=f"{spec.summary}.",
        epilog=(
            "Overrides are dotted keys with YAML values, applied after the config file:\n"
            "  grpo.max_steps=5  policy.optimizer.lr=1e-5  logger.tags=[a,b]  logger.wandb=null\n"
            "Every config problem is reported at once (exit code 2) before anything is written."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--config",
        metavar="FILE",
        help="YAML config (may use `defaults:`); a packaged recipe name also works. Default: the command's default recipe.",
    )
    parser.add_argument("--print-config", action="store_true", help="print the resolved config as YAML and exit")
    parser.add_argument("--max-restarts", type=int, default=0, metavar="N",
                        help="run in a child process; when it fails, restart it from its last checkpoint, at most N times")
    parser.add_argument("overrides", nargs="*", metavar="key.subkey=value", help="config overrides")
    return parser


def _module_exists(spec: CommandSpec) -> bool:
    try:
        return importlib.util.find_spec(spec.module) is not None
    except ModuleNotFoundError:  # a parent package is missing
        return False


def _availability(spec: CommandSpec) -> str:
    if _module_exists(spec):
        return ""
    return f" (not available yet: issue #{spec.issue})" if spec.issue is not None else " (not available yet)"


def _import_command(spec: CommandSpec) -> ModuleType | None:
    """Import the command's module, or say clearly that it is not available yet (returns None)."""
    see = f": see issue #{spec.issue}" if spec.issue is not None else ""
    if not _module_exists(spec):
        print(f"`rl {spec.name}` is not available yet{see}", file=sys.stderr)
        return None
    module = importlib.import_module(spec.module)
    missing = [name for name in _REQUIRED_ATTRIBUTES if not hasattr(module, name)]
    if missing:
        print(
            f"`rl {spec.name}` is not available yet: {spec.module} does not define {', '.join(missing)}{see}",
            file=sys.stderr,
        )
        return None
    return module


class _Missing:
    def __init__(self, message: str):
        self.message = message


def _resolve_config_path(given: str | None, default_recipe: str | None) -> str | None | _Missing:
    """``--config`` as given, else a packaged recipe of that name, else the command's default recipe."""
    if given is None:
        return default_recipe
    if os.path.exists(given):
        return given
    packaged = recipe_path(given)
    if os.path.isfile(packaged):
        return packaged
    recipes = ", ".join(list_recipes()) or "none"
    return _Missing(f"--config {given}: file not found (nor a packaged recipe; packaged recipes: {recipes})")


def _exit_code(exit_: SystemExit) -> int:
    code = exit_.code
    if code is None:
        return 0
    return code if isinstance(code, int) else EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
