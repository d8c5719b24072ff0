"""The GPU check collects the backend tests on a machine without Ray: collection must not import it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# Makes `import ray` (and every ray.* module) fail in the interpreter that loads it.
BLOCK_RAY = """
import sys

class _NoRay:
    def find_spec(self, name, path=None, target=None):
        if name == "ray" or name.startswith("ray."):
            raise ImportError(f"{name} is blocked (a machine without Ray)")

sys.meta_path.insert(0, _NoRay())
"""


def test_gpu_tests_are_collected_without_ray(tmp_path):
    (tmp_path / "sitecustomize.py").write_text(BLOCK_RAY)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    blocked = subprocess.run([sys.executable, "-c", "import ray"], env=env, capture_output=True, text=True)
    assert blocked.returncode != 0 and "blocked" in blocked.stderr
    # The options of scripts/gpu_check.sh.
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "gpu", "-p", "no:cacheprovider", "-o",
         "addopts=", "tests/rl_backends_train", "tests/rl_backends_gen"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    collected = {line.split("[")[0] for line in result.stdout.splitlines() if "::" in line}
    assert "tests/rl_backends_train/test_dtensor_gpu.py::test_bf16_mixed_precision_step_tracks_fp32" in collected
    assert "tests/rl_backends_gen/test_native_cuda.py::test_cuda_greedy_equals_hf_greedy" in collected
