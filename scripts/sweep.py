"""sweep: one `rl grpo` run per (preset, seed) cell, each in its own output directory, one after another.

    python scripts/sweep.py --out runs/learning/main --presets grpo dapo --seeds 0 1 --set grpo.max_steps=300 grpo.max_minutes=30
    python scripts/sweep.py --out runs/learning/arith3 --task grpo_arithmetic3_smollm2.yaml --presets dapo
    python scripts/sweep.py --out runs/learning/main --presets trl --seeds 0 1 --set grpo.max_steps=34 --dry-run

A cell is ``rl grpo --config <preset> seed=<seed> output_dir=<out>/<preset>-s<seed> grpo.test_at_end=true
checkpointing.enabled=false <task keys> <--set ...>`` (``--checkpoints`` keeps the recipe's checkpointing:
each SmolLM2 checkpoint, model and optimizer, is 1.7 GB). ``--task`` names a recipe built on the main job (``defaults:
grpo_arithmetic_smollm2.yaml``, as every preset is): the keys written in that file itself become overrides
of each preset, so a preset runs on the other task with its own algorithm settings. The preset ``trl`` is
TRL's GRPOTrainer on the same task (``python bench/trl_grpo_arith.py --recipe <task> --seed <seed> --out
<out>/trl-s<seed> <--set ...>``), written in the same format.

Cells run one at a time: they share the machine's cores, and their wall times are what is compared. Each
cell directory keeps its ``metrics.jsonl`` (and ``metrics.png``, ``samples.jsonl``, ``validation.jsonl``, ``config.yaml``),
``cell.json`` (preset, seed, task, library, the command as given to a shell) and ``run.log``. A cell whose
``metrics.jsonl`` already holds ``test/*`` metrics is finished and skipped (``--redo`` runs it again), so an
interrupted sweep continues where it stopped. bench/learning.py reads the cells into the table and plots.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
MAIN_RECIPE = "grpo_arithmetic_smollm2.yaml"
TRL_SCRIPT = "bench/trl_grpo_arith.py"
CELL_FILE = "cell.json"


@dataclass
class Cell:
    """One run of the sweep."""

    preset: str
    """The recipe (``dapo``), or ``trl`` for TRL's GRPOTrainer."""
    seed: int
    task: str
    """The task recipe the cell runs on (the main job unless ``--task``)."""
    output_dir: str
    argv: list[str] = field(default_factory=list)
    """The command, as run: ``argv[0]`` is ``rl`` or ``python``."""

    @property
    def library(self) -> str:
        return "trl" if self.preset == "trl" else "rl"

    @property
    def command(self) -> str:
        """The command as one shell line (what docs/learning.md shows)."""
        return shlex.join(self.argv)


def recipe_file(name: str) -> Path:
    """A packaged recipe by name (``dapo``, ``dapo.yaml``) or a YAML path."""
    from rl_apps import recipe_path

    path = Path(name)
    if path.suffix in (".yaml", ".yml") and path.is_file():
        return path
    packaged = Path(recipe_path(name if name.endswith((".yaml", ".yml")) else f"{name}.yaml"))
    if not packaged.is_file():
        raise SystemExit(f"sweep: no recipe {name!r} (neither a file nor a packaged recipe; rl list recipes)")
    return packaged


def task_overrides(task: str | None) -> list[str]:
    """The keys written in the task recipe itself (not those of its ``defaults:``) as dotted overrides.
    The task must build on the main job only, so that its own keys are all that differs from it."""
    if task is None:
        return []
    path = recipe_file(task)
    data = yaml.safe_load(path.read_text()) or {}
    parents = data.pop("defaults", None)
    if path.name != MAIN_RECIPE and parents not in (MAIN_RECIPE, [MAIN_RECIPE]):
        raise SystemExit(f"sweep: --task {task}: the task recipe must say `defaults: {MAIN_RECIPE}` (as every "
                         f"preset does), got defaults: {parents!r}")
    data.pop("output_dir", None)  # each cell has its own
    return [f"{key}={json.dumps(value)}" for key, value in flatten(data)]


