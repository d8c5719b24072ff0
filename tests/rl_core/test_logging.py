"""MetricsLogger: the JSONL record, resuming it, the terminal display, and the PNG plot (the TensorBoard,
W&B and MLflow sinks: test_logging_sinks.py)."""

from __future__ import annotations

import io
import json
import math
import sys

import numpy as np
import pytest
import torch

from rl_core.logging import LoggerConfig, MetricsLogger, plot_metrics, read_jsonl_metrics


def log_a_short_run(run_dir, cfg: LoggerConfig) -> MetricsLogger:
    metrics = MetricsLogger(cfg, run_dir, total_steps=4)
    for step in range(1, 5):
        metrics.log({"reward_mean": step / 4, "loss": torch.tensor(1.0 / step), "accuracy": np.float32(0.5)}, step)
        if step % 2 == 0:
            metrics.log({"accuracy": step / 10}, step, prefix="val")
    metrics.log({"time/generate": 1.25}, 4, prefix="")
    return metrics


def test_jsonl_records_every_call_with_prefixed_names(tmp_path):
    metrics = log_a_short_run(tmp_path, LoggerConfig(tensorboard=False, stdout=False, plot=False))
    metrics.close()
    records = read_jsonl_metrics(tmp_path / "metrics.jsonl")
    assert len(records) == 4 + 2 + 1
    assert records[0]["step"] == 1 and records[0]["train/reward_mean"] == 0.25
    train = [r for r in records if "train/loss" in r]
    assert [r["train/loss"] for r in train] == [1.0, 0.5, pytest.approx(1 / 3), 0.25]
    assert records[0]["train/accuracy"] == 0.5
    assert [r["val/accuracy"] for r in records if "val/accuracy" in r] == [0.2, 0.4]
    assert records[-1]["time/generate"] == 1.25 and records[-1]["step"] == 4
    assert all(isinstance(r["timestamp"], float) for r in records)


def test_example_generations_go_to_samples_jsonl(tmp_path):
    metrics = MetricsLogger(LoggerConfig(tensorboard=False, stdout=False, plot=False), tmp_path)
    metrics.log_samples([{"prompt": "What is 2 + 2?", "response": "\\boxed{4}", "reward": 1.0}], step=3)
    metrics.log_samples([], step=4)  # nothing to write
    metrics.log_samples([{"prompt": "x", "response": "yé", "reward": 0.0}], step=5)
    metrics.close()
    rows = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text(encoding="utf-8").splitlines()]
    assert rows == [{"step": 3, "prompt": "What is 2 + 2?", "response": "\\boxed{4}", "reward": 1.0},
                    {"step": 5, "prompt": "x", "response": "yé", "reward": 0.0}]
    with pytest.raises(RuntimeError, match="after close"):
        metrics.log_samples([{"a": 1}], step=6)


def test_evaluation_outcomes_go_to_validation_jsonl(tmp_path):
    metrics = MetricsLogger(LoggerConfig(tensorboard=False, stdout=False, plot=False), tmp_path)
    metrics.log_validation({"split": "validation", "correct": "10", "answers": ["4", None]}, step=0)
    metrics.log_validation({"split": "test", "correct": "11", "answers": ["4", "5"]}, step=5.0)
    metrics.close()
    rows = [json.loads(line) for line in (tmp_path / "validation.jsonl").read_text(encoding="utf-8").splitlines()]
    assert rows == [{"step": 0, "split": "validation", "correct": "10", "answers": ["4", None]},
                    {"step": 5, "split": "test", "correct": "11", "answers": ["4", "5"]}]
    assert not (tmp_path / "samples.jsonl").exists()
    with pytest.raises(RuntimeError, match=r"log_validation\(\) after close"):
        metrics.log_validation({"split": "test"}, step=6)


def test_jsonl_appends_on_resume_and_skips_a_torn_last_line(tmp_path):
    cfg = LoggerConfig(tensorboard=False, stdout=False, plot=False)
    with MetricsLogger(cfg, tmp_path) as metrics:
        metrics.log({"loss": 2.0}, 1)
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 2, "train/lo')  # a run killed mid-write
    records = read_jsonl_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in records] == [1]
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\nnot json\n{"step": 2}\n')
    with pytest.raises(ValueError, match="metrics.jsonl:2"):
        read_jsonl_metrics(tmp_path / "metrics.jsonl")


