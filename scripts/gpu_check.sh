#!/usr/bin/env bash
# The GPU checks, as one short script for a device machine (one CUDA GPU, no network):
# the gpu-marked tests that need no extra engine (native engine on CUDA, DTensor bf16 mixed
# precision with and without CPU offload), then the gen-gpu benchmark (bench/gen_gpu.py).
#
#   here:    bash scripts/gpu_wheels.sh                      # once: the wheels the device image lacks
#   device:  run(command="bash scripts/gpu_check.sh", carry=[".whl"], timeout_s=540)
#
# Logs go to $OUT (the device tool brings them back) or ./gpu_check_out. Not covered: vLLM and
# SGLang on GPU (their CUDA wheels are far over what a device call can carry) and Ray-based tests
# (no Ray in the device image).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out="${OUT:-gpu_check_out}"
mkdir -p "$out"
PYTHONPATH="${PYTHONPATH:-}"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
if compgen -G ".whl/*.whl" > /dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && PYTHONPATH="/tmp/site:$PYTHONPATH"
fi
for src in packages/*/src; do PYTHONPATH="$PWD/$src:$PYTHONPATH"; done
PYTHONPATH="${PYTHONPATH%:}"
export PYTHONPATH
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__)"
} 2>&1 | tee "$out/env.txt"
status=0
timeout 300 python3 -m pytest -m gpu -q -p no:cacheprovider -o addopts="" \
    tests/rl_backends_gen/test_native_cuda.py tests/rl_backends_train/test_dtensor_gpu.py 2>&1 | tee "$out/gpu_tests.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
timeout 200 python3 bench/gen_gpu.py --batch-sizes 64 256 --new-tokens 128 2>&1 | grep -v "Loading weights" | tee "$out/gen_gpu.txt"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

# ---- FP8 (issue 24) ------------------------------------------------------------------------------
# FP8 numerics (torch._scaled_mm against the CPU reference), DTensor FP8 training on CUDA (torchao
# float8: tensorwise, rowwise, blockwise) against bf16, then the FP8-vs-bf16 step-time benchmark.
# Needs torchao (scripts/gpu_wheels.sh carries its wheel). The Megatron FP8 tests need Transformer
# Engine and megatron-core, which the device image lacks: they skip here.
timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider -o addopts="" \
    tests/rl_core/test_fp8_numerics.py tests/rl_backends_train/test_fp8_training.py 2>&1 | tee "$out/fp8_tests.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
timeout 150 python3 bench/fp8_step.py --recipes tensorwise rowwise 2>&1 | grep -v "Loading weights" | tee "$out/fp8_step.txt"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
# ---- end FP8 -------------------------------------------------------------------------------------
exit $status
