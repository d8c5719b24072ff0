"""scripts/slurm/ray.sub run for real on this machine, with fake `srun` / `scontrol` (tests/deploy/
fake_slurm) that start each "node" as a local process: a 2-node Ray cluster forms, `rl grpo` runs on
it, and everything is torn down, also when a node never joins or the command fails.

As sbatch does, the script runs as a copy in a spool directory, from the submission directory.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from rl_apps import recipe_path

ROOT = Path(__file__).resolve().parents[2]
RAY_SUB = ROOT / "scripts" / "slurm" / "ray.sub"
FAKE_SLURM = Path(__file__).resolve().parent / "fake_slurm"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def live_processes_mentioning(text: str) -> list[str]:
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            command = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in command:
            found.append(command[:200])
    return found


@pytest.fixture
def job(tmp_path):
    """``submit(command, **env) -> CompletedProcess``: ray.sub as a 2-node job submitted from
    ``tmp_path / "submit"``; afterwards no process of the job may be left."""
    submit_dir = tmp_path / "submit"
    spool = tmp_path / "spool"
    submit_dir.mkdir()
    spool.mkdir()
    shutil.copy(RAY_SUB, spool / "slurm_script")  # sbatch runs a copy: the script cannot find the repository
    # Short: Ray's socket paths must stay under 107 characters.
    temp_root = tempfile.mkdtemp(prefix="rlsub-", dir="/tmp")

    def submit(command: list[str], timeout_s: float = 600, background: bool = False, **extra_env: str):
        env = {
            **os.environ,
            "PATH": f"{FAKE_SLURM}:{Path(sys.executable).parent}:{os.environ['PATH']}",
            "SLURM_JOB_ID": "4242",
            "SLURM_JOB_NODELIST": "node1,node2",
            "SLURM_CPUS_ON_NODE": "2",
            "SLURM_SUBMIT_DIR": str(submit_dir),
            "RL_RAY_PORT": str(free_port()),
            "RL_RAY_CLIENT_PORT": str(free_port()),
            "RL_RAY_TEMP_ROOT": temp_root,
            "RL_RAY_START_ARGS": "--object-store-memory=150000000",
            "RL_CACHE_DIR": str(tmp_path / "cache"),
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            **extra_env,
        }
        argv = ["bash", str(spool / "slurm_script"), *command]
        if background:
            return subprocess.Popen(argv, cwd=submit_dir, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True)
        return subprocess.run(argv, cwd=submit_dir, env=env, capture_output=True, text=True, timeout=timeout_s)

    submit.dir = submit_dir
    yield submit
    left = live_processes_mentioning(temp_root)
    shutil.rmtree(temp_root, ignore_errors=True)
    assert not left, f"ray.sub left processes running: {left}"


def test_ray_sub_is_shellcheck_clean():
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck is not installed (Debian: apt-get install shellcheck)")
    result = subprocess.run(["shellcheck", str(RAY_SUB)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


@pytest.mark.slow
def test_two_node_job_runs_grpo_from_the_submission_directory(job):
    # A config given relative to the submission directory, outputs written there.
    (job.dir / "my_run.yaml").write_text(f"defaults: {recipe_path('grpo_smoke_tiny.yaml')}\n")
    result = job(["rl", "grpo", "--config", "my_run.yaml", "output_dir=out", "grpo.max_steps=1", "grpo.val_every=0",
                  "logger.progress_bar=false", "logger.tensorboard=false", "logger.plot=false",
                  "policy.use_ray=true", "policy.num_workers=2", "generation.num_replicas=1",
                  "cluster.address=auto", "cluster.placement_strategy=SPREAD"])
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "all 2 node(s) joined" in output
    assert "2 node(s) (node1 node2), 2 CPUs and 0 GPUs each" in output
    assert (job.dir / "out" / "metrics.jsonl").exists()
    logs = job.dir / "ray-logs" / "4242"
    assert "Ray runtime started" in (logs / "ray-head-node1.log").read_text()
    assert "Ray runtime started" in (logs / "ray-worker-node2.log").read_text()
    assert "the command exited with code 0" in output


def test_a_node_that_never_joins_times_out_with_a_message(job):
    result = job(["rl", "grpo", "cluster.address=auto"], RL_RAY_WAIT_S="15", FAKE_SLURM_UNREACHABLE_NODES="node2")
    assert result.returncode == 1
    assert "only 1 of 2 node(s) joined the Ray cluster" in result.stderr
    assert "stopping Ray on 2 node(s)" in result.stderr


def test_a_failing_command_ends_the_job_with_its_exit_code(job):
    # One node is enough here; GPUs as `--gpus-per-node=a100:2` spells them (Ray takes GPUs it is told of).
    result = job(["rl", "grpo", "grpo.max_stepz=1"], SLURM_JOB_NODELIST="node1", SLURM_GPUS_PER_NODE="a100:2")
    assert result.returncode == 2, result.stdout + result.stderr
    assert "1 node(s) (node1), 2 CPUs and 2 GPUs each" in result.stderr
    assert "Did you mean 'max_steps'" in result.stderr
    assert "the command exited with code 2" in result.stderr


def test_scancel_stops_the_command_and_every_node(job):
    job_process = job(["bash", "-c", "touch started && exec sleep 6007"], background=True, SLURM_JOB_NODELIST="node1")
    try:
        deadline = time.monotonic() + 300
        while not (job.dir / "started").exists():  # the command runs, in the submission directory
            assert job_process.poll() is None and time.monotonic() < deadline, job_process.stderr.read()
            time.sleep(0.1)
        job_process.send_signal(signal.SIGTERM)  # what scancel sends to the batch script
        code = job_process.wait(timeout=60)
    finally:
        if job_process.poll() is None:
            job_process.kill()
    output = job_process.stderr.read()
    assert code == 143, output
    assert "stopping the command" in output and "stopping Ray on 1 node(s)" in output
    assert not live_processes_mentioning("sleep 6007")  # an odd duration: no other process on the machine matches
