"""families-gen: generation tokens/s of the native engine vs HF generate on the newer families, at
SmolLM2-135M's size with random weights: a Qwen3.5 hybrid (gated delta-net + full attention, 3:1) and a
Qwen3-MoE (8 experts, 2 per token: the active MLP of SmolLM2's dense one; 320M parameters in all).

    python bench/families_gen.py                        # both families, batch 64, fp32, 64 new tokens
    python bench/families_gen.py --families qwen3_moe --dtype bfloat16
    python bench/families_gen.py --prompts random       # random ids of 40-56 tokens, no shared prefix
    python bench/families_gen.py --phases --chunked-prefill    # prefill and decode/step, token loop vs chunks
    python bench/families_gen.py --dtype bfloat16 --phases --sdpa-decode   # decode attention: matmuls vs SDPA
    python bench/families_gen.py --families qwen3_moe --hf-forward-decode   # the engine's own decode forward or not
    python bench/families_gen.py --phases --narrow      # each engine's fixed cost per decode step (tiny widths)
    python bench/families_gen.py --tiny                 # the tiny models, batch 4: a check that it runs

Same protocol as bench/gen_cpu.py (interleaved rounds, best round, temperature 1.0 and no stop token so
each engine generates exactly batch x new_tokens tokens). The prompts (``--prompts``): ``chat`` (default),
gen-cpu's own: its arithmetic questions in SmolLM2-135M-Instruct's chat template (49-54 tokens, the first 27
shared, which the native engine prefills once; the models share SmolLM2's vocabulary size, so its token ids
are valid); ``random``: random ids of 40-56 tokens that share no prefix, so both engines prefill every token.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gen_cpu import _hf, _native, make_prompts, sdpa_decode  # noqa: E402

# SmolLM2-135M: 30 layers, hidden 576, 9 query / 3 key-value heads of 64, MLP 1536, vocab 49152.
SMOLLM2 = dict(num_hidden_layers=30, hidden_size=576, num_attention_heads=9, num_key_value_heads=3, head_dim=64,
               intermediate_size=1536, vocab_size=49152, max_position_embeddings=2048)
SIZES = {
    "qwen3_5_text": dict(SMOLLM2, layer_types=(["linear_attention"] * 3 + ["full_attention"]) * 7
                         + ["linear_attention", "full_attention"], linear_num_key_heads=4, linear_num_value_heads=8,
                         linear_key_head_dim=64, linear_value_head_dim=64),
    "qwen3_moe": dict(SMOLLM2, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=768),
}
# --narrow: the same layers (count, kinds, experts) at the tiny models' widths, so that a step's time is what it
# costs beyond reading weights and doing FLOPs: per-layer operations, dispatch, Python.
NARROW = {
    "qwen3_5_text": dict(hidden_size=64, num_attention_heads=2, num_key_value_heads=1, head_dim=32, intermediate_size=64,
                         vocab_size=512, linear_num_key_heads=1, linear_num_value_heads=2, linear_key_head_dim=32,
                         linear_value_head_dim=32),
    "qwen3_moe": dict(hidden_size=64, num_attention_heads=2, num_key_value_heads=1, head_dim=32, intermediate_size=64,
                      vocab_size=512, moe_intermediate_size=32),
}


def sampling_params(new_tokens: int):
    """T = 1, and a stop id outside every vocabulary: the native engine generates exactly ``new_tokens`` per
    sample, as HF generate does with ``min_new_tokens`` (gen-cpu's stop id, 4518, is a token these random
    models sample now and then; gen-cpu keeps an in-vocabulary id because vLLM refuses out-of-vocabulary
    stop ids, and this bench runs no vLLM)."""
    from rl_core.types import SamplingParams

    return SamplingParams(max_new_tokens=new_tokens, temperature=1.0, seed=0, stop_token_ids=(2**31 - 1,))


def build(family: str, tiny: bool, folder: str, narrow: bool = False) -> str:
    """The family's model (the tiny one, or at SmolLM2's size: the config's vocab, the tiny tokenizer; with
    ``narrow``, SmolLM2's layers at the tiny widths) saved."""
    from rl_core.models.tiny import build_tiny_model, build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer()
    size = {} if tiny else {**SIZES[family], **(NARROW[family] if narrow else {})}
    build_tiny_model(tokenizer, family=family, **size).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


