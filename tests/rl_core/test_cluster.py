"""Worker groups on a real local Ray (one Ray for the session): collectives, errors, deaths, shutdown."""

from __future__ import annotations

import os
import time

import pytest
import torch
import torch.distributed as dist

from rl_core.cluster import ClusterConfig, WorkerError, WorkerGroup, init_ray, malloc

pytestmark = pytest.mark.timeout(120)


class SumWorker:
    """Holds a rank-dependent tensor; sums it across ranks with a real gloo all_reduce."""

    def __init__(self, base: float, scale: float = 1.0):
        self.rank = dist.get_rank()
        self.value = torch.tensor([base + self.rank * scale])

    def all_reduce_sum(self) -> float:
        tensor = self.value.clone()
        dist.all_reduce(tensor)
        return tensor.item()

    def env(self) -> dict[str, str]:
        keys = ["RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TOKENIZERS_PARALLELISM",
                "RL_TEST_VAR", "RL_MALLOC"]
        return {k: os.environ.get(k) for k in keys} | {"threads": torch.get_num_threads(),
                                                         "backend": dist.get_backend(),
                                                         "retains_freed_memory": malloc.retaining()}

    def add(self, x: float, *, times: int = 1) -> float:
        return self.value.item() + x * times

    def fail(self, message: str) -> None:
        raise ValueError(message)

    def fail_on_rank(self, rank: int) -> float:
        """Rank ``rank`` raises; the others block in an all_reduce that can never complete."""
        if self.rank == rank:
            raise RuntimeError(f"rank {rank} gives up")
        return self.all_reduce_sum()

    def die(self) -> None:
        os._exit(1)

    def pid(self) -> int:
        return os.getpid()


@pytest.fixture(scope="module")
def group(ray_session):
    with WorkerGroup(SumWorker, 2, init_args=(10.0,), init_kwargs={"scale": 5.0}, name="sum",
                     env_vars={"RL_TEST_VAR": "yes"}, torch_threads=2) as g:
        yield g


def test_all_reduce_over_gloo(group):
    # rank 0 holds 10, rank 1 holds 15
    assert group.run_all("all_reduce_sum") == [25.0, 25.0]


def test_ranks_get_their_environment(group):
    envs = group.run_all("env")
    assert [e["RANK"] for e in envs] == ["0", "1"]
    assert {e["WORLD_SIZE"] for e in envs} == {"2"}
    assert [e["LOCAL_RANK"] for e in envs] == ["0", "1"]  # one node
    assert len({(e["MASTER_ADDR"], e["MASTER_PORT"]) for e in envs}) == 1
    assert {e["TOKENIZERS_PARALLELISM"] for e in envs} == {"false"}
    assert {e["RL_TEST_VAR"] for e in envs} == {"yes"}
    assert {e["threads"] for e in envs} == {2}
    assert {e["backend"] for e in envs} == {"gloo"}
    # cluster.malloc (default auto) reaches the ranks, and CPU ranks keep freed memory (glibc)
    assert {e["RL_MALLOC"] for e in envs} == {"auto"}
    if malloc.is_glibc():
        assert {e["retains_freed_memory"] for e in envs} == {True}


def test_run_rank_and_per_rank_args(group):
    assert group.run_rank(1, "add", 1.0, times=3) == 18.0
    assert group.run_all_per_rank("add", [(1.0,), (2.0,)], [{"times": 2}, {}]) == [12.0, 17.0]
    futures = group.run_all_async("add", 0.5)
    assert group.get(futures) == [10.5, 15.5]
    assert group.get(group.run_rank_async(0, "add", 2.0)) == 12.0


def test_per_rank_args_must_match_world_size(group):
    with pytest.raises(ValueError, match="1 argument tuples for 2 ranks"):
        group.run_all_per_rank("add", [(1.0,)])


def test_worker_exception_names_rank_method_and_traceback(group):
    start = time.monotonic()
    with pytest.raises(WorkerError) as info:
        group.run_rank(1, "fail", "bad input 42")
    assert time.monotonic() - start < 30
    err = info.value
    assert (err.group, err.rank, err.method) == ("sum", 1, "fail")
    assert isinstance(err.__cause__, ValueError)
    text = str(err)
    assert "ValueError: bad input 42" in text and "rank 1" in text and "fail()" in text
    assert 'raise ValueError(message)' in text  # the worker's own traceback line
    # a rank that merely raised leaves a healthy group
    assert not err.group_shut_down
    assert group.run_all("all_reduce_sum") == [25.0, 25.0]


def test_one_rank_raises_while_the_other_waits_in_a_collective(ray_session):
    group = WorkerGroup(SumWorker, 2, init_args=(1.0,), name="stuck", pg_timeout_s=600)
    start = time.monotonic()
    with pytest.raises(WorkerError) as info:
        group.run_all("fail_on_rank", 1)
    assert time.monotonic() - start < 30
    assert info.value.rank == 1 and info.value.group_shut_down
    assert "rank 1 gives up" in str(info.value)
    with pytest.raises(WorkerError, match="shut down"):
        group.run_all("all_reduce_sum")


