"""fp8-step: DTensor training step time with FP8 linears (torchao float8) against bf16, one CUDA GPU.

    python bench/fp8_step.py                                  # SmolLM2-135M shape, tensorwise, 16 x 512 tokens
    python bench/fp8_step.py --recipes tensorwise rowwise --rows 32 --length 1024

The model is SmolLM2-135M's architecture with random weights (a device machine cannot download it;
the matmuls are the same). Every variant is one in-process DTensor policy (FSDP2 on one GPU, bf16
compute, fp32 masters, AdamW); after a warm-up step each, the variants take turns step by step
(interleaved A/B, so clock and thermal drift hit all alike) and the median step time is shown with
its ratio to bf16 (> 1: FP8 is faster). No torch.compile: torchao's casts run as separate kernels,
which on a model this small can cost more than the FP8 matmuls save.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch
from gen_gpu import smollm2_shaped_model  # bench/ is on sys.path when this file is run


class TokenNLL:
    """Mean NLL over the loss mask (global token count), the shape of an SFT/GRPO token loss."""

    needs_logits = False

    def __call__(self, outputs, batch, normalizer):
        loss = -(outputs.logprobs * batch["loss_mask"]).sum() / normalizer.num_valid_tokens
        return loss, {}


def make_batch(rows: int, length: int, vocab: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(100, vocab, (rows, length), generator=generator)
    loss_mask = torch.ones(rows, length)
    loss_mask[:, : length // 4] = 0.0  # a prompt the loss does not read
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "loss_mask": loss_mask}


def main() -> int:
    from rl_backends_train import TrainBackendConfig, build_training_backend

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipes", nargs="+", default=["tensorwise"],
                        choices=["tensorwise", "rowwise", "rowwise_with_gw_hp", "blockwise"])
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--micro-batch-size", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("fp8_step.py needs a CUDA GPU")
    model_path = smollm2_shaped_model(tempfile.mkdtemp(prefix="fp8-step-"))
    batch = make_batch(args.rows, args.length, 49152)
    print(f"# fp8-step  {torch.cuda.get_device_name()}  torch {torch.__version__}  SmolLM2-135M shape  "
          f"batch {args.rows} x {args.length}  micro-batch {args.micro_batch_size}")
    common = {"use_ray": False, "gpus_per_worker": 1, "dtype": "bfloat16", "reference_model": False,
              "micro_batch_size": args.micro_batch_size, "optimizer": {"lr": 1e-5}}
    variants = {"bf16": TrainBackendConfig(**common)}
    for recipe in args.recipes:
        variants[f"fp8-{recipe}"] = TrainBackendConfig(**common, precision={"linear": "fp8", "recipe": recipe})
    policies = {name: build_training_backend(cfg, model_path) for name, cfg in variants.items()}
    try:
        losses = {name: policy.train(batch, TokenNLL())["loss"] for name, policy in policies.items()}  # warm-up
        times: dict[str, list[float]] = {name: [] for name in policies}
        for _ in range(args.rounds):
            for name, policy in policies.items():
                torch.cuda.synchronize()
                start = time.perf_counter()
                policy.train(batch, TokenNLL())  # returns floats: the step has finished
                times[name].append(time.perf_counter() - start)
    finally:
        for policy in policies.values():
            policy.shutdown()
    base = statistics.median(times["bf16"])
    tokens = args.rows * args.length
    print(f"{'variant':<26}{'step s (median)':>16}{'tokens/s':>12}{'vs bf16':>9}{'first loss':>12}")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"{name:<26}{median:>16.4f}{tokens / median:>12.0f}{base / median:>8.2f}x{losses[name]:>12.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
