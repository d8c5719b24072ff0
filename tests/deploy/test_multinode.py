"""Multi-node behaviour on one machine: a Ray cluster of three raylets (head, trainer node, rollout
node), worker groups placed across nodes, GRPO with training on one node and generation on
another, a node lost mid-run, an exact resume on other nodes, and `--max-restarts`.

The tests share one cluster and one uninterrupted reference run; they run in file order and each
leaves the cluster with a live trainer and rollout node.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from rl_apps import recipe_path
from rl_core.logging import read_jsonl_metrics

NODE_CPUS = 3
STEPS = 3
# Wall-clock measurements differ between any two runs; everything else must match exactly.
NOT_COMPARED = ("train/time/", "train/throughput/", "train/memory/", "timestamp")
# The driver logs where each worker group went (rl_core.cluster.worker_group logs it at INFO).
DRIVER = ("import logging, sys; logging.basicConfig(level=logging.INFO, format='%(name)s: %(message)s'); "
          "from rl_apps.cli import main; sys.exit(main())")


class LocalCluster:
    """Head + trainer node + rollout node, each its own raylet, in a private Ray directory."""

    def __init__(self):
        from ray.cluster_utils import Cluster

        # Short: Ray's socket paths must stay under 107 characters.
        self.temp_dir = tempfile.mkdtemp(prefix="rlmn-", dir="/tmp")
        # Cluster() writes the head's address to Ray's default directory whatever temp_dir says; on a machine
        # where Ray never ran, that directory does not exist yet.
        from ray._private.utils import get_ray_address_file

        os.makedirs(os.path.dirname(get_ray_address_file(None)), exist_ok=True)
        self.cluster = Cluster(initialize_head=True, head_node_args=dict(
            num_cpus=1, include_dashboard=False, temp_dir=self.temp_dir, object_store_memory=150 * 2**20))
        self.trainer = self.add("trainer")
        self.rollout = self.add("rollout")

    @property
    def address(self) -> str:
        return self.cluster.address

    def add(self, resource: str):
        node = self.cluster.add_node(num_cpus=NODE_CPUS, resources={resource: NODE_CPUS},
                                     object_store_memory=150 * 2**20)
        self.cluster.wait_for_nodes()
        return node

    def replace_rollout(self) -> None:
        """Clean up what is left of the rollout node (after a test killed it) and start a new one."""
        self.cluster.remove_node(self.rollout, allow_graceful=False)
        self.rollout = self.add("rollout")

    def raylet_pid(self, node) -> int:
        return node.all_processes["raylet"][0].process.pid

    def shutdown(self) -> None:
        self.cluster.shutdown()
        shutil.rmtree(self.temp_dir, ignore_errors=True)


def grpo_argv(cluster: LocalCluster, out: Path, *extra: str, policy_on: str = "trainer",
              generation_on: str = "rollout") -> list[str]:
    """`rl grpo` on the smoke recipe with the policy and one generation replica on Ray, each pinned
    to a node by its custom resource, a checkpoint every step."""
    return [
        sys.executable, "-c", DRIVER, "grpo", "--config", recipe_path("grpo_smoke_tiny.yaml"),
        f"output_dir={out}", f"grpo.max_steps={STEPS}", "grpo.val_every=0",
        "checkpointing.every_n_steps=1", "checkpointing.keep_last=2",
        "logger.progress_bar=false", "logger.tensorboard=false", "logger.plot=false",
        "policy.use_ray=true", "generation.num_replicas=1", f"cluster.address={cluster.address}",
        f"cluster.group_resources={{policy: {{{policy_on}: 1}}, generation: {{{generation_on}: 1}}}}",
        *extra,
    ]


def descendants(pid: int) -> list[tuple[int, str]]:
    """``(pid, command line)`` of every process below ``pid`` (read from /proc)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # the process ended meanwhile
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], list(children.get(pid, []))
    while todo:
        child = todo.pop()
        todo += children.get(child, [])
        try:
            found.append((child, (Path("/proc") / str(child) / "cmdline").read_bytes().replace(b"\0", b" ").decode()))
        except OSError:
            continue
    return found


def driver_env(cache_dir: Path) -> dict[str, str]:
    return {**os.environ, "RL_CACHE_DIR": str(cache_dir), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
            "PYTHONUNBUFFERED": "1"}


