"""cluster.malloc: "retain" keeps large freed blocks in the process (no page faults when the next
allocation of that size reuses them), "system" leaves glibc's defaults; start_run applies it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from rl_core.cluster import malloc

pytestmark = pytest.mark.skipif(not malloc.is_glibc(), reason="cluster.malloc sets glibc's malloc")

# A fresh process: set the mode, allocate and free 64 MiB (16384 pages of 4 KiB) twice, then count the
# page faults of eight more allocations of 64 MiB, each freed at once. glibc hands blocks this large to
# mmap by default, so each one faults all its pages in again; kept, a freed block is reused (the heap
# grows a few times until freed blocks coalesce into one that the next aligned allocation fits).
PAGES = 16384
REUSE = """
import resource, sys, torch
from rl_core.cluster import malloc
applied = malloc.apply(sys.argv[1], on_gpu=False)
for _ in range(2):
    torch.ones(16 * 2**20)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(8):
    torch.ones(16 * 2**20)
print(applied, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""

# start_run's process settings with the cluster section the run gives.
START_RUN = """
import sys
from rl_apps.run_setup import use_process_settings
from rl_core.cluster import ClusterConfig, malloc
use_process_settings(ClusterConfig(malloc=sys.argv[1]))
print(malloc.retaining())
"""


def run_python(script: str, *args: str) -> list[str]:
    done = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def transparent_huge_pages_always() -> bool:
    path = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    return path.exists() and "[always]" in path.read_text()


def test_retain_reuses_a_freed_block_without_page_faults():
    applied, faults = run_python(REUSE, "retain")
    assert applied == "True"
    assert int(faults) < 3 * PAGES  # the freed blocks are reused, not faulted in again
    applied, faults = run_python(REUSE, "system")
    assert applied == "False"
    if not transparent_huge_pages_always():  # with huge pages for every mmap, glibc's own faults are few too
        assert int(faults) > 7 * PAGES


def test_the_mode_by_device():
    assert malloc.retains("retain", on_gpu=True) and malloc.retains("auto", on_gpu=False)
    assert not malloc.retains("auto", on_gpu=True) and not malloc.retains("system", on_gpu=False)
    with pytest.raises(ValueError, match="auto, retain or system"):
        malloc.retains("jemalloc", on_gpu=False)


@pytest.mark.parametrize("mode", ["auto", "system"])
def test_start_run_applies_cluster_malloc_to_the_driver(mode):
    import torch

    expected = mode == "auto" and not torch.cuda.is_available()  # auto retains where no GPU is used
    assert run_python(START_RUN, mode) == [str(expected)]
