"""The TensorBoard, W&B and MLflow sinks of MetricsLogger, each with the real package (W&B offline,
MLflow's default store in the run directory), read back through that package's own format."""

from __future__ import annotations

import importlib.util
import json
import struct
import time
from pathlib import Path

import pytest

from rl_core.logging import LoggerConfig, MetricsLogger, MlflowConfig, WandbConfig, backends

HPARAMS = {"seed": 3, "sft": {"lr": 1e-4, "max_steps": 4}, "model": "tiny", "tags": ["a", "b"], "dir": None}
ODD_HPARAMS = {**HPARAMS, "output_dir": Path("/runs/x")}  # not plain JSON: logged as its text
QUIET = dict(jsonl=True, tensorboard=False, stdout=False, plot=False)
needs_wandb = pytest.mark.skipif(importlib.util.find_spec("wandb") is None, reason="pip install 'rl-core[test]'")
needs_mlflow = pytest.mark.skipif(any(importlib.util.find_spec(p) is None for p in ("mlflow", "sqlalchemy", "alembic")),
                                  reason="pip install 'rl-core[test]'")


def log_four_steps(metrics: MetricsLogger, first: int = 1, scale: float = 1.0) -> None:
    for step in range(first, 5):
        metrics.log({"loss": scale / step, "reward_mean": step / 4}, step)
        if step % 2 == 0:
            metrics.log({"accuracy": step / 10}, step, prefix="val")


def tensorboard_events(run_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"tensors": 0})
    events.Reload()
    return events


def test_tensorboard_holds_the_scalars_and_the_config(tmp_path):
    from tensorboard.plugins.hparams import plugin_data_pb2

    with MetricsLogger(LoggerConfig(**{**QUIET, "tensorboard": True}), tmp_path, hparams=ODD_HPARAMS) as metrics:
        log_four_steps(metrics)
    events = tensorboard_events(tmp_path)
    assert [(e.step, e.value) for e in events.Scalars("train/reward_mean")] == [(1, 0.25), (2, 0.5), (3, 0.75), (4, 1.0)]
    assert [e.value for e in events.Scalars("val/accuracy")] == pytest.approx([0.2, 0.4])
    text = events.Tensors("config/text_summary")[0].tensor_proto.string_val[0].decode()
    assert "    sft:\n      lr: 0.0001\n      max_steps: 4" in text and "    model: tiny" in text
    content = events.PluginTagToContent("hparams")
    start = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"]).session_start_info
    assert start.hparams["sft.lr"].number_value == pytest.approx(1e-4)
    assert start.hparams["sft.max_steps"].number_value == 4
    assert start.hparams["model"].string_value == "tiny"
    assert start.hparams["tags"].string_value == "['a', 'b']"
    assert start.hparams["output_dir"].string_value == "/runs/x"
    experiment = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/experiment"]).experiment
    assert "train/loss" in [m.name.tag for m in experiment.metric_infos]


def test_tensorboard_hides_the_steps_a_resumed_run_logs_again(tmp_path):
    cfg = LoggerConfig(**{**QUIET, "tensorboard": True})
    with MetricsLogger(cfg, tmp_path) as metrics:
        log_four_steps(metrics)  # killed after step 4; the checkpoint is of step 2
    with MetricsLogger(cfg, tmp_path, resume_from_step=2) as metrics:
        log_four_steps(metrics, first=3, scale=10.0)
    events = tensorboard_events(tmp_path)
    assert [(e.step, e.value) for e in events.Scalars("train/loss")] == [(1, 1.0), (2, 0.5), (3, pytest.approx(10 / 3)),
                                                                           (4, 2.5)]