def test_worker_that_dies_surfaces_quickly(ray_session):
    group = WorkerGroup(SumWorker, 2, init_args=(1.0,), name="dying")
    start = time.monotonic()
    with pytest.raises(WorkerError) as info:
        group.run_rank(0, "die")
    assert time.monotonic() - start < 30
    assert info.value.rank == 0 and "died" in str(info.value) and info.value.group_shut_down
    group.shutdown()  # idempotent after the automatic shutdown


def test_constructor_failure_is_reported(ray_session):
    with pytest.raises(WorkerError) as info:
        WorkerGroup(SumWorker, 1, init_args=("not a number",), name="badinit")
    assert info.value.method == "SumWorker.__init__" and "TypeError" in str(info.value)


def test_unschedulable_group_fails_with_the_free_resources(ray_session):
    with pytest.raises(WorkerError, match=r"could not reserve 2 x \{'CPU': 1000\}.*cluster.num_cpus"):
        WorkerGroup(SumWorker, 2, init_args=(0.0,), cpus_per_worker=1000, startup_timeout_s=2, name="huge")


class CudaSumWorker:
    def all_reduce_on_cuda(self) -> tuple[str, float]:
        tensor = torch.ones(1, device="cuda") * (dist.get_rank() + 1)
        dist.all_reduce(tensor)
        return dist.get_backend(), tensor.item()


@pytest.mark.gpu
def test_gpu_group_uses_nccl_for_cuda_tensors(ray_session):
    num_gpus = int(ray_session.cluster_resources().get("GPU", 0))
    if num_gpus < 1:
        pytest.skip("the session's Ray sees no GPU")
    world = min(num_gpus, 2)
    with WorkerGroup(CudaSumWorker, world, gpus_per_worker=1, name="cuda") as group:
        results = group.run_all("all_reduce_on_cuda")
    assert [value for _, value in results] == [world * (world + 1) / 2] * world
    assert all("nccl" in backend for backend, _ in results)


def test_cuda_device_comes_from_rays_assigned_gpus():
    from rl_core.cluster.rank import cuda_device_index

    def device(assigned, visible=None, cuda=True, local_rank=0):
        return cuda_device_index(cuda_available=cuda, assigned_gpus=assigned, visible_devices=visible,
                                 local_rank=local_rank)

    assert device(["3"], visible="3") == 0  # Ray narrowed CUDA_VISIBLE_DEVICES to the rank's GPU
    assert device(["5", "2"], visible="2,5") == 0 and device(["5", "2"], visible="5,2") == 1  # the lowest id
    assert device(["2"], visible="0,1,2,3") == 2  # CUDA_VISIBLE_DEVICES left as it was
    assert device([1]) == 1  # no CUDA_VISIBLE_DEVICES: the id is the device
    assert device([], cuda=False) is None and device(["0"], cuda=False) is None  # no CUDA: the CPU
    assert device(None, local_rank=1) == 1  # an in-process rank, not a Ray actor
    with pytest.raises(RuntimeError, match=r"assigned it no GPU \(gpus_per_worker=0\)"):
        device([], visible="0,1")  # Ray 2.60 leaves CUDA_VISIBLE_DEVICES alone for a 0-GPU actor
    with pytest.raises(RuntimeError, match="does not list it"):
        device(["4"], visible="0,1")


def test_shutdown_frees_actors_and_placement_group(ray_session):
    import ray
    from ray.util import placement_group_table

    group = WorkerGroup(SumWorker, 1, init_args=(0.0,), name="freed")
    actors, pg = list(group._actors), group._placement_group
    group.shutdown()
    group.shutdown()
    assert placement_group_table(pg)["state"] == "REMOVED"
    for actor in actors:
        with pytest.raises(ray.exceptions.RayActorError):
            ray.get(actor.node_info.remote(), timeout=30)


def test_in_process_group_has_the_same_api():
    before = os.environ.get("RANK")
    with WorkerGroup(SumWorker, 1, init_args=(3.0,), use_ray=False, name="local") as group:
        assert group.run_all("all_reduce_sum") == [3.0]
        assert group.run_rank(0, "add", 1.0, times=2) == 5.0
        assert group.run_all_per_rank("add", [(2.0,)]) == [5.0]
        assert group.get(group.run_all_async("add", 1.0)) == [4.0]
        assert group.run_rank(0, "pid") == os.getpid()
        with pytest.raises(WorkerError) as info:
            group.run_all("fail", "local failure")
        assert "ValueError: local failure" in str(info.value) and "raise ValueError(message)" in str(info.value)
        # two in-process groups share this process's world-size-1 process group
        with WorkerGroup(SumWorker, 1, init_args=(4.0,), use_ray=False) as other:
            assert other.run_all("all_reduce_sum") == [4.0]
        assert group.run_all("all_reduce_sum") == [3.0]
    assert not dist.is_initialized()
    assert os.environ.get("RANK") == before


def test_in_process_group_rejects_more_than_one_worker():
    with pytest.raises(ValueError, match="exactly one worker"):
        WorkerGroup(SumWorker, 2, use_ray=False)


