#!/usr/bin/env bash
# Set up .venv (scripts/setup_env.sh) and run the main job: the default GRPO recipe.
#
#   bash scripts/run_main.sh [--config FILE] [key.subkey=value ...]
#
# Arguments go to `rl grpo` (see `rl grpo --help`).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/setup_env.sh

export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
exec "$ROOT/.venv/bin/rl" grpo "$@"