def test_non_numbers_are_skipped_not_fatal(tmp_path, caplog):
    with MetricsLogger(LoggerConfig(tensorboard=False, stdout=False, plot=False), tmp_path) as metrics:
        logged = metrics.log({"loss": 0.5, "note": "text", "vector": torch.ones(3), "nan": float("nan")}, 1)
    assert set(logged) == {"train/loss", "train/nan"} and math.isnan(logged["train/nan"])
    assert "'train/note' is not a number" in caplog.text
    assert math.isnan(read_jsonl_metrics(tmp_path / "metrics.jsonl")[0]["train/nan"])


def test_close_draws_the_plot(tmp_path):
    png = log_a_short_run(tmp_path, LoggerConfig(tensorboard=False, stdout=False)).close()
    assert png == tmp_path / "metrics.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000


def test_plot_metrics_directly_and_its_error(tmp_path):
    log_a_short_run(tmp_path, LoggerConfig(tensorboard=False, stdout=False, plot=False)).close()
    out = plot_metrics(tmp_path / "metrics.jsonl", tmp_path / "plots" / "x.png", ["train/loss", "missing/key"])
    assert out.exists()
    with pytest.raises(ValueError, match="holds: .*train/loss"):
        plot_metrics(tmp_path / "metrics.jsonl", tmp_path / "y.png", ["missing/key"])


def test_a_failing_sink_is_switched_off_not_fatal(tmp_path, caplog):
    metrics = MetricsLogger(LoggerConfig(stdout=False, plot=False), tmp_path)
    metrics._sinks["tensorboard"].writer.close()
    metrics._sinks["tensorboard"].writer = None  # the sink now fails on every call
    metrics.log({"loss": 1.0}, 1)
    metrics.log({"loss": 0.5}, 2)
    metrics.close()
    assert "logging to tensorboard failed" in caplog.text
    assert [r["train/loss"] for r in read_jsonl_metrics(tmp_path / "metrics.jsonl")] == [1.0, 0.5]


def test_disabled_sections_and_bad_configs(tmp_path):
    cfg = LoggerConfig.model_validate({"wandb": {"enabled": False}, "mlflow": {"enabled": False}})
    MetricsLogger(cfg.model_copy(update={"stdout": False}), tmp_path).close()
    with pytest.raises(ValueError, match="needs logger.jsonl=true"):
        MetricsLogger(LoggerConfig(jsonl=False, plot=True), tmp_path)
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="tensorbord"):
        LoggerConfig.model_validate({"tensorbord": True})


def log_like_the_supervised_loops(metrics: MetricsLogger, steps: range, val_every: int = 2) -> None:
    """One call per step with names already prefixed and the step among them, as sft/dpo/rm/distill do."""
    for step in steps:
        record = {"train/loss": 1.0 / (step + 1), "time/train": 0.01, "step": float(step), "epoch": 0.0}
        if step % val_every == 0:
            record.update({"val/nll": 2.0 / (step + 1), "val/perplexity": 3.0})
        metrics.log(record, step, prefix="")


def test_step_is_an_integer_in_every_jsonl_line(tmp_path):
    with MetricsLogger(LoggerConfig(tensorboard=False, stdout=False, plot=False), tmp_path) as metrics:
        log_like_the_supervised_loops(metrics, range(1, 4))
        metrics.log({"loss": 0.1}, 4.0)  # a whole float is that step
        metrics.log_samples([{"prompt": "p"}], 4.0)
        with pytest.raises(TypeError, match="whole number, got 4.5"):
            metrics.log({"loss": 0.1}, 4.5)
    for name in ("metrics.jsonl", "samples.jsonl"):
        lines = (tmp_path / name).read_text().splitlines()
        assert all(type(json.loads(line)["step"]) is int for line in lines)
        assert all('"step": 4.0' not in line and '"step": 1.0' not in line for line in lines)
    records = read_jsonl_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    assert records[0]["epoch"] == 0.0 and "train/step" not in records[0]


