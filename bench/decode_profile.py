"""Where a decode step's time goes in the native engine: one forward of R rows x q queries (q = 1: a
plain step; q = k + 1: a speculative verification), split into the decoder forward, the LM head and the
sampling / verification, at several row counts. A speculative step pays when a (k + 1)-query forward
costs little more than a 1-query one, which holds while the step is bound by reading the weights.

    python bench/decode_profile.py                       # SmolLM2-135M-Instruct, bfloat16
    python bench/decode_profile.py --rows 1 4 16 64 --num-tokens 4 --context 160
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch


def timed(fn, repeats: int) -> float:
    """Median seconds of ``fn()`` over ``repeats`` runs (after one warm-up)."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64])
    parser.add_argument("--num-tokens", type=int, default=4)
    parser.add_argument("--context", type=int, default=160, help="cached positions per row")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    from rl_backends_gen.native import NativeEngine
    from rl_backends_gen.native.sampling import sample_tokens
    from rl_backends_gen.native.steps import DecodeStep
    from rl_core.models import resolve_model
    from rl_core.types import SamplingParams

    engine = NativeEngine(str(resolve_model(args.model)), dtype=args.dtype, max_batch_size=max(args.rows),
                          max_seq_len=args.context + args.num_tokens + 2)
    engine.cache.ensure_clean(engine.max_seq_len)
    vocab = engine.head.weight.shape[0]
    sampling = SamplingParams(temperature=1.0)
    print(f"# decode-profile  model={args.model}  dtype={args.dtype}  context={args.context}  "
          f"torch threads={torch.get_num_threads()}  load average={os.getloadavg()[0]:.1f}")
    print(f"{'rows':>4} {'q':>2} {'forward ms':>10} {'head ms':>7} {'sample ms':>9} {'step ms':>7} "
          f"{'x q=1':>6} {'ms/row-query':>12}")
    with torch.inference_mode():
        for rows in args.rows:
            base = None
            for queries in (1, args.num_tokens + 1):
                ids = torch.randint(0, vocab, (rows, queries))
                positions = args.context + torch.arange(queries)[None, :].expand(rows, queries)
                hidden = engine._forward(ids, positions, DecodeStep(engine.cache, positions))
                flat = hidden.reshape(rows * queries, -1)
                logits = engine.head(flat).float()
                work = torch.empty_like(logits)
                uniforms = torch.rand(rows * queries, dtype=torch.float64)
                forward = timed(lambda ids=ids, positions=positions: engine._forward(ids, positions,
                                                                                     DecodeStep(engine.cache, positions)),
                                args.repeats)
                head = timed(lambda flat=flat: engine.head(flat).float(), args.repeats)
                sample = timed(lambda logits=logits, uniforms=uniforms, work=work: sample_tokens(logits, sampling, uniforms, work),
                               args.repeats)
                step = forward + head + sample
                base = base or step
                print(f"{rows:4d} {queries:2d} {forward * 1e3:10.2f} {head * 1e3:7.2f} {sample * 1e3:9.2f} "
                      f"{step * 1e3:7.2f} {step / base:6.2f} {step * 1e3 / (rows * queries):12.3f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