def read_wandb_records(path):
    """The protobuf records of an offline ``run-*.wandb`` file (W&B's LevelDB-style log: a 7-byte file
    header, then 32 KiB blocks of records, each with a 7-byte header: checksum, length, type)."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    block, header = 32 * 1024, 7
    offset, chunks, records = 7, b"", []
    while offset + header <= len(data):
        left_in_block = block - offset % block
        if left_in_block < header:
            offset += left_in_block  # block trailer padding
            continue
        _, length, kind = struct.unpack("<IHB", data[offset:offset + header])
        if offset + header + length > len(data):
            break  # still being written
        chunks += data[offset + header:offset + header + length]
        offset += header + length
        if kind in (1, 4):  # a full record, or the last piece of one
            records.append(wandb_internal_pb2.Record.FromString(chunks))
            chunks = b""
    return records


@needs_wandb
def test_wandb_offline_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")  # the config leaves the mode to W&B
    monkeypatch.setenv("WANDB_CONSOLE", "off")
    cfg = LoggerConfig(**QUIET, wandb=WandbConfig(project="rl-test", name="offline"))
    assert cfg.wandb.mode is None
    with MetricsLogger(cfg, tmp_path, hparams=HPARAMS) as metrics:
        log_four_steps(metrics)
    [run_file] = tmp_path.glob("wandb/offline-run-*/run-*.wandb")
    deadline = time.monotonic() + 30
    while True:  # W&B's service process finishes writing the file after run.finish() returns
        records = read_wandb_records(run_file)
        if any(r.WhichOneof("record_type") == "exit" for r in records) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    history = {}
    for record in records:
        if record.WhichOneof("record_type") == "history":
            items = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            history.setdefault(record.history.step.num, {}).update(items)
    assert [history.get(s, {}).get("train/loss") for s in (1, 2, 3, 4)] == pytest.approx([1.0, 0.5, 1 / 3, 0.25]), history
    assert history[4]["val/accuracy"] == pytest.approx(0.4)
    config = {}
    for record in records:
        if record.WhichOneof("record_type") == "run":
            config.update({item.key: json.loads(item.value_json) for item in record.run.config.update})
    assert config["sft"] == {"lr": 1e-4, "max_steps": 4} and config["seed"] == 3


@needs_mlflow
def test_mlflow_default_store_is_sqlite_in_the_run_directory(tmp_path, monkeypatch):
    import mlflow

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    workdir = tmp_path / "cwd"
    workdir.mkdir()
    monkeypatch.chdir(workdir)  # nothing may land in the working directory (MLflow's own default)
    run_dir = tmp_path / "run"
    with MetricsLogger(LoggerConfig(**QUIET, mlflow=MlflowConfig(run_name="r")), run_dir, hparams=HPARAMS) as metrics:
        log_four_steps(metrics)
        run_id = metrics._sinks["mlflow"].run.info.run_id
    client = mlflow.MlflowClient(f"sqlite:///{run_dir / 'mlflow.db'}")
    assert [(m.step, m.value) for m in client.get_metric_history(run_id, "train/loss")] == \
        [(1, 1.0), (2, 0.5), (3, pytest.approx(1 / 3)), (4, 0.25)]
    run = client.get_run(run_id)
    assert run.data.params["sft.lr"] == "0.0001" and run.data.params["model"] == "tiny"
    assert run.info.run_name == "r"
    assert list(workdir.iterdir()) == []


@pytest.mark.parametrize(("section", "missing", "message"), [
    ({"wandb": WandbConfig(project="p")}, "wandb", r'Please install "rl-core\[wandb\]".*logger.wandb.enabled=false'),
    ({"mlflow": MlflowConfig(tracking_uri="file:///nowhere")}, "mlflow", r'Please install "rl-core\[mlflow\]"'),
    ({"mlflow": MlflowConfig()}, "sqlalchemy", r"\(or `pip install sqlalchemy`\) to log to MLflow's default store "
                                               r".*or set logger.mlflow.tracking_uri"),
])
def test_an_enabled_sink_without_its_package_fails_at_construction(tmp_path, monkeypatch, section, missing, message):
    if missing == "sqlalchemy" and importlib.util.find_spec("mlflow") is None:
        pytest.skip("the sqlite check comes after mlflow's own")
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(backends.importlib.util, "find_spec", lambda name: None if name == missing else find_spec(name))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)  # a store MLflow would open in the working directory lands here
    with pytest.raises(ImportError, match=message):
        MetricsLogger(LoggerConfig(**QUIET, **section), tmp_path)