def test_resume_cuts_every_per_step_file_back_to_the_checkpoint(tmp_path):
    cfg = LoggerConfig(tensorboard=False, stdout=False, plot=False)
    with MetricsLogger(cfg, tmp_path) as metrics:  # the run that was killed after logging step 7
        log_like_the_supervised_loops(metrics, range(0, 8))
        for step in range(0, 8):
            metrics.log_samples([{"prompt": f"p{step}"}], step)
            metrics.log_validation({"split": "validation", "correct": "1"}, step)
    before = {name: (tmp_path / name).read_bytes().splitlines(keepends=True)
              for name in ("metrics.jsonl", "samples.jsonl", "validation.jsonl")}
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 8, "train/lo')  # and torn mid-write
    with MetricsLogger(cfg, tmp_path, resume_from_step=5) as metrics:  # resumed from the checkpoint of step 5
        assert (tmp_path / "metrics.jsonl").read_bytes() == b"".join(before["metrics.jsonl"][:6])
        assert (tmp_path / "samples.jsonl").read_bytes() == b"".join(before["samples.jsonl"][:6])
        assert (tmp_path / "validation.jsonl").read_bytes() == b"".join(before["validation.jsonl"][:6])
        log_like_the_supervised_loops(metrics, range(6, 8))
    resumed = read_jsonl_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in resumed] == list(range(8))
    with MetricsLogger(cfg, tmp_path / "uninterrupted") as metrics:
        log_like_the_supervised_loops(metrics, range(0, 8))
    uninterrupted = read_jsonl_metrics(tmp_path / "uninterrupted" / "metrics.jsonl")
    assert [{k: v for k, v in r.items() if k != "timestamp"} for r in resumed] == \
        [{k: v for k, v in r.items() if k != "timestamp"} for r in uninterrupted]
    # A resume at a step past everything logged changes nothing, not even the file's identity.
    inode = (tmp_path / "metrics.jsonl").stat().st_ino
    MetricsLogger(cfg, tmp_path, resume_from_step=100).close()
    assert (tmp_path / "metrics.jsonl").stat().st_ino == inode
    assert not list(tmp_path.glob(".*.tmp"))


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def fake_terminal(monkeypatch) -> FakeTerminal:
    """stdout as a terminal, outside CI (set in the test itself: pytest's capture resets sys.stdout
    between fixture setup and the test)."""
    monkeypatch.delenv("CI", raising=False)
    stream = FakeTerminal()
    monkeypatch.setattr(sys, "stdout", stream)
    return stream


def test_live_display_on_a_terminal_shows_steps_metrics_and_validation(tmp_path, monkeypatch):
    terminal = fake_terminal(monkeypatch)
    metrics = MetricsLogger(LoggerConfig(tensorboard=False, plot=False), tmp_path, total_steps=6)
    log_like_the_supervised_loops(metrics, range(1, 5))
    metrics.log({"reward_mean": 0.5}, 5)  # a GRPO-style step: one call per prefix
    metrics.log({"accuracy": 0.75}, 5, prefix="val")
    metrics.close()
    text = terminal.getvalue()
    frames = text.split("\r")
    assert len(frames) > 4  # redrawn in place
    assert any("4/6" in frame and "loss=0.2]" in frame for frame in frames)
    assert "5/6" in frames[-1] and "reward_mean=0.5" in frames[-1] and "val/accuracy=0.75" in frames[-1]
    assert "<" in frames[-1]  # elapsed<remaining: the ETA
    assert "step 2/6 [val] nll=0.6667 perplexity=3" in text and "step 4/6 [val] nll=0.4 perplexity=3" in text
    assert "step 5/6 [val] accuracy=0.75" in text
    assert "[]" not in text and "time/" not in text


def test_plain_lines_when_not_a_terminal_or_in_ci(tmp_path, monkeypatch, capsys):
    def run(run_dir) -> None:
        with MetricsLogger(LoggerConfig(tensorboard=False, plot=False), run_dir, total_steps=4) as metrics:
            log_like_the_supervised_loops(metrics, range(1, 3))

    terminal = fake_terminal(monkeypatch)
    monkeypatch.setenv("CI", "true")
    run(tmp_path / "ci")
    expected = ("step 1/4 [train] loss=0.5\nstep 2/4 [train] loss=0.3333\n"
                "step 2/4 [val] nll=0.6667 perplexity=3\n")
    assert terminal.getvalue() == expected  # no bar: no carriage returns, no ETA
    monkeypatch.delenv("CI")
    monkeypatch.undo()
    run(tmp_path / "pipe")  # pytest's captured stdout is no terminal
    assert capsys.readouterr().out == expected
    with MetricsLogger(LoggerConfig(tensorboard=False, plot=False, stdout=False), tmp_path / "quiet") as metrics:
        log_like_the_supervised_loops(metrics, range(1, 3))
    assert capsys.readouterr().out == ""


def test_plot_ticks_are_whole_steps(tmp_path, monkeypatch):
    import matplotlib.pyplot as plt

    figures = []
    close = plt.close
    monkeypatch.setattr(plt, "close", lambda fig: (figures.append(fig), close(fig)))
    with MetricsLogger(LoggerConfig(tensorboard=False, stdout=False, plot=False), tmp_path) as metrics:
        log_like_the_supervised_loops(metrics, range(1, 4))
    plot_metrics(tmp_path / "metrics.jsonl", tmp_path / "m.png", ["train/loss"])
    ticks = figures[0].axes[0].get_xticks()
    assert len(ticks) >= 2 and all(float(t).is_integer() for t in ticks)
