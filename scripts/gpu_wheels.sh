#!/usr/bin/env bash
# Fetch, on this (networked) machine, the wheels that the device machine's image lacks and
# scripts/gpu_check.sh needs, into .cache/gpu-wheels/ (git-ignored), for Python 3.12 on x86-64 Linux.
# The device image already has CUDA torch 2.11, transformers 5.17, tokenizers, safetensors, numpy,
# pyyaml, tqdm and pytest. What comes here:
#   pydantic            our configs
#   megatron-core       the Megatron backend on CUDA
#   torchao             FP8 training (tests/rl_backends_train/test_fp8_training.py, bench/fp8_step.py; abi3, ~3.4 MB)
#   ray + its deps      Ray placement on one GPU; also what tests/rl_backends_train/conftest.py imports.
#                       Ray's wheel is 79 MB, over the 64 MiB a device call carries: its Java jar
#                       (ray/jars, 31 MB) and the dashboard's web client are dropped (neither is used:
#                       Python workers, include_dashboard=False).
#
#   bash scripts/gpu_wheels.sh      # then: run(command="bash scripts/gpu_check.sh", carry=[".cache/gpu-wheels"])
#
# RL_GPU_WHEELS_PYTHON=3.11 fetches for Python 3.11 instead: a dry run of gpu_check.sh on this machine.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
dest=.cache/gpu-wheels
py="${RL_GPU_WHEELS_PYTHON:-3.12}"
rm -rf "$dest" && mkdir -p "$dest"
target=(--only-binary=:all: --python-version "$py" --implementation cp --abi "cp${py/./}" --abi abi3 --abi none
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
        --platform manylinux_2_24_x86_64 --platform any)
wheels=(
    pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5
    megatron-core==0.16.1 pytest-timeout
    torchao==0.18.0
    ray==2.60.0 click jsonschema jsonschema-specifications referencing rpds-py attrs msgpack protobuf
    requests urllib3 idna certifi charset-normalizer filelock packaging
    aiohappyeyeballs aiosignal frozenlist multidict propcache yarl
)
python3 -m pip download -q --no-deps "${target[@]}" -d "$dest" "${wheels[@]}"

# Ray without its Java jar and dashboard client (pip installs the files a wheel holds; RECORD is rewritten).
python3 - "$dest" <<'PY'
import pathlib, sys, zipfile
(wheel,) = pathlib.Path(sys.argv[1]).glob("ray-*.whl")
slim = wheel.with_suffix(".slim")
dropped = ("ray/jars/", "ray/dashboard/client/")
with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(slim, "w", zipfile.ZIP_DEFLATED) as dst:
    for item in src.infolist():
        if not item.filename.startswith(dropped):
            dst.writestr(item, src.read(item))
slim.replace(wheel)
PY
total=$(du -cb "$dest"/*.whl | tail -1 | cut -f1)
ls -la "$dest"
echo "total: $(( total / 1048576 )) MiB in $(ls "$dest"/*.whl | wc -l) wheels (a device call carries at most 64 MiB)"
(( total < 64 * 1048576 )) || { echo "too large to carry" >&2; exit 1; }
