"""MetricsLogger on real sinks: JSONL, TensorBoard event files, the terminal, and the PNG plot."""

from __future__ import annotations

import importlib.util
import math

import numpy as np
import pytest
import torch

from rl_core.logging import LoggerConfig, MetricsLogger, plot_metrics, read_jsonl_metrics
from rl_core.logging.config import MlflowConfig, WandbConfig


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
    import json

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


def test_tensorboard_event_file_holds_the_scalars(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    log_a_short_run(tmp_path, LoggerConfig(stdout=False, plot=False)).close()
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    rewards = events.Scalars("train/reward_mean")
    assert [(e.step, e.value) for e in rewards] == [(1, 0.25), (2, 0.5), (3, 0.75), (4, 1.0)]
    assert [e.value for e in events.Scalars("val/accuracy")] == pytest.approx([0.2, 0.4])


def test_progress_bar_shows_the_key_numbers(tmp_path, capsys):
    log_a_short_run(tmp_path, LoggerConfig(tensorboard=False, plot=False)).close()
    out = capsys.readouterr().out
    assert "4/4" in out
    assert "reward_mean=1" in out and "loss=0.25" in out
    assert "step 4 [val] accuracy=0.4" in out


def test_plain_lines_without_a_bar_and_silence_without_stdout(tmp_path, capsys):
    log_a_short_run(tmp_path / "a", LoggerConfig(tensorboard=False, plot=False, progress_bar=False)).close()
    out = capsys.readouterr().out
    assert "step 2 [train] reward_mean=0.5 accuracy=0.5 loss=0.5" in out
    log_a_short_run(tmp_path / "b", LoggerConfig(tensorboard=False, plot=False, stdout=False)).close()
    assert capsys.readouterr().out == ""


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


@pytest.mark.skipif(importlib.util.find_spec("wandb") is not None, reason="wandb is installed")
def test_enabled_wandb_without_the_package_fails_at_construction(tmp_path):
    with pytest.raises(ImportError, match=r'Please install "rl-core\[wandb\]".*logger.wandb.enabled=false'):
        MetricsLogger(LoggerConfig(wandb=WandbConfig(project="p")), tmp_path)


@pytest.mark.skipif(importlib.util.find_spec("mlflow") is not None, reason="mlflow is installed")
def test_enabled_mlflow_without_the_package_fails_at_construction(tmp_path):
    with pytest.raises(ImportError, match=r'Please install "rl-core\[mlflow\]"'):
        MetricsLogger(LoggerConfig(mlflow=MlflowConfig(tracking_uri="file:///nowhere")), tmp_path)


def test_disabled_sections_and_bad_configs(tmp_path):
    cfg = LoggerConfig.model_validate({"wandb": {"enabled": False}, "mlflow": {"enabled": False}})
    MetricsLogger(cfg.model_copy(update={"stdout": False}), tmp_path).close()
    with pytest.raises(ValueError, match="needs logger.jsonl=true"):
        MetricsLogger(LoggerConfig(jsonl=False, plot=True), tmp_path)
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="tensorbord"):
        LoggerConfig.model_validate({"tensorbord": True})