def test_init_ray_is_idempotent(ray_session):
    init_ray(ClusterConfig(num_cpus=3))  # Ray already runs: nothing happens
    assert ray_session.is_initialized()


JOIN_SCRIPT = """
import sys
from rl_core.cluster import ClusterConfig, WorkerGroup, init_ray
sys.path.insert(0, sys.argv[2])
from test_cluster import SumWorker

init_ray(ClusterConfig(address=sys.argv[1], log_to_driver=False))
import ray
with WorkerGroup(SumWorker, 1, init_args=(7.0,), name="joined") as group:
    print("RESULT", group.run_all("add", 1.0), ray.get_runtime_context().gcs_address)
"""


def test_joining_an_existing_cluster_by_address(ray_session, tmp_path):
    """A second driver (a subprocess) joins the session's Ray by its address and runs a group on it."""
    import subprocess
    import sys

    address = ray_session.get_runtime_context().gcs_address
    script = tmp_path / "join.py"
    script.write_text(JOIN_SCRIPT)
    proc = subprocess.run([sys.executable, str(script), address, os.path.dirname(__file__)],
                          capture_output=True, text=True, timeout=100)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"RESULT [8.0] {address}" in proc.stdout


def test_joining_a_missing_cluster_fails_clearly(tmp_path):
    import subprocess
    import sys

    code = ("from rl_core.cluster import ClusterConfig, init_ray\n"
            "init_ray(ClusterConfig(address='127.0.0.1:1'))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=100)
    assert proc.returncode != 0
    assert "could not join the Ray cluster at cluster.address='127.0.0.1:1'" in proc.stderr


@pytest.fixture
def ray_cli_cluster(tmp_path):
    """A head node started with `ray start --head --block` on a free port, in its own temp dir; yields
    its address. Stopped by ending that command (with --block it takes down the processes it started),
    not by `ray stop`, which would kill every Ray on the machine, this session's own included."""
    import shutil
    import socket
    import subprocess
    import sys
    import tempfile
    from pathlib import Path

    ray_cli = Path(sys.executable).with_name("ray")
    ray_cli = str(ray_cli) if ray_cli.exists() else shutil.which("ray")
    if ray_cli is None:
        pytest.skip("the `ray` command line is not installed")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    # Ray's unix sockets live under the temp dir, and their paths may not exceed 107 bytes.
    temp_dir = tempfile.mkdtemp(prefix="rl-ray-")
    log_path = tmp_path / "ray-start.log"
    with open(log_path, "w") as log:
        head = subprocess.Popen(
            [ray_cli, "start", "--head", "--block", f"--port={port}", "--node-ip-address=127.0.0.1", "--num-cpus=2",
             "--include-dashboard=false", "--disable-usage-stats", f"--temp-dir={temp_dir}"],
            stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while "Ray runtime started" not in log_path.read_text():
            if head.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"`ray start --head` did not start (exit code {head.poll()}):\n{log_path.read_text()[-3000:]}")
            time.sleep(0.5)
        yield f"127.0.0.1:{port}"
    finally:
        head.terminate()
        try:
            head.wait(timeout=30)
        except subprocess.TimeoutExpired:
            head.kill()
            head.wait()
        shutil.rmtree(temp_dir, ignore_errors=True)


def test_auto_joins_the_cluster_started_with_ray_start(ray_cli_cluster, tmp_path):
    """cluster.address=auto joins the cluster that `ray start --head` runs (found through RAY_ADDRESS, as
    `ray start` tells users to set it) and runs a group on it."""
    import subprocess
    import sys

    script = tmp_path / "join.py"
    script.write_text(JOIN_SCRIPT)
    env = {**os.environ, "RAY_ADDRESS": ray_cli_cluster}
    proc = subprocess.run([sys.executable, str(script), "auto", os.path.dirname(__file__)],
                          capture_output=True, text=True, timeout=100, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # Ray names its GCS by the node's IP whatever address was dialled: the free port identifies our head.
    port = ray_cli_cluster.rpartition(":")[2]
    result = next(line for line in proc.stdout.splitlines() if line.startswith("RESULT"))
    assert result.startswith("RESULT [8.0] ") and result.endswith(f":{port}"), result


def test_no_address_starts_a_ray_of_its_own_beside_a_running_cluster(ray_cli_cluster, tmp_path):
    """cluster.address unset: the program starts its own local Ray even when another cluster runs on the
    machine and RAY_ADDRESS points at it (a stale `ray start` is never joined by accident)."""
    import subprocess
    import sys

    code = ("from rl_core.cluster import ClusterConfig, init_ray\n"
            "init_ray(ClusterConfig(num_cpus=1, log_to_driver=False))\n"
            "import ray\n"
            "print('GCS', ray.get_runtime_context().gcs_address)\n")
    env = {**os.environ, "RAY_ADDRESS": ray_cli_cluster}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=100, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    gcs = next(line for line in proc.stdout.splitlines() if line.startswith("GCS "))
    assert not gcs.endswith(":" + ray_cli_cluster.rpartition(":")[2]), gcs
