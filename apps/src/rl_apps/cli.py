"""`rl <command> [--config FILE] [--print-config [--comments]] [--dry-run] [key.subkey=value ...]`, and
`rl list recipes | envs | models`.

The config is loaded and validated before anything else happens: a bad config prints every
problem to stderr and exits 2 without creating an output directory or a log.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import shlex
import signal
import sys
import threading
from collections.abc import Sequence

from rl_apps import RECIPES_DIR, __version__, list_recipes, recipe_path
from rl_apps.commands import COMMANDS, CommandSpec
from rl_apps.listing import keys_of_other_commands

EXIT_USAGE = 2
"""Exit code for a bad command line or config (as argparse uses)."""


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``rl`` console script. Returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["list"]:
        from rl_apps.listing import main as list_main

        return list_main(argv[1:])
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
    module = importlib.import_module(spec.module)
    try:
        args = _command_parser(spec, module).parse_intermixed_args(list(argv))
    except SystemExit as e:
        return _exit_code(e)
    if args.comments and not args.print_config:
        print(f"rl {spec.name}: --comments goes with --print-config (rl {spec.name} --print-config --comments)",
              file=sys.stderr)
        return EXIT_USAGE

    from rl_core.config import ConfigError, dump_config, load_config

    config_path = _resolve_config_path(args.config, module.DEFAULT_RECIPE)
    if isinstance(config_path, _Missing):
        print(f"rl {spec.name}: {config_path.message}", file=sys.stderr)
        return EXIT_USAGE
    try:
        cfg = load_config(module.CONFIG_CLASS, config_path, args.overrides)
    except ConfigError as e:
        message = (_recipe_of_another_command(spec.name, args.config, config_path)
                   or _config_of_another_command(spec.name, args.config) or keys_of_other_commands(spec.name, e))
        print(f"rl {spec.name}: {message}", file=sys.stderr)
        return EXIT_USAGE

    if args.print_config:
        command = shlex.join(["rl", spec.name, *argv])
        if args.comments:
            from rl_apps.config_comments import commented_yaml

            sys.stdout.write(f"# resolved config of: {command}\n{commented_yaml(cfg)}")
        else:
            sys.stdout.write(f"# resolved config of: {command}\n{dump_config(cfg)}")
        return 0
    if args.overwrite and not hasattr(cfg, "output_dir"):
        print(f"rl {spec.name}: --overwrite: this command writes no run directory", file=sys.stderr)
        return EXIT_USAGE
    if args.max_restarts:  # the run goes to child processes, restarted from the last checkpoint
        from rl_apps.restarts import supervise

        return supervise(spec.name, cfg, argv, args.max_restarts)
    from rl_apps.run_dir import invoked

    interrupted = threading.Event()
    try:
        with _noting_interrupts(interrupted):
            if args.dry_run:
                from rl_apps.dry_run import dry_run

                return dry_run(spec.name, cfg)
            with invoked(shlex.join(["rl", spec.name, *argv]), overwrite=args.overwrite):
                return int(module.run(cfg) or 0)
    except Exception as e:
        if interrupted.is_set():  # Ctrl-C inside a library that wraps it in its own error (a checkpoint save's writers)
            print(f"rl {spec.name}: interrupted", file=sys.stderr)
            return 130
        bad_input = _bad_input(e)  # a check that needs more than the schema, a bad data file or checkpoint
        if bad_input is None:
            raise
        print(f"rl {spec.name}: {bad_input}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(f"rl {spec.name}: interrupted", file=sys.stderr)
        return 130


@contextlib.contextmanager
def _noting_interrupts(interrupted: threading.Event):
    """Set ``interrupted`` when SIGINT arrives (which still raises KeyboardInterrupt): a Ctrl-C that a library
    turns into another exception (torch's checkpoint writers raise a CheckpointException) still ends the
    command as interrupted. Only in the main thread, where Python delivers signals, and only over Python's
    default handler (an embedding program's own stays)."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield
        return

    def note(signum, frame):
        interrupted.set()
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, note)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _top_parser() -> argparse.ArgumentParser:
    lines = [f"  {name:<16}{spec.summary}" for name, spec in COMMANDS.items()]
    recipes = list_recipes()
    epilog = "commands:\n" + "\n".join(lines)
    if recipes:
        epilog += "\n\npackaged recipes (use with --config NAME):\n  " + "\n  ".join(recipes)
    epilog += ("\n\nlist what a config may name:\n  rl list recipes | envs | models"
               "\n\nexamples:\n  rl grpo --config grpo_smoke_tiny grpo.max_steps=5\n  rl sft --help"
               "\n  rl sft --dry-run")
    parser = argparse.ArgumentParser(
        prog="rl",
        description="RL post-training of language models. `rl <command> --help` describes a command.",
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"rl {__version__}")
    parser.add_argument("command", nargs="?", choices=list(COMMANDS), metavar="command")
    return parser


def _command_parser(spec: CommandSpec, module) -> argparse.ArgumentParser:
    from rl_apps.help import HELP, command_epilog

    if spec.name in HELP:
        epilog = command_epilog(spec.name, module.CONFIG_CLASS, module.DEFAULT_RECIPE)
    else:  # a command registered without help text
        epilog = "Overrides are dotted keys with YAML values, applied after the config file."
    parser = argparse.ArgumentParser(
        prog=f"rl {spec.name}",
        description=f"rl {spec.name}: {spec.summary}.",
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--config",
        metavar="FILE",
        help="YAML config (may use `defaults:`); a packaged recipe name also works. Default: the command's default recipe.",
    )
    parser.add_argument("--print-config", action="store_true", help="print the resolved config as YAML and exit")
    parser.add_argument("--comments", action="store_true",
                        help="with --print-config: each key's documentation as a YAML comment above it")
    parser.add_argument("--dry-run", action="store_true",
                        help="check the model and the data, print one templated sample with its loss mask, write "
                             "nothing and start no Ray")
    parser.add_argument("--max-restarts", type=int, default=0, metavar="N",
                        help="run in a child process; when it fails, restart it from its last checkpoint, at most N times")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace a previous run in output_dir: remove the files a run writes there (config.yaml, "
                             "metrics, checkpoints/, hf/, ...), nothing else. Without it such a directory is refused "
                             "unless checkpointing.resume=true continues that run")
    parser.add_argument("overrides", nargs="*", metavar="key.subkey=value", help="config overrides")
    return parser


def _bad_input(error: BaseException) -> BaseException | None:
    """The user-facing error behind ``error``: a ConfigError, DataError, EvalError or CheckpointError raised here or
    in a worker (a Ray worker's error arrives as the ``__cause__`` of a WorkerError); None for a bug."""
    from rl_checkpoint.errors import CheckpointError
    from rl_core.config import ConfigError
    from rl_core.data_files import DataError
    from rl_eval.errors import EvalError

    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, (ConfigError, DataError, EvalError, CheckpointError)):
            return error
        seen.add(id(error))
        error = error.__cause__
    return None


