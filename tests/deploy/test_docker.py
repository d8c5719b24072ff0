"""docker/Dockerfile (CUDA) and docker/Dockerfile.cpu, read as instructions and checked: the CPU image
installs the way the README does (scripts/setup_env.sh, the same torch), the CUDA image installs every
package with the engine and Megatron-core extras, and both follow the usual lint rules (apt lists
removed, no `latest` base, exec-form CMD, a .dockerignore keeping the local venv and git out).

No image is built here (no Docker daemon in CI); docs/cluster.md says how the CPU image was built and
tested with podman on a development machine.
"""

from __future__ import annotations

import re
import shlex
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILES = {"cuda": ROOT / "docker" / "Dockerfile", "cpu": ROOT / "docker" / "Dockerfile.cpu"}
KNOWN = {"FROM", "ARG", "ENV", "RUN", "COPY", "WORKDIR", "CMD", "ENTRYPOINT", "LABEL", "USER", "EXPOSE", "SHELL"}


def instructions(path: Path) -> list[tuple[str, str]]:
    """``(INSTRUCTION, arguments)`` in file order: comments dropped, continued lines joined."""
    result, pending = [], ""
    for line in path.read_text().splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        keyword, _, arguments = (pending + stripped).partition(" ")
        result.append((keyword.upper(), " ".join(arguments.split())))
        pending = ""
    assert not pending, f"{path}: the last instruction ends with a line continuation"
    return result


def args(path: Path) -> dict[str, str]:
    """The ARG defaults."""
    found = {}
    for keyword, arguments in instructions(path):
        if keyword == "ARG" and "=" in arguments:
            name, _, value = arguments.partition("=")
            found[name] = shlex.split(value)[0] if value else ""
    return found


def runs(path: Path) -> list[str]:
    return [arguments for keyword, arguments in instructions(path) if keyword == "RUN"]


@pytest.mark.parametrize("kind", sorted(DOCKERFILES))
def test_lint_rules(kind):
    path = DOCKERFILES[kind]
    steps = instructions(path)
    assert {keyword for keyword, _ in steps} <= KNOWN, f"{path}: unknown instruction"
    assert steps[0][0] == "ARG" and steps[1] == ("FROM", "${BASE_IMAGE}")
    base = args(path)["BASE_IMAGE"]
    assert ":" in base and not base.endswith(":latest"), f"{path}: pin the base image's tag, got {base}"
    for run in runs(path):
        if "apt-get install" in run:
            assert "apt-get update" in run and "-y" in run and "--no-install-recommends" in run
            assert "rm -rf /var/lib/apt/lists/*" in run
    cmd = [arguments for keyword, arguments in steps if keyword == "CMD"]
    assert len(cmd) == 1 and cmd[0].startswith("["), f"{path}: CMD in exec form"
    assert all(arguments.startswith("/") for keyword, arguments in steps if keyword == "WORKDIR")
    assert "PIP_NO_CACHE_DIR=1" in " ".join(a for k, a in steps if k == "ENV")


def test_the_build_context_leaves_out_the_venv_and_git():
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {".git", ".venv", ".nox", "runs"} <= set(ignored)


def test_the_cpu_image_installs_as_the_readme_does():
    path = DOCKERFILES["cpu"]
    readme = (ROOT / "README.md").read_text()
    setup = (ROOT / "scripts" / "setup_env.sh").read_text()
    # The README's two commands both install through setup_env.sh; the image runs the same script.
    assert "bash scripts/run_main.sh" in readme and "bash scripts/test_cpu.sh" in readme
    for script in ("run_main.sh", "test_cpu.sh"):
        assert "bash scripts/setup_env.sh" in (ROOT / "scripts" / script).read_text()
    assert any(run.endswith("bash scripts/setup_env.sh") for run in runs(path))
    assert ("COPY", ". .") in instructions(path)
    # The same torch version as setup_env.sh's default, from PyTorch's CPU index.
    default_torch = re.search(r'TORCH_SPEC="\$\{RL_TORCH_SPEC:-([^}]+)\}"', setup).group(1)
    image_torch = args(path)["RL_TORCH_SPEC"].split()
    assert image_torch == [default_torch, "--index-url", "https://download.pytorch.org/whl/cpu"]
    # Python of the base image >= the packages' requires-python.
    python = re.search(r"python:(\d+)\.(\d+)", args(path)["BASE_IMAGE"])
    assert (int(python.group(1)), int(python.group(2))) >= (3, 11)
    assert 'RL_PYTHON=python3' in runs(path)[-1]
    assert ("ENV", "PATH=/opt/rl/.venv/bin:${PATH}") in instructions(path)


def test_the_cuda_image_installs_every_package_with_the_engine_and_megatron():
    path = DOCKERFILES["cuda"]
    engine = args(path)["ENGINE"]
    gen_extras = tomllib.loads((ROOT / "packages" / "rl-backends-gen" / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    assert engine == "vllm" and {"vllm", "sglang"} <= set(gen_extras)
    first, final = [run for run in runs(path) if run.startswith("pip install")][0], runs(path)[-2]
    assert first == 'pip install "./packages/rl-backends-gen[${ENGINE}]"'  # the engine (and its torch) first
    installed = {re.sub(r"\[.*\]", "", word.strip('"')) for word in final.split() if word.strip('"').startswith("./")}
    expected = {f"./{p.parent.relative_to(ROOT)}" for p in [*ROOT.glob("packages/*/pyproject.toml"), ROOT / "apps" / "pyproject.toml"]}
    assert installed == expected
    assert '"./packages/rl-backends-train[megatron]"' in final and '"ray[default]"' in final
    assert "-c /tmp/keep-torch.txt" in final and "grep -E '^torch==' > /tmp/keep-torch.txt" in final
    assert "torch.version.cuda" in runs(path)[-1]
