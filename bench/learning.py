"""learning: the table and the plot of a sweep's learning curves (docs/learning.md).

    python bench/learning.py runs/learning/main --title "Main job" --plot docs/img/learning_main.png \
        --markdown runs/learning/main/report.md --budget-min 30 --target 0.4 --drop-after-step 15

Reads every cell directory of a sweep (scripts/sweep.py: ``cell.json`` + ``metrics.jsonl``; TRL's cells from
bench/trl_grpo_arith.py have the same format; a directory without ``cell.json`` is read as
``<preset>-s<seed>``). Held-out accuracy is ``val/accuracy``; its wall time is the run's training time up to
that step: the sum of ``train/time/total`` minus ``train/time/validate`` (start-up and evaluation left out,
on both libraries). Per preset, over its seeds (mean, and min-max as the spread):

* held-out accuracy before training, at its best, and at the last validation within ``--budget-min``;
* ``test/accuracy`` at the end of the run (the test split: never used to pick anything);
* the wall time to first reach ``--target``, and to reach TRL's best held-out accuracy (with TRL's own
  time to its best, and the ratio), when the sweep has TRL cells;
* the largest drop below the running best after ``--drop-after-step`` (points);
* held-out accuracy per validation step and per ``--every-min`` minutes (two more tables);
* for cells that kept ``validation.jsonl``: how many prompts change outcome from one validation to the next
  after ``--churn-from-step``, and how often 3,000 simulated curves with that churn and no trend fall more than
  ``--drop-pts`` below their running best (a table; what a cell's falls are read against).

Prints the markdown (and writes it with ``--markdown``); ``--plot`` draws held-out accuracy vs step and vs
wall time, one line per preset (mean over seeds, the band its min-max).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Run:
    """One cell: its held-out curve and end-of-run numbers."""

    preset: str
    seed: int
    library: str
    command: str
    steps: list[int] = field(default_factory=list)
    """Validation steps (0: before training)."""
    minutes: list[float] = field(default_factory=list)
    """Training wall time at each validation step."""
    accuracy: list[float] = field(default_factory=list)
    test_accuracy: float | None = None
    last_step: int = 0
    total_minutes: float = 0.0
    outcomes: list[str] = field(default_factory=list)
    """Per validation (when the cell kept ``validation.jsonl``): which prompts were right, a 0/1 string."""

    def at_budget(self, budget_min: float) -> float | None:
        """Held-out accuracy of the last validation within the budget."""
        within = [a for m, a in zip(self.minutes, self.accuracy) if m <= budget_min + 1e-9]
        return within[-1] if within else None

    def minutes_to(self, target: float) -> float | None:
        """Wall time of the first validation at or above ``target`` (None: never)."""
        return next((m for m, a in zip(self.minutes, self.accuracy) if a >= target - 1e-9), None)

    def max_drop_after(self, step: int) -> float:
        """Largest fall (points) below the running best at validations after ``step``."""
        best, drop = -math.inf, 0.0
        for s, a in zip(self.steps, self.accuracy):
            best = max(best, a)
            if s > step:
                drop = max(drop, best - a)
        return 100 * drop

    def flips(self, from_step: int) -> list[tuple[int, int, int]]:
        """(step, prompts right at the validation before and wrong now, wrong before and right now) for each
        validation whose previous one is at or after ``from_step`` and the usual interval before it ([] without
        ``validation.jsonl``)."""
        if len(self.outcomes) != len(self.steps) or len(self.steps) < 2:
            return []
        gaps = [b - a for a, b in zip(self.steps, self.steps[1:])]
        interval = statistics.mode(gaps)
        out = []
        for (a, before), (b, now) in zip(zip(self.steps, self.outcomes), zip(self.steps[1:], self.outcomes[1:])):
            if a >= from_step and b - a == interval:
                out.append((b, sum(x == "1" and y == "0" for x, y in zip(before, now)),
                            sum(x == "0" and y == "1" for x, y in zip(before, now))))
        return out


def no_trend_dips(prompts: int, churn: float, accuracy: float, validations: int, runs: int = 3000,
                  seed: int = 0) -> list[float]:
    """The largest fall below the running best (points) of ``runs`` simulated validation curves with no trend:
    ``prompts`` prompts, each a two-state chain (right / wrong) that stays at ``accuracy`` on average and changes
    so that ``churn`` prompts change outcome between two validations, validated ``validations`` times. What
    per-prompt churn alone does to a curve: a cell's falls are read against it."""
    import numpy as np

    if not 0.0 < accuracy < 1.0:
        raise ValueError(f"no_trend_dips: accuracy must be strictly between 0 and 1, got {accuracy}")
    leave = churn / prompts / (2 * accuracy)  # churn = 2 p P(right -> wrong) at the stationary accuracy p
    if leave > 1.0 or leave * accuracy / (1 - accuracy) > 1.0:
        raise ValueError(f"no_trend_dips: {churn} of {prompts} prompts changing is more than a chain around "
                         f"{accuracy} can change")
    rng = np.random.default_rng(seed)
    state = rng.random((runs, prompts)) < accuracy
    curves = [state.mean(1)]
    for _ in range(validations - 1):
        u = rng.random(state.shape)
        state = np.where(state, u >= leave, u < leave * accuracy / (1 - accuracy))
        curves.append(state.mean(1))
    acc = np.stack(curves, 1)
    return (100 * (np.maximum.accumulate(acc, 1) - acc)[:, 1:].max(1)).tolist()