def start(argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    """A driver in the background, its stdout and stderr to ``log``."""
    return subprocess.Popen(argv, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)


def wait_for(path: Path, process: subprocess.Popen, log: Path, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert process.poll() is None, f"the run ended (exit code {process.returncode}) before {path}:\n{log.read_text()}"
        assert time.monotonic() < deadline, f"no {path} after {timeout_s} s:\n{log.read_text()}"
        time.sleep(0.05)


def metrics_by_step(out: Path) -> dict[int, dict]:
    """Each step's metrics (records of the same step merged, the last run's winning), timings left out."""
    merged: dict[int, dict] = {}
    for record in read_jsonl_metrics(out / "metrics.jsonl"):
        merged.setdefault(record["step"], {}).update(record)
    return {step: {k: v for k, v in m.items() if not k.startswith(NOT_COMPARED)} for step, m in merged.items()}


def placement_lines(log_text: str, group: str) -> list[str]:
    """The "worker group 'NAME': rank 0 on node ..." lines of one group in a driver's log."""
    return [line for line in log_text.splitlines() if f"worker group '{group}': rank 0 on node" in line]



@pytest.fixture(scope="module")
def cluster():
    local = LocalCluster()
    yield local
    local.shutdown()


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("rl-cache")


@pytest.fixture(scope="module")
def reference(cluster, cache_dir, tmp_path_factory):
    """An uninterrupted run: (its metrics by step, its driver log)."""
    out = tmp_path_factory.mktemp("reference")
    result = subprocess.run(grpo_argv(cluster, out), env=driver_env(cache_dir), capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    return metrics_by_step(out), result.stdout + result.stderr


PLACEMENT_PROBE = """
import json, sys
from rl_core.cluster import ClusterConfig, WorkerError, WorkerGroup, init_ray

class Probe:
    def node(self):
        import ray
        return ray.get_runtime_context().get_node_id()

def nodes(**kwargs):
    with WorkerGroup(Probe, 2, **kwargs) as group:
        return group.run_all("node")

init_ray(ClusterConfig(address=sys.argv[1], placement_strategy="SPREAD",
                       group_resources={"policy": {"trainer": 1}}))
report = {
    "spread": nodes(name="spread"),                              # the config's strategy
    "pack": nodes(name="packed", placement_strategy="PACK"),     # the group's own
    "policy": nodes(name="policy"),                              # pinned by cluster.group_resources
}
try:
    nodes(name="nowhere", resources={"gpu_node": 1}, startup_timeout_s=3)
except WorkerError as e:
    report["unschedulable"] = str(e)
print("REPORT " + json.dumps(report))
"""


def test_worker_groups_are_placed_by_strategy_and_resources(cluster):
    result = subprocess.run([sys.executable, "-c", PLACEMENT_PROBE, cluster.address], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    # Ray may print worker log lines after the report: read the report's own line.
    report = json.loads(next(line for line in result.stdout.splitlines() if line.startswith("REPORT "))[7:])
    assert len(set(report["pack"])) == 1  # both ranks on one node
    assert len(set(report["spread"])) == 2  # one rank on each of two nodes
    assert report["policy"] == [cluster.trainer.node_id] * 2  # SPREAD, but only that node has 'trainer'
    assert "'gpu_node'" in report["unschedulable"] and "0 'gpu_node' free" in report["unschedulable"]


def test_grpo_trains_on_one_node_and_generates_on_another(cluster, reference):
    metrics, log = reference
    assert sorted(metrics) == list(range(1, STEPS + 1))
    assert all("train/loss" in metrics[step] for step in metrics)
    # Refit sent new weights to the generation node every step: the run learns (rewards change).
    assert len({metrics[step]["train/reward_mean"] for step in metrics}) > 1
    (policy,) = placement_lines(log, "policy")
    (generation,) = placement_lines(log, "generation")
    assert f"({cluster.trainer.node_id[:8]})" in policy
    assert f"({cluster.rollout.node_id[:8]})" in generation


@pytest.mark.slow
def test_max_restarts_resumes_after_a_worker_is_killed(cluster, reference, cache_dir, tmp_path):
    out = tmp_path / "restarted"
    log = tmp_path / "driver.log"
    argv = grpo_argv(cluster, out)
    argv.insert(argv.index("grpo") + 1, "--max-restarts=1")
    process = start(argv, driver_env(cache_dir), log)
    try:
        wait_for(out / "checkpoints" / "step_000001" / "trainer_state.json", process, log)
        workers = [pid for pid, cmd in descendants(cluster.raylet_pid(cluster.rollout)) if "RankRuntime" in cmd]
        assert workers, "no worker process on the rollout node"
        for pid in workers:
            os.kill(pid, signal.SIGKILL)
        assert process.wait(timeout=600) == 0, log.read_text()
    finally:
        if process.poll() is None:
            process.kill()
    text = log.read_text()
    assert "rl grpo: the run failed (exit code 1); restart 1 of 1 from its last checkpoint" in text
    assert "died" in text  # the first run's WorkerError
    metrics = metrics_by_step(out)
    expected, _ = reference
    assert metrics[STEPS] == expected[STEPS]
    assert metrics[STEPS - 1] == expected[STEPS - 1]


@pytest.mark.slow
def test_lost_node_fails_fast_and_the_run_resumes_exactly_on_other_nodes(cluster, reference, cache_dir, tmp_path):
    out = tmp_path / "lost"
    log = tmp_path / "driver.log"
    env = driver_env(cache_dir)
    process = start(grpo_argv(cluster, out), env, log)
    lost_node = cluster.rollout.node_id
    try:
        wait_for(out / "checkpoints" / "step_000001" / "trainer_state.json", process, log)
        killed_at = time.monotonic()
        os.kill(cluster.raylet_pid(cluster.rollout), signal.SIGKILL)
        code = process.wait(timeout=120)
        elapsed = time.monotonic() - killed_at
    finally:
        if process.poll() is None:
            process.kill()
    text = log.read_text()
    assert code != 0
    assert elapsed < 30, f"the driver took {elapsed:.0f} s to fail"
    assert f"node id {lost_node}" in text and "WorkerError" in text, text[-3000:]
    assert STEPS not in metrics_by_step(out)

    cluster.replace_rollout()
    # Roles swapped: the policy now loads, on another node, the checkpoint the trainer node wrote.
    resumed = subprocess.run(grpo_argv(cluster, out, "checkpointing.resume=true", policy_on="rollout",
                                       generation_on="trainer"),
                             env=env, capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    (policy,) = placement_lines(resumed.stdout + resumed.stderr, "policy")
    assert f"({cluster.rollout.node_id[:8]})" in policy
    expected, _ = reference
    metrics = metrics_by_step(out)
    assert metrics[STEPS] == expected[STEPS]
    assert metrics[STEPS - 1] == expected[STEPS - 1]
