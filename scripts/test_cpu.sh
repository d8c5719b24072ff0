#!/usr/bin/env bash
# Set up .venv (scripts/setup_env.sh) and run the whole CPU test suite.
#
#   bash scripts/test_cpu.sh [extra pytest arguments]
#
# GPU tests (-m gpu) and vLLM tests (-m vllm, see `nox -s vllm_cpu`) are left out. A later -m wins,
# e.g. `bash scripts/test_cpu.sh -m "not gpu and not vllm and not slow"` also skips the slow tests.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/setup_env.sh

export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# pytest's exit code 5 (no tests collected) is a failure here too: a suite that ran nothing proves nothing.
exec "$ROOT/.venv/bin/python" -m pytest tests -m "not gpu and not vllm" -q -p no:cacheprovider "$@"
