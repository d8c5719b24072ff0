"""``rl-eval``: evaluate a model (HF dir or any checkpoint) on datasets; pass@k, cons@k, mean@k.

    rl-eval --config eval.yaml sampling.n=8 k_values=[1,4,8]
    rl-eval model=runs/grpo/checkpoints/step_000005 datasets.0.data.source.kind=countdown
    rl-eval --print-config
"""

from __future__ import annotations

import argparse
import sys

from rl_core.config import ConfigError, dump_config, load_config
from rl_eval.config import EvalConfig
from rl_eval.errors import EvalError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rl-eval", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", help="YAML config (EvalConfig); defaults: a tiny model on arithmetic")
    parser.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. sampling.temperature=0.7")
    args = parser.parse_args(argv)
    try:
        cfg = load_config(EvalConfig, args.config, args.overrides)
    except ConfigError as e:
        print(str(e), file=sys.stderr)
        return 2
    if args.print_config:
        print(dump_config(cfg))
        return 0
    return run_cli(cfg)


def run_cli(cfg: EvalConfig) -> int:
    """Run and turn bad input into one line on stderr and exit code 2."""
    from rl_eval.run import run_eval

    try:
        run_eval(cfg)
    except EvalError as e:
        print(f"rl-eval: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
