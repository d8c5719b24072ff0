"""Benchmark `packing` (BENCHMARKS.md): training tokens/s with sequence packing vs the same batch padded.

One process, one in-process worker (world size 1). The two backends train on the same length-skewed
batch in turns (A, B, A, B, ...) so machine noise hits both alike; the ratio of median step times is
printed. Tokens/s counts real (non-padding) tokens. ``--rss`` instead reports the peak RSS of one
worker training SmolLM2-135M on batch 16 x 128.

    .venv/bin/python bench/packing.py                      # small random Llama, fp32
    .venv/bin/python bench/packing.py --model smollm2-135m-instruct --rounds 3
    .venv/bin/python bench/packing.py --rss
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

from rl_backends_train import TrainBackendConfig, build_training_backend  # noqa: E402
from rl_core.types import ModelOutputs, Normalizer  # noqa: E402


class MaskedNLL:
    """Token-level NLL normalised by the global number of loss tokens."""

    needs_logits = False

    def __call__(self, outputs: ModelOutputs, batch, normalizer: Normalizer):
        loss = -(outputs.logprobs * batch["loss_mask"]).sum() / normalizer.num_valid_tokens
        return loss, {}


def skewed_batch(vocab: int, num_long: int, num_short: int, long_len: int, short_range: tuple[int, int], seed: int):
    """A few long rows among many short ones, in shuffled order, right-padded."""
    gen = torch.Generator().manual_seed(seed)
    lengths = [long_len] * num_long + torch.randint(*short_range, (num_short,), generator=gen).tolist()
    lengths = [lengths[i] for i in torch.randperm(len(lengths), generator=gen).tolist()]
    width = max(lengths)
    ids = torch.zeros(len(lengths), width, dtype=torch.long)
    attention = torch.zeros_like(ids)
    for i, n in enumerate(lengths):
        ids[i, :n] = torch.randint(4, vocab, (n,), generator=gen)
        attention[i, :n] = 1
    loss_mask = attention.float()
    loss_mask[:, 0] = 0
    return {"input_ids": ids, "attention_mask": attention, "loss_mask": loss_mask}


def small_llama(path: str) -> str:
    """A random ~10M-parameter Llama (hidden 256, 4 layers) with the tiny tokenizer."""
    from rl_core.models import save_tiny_model

    return str(save_tiny_model(path, family="llama", hidden_size=256, intermediate_size=768, num_hidden_layers=4,
                               num_attention_heads=8, num_key_value_heads=4, head_dim=32, vocab_size=2048))


def compare(model_dir: str, args) -> None:
    common = {"use_ray": False, "dtype": args.dtype, "reference_model": False, "optimizer": {"lr": 1e-5}}
    padded_cfg = TrainBackendConfig(**common, micro_batch_size=args.micro_batch_size)
    packed_cfg = TrainBackendConfig(**common, packing={"enabled": True, "max_tokens_per_micro_batch": args.budget})
    from transformers import AutoConfig

    vocab = AutoConfig.from_pretrained(model_dir).vocab_size
    batch = skewed_batch(vocab, args.num_long, args.num_short, args.long_len, (args.short_min, args.short_max), 0)
    real_tokens = int(batch["attention_mask"].sum())
    print(f"batch: {batch['input_ids'].shape[0]} rows, {real_tokens} real tokens, padded width "
          f"{batch['input_ids'].shape[1]}; padded micro_batch_size={args.micro_batch_size}, packing budget={args.budget}")
    loss = MaskedNLL()
    times: dict[str, list[float]] = {"padded": [], "packed": []}
    with build_training_backend(padded_cfg, model_dir) as padded, build_training_backend(packed_cfg, model_dir) as packed:
        padded.train(batch, loss)  # warm-up both
        packed.train(batch, loss)
        for round_ in range(args.rounds):
            for name, backend in (("padded", padded), ("packed", packed)):
                start = time.perf_counter()
                backend.train(batch, loss)
                times[name].append(time.perf_counter() - start)
            print(f"round {round_ + 1}: padded {times['padded'][-1]:.2f} s, packed {times['packed'][-1]:.2f} s")
    med = {k: statistics.median(v) for k, v in times.items()}
    for name in ("padded", "packed"):
        print(f"{name}: median step {med[name]:.3f} s, {real_tokens / med[name]:.0f} training tokens/s")
    print(f"packing speed-up: {med['padded'] / med['packed']:.2f}x (target >= 1.5x)")


def peak_rss(args) -> None:
    import subprocess

    # Resolve (and on first use convert) the model in a child process: the conversion's memory must
    # not count in this process's peak RSS.
    model_dir = subprocess.run(
        [sys.executable, "-c", "from rl_core.models import resolve_model; print(resolve_model('smollm2-135m-instruct'))"],
        check=True, capture_output=True, text=True,
    ).stdout.strip().splitlines()[-1]
    cfg = TrainBackendConfig(use_ray=False, dtype=args.dtype, reference_model=False, micro_batch_size=16,
                             optimizer={"lr": 1e-5})
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(4, 49152, (16, 128), generator=gen)
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "loss_mask": torch.ones(16, 128)}
    with build_training_backend(cfg, model_dir) as policy:
        start = time.perf_counter()
        policy.train(batch, MaskedNLL())
        step = time.perf_counter() - start
    rss_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(f"SmolLM2-135M, {args.dtype}, batch 16 x 128, one worker: step {step:.1f} s, peak RSS {rss_gib:.2f} GiB")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="HF dir or short name (default: a small random Llama)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--num-long", type=int, default=2)
    parser.add_argument("--num-short", type=int, default=14)
    parser.add_argument("--long-len", type=int, default=512)
    parser.add_argument("--short-min", type=int, default=16)
    parser.add_argument("--short-max", type=int, default=96)
    parser.add_argument("--micro-batch-size", type=int, default=4)
    parser.add_argument("--budget", type=int, default=512, help="packing: tokens per micro-batch")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--rss", action="store_true", help="peak RSS of SmolLM2-135M training at 16 x 128")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} CPUs")
    if args.rss:
        peak_rss(args)
        return 0
    if args.model:
        from rl_core.models import resolve_model

        compare(resolve_model(args.model), args)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        compare(small_llama(tmp), args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