def read_run(cell: Path) -> Run:
    from rl_core.logging import read_jsonl_metrics

    info_path = cell / "cell.json"
    if info_path.is_file():
        info = json.loads(info_path.read_text())
    else:
        preset, _, seed = cell.name.rpartition("-s")
        info = {"preset": preset, "seed": int(seed) if seed.isdigit() else 0, "command": ""}
        info["library"] = "trl" if preset == "trl" else "rl"
    run = Run(info["preset"], int(info["seed"]), info.get("library", "rl"), info.get("command", ""))
    seconds = 0.0
    for record in read_jsonl_metrics(cell / "metrics.jsonl"):
        step = int(record["step"])
        if "train/time/total" in record:
            seconds += record["train/time/total"] - record.get("train/time/validate", 0.0)
            run.last_step = step
        if "val/accuracy" in record:
            run.steps.append(step)
            run.minutes.append(seconds / 60)
            run.accuracy.append(record["val/accuracy"])
        if "test/accuracy" in record:
            run.test_accuracy = record["test/accuracy"]
    run.total_minutes = seconds / 60
    outcomes = cell / "validation.jsonl"
    if outcomes.is_file():
        for number, line in enumerate(outcomes.read_text().splitlines(), 1):
            try:
                record = json.loads(line) if line.strip() else {}
                if record.get("split") == "validation":
                    run.outcomes.append(str(record["correct"]))
            except (json.JSONDecodeError, KeyError, AttributeError) as err:
                raise SystemExit(f"learning: {outcomes}:{number}: not a validation record ({err}); "
                                 "rl grpo writes one JSON object with 'step', 'split' and 'correct' a line") from None
    return run


def read_sweep(folder: Path) -> dict[str, list[Run]]:
    """Runs by preset (in the order the presets first appear), each list sorted by seed."""
    groups: dict[str, list[Run]] = defaultdict(list)
    for cell in sorted(p for p in folder.iterdir() if (p / "metrics.jsonl").is_file()):
        run = read_run(cell)
        groups[run.preset].append(run)
    return {k: sorted(v, key=lambda r: r.seed) for k, v in groups.items()}


def spread(values: list[float | None], fmt: str = "{:.3f}") -> str:
    """``mean (min-max)`` of the values present; ``-`` when none."""
    present = [v for v in values if v is not None]
    if not present:
        return "-"
    mean = fmt.format(statistics.fmean(present))
    if min(present) == max(present):
        return mean
    return f"{mean} ({fmt.format(min(present))}-{fmt.format(max(present))})"


def time_to(runs: list[Run], target: float) -> str:
    """Mean minutes to reach ``target`` over the runs that did, and how many did not."""
    times = [r.minutes_to(target) for r in runs]
    reached = [t for t in times if t is not None]
    text = spread(reached, "{:.1f}") if reached else "not reached"
    missing = len(times) - len(reached)
    return f"{text} ({missing}/{len(times)} never)" if reached and missing else text


def trl_reference(groups: dict[str, list[Run]]) -> tuple[float, float] | None:
    """(TRL's best held-out accuracy, mean over its seeds; minutes TRL took to first reach it)."""
    trl = [r for runs in groups.values() for r in runs if r.library == "trl"]
    if not trl:
        return None
    best = statistics.fmean(max(r.accuracy) for r in trl if r.accuracy)
    times = [r.minutes_to(best) for r in trl]
    reached = [t for t in times if t is not None]
    return best, statistics.fmean(reached) if reached else math.nan


