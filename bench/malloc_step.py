"""malloc-step: the main recipe's reference forward and training step with glibc's malloc keeping freed
memory (`cluster.malloc: retain`, the default on CPU) and with glibc's defaults (`system`), same run.

    python bench/malloc_step.py                 # 2 rounds x 3 calls per mode
    python bench/malloc_step.py --rounds 1 --calls 2

One process per mode and round (the setting lasts for a process), the modes alternating. Each builds
the DTensor backend with the recipe's policy settings (SmolLM2-135M-Instruct, fp32, packed groups of
one prompt and its answers, a reference model) and times `reference_logprobs` and `train` on the same
GRPO-shaped batch: 16 prompts of 58 tokens x 6 answers of 20-32 tokens (random ids, seeded), the recipe's
loss (clip 0.2 / 0.28, KL 0.04). The first call of a process is timed too (it faults the most in).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import time

CHILD = "--child"


def child(mode: str, calls: int) -> None:
    import torch
    import yaml

    from rl_algorithms.grpo.config import LossConfig
    from rl_apps import recipe_path
    from rl_apps.run_setup import use_process_settings
    from rl_backends_train import TrainBackendConfig, build_training_backend
    from rl_core.cluster import ClusterConfig
    from rl_core.models import resolve_model

    use_process_settings(ClusterConfig(malloc=mode))  # as `rl` commands do: this process and its in-process rank
    with open(recipe_path("grpo_arithmetic_smollm2")) as f:
        recipe = yaml.safe_load(f)
    policy_cfg = TrainBackendConfig(**(recipe["policy"] | {"reference_model": True}))
    loss_fn = LossConfig(**recipe["loss"]).build()
    temperature = recipe["grpo"]["temperature"]
    rng = random.Random(0)
    gen = torch.Generator().manual_seed(0)
    rows = []
    for _ in range(16):
        prompt = torch.randint(4, 49152, (58,), generator=gen)
        rows += [torch.cat([prompt, torch.randint(4, 49152, (rng.randint(20, 32),), generator=gen)]) for _ in range(6)]
    width = max(len(r) for r in rows)
    batch = {"input_ids": torch.zeros(len(rows), width, dtype=torch.long),
             "attention_mask": torch.zeros(len(rows), width, dtype=torch.long),
             "loss_mask": torch.zeros(len(rows), width), "advantages": torch.randn(len(rows), generator=gen),
             "rewards": torch.rand(len(rows), generator=gen)}
    for i, row in enumerate(rows):
        batch["input_ids"][i, :len(row)] = row
        batch["attention_mask"][i, :len(row)] = 1
        batch["loss_mask"][i, 58:len(row)] = 1.0
    times: dict[str, list[float]] = {"reference": [], "train": []}
    with build_training_backend(policy_cfg, str(resolve_model(recipe["model"]))) as policy:
        for _ in range(calls):
            start = time.perf_counter()
            batch["ref_logprobs"] = policy.reference_logprobs(batch, temperature=temperature, loss_tokens_only=True)
            times["reference"].append(time.perf_counter() - start)
            start = time.perf_counter()
            policy.train(batch, loss_fn, temperature=temperature)
            times["train"].append(time.perf_counter() - start)
    print(json.dumps(times))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--calls", type=int, default=3, help="reference + train calls per process")
    args = parser.parse_args()
    results: dict[str, dict[str, list[float]]] = {m: {"reference": [], "train": []} for m in ("system", "retain")}
    for round_ in range(args.rounds):
        for mode in ("system", "retain"):
            done = subprocess.run([sys.executable, __file__, CHILD, mode, str(args.calls)], capture_output=True,
                                  text=True, check=True)
            times = json.loads(done.stdout.strip().splitlines()[-1])
            print(f"round {round_ + 1} {mode:>6}: reference " + ", ".join(f"{t:.2f}" for t in times["reference"])
                  + " s; train " + ", ".join(f"{t:.2f}" for t in times["train"]) + " s", flush=True)
            for key, values in times.items():
                results[mode][key] += values
    print(f"\n{'mode':>7} {'reference (s)':>14} {'train (s)':>10}  (means over every call)")
    for mode, times in results.items():
        print(f"{mode:>7} {statistics.fmean(times['reference']):14.2f} {statistics.fmean(times['train']):10.2f}")
    ratio = statistics.fmean(results["retain"]["train"]) / statistics.fmean(results["system"]["train"])
    print(f"train, retain / system: {ratio:.2f}x")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == CHILD:
        child(sys.argv[2], int(sys.argv[3]))
    else:
        main()