def _config_of_another_command(name: str, given: str | None) -> str | None:
    """``<file> is a recipe of `rl dpo` ...`` when ``--config`` (``given``), which failed for ``rl name``,
    is a valid config of exactly one other command (a pydantic message would not say so)."""
    from rl_core.config import ConfigError, load_config

    config_path = _resolve_config_path(given, None)
    if not isinstance(config_path, str):
        return None
    owners = []
    for other, spec in COMMANDS.items():
        if other == name:
            continue
        try:
            load_config(importlib.import_module(spec.module).CONFIG_CLASS, config_path, [])
        except ConfigError:
            continue
        owners.append(other)
    if len(owners) != 1:
        return None
    return (f"{given} is a recipe of `rl {owners[0]}`, not of `rl {name}`: run "
            f"`rl {owners[0]} --config {given}`, or pass a recipe of `rl {name}`")


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


def _recipe_of_another_command(command: str, given: str | None, config_path: str | None) -> str | None:
    """When a packaged recipe of another command was given, say so (instead of listing its keys as unknown)."""
    if given is None or config_path is None or os.path.dirname(os.path.abspath(config_path)) != str(RECIPES_DIR):
        return None
    from rl_apps.listing import recipe_commands, recipes_of

    recipe = os.path.basename(config_path)
    others = recipe_commands(recipe)
    if not others or command in others:
        return None
    mine = ", ".join(recipes_of(command)) or "none"
    return (f"--config {given}: {recipe} is a recipe of `rl {others[0]}`, not of `rl {command}`; run "
            f"`rl {others[0]} --config {given}`, or pick a recipe of rl {command}: {mine} (rl list recipes)")


def _exit_code(exit_: SystemExit) -> int:
    code = exit_.code
    if code is None:
        return 0
    return code if isinstance(code, int) else EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