def summary_table(groups: dict[str, list[Run]], args: argparse.Namespace) -> list[str]:
    trl = trl_reference(groups)
    header = ["preset", "seeds", "steps (min)", "held-out at 0", "best held-out",
              f"held-out at {args.budget_min:g} min", "test at end", f"min to {args.target:g}",
              f"max drop after step {args.drop_after_step} (pts)"]
    if trl:
        header += [f"min to TRL's best ({trl[0]:.3f})", "x TRL's time"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for preset, runs in groups.items():
        row = [preset, ",".join(str(r.seed) for r in runs),
               spread([r.last_step for r in runs], "{:.0f}") + f" ({spread([r.total_minutes for r in runs], '{:.1f}')})",
               spread([r.accuracy[0] if r.steps and r.steps[0] == 0 else None for r in runs]),
               spread([max(r.accuracy) if r.accuracy else None for r in runs]),
               spread([r.at_budget(args.budget_min) for r in runs]), spread([r.test_accuracy for r in runs]),
               time_to(runs, args.target), spread([r.max_drop_after(args.drop_after_step) for r in runs], "{:.1f}")]
        if trl:
            times = [r.minutes_to(trl[0]) for r in runs]
            ratio = ([t / trl[1] for t in times if t is not None] if trl[1] and not math.isnan(trl[1]) else [])
            row += [time_to(runs, trl[0]), spread(ratio, "{:.2f}") if ratio else "-"]
        lines.append("| " + " | ".join(row) + " |")
    return lines


def mean_curve(runs: list[Run]) -> tuple[list[int], list[float], list[float], list[float], list[float]]:
    """(steps validated by every run, mean minutes, mean / min / max held-out accuracy) over the seeds."""
    common = sorted(set.intersection(*(set(r.steps) for r in runs))) if runs else []
    minutes, mean, low, high = [], [], [], []
    for step in common:
        points = [(r.minutes[r.steps.index(step)], r.accuracy[r.steps.index(step)]) for r in runs]
        minutes.append(statistics.fmean(m for m, _ in points))
        accs = [a for _, a in points]
        mean.append(statistics.fmean(accs))
        low.append(min(accs))
        high.append(max(accs))
    return common, minutes, mean, low, high


def curve_tables(groups: dict[str, list[Run]], every_min: float, budget_min: float) -> list[str]:
    presets = list(groups)
    curves = {p: mean_curve(runs) for p, runs in groups.items()}
    steps = sorted({s for c in curves.values() for s in c[0]})
    lines = ["Held-out accuracy per validation step (mean over seeds):", "",
             "| step | " + " | ".join(presets) + " |", "|---|" + "---|" * len(presets)]
    for step in steps:
        cells = [f"{c[2][c[0].index(step)]:.3f}" if step in c[0] else "" for c in (curves[p] for p in presets)]
        lines.append(f"| {step} | " + " | ".join(cells) + " |")
    lines += ["", f"Held-out accuracy at each {every_min:g} minutes of training (the last validation by then, "
                  "mean over seeds):", "", "| minutes | " + " | ".join(presets) + " |", "|---|" + "---|" * len(presets)]
    marks = [every_min * i for i in range(int(budget_min // every_min) + 1)]
    for mark in marks:
        cells = [spread([r.at_budget(mark) for r in groups[p]]) for p in presets]
        lines.append(f"| {mark:g} | " + " | ".join(cells) + " |")
    return lines


def plot(groups: dict[str, list[Run]], out_png: Path, title: str, budget_min: float) -> Path:
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    fig, (by_step, by_time) = plt.subplots(1, 2, figsize=(12, 4.5))
    for preset, runs in groups.items():
        steps, minutes, mean, low, high = mean_curve(runs)
        label = f"{preset} ({len(runs)} seed{'s' if len(runs) > 1 else ''})"
        style = {"linestyle": "--"} if runs[0].library == "trl" else {}
        line, = by_step.plot(steps, mean, marker="o", markersize=3, label=label, **style)
        by_time.plot(minutes, mean, marker="o", markersize=3, color=line.get_color(), label=label, **style)
        if len(runs) > 1:
            by_step.fill_between(steps, low, high, color=line.get_color(), alpha=0.15)
            by_time.fill_between(minutes, low, high, color=line.get_color(), alpha=0.15)
    by_time.axvline(budget_min, color="grey", linewidth=0.8, linestyle=":")
    for ax, xlabel in ((by_step, "step"), (by_time, "training wall time (min)")):
        ax.set_xlabel(xlabel)
        ax.set_ylabel("held-out accuracy (greedy, strict)")
        ax.grid(alpha=0.3)
    by_time.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    out_png.parent.mkdir(parents=True, exist_ok=True)
    partial = out_png.with_name(f".{out_png.name}.partial")  # renamed into place once whole
    fig.savefig(partial, format="png", dpi=100)
    plt.close(fig)
    os.replace(partial, out_png)
    return out_png


def churn_table(groups: dict[str, list[Run]], args: argparse.Namespace) -> list[str]:
    """Per cell with ``validation.jsonl``: how many prompts change outcome between validations (after
    ``--churn-from-step``), and how often a curve with that churn and no trend falls more than ``--drop-pts``
    below its running best after ``--drop-after-step``."""
    flips_of = {id(r): r.flips(args.churn_from_step) for rs in groups.values() for r in rs}
    runs = [r for rs in groups.values() for r in rs if flips_of[id(r)]]
    if not runs:
        return []
    lines = [f"Per-prompt churn (validation.jsonl): prompts that change outcome from one validation to the next "
             f"after step {args.churn_from_step}, and a no-trend model with that churn (3,000 simulated curves):", "",
             "| preset | seed | prompts | changing per validation | right -> wrong / wrong -> right (mean) | "
             f"max drop after step {args.drop_after_step} (pts) | no trend: P(drop > {args.drop_pts:g}) | "
             "no trend: mean max drop (pts) |", "|" + "---|" * 8]
    for r in runs:
        flips = flips_of[id(r)]
        changing = [lost + gained for _, lost, gained in flips]
        after = [a for s, a in zip(r.steps, r.accuracy) if s > args.drop_after_step]
        model = "- | -"  # no model for fewer than two validations after the step, or a curve stuck at 0 or 1
        if len(after) >= 2 and 0.0 < statistics.fmean(after) < 1.0:
            try:
                dips = no_trend_dips(len(r.outcomes[0]), statistics.fmean(changing), statistics.fmean(after), len(after))
                model = f"{sum(d > args.drop_pts for d in dips) / len(dips):.2f} | {statistics.fmean(dips):.1f}"
            except ValueError:  # more churn than a two-state chain around that accuracy can make
                pass
        lines.append(f"| {r.preset} | {r.seed} | {len(r.outcomes[0])} | {spread(changing, '{:.1f}')} | "
                     f"{statistics.fmean(f[1] for f in flips):.1f} / {statistics.fmean(f[2] for f in flips):.1f} | "
                     f"{r.max_drop_after(args.drop_after_step):.1f} | {model} |")
    return lines


def report(folder: Path, args: argparse.Namespace) -> str:
    if not folder.is_dir():
        raise SystemExit(f"learning: no sweep directory {folder} (scripts/sweep.py --out makes one)")
    groups = read_sweep(folder)
    if not groups:
        raise SystemExit(f"learning: no cell with a metrics.jsonl under {folder}")
    lines = [f"### {args.title}", "", *summary_table(groups, args), "", *curve_tables(groups, args.every_min,
                                                                                      args.budget_min)]
    churn = churn_table(groups, args)
    if churn:
        lines += ["", *churn]
    commands = [r.command for runs in groups.values() for r in runs if r.command]
    if commands:
        lines += ["", "Commands (one per cell):", "", "```", *commands, "```"]
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sweep", type=Path, help="a sweep's directory (scripts/sweep.py --out)")
    parser.add_argument("--title", default="Held-out accuracy")
    parser.add_argument("--budget-min", type=float, default=30.0, help="the wall-time budget compared at")
    parser.add_argument("--target", type=float, default=0.4, help="held-out accuracy whose time to reach is reported")
    parser.add_argument("--drop-after-step", type=int, default=15)
    parser.add_argument("--drop-pts", type=float, default=5.0,
                        help="the fall below the running best the no-trend model is asked about")
    parser.add_argument("--churn-from-step", type=int, default=25,
                        help="count prompts changing outcome between validations from this step (validation.jsonl)")
    parser.add_argument("--every-min", type=float, default=5.0)
    parser.add_argument("--plot", type=Path, help="write the PNG here (e.g. docs/img/learning_main.png)")
    parser.add_argument("--markdown", type=Path, help="also write the markdown here")
    return parser.parse_args(argv)


def run(args: argparse.Namespace) -> int:
    text = report(args.sweep, args)
    print(text, end="")
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        tmp = args.markdown.with_name(f".{args.markdown.name}.tmp")
        tmp.write_text(text)
        os.replace(tmp, args.markdown)
    if args.plot:
        print(f"plot: {plot(read_sweep(args.sweep), args.plot, args.title, args.budget_min)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        return run(args)
    except SystemExit as stop:  # a bad sweep or cell: its one line, exit 2
        if not isinstance(stop.code, str):
            raise
        print(stop.code, file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
