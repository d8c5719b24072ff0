"""families-gen: generation tokens/s of the native engine vs HF generate on the newer families, at
SmolLM2-135M's size with random weights: a Qwen3.5 hybrid (gated delta-net + full attention, 3:1) and a
Qwen3-MoE (8 experts, 2 per token: the active MLP of SmolLM2's dense one; 320M parameters in all).

    python bench/families_gen.py                        # both families, batch 64, fp32, 64 new tokens
    python bench/families_gen.py --families qwen3_moe --dtype bfloat16
    python bench/families_gen.py --tiny                 # the tiny models, batch 4: a check that it runs

Same protocol as bench/gen_cpu.py (interleaved rounds, best round, temperature 1.0 and no stop token so
each engine generates exactly batch x new_tokens tokens); the prompts are random ids of 40-56 tokens.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from functools import partial
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gen_cpu import _hf, _native, sampling_params  # noqa: E402

# SmolLM2-135M: 30 layers, hidden 576, 9 query / 3 key-value heads of 64, MLP 1536, vocab 49152.
SMOLLM2 = dict(num_hidden_layers=30, hidden_size=576, num_attention_heads=9, num_key_value_heads=3, head_dim=64,
               intermediate_size=1536, vocab_size=49152, max_position_embeddings=2048)
SIZES = {
    "qwen3_5_text": dict(SMOLLM2, layer_types=(["linear_attention"] * 3 + ["full_attention"]) * 7
                         + ["linear_attention", "full_attention"], linear_num_key_heads=4, linear_num_value_heads=8,
                         linear_key_head_dim=64, linear_value_head_dim=64),
    "qwen3_moe": dict(SMOLLM2, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=768),
}


def build(family: str, tiny: bool, folder: str) -> str:
    """The family's model (the tiny one, or at SmolLM2's size: the config's vocab, the tiny tokenizer) saved."""
    from rl_core.models.tiny import build_tiny_model, build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer()
    build_tiny_model(tokenizer, family=family, **({} if tiny else SIZES[family])).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def run_family(family: str, args) -> dict[str, float]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rl_backends_gen.native import NativeEngine

    with tempfile.TemporaryDirectory() as folder:
        path = build(family, args.tiny, folder)
        tokenizer = AutoTokenizer.from_pretrained(path)
        vocab = min(tokenizer.vocab_size, 512)
        gen = torch.Generator().manual_seed(0)
        prompts = [torch.randint(4, vocab, (40 + i % 17,), generator=gen).tolist() for i in range(args.batch)]
        sampling = sampling_params(args.new_tokens)
        native = NativeEngine(path, dtype=args.dtype, max_batch_size=args.batch,
                              max_seq_len=max(map(len, prompts)) + args.new_tokens + 8)
        hf = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, args.dtype)).eval()
        native.generate(prompts[:2], sampling)  # warm-up
        engines = {"native": partial(_native, native, prompts, sampling),
                   "hf": partial(_hf, hf, tokenizer, prompts, args.new_tokens)}
        rates: dict[str, list[float]] = {name: [] for name in engines}
        for _ in range(args.repeats):
            for name, run in engines.items():
                tokens, seconds = run()
                assert tokens == args.batch * args.new_tokens, (name, tokens)
                rates[name].append(tokens / seconds)
        native.shutdown()
    best = {name: max(r) for name, r in rates.items()}
    for name, r in rates.items():
        print(f"{family:>13} {args.dtype:>9} {args.batch:>5} {name:>7} {best[name]:8.1f}   "
              f"{' '.join(f'{x:.1f}' for x in r)}")
    print(f"{family:>13} {args.dtype:>9} {args.batch:>5} {'ratio':>7} native/hf = {best['native'] / best['hf']:.2f}x",
          flush=True)
    return {"native": best["native"], "hf": best["hf"], "ratio": best["native"] / best["hf"]}


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--families", nargs="+", default=sorted(SIZES), choices=sorted(SIZES))
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--batch", type=int, default=None, help="prompts per call (default 64; 4 with --tiny)")
    parser.add_argument("--new-tokens", type=int, default=None, help="default 64; 4 with --tiny")
    parser.add_argument("--repeats", type=int, default=None, help="rounds of (native, hf); default 2, 1 with --tiny")
    parser.add_argument("--tiny", action="store_true", help="rl_core.models.tiny's models, batch 4: a quick check")
    args = parser.parse_args(argv)
    args.batch = args.batch or (4 if args.tiny else 64)
    args.new_tokens = args.new_tokens or (4 if args.tiny else 64)
    args.repeats = args.repeats or (1 if args.tiny else 2)
    print(f"# families-gen  torch threads={torch.get_num_threads()}  load average={os.getloadavg()[0]:.1f}")
    print(f"{'family':>13} {'dtype':>9} {'batch':>5} {'engine':>7} {'tok/s':>8}   runs (tok/s)")
    return {family: run_family(family, args) for family in args.families}


if __name__ == "__main__":
    main()