PROMPTS = ("chat", "random")  # the prompt kinds of make_family_prompts (--prompts)


def make_family_prompts(kind: str, tokenizer, batch: int, tiny: bool) -> list[list[int]]:
    """``batch`` prompts of token ids: gen-cpu's chat prompts (SmolLM2's tokenizer at SmolLM2's size, the
    tiny tokenizer with ``tiny``) or random ids of 40-56 tokens."""
    if kind == "chat":
        if not tiny:
            from transformers import AutoTokenizer

            from rl_core.models import resolve_model

            tokenizer = AutoTokenizer.from_pretrained(resolve_model("smollm2-135m-instruct"))
        return make_prompts(tokenizer, batch)
    gen = torch.Generator().manual_seed(0)
    vocab = min(tokenizer.vocab_size, 512)
    return [torch.randint(4, vocab, (40 + i % 17,), generator=gen).tolist() for i in range(batch)]


def run_family(family: str, args) -> dict:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rl_backends_gen.native import NativeEngine

    with tempfile.TemporaryDirectory() as folder:
        path = build(family, args.tiny, folder, args.narrow)
        tokenizer = AutoTokenizer.from_pretrained(path)
        prompts = make_family_prompts(args.prompts, tokenizer, args.batch, args.tiny)
        native = NativeEngine(path, dtype=args.dtype, max_batch_size=args.batch,
                              max_seq_len=max(map(len, prompts)) + max(args.new_tokens, PHASE_TOKENS) + 8)
        hf = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, args.dtype)).eval()
        native.generate(prompts[:2], sampling_params(2))  # warm-up
        engines = {"native": lambda n: _native(native, prompts, sampling_params(n)),
                   "hf": lambda n: _hf(hf, tokenizer, prompts, n)}
        if args.chunked_prefill:
            engines["chunked"] = chunked_prefill(engines["native"])
        if args.sdpa_decode:
            engines["sdpa"] = sdpa_decode(engines["native"])
        if args.hf_forward_decode:
            engines["hf-fwd"] = hf_forward_decode(native, engines["native"])
        result = (phases if args.phases else rates)(family, engines, args)
        native.shutdown()
    return result


def hf_forward_decode(engine, run):
    """``run`` with ``engine``'s decode steps through transformers' forward instead of the engine's own
    (``native/direct.py``; the same engine and weights): an in-process A/B of that forward."""
    def forced(new_tokens: int):
        direct, engine.direct_decode = engine.direct_decode, None
        try:
            return run(new_tokens)
        finally:
            engine.direct_decode = direct
    return forced


def chunked_prefill(run):
    """``run`` with the gated delta rule's prefill forced onto transformers' chunked kernel (the engine's
    path before its token loop, ``recurrent_steps.stepwise_is_cheaper``)."""
    from rl_backends_gen.native import recurrent_steps

    def forced(new_tokens: int):
        cost_model = recurrent_steps.stepwise_is_cheaper
        recurrent_steps.stepwise_is_cheaper = lambda rows, tokens: False
        try:
            return run(new_tokens)
        finally:
            recurrent_steps.stepwise_is_cheaper = cost_model
    return forced


def rates(family: str, engines: dict, args) -> dict[str, float]:
    """Tokens/s of each engine over ``args.repeats`` interleaved rounds (best round), and native/hf."""
    runs: dict[str, list[float]] = {name: [] for name in engines}
    for _ in range(args.repeats):
        for name, run in engines.items():
            tokens, seconds = run(args.new_tokens)
            assert tokens == args.batch * args.new_tokens, (name, tokens)
            runs[name].append(tokens / seconds)
    best = {name: max(r) for name, r in runs.items()}
    for name, r in runs.items():
        print(f"{family:>13} {args.dtype:>9} {args.batch:>5} {name:>7} {best[name]:8.1f}   "
              f"{' '.join(f'{x:.1f}' for x in r)}")
    print(f"{family:>13} {args.dtype:>9} {args.batch:>5} {'ratio':>7} native/hf = {best['native'] / best['hf']:.2f}x",
          flush=True)
    return {**best, "ratio": best["native"] / best["hf"]}


PHASE_TOKENS = 33  # --phases: decode per step = (a call of 33 new tokens - a call of 1) / 32


