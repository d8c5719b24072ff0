#!/usr/bin/env bash
# Fetch, on this (networked) machine, the pure-Python wheels that the device machine's image lacks
# and scripts/gpu_check.sh needs, into .whl/ (git-ignored through .git/info/exclude). The device
# image already has CUDA torch, transformers, tokenizers, safetensors, pyyaml, tqdm and pytest.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
rm -rf .whl && mkdir -p .whl
platforms=(--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${platforms[@]}" \
    -d .whl pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5
# torchao: FP8 training (tests/rl_backends_train/test_fp8_training.py, bench/fp8_step.py); an abi3 wheel, ~3.4 MB.
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${platforms[@]}" \
    -d .whl torchao==0.18.0
ls -la .whl
