"""The uv workspace of the root pyproject.toml and its committed uv.lock: every package is a member,
the lock is up to date (`uv lock --check`) and installs the whole stack (`uv sync --dry-run`, into a
throw-away environment path: the real sync downloads PyPI's CUDA torch, ~3 GB)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MEMBERS = sorted([*ROOT.glob("packages/*/pyproject.toml"), ROOT / "apps" / "pyproject.toml"])


def uv() -> list[str]:
    if shutil.which("uv"):
        return ["uv"]
    if subprocess.run([sys.executable, "-m", "uv", "--version"], capture_output=True).returncode == 0:
        return [sys.executable, "-m", "uv"]
    pytest.skip("uv is not installed (pip install uv; scripts/setup_env.sh installs it)")


def member_names() -> list[str]:
    return sorted(tomllib.loads(path.read_text())["project"]["name"] for path in MEMBERS)


def test_every_package_is_a_workspace_member_taken_from_the_checkout():
    root = tomllib.loads((ROOT / "pyproject.toml").read_text())
    members = {path for pattern in root["tool"]["uv"]["workspace"]["members"] for path in ROOT.glob(pattern)}
    assert {path.parent for path in MEMBERS} <= members
    sources = root["tool"]["uv"]["sources"]
    assert sorted(name for name, source in sources.items() if source == {"workspace": True}) == member_names()
    lock = tomllib.loads((ROOT / "uv.lock").read_text())
    editable = {p["name"]: p["source"]["editable"] for p in lock["package"] if "editable" in p["source"]}
    assert sorted(editable) == member_names()
    assert {ROOT / path for path in editable.values()} == {path.parent for path in MEMBERS}


def test_the_lock_is_up_to_date():
    result = subprocess.run([*uv(), "lock", "--check"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr + "\nRun `uv lock` after changing a pyproject.toml."


def test_sync_would_install_the_whole_stack(tmp_path):
    env = {**os.environ, "UV_PROJECT_ENVIRONMENT": str(tmp_path / "env")}
    result = subprocess.run([*uv(), "sync", "--locked", "--dry-run"], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr
    planned = result.stderr + result.stdout
    assert f"Would create project environment at: {tmp_path / 'env'}" in planned
    for name in [*member_names(), "torch", "ray", "transformers", "pytest"]:
        assert f" + {name}" in planned, f"{name} is not installed by `uv sync`:\n{planned}"
    assert not (tmp_path / "env").exists()
