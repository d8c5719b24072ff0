"""arith_errors: where a cell's held-out answers go wrong, validation by validation (docs/learning.md).

    python bench/arith_errors.py docs/learning/main_cos75/grpo_arithmetic_smollm2-s2 [more cells] \
        [--markdown runs/learning/errors.md]

A cell is a directory of scripts/sweep.py (``cell.json`` + ``validation.jsonl``). Its validation prompts are
built again from the cell's own command (the recipe and its overrides, loaded as ``rl grpo`` loads them), in
the order ``validation.jsonl`` records them, and each greedy answer is read against its true result. For
two-operand arithmetic (``a + b``, ``a - b``), per validation:

* accuracy on the problems whose ones column carries (``a + b``: the ones digits sum to 10 or more) or
  borrows (``a - b``: the ones digit of ``a`` is below that of ``b``), and on the others;
* wrong answers that are 10 too high, 10 too low (a tens digit off by one: a carry added where none is, or
  one dropped), and the other wrong ones (no answer included).

A fall in held-out accuracy that comes with a swing between "10 too high" and "10 too low" is the policy's
handling of the carry moving as a whole, not scattered errors. A bad cell (no ``cell.json``, a TRL cell, a
task this does not read, a ``validation.jsonl`` that does not match its prompts) is one line, exit 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from rl_environments.answers import parse_number

CELL_FILE = "cell.json"
VALIDATION_FILE = "validation.jsonl"


@dataclass(frozen=True)
class Problem:
    a: int
    op: str
    b: int

    @property
    def result(self) -> int:
        return self.a + self.b if self.op == "+" else self.a - self.b

    @property
    def carries(self) -> bool:
        """The ones column carries (``+``) or borrows (``-``)."""
        return self.a % 10 + self.b % 10 >= 10 if self.op == "+" else self.a % 10 < self.b % 10


@dataclass(frozen=True)
class Row:
    step: int
    accuracy: float
    carry: tuple[int, int]
    """(right, of) on the problems that carry or borrow."""
    plain: tuple[int, int]
    """(right, of) on the others."""
    ten_high: int
    ten_low: int
    other_wrong: int


def parse_problem(text: str, where: str) -> Problem:
    parts = text.split()
    if len(parts) != 3 or parts[1] not in ("+", "-") or not all(p.isdigit() for p in parts[::2]):
        raise SystemExit(f"arith_errors: {where}: problem {text!r} is not 'a + b' or 'a - b'; this table reads "
                         "two-operand sums and differences (data.num_operands=2, data.operators + and -)")
    return Problem(int(parts[0]), parts[1], int(parts[2]))


def validation_problems(cell: Path) -> list[Problem]:
    """The cell's validation problems, in the order its run validated them."""
    path = cell / CELL_FILE
    try:
        record = json.loads(path.read_text())
        argv, preset = list(record["argv"]), str(record["preset"])
    except FileNotFoundError:
        raise SystemExit(f"arith_errors: {path}: no such file; pass a cell directory of scripts/sweep.py") from None
    except (ValueError, KeyError, TypeError) as err:
        raise SystemExit(f"arith_errors: {path}: not a sweep cell record ({err}); run the cell again") from None
    if argv[:4] != ["rl", "grpo", "--config", preset]:
        raise SystemExit(f"arith_errors: {path}: the cell is not an `rl grpo` run (TRL's cells keep no "
                         "validation.jsonl); pass a cell of this library")
    from rl_apps import recipe_path
    from rl_apps.commands.grpo import GRPORunConfig
    from rl_core.config import ConfigError, load_config

    try:
        cfg = load_config(GRPORunConfig, recipe_path(f"{preset}.yaml"), argv[4:])
    except (ConfigError, FileNotFoundError) as err:
        first = str(err).strip().splitlines()[0]
        raise SystemExit(f"arith_errors: {path}: its command does not load ({first}); is it this version's?") from None
    if getattr(cfg.data, "kind", None) != "arithmetic":
        raise SystemExit(f"arith_errors: {path}: data.kind is {getattr(cfg.data, 'kind', None)!r}; this table "
                         "reads the arithmetic task")
    samples = cfg.data.generate("validation", cfg.grpo.val_num_prompts)
    return [parse_problem(s.metadata["problem"], f"{path}") for s in samples]


def rows(cell: Path) -> list[Row]:
    """One row per validation of the cell (the test split's record, if any, is left out)."""
    problems = validation_problems(cell)
    path = cell / VALIDATION_FILE
    if not path.is_file():
        raise SystemExit(f"arith_errors: {path}: no such file; the cell's run kept no per-prompt outcomes")
    out = []
    for line_no, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            split, step, correct, answers = record["split"], int(record["step"]), record["correct"], record["answers"]
        except (ValueError, KeyError, TypeError) as err:
            raise SystemExit(f"arith_errors: {path}:{line_no}: not a validation record ({err})") from None
        if split != "validation":
            continue
        if len(correct) != len(problems) or len(answers) != len(problems):
            raise SystemExit(f"arith_errors: {path}:{line_no}: {len(correct)} outcomes for the {len(problems)} "
                             "validation prompts the cell's command builds; is cell.json this run's?")
        out.append(row(step, problems, correct, answers))
    return out


def row(step: int, problems: list[Problem], correct: str, answers: list[str | None]) -> Row:
    tally = {True: [0, 0], False: [0, 0]}
    high = low = other = 0
    for problem, ok, answer in zip(problems, correct, answers):
        tally[problem.carries][1] += 1
        if ok == "1":
            tally[problem.carries][0] += 1
            continue
        value = parse_number(answer)  # read as the grader reads it
        offset = None if value is None else value - problem.result
        high += offset == 10
        low += offset == -10
        other += offset not in (10, -10)
    right = tally[True][0] + tally[False][0]
    return Row(step, right / len(problems), tuple(tally[True]), tuple(tally[False]), high, low, other)


def share(counts: tuple[int, int]) -> str:
    right, of = counts
    return f"{right / of:.3f}" if of else "-"


def table(cell: Path) -> list[str]:
    lines = [f"{cell}", "",
             "| step | held-out | carry/borrow | no carry | 10 too high | 10 too low | other wrong |",
             "|---|---|---|---|---|---|---|"]
    for r in rows(cell):
        lines.append(f"| {r.step} | {r.accuracy:.3f} | {share(r.carry)} | {share(r.plain)} | {r.ten_high} | "
                     f"{r.ten_low} | {r.other_wrong} |")
    return lines + [""]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("cells", nargs="+", type=Path, help="cell directories (cell.json + validation.jsonl)")
    parser.add_argument("--markdown", type=Path, help="also write the tables here")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        text = "\n".join(line for cell in args.cells for line in table(cell))
    except SystemExit as stop:  # a bad cell: its one line, exit 2, nothing written
        if not isinstance(stop.code, str):
            raise
        print(stop.code, file=sys.stderr)
        return 2
    print(text, end="")
    if args.markdown:
        from rl_apps.run_dir import write_atomically

        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(args.markdown, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