def phases(family: str, engines: dict, args) -> dict[str, dict[str, float]]:
    """Prefill (a call of 1 new token) and decode per step of each engine, interleaved rounds, best of each;
    and the workload of ``args.new_tokens`` tokens projected from them."""
    seconds: dict[str, dict[int, list[float]]] = {name: {1: [], PHASE_TOKENS: []} for name in engines}
    for _ in range(args.repeats):
        for name, run in engines.items():
            for new_tokens in (1, PHASE_TOKENS):
                seconds[name][new_tokens].append(run(new_tokens)[1])
    result = {}
    for name, by_tokens in seconds.items():
        prefill, longer = min(by_tokens[1]), min(by_tokens[PHASE_TOKENS])
        decode = (longer - prefill) / (PHASE_TOKENS - 1)
        result[name] = {"prefill_ms": prefill * 1e3, "decode_ms": decode * 1e3,
                        "workload_s": prefill + args.new_tokens * decode,
                        "prefill_runs_ms": [t * 1e3 for t in by_tokens[1]]}
        print(f"{family:>13} {args.dtype:>9} {args.batch:>5} {name:>7}   prefill+1 {prefill * 1e3:8.0f} ms   "
              f"decode/step {decode * 1e3:7.1f} ms   {args.new_tokens} new tokens {result[name]['workload_s']:6.1f} s   "
              f"prefill runs (ms) {' '.join(f'{t * 1e3:.0f}' for t in by_tokens[1])}")
    ratio = result["hf"]["workload_s"] / result["native"]["workload_s"]
    print(f"{family:>13} {args.dtype:>9} {args.batch:>5} {'ratio':>7} native/hf = {ratio:.2f}x (projected)", flush=True)
    return result


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--families", nargs="+", default=sorted(SIZES), choices=sorted(SIZES))
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--batch", type=int, default=None, help="prompts per call (default 64; 4 with --tiny)")
    parser.add_argument("--new-tokens", type=int, default=None, help="default 64; 4 with --tiny")
    parser.add_argument("--repeats", type=int, default=None, help="rounds of (native, hf); default 2, 1 with --tiny")
    parser.add_argument("--prompts", default=None, choices=PROMPTS,
                        help="gen-cpu's chat prompts (a shared 27-token prefix; the default) or random ids (no shared "
                        "prefix; the default with --narrow)")
    parser.add_argument("--phases", action="store_true",
                        help="time prefill (1 new token) and decode per step (33 - 1 tokens) instead of the workload")
    parser.add_argument("--chunked-prefill", action="store_true", help="also run the native engine with its "
                        "gated delta rule prefill forced onto transformers' chunked kernel (an A/B of the token loop)")
    parser.add_argument("--sdpa-decode", action="store_true", help="also run the native engine with its decode "
                        "attention on CPU SDPA (its bfloat16 path before 2026-12-06; an A/B of the grouped matmuls)")
    parser.add_argument("--hf-forward-decode", action="store_true", help="also run the native engine with its "
                        "decode steps through transformers' forward (an A/B of native/direct.py, the same weights)")
    parser.add_argument("--tiny", action="store_true", help="rl_core.models.tiny's models, batch 4: a quick check")
    parser.add_argument("--narrow", action="store_true", help="SmolLM2's layers (count, kinds, experts) at the tiny "
                        "models' widths (hidden 64, vocab 512) and random prompts: what a step costs beyond weights "
                        "and FLOPs (with --phases: each engine's fixed cost per decode step)")
    args = parser.parse_args(argv)
    if args.narrow and args.tiny:
        parser.error("--narrow and --tiny are two model sizes: give one")
    if args.narrow and args.prompts == "chat":
        parser.error("--narrow runs random prompts: the chat prompts' token ids need SmolLM2's vocabulary")
    args.prompts = args.prompts or ("random" if args.narrow else "chat")
    args.batch = args.batch or (4 if args.tiny else 64)
    args.new_tokens = args.new_tokens or (4 if args.tiny else 64)
    args.repeats = args.repeats or (1 if args.tiny else 2)
    print(f"# families-gen  prompts={args.prompts}  torch threads={torch.get_num_threads()}  "
          f"load average={os.getloadavg()[0]:.1f}")
    if not args.phases:
        print(f"{'family':>13} {'dtype':>9} {'batch':>5} {'engine':>7} {'tok/s':>8}   runs (tok/s)")
    return {family: run_family(family, args) for family in args.families}


if __name__ == "__main__":
    main()