def flatten(data: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """``{"a": {"b": 1}}`` -> ``[("a.b", 1)]``; lists and scalars are leaves (JSON is valid YAML for the
    override parser, including strings with backslashes)."""
    out: list[tuple[str, Any]] = []
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out += flatten(value, f"{name}.")
        else:
            out.append((name, value))
    return out


def plan(args: argparse.Namespace) -> list[Cell]:
    """Every cell of the sweep, in run order (seed-major, so a partial sweep has whole seeds)."""
    task = args.task or MAIN_RECIPE
    task_keys = task_overrides(args.task)
    out = Path(args.out)
    cells = []
    for seed in args.seeds:
        for preset in args.presets:
            name = Path(preset).stem
            cell_dir = out / f"{name}-s{seed}"
            if name == "trl":
                argv = ["python", TRL_SCRIPT, "--recipe", task, "--seed", str(seed), "--out", str(cell_dir), *args.set]
            else:
                config = str(recipe_file(preset)) if Path(preset).is_file() else name
                keep = [] if args.checkpoints else ["checkpointing.enabled=false"]
                argv = ["rl", "grpo", "--config", config, f"seed={seed}", f"output_dir={cell_dir}",
                        "grpo.test_at_end=true", "logger.progress_bar=false", *keep, *task_keys, *args.set]
            cells.append(Cell(name, seed, task, str(cell_dir), argv))
    return cells


def finished(cell: Cell) -> bool:
    """Whether the cell's run got to its end (its test metrics are logged)."""
    metrics = Path(cell.output_dir) / "metrics.jsonl"
    if not metrics.is_file():
        return False
    return any(line.startswith("{") and '"test/' in line for line in metrics.read_text().splitlines())


def executable(argv: list[str]) -> list[str]:
    """``argv`` with ``rl`` / ``python`` resolved to this interpreter's environment."""
    if argv[0] == "rl":
        return [str(Path(sys.executable).with_name("rl")), *argv[1:]]
    return [sys.executable, *argv[1:]]


def run_cell(cell: Cell, timeout_s: float | None) -> dict[str, Any]:
    """Run one cell (output to ``run.log``); returns its record for the sweep's summary."""
    out = Path(cell.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / CELL_FILE, {**asdict(cell), "library": cell.library, "command": cell.command})
    start = time.time()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    with open(out / "run.log", "w") as log:
        try:
            code = subprocess.run(executable(cell.argv), cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                  timeout=timeout_s).returncode
        except subprocess.TimeoutExpired:
            code = "timeout"
    return {"cell": out.name, "exit": code, "seconds": round(time.time() - start, 1)}


def write_json(path: Path, data: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="the sweep's directory: one sub-directory per cell")
    parser.add_argument("--presets", nargs="+", default=["grpo_arithmetic_smollm2"],
                        help="recipes by name or path (grpo dapo gspo gdpo drgrpo cispo reinforce_pp rloo ...), "
                             "and trl for TRL's GRPOTrainer")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--task", help="a task recipe built on the main job, e.g. grpo_arithmetic3_smollm2.yaml")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                        help="overrides for every cell (rl grpo's dotted keys; TRL's script reads grpo.max_steps, grpo.max_minutes, "
                             "grpo.val_every, grpo.val_num_prompts, grpo.test_num_prompts)")
    parser.add_argument("--checkpoints", action="store_true",
                        help="let each cell keep its recipe's checkpoints (default: checkpointing.enabled=false; a "
                             "cell is compared by its metrics, and each SmolLM2 checkpoint is 1.7 GB)")
    parser.add_argument("--timeout-min", type=float, help="stop a cell that runs longer than this")
    parser.add_argument("--redo", action="store_true", help="run finished cells again")
    parser.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cells = plan(args)
    if args.dry_run:
        for cell in cells:
            print(cell.command)
        return 0
    summary = []
    for i, cell in enumerate(cells, start=1):
        if finished(cell) and not args.redo:
            print(f"[{i}/{len(cells)}] {cell.output_dir}: finished before, skipped", flush=True)
            continue
        print(f"[{i}/{len(cells)}] {cell.command}", flush=True)
        record = run_cell(cell, args.timeout_min * 60 if args.timeout_min else None)
        print(f"    exit {record['exit']} after {record['seconds']:.0f} s", flush=True)
        summary.append(record)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    write_json(Path(args.out) / "sweep.json", summary)
    return 0 if all(r["exit"] == 0 for r in summary) else 1


if __name__ == "__main__":
    sys.exit(main())
