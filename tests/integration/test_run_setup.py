"""The one run setup of every training command: the resolved config.yaml in the run directory, and Ray
started once from `cluster:` whenever any part of the run uses it (never with defaults elsewhere)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from rl_apps import run_setup
from rl_apps.commands import COMMANDS
from rl_apps.run_config import RunConfig
from rl_core.config import dump_config, load_config

TRAINING = [name for name in COMMANDS if name != "eval"]
QUIET = ["logger.progress_bar=false", "logger.tensorboard=false", "logger.plot=false"]


def default_config(name: str, *overrides: str):
    import importlib

    module = importlib.import_module(COMMANDS[name].module)
    return load_config(module.CONFIG_CLASS, module.DEFAULT_RECIPE, [*QUIET, *overrides])


@pytest.mark.parametrize("name", TRAINING)
def test_every_command_writes_its_resolved_config(name, tmp_path, monkeypatch):
    monkeypatch.setattr(run_setup, "init_ray", lambda cluster: None)
    cfg = default_config(name, f"output_dir={tmp_path / 'run'}")
    assert isinstance(cfg, RunConfig)
    with run_setup.open_run(cfg) as run:
        written = (run.out / "config.yaml").read_text()
    assert written == dump_config(cfg)
    assert load_config(type(cfg), tmp_path / "run" / "config.yaml") == cfg
    assert not list((tmp_path / "run").glob(".*.tmp"))


@pytest.mark.parametrize(("name", "overrides", "uses_ray"), [
    ("distill", ["generation.num_replicas=1"], True),  # replicas with policy.use_ray=false
    ("distill", ["teacher.backend.use_ray=true"], True),
    ("xtoken-distill", ["teacher.backend.use_ray=true"], True),
    ("grpo", ["grpo.env_runner.kind=ray"], True),
    ("grpo", ["generation.num_replicas=2"], True),
    ("sft", ["policy.use_ray=true"], True),
    ("distill", [], False),
    ("sft", [], False),
])
def test_ray_starts_from_the_cluster_section_on_every_path(name, overrides, uses_ray, tmp_path, monkeypatch):
    started = []
    monkeypatch.setattr(run_setup, "init_ray", started.append)
    cfg = default_config(name, f"output_dir={tmp_path / 'run'}", "cluster.num_cpus=3", *overrides)
    assert cfg.uses_ray() is uses_ray
    with run_setup.open_run(cfg):
        pass
    assert started == ([cfg.cluster] if uses_ray else [])


def test_a_ray_worker_group_never_starts_ray_with_defaults():
    """Without the program starting Ray first, a Ray worker group is a clear error (it used to start a
    local Ray with defaults, ignoring the config's `cluster:` section)."""
    code = ("import ray\n"
            "from rl_core.cluster import WorkerGroup\n"
            "class Worker:\n"
            "    pass\n"
            "try:\n"
            "    WorkerGroup(Worker, 1, name='policy')\n"
            "except RuntimeError as e:\n"
            "    print(e)\n"
            "print('ray initialized:', ray.is_initialized())\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert "worker group 'policy' runs on Ray, but Ray is not started" in result.stdout, result.stderr
    assert "init_ray(cfg.cluster)" in result.stdout and "ray initialized: False" in result.stdout


def test_rl_eval_starts_ray_from_its_cluster_section_for_replicas(tiny_model_dir, monkeypatch):
    import rl_backends_gen
    import rl_core.cluster
    from rl_eval import EvalConfig, run_eval

    calls = []

    class Stop(Exception):
        pass

    def build(generation_cfg, model_dir):
        calls.append(("build", generation_cfg.num_replicas))
        raise Stop

    monkeypatch.setattr(rl_core.cluster, "init_ray", lambda cluster: calls.append(("init_ray", cluster.num_cpus)))
    monkeypatch.setattr(rl_backends_gen, "build_generation_backend", build)
    cfg = EvalConfig.model_validate({"model": tiny_model_dir, "generation": {"num_replicas": 2},
                                     "cluster": {"num_cpus": 3}, "progress": False})
    with pytest.raises(Stop):
        run_eval(cfg)
    assert calls == [("init_ray", 3), ("build", 2)]
