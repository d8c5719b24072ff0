"""`rl grpo` for 3 steps with the policy and the native engine colocated on one GPU, CUDA memory recorded
after every phase (generate, engine asleep, logprobs, train, engine awake, refit) and written to
``grpo_memory.txt`` in the report folder."""

from __future__ import annotations

import math

import pytest
import torch

pytestmark = pytest.mark.gpu

GiB = 2**30
STEPS = 3


class MemoryProbe:
    """Forwards every attribute to ``target``; after each call of a method named in ``phases`` it records
    (phase, GiB allocated by this process, GiB reserved by it, GiB used on the device by every process)."""

    def __init__(self, target, phases: dict[str, str], log: list[tuple[str, float, float, float]]):
        self._target, self._phases, self._log = target, phases, log

    def __getattr__(self, name):
        attribute = getattr(self._target, name)
        phase = self._phases.get(name)
        if phase is None or not callable(attribute):
            return attribute

        def probed(*args, **kwargs):
            result = attribute(*args, **kwargs)
            torch.cuda.synchronize()
            free, total = torch.cuda.mem_get_info()
            self._log.append((phase, torch.cuda.memory_allocated() / GiB, torch.cuda.memory_reserved() / GiB,
                              (total - free) / GiB))
            return result

        return probed


def test_three_colocated_grpo_steps_with_memory_per_phase(tiny_model_dir, tmp_path, monkeypatch, report_dir):
    import rl_apps.commands.grpo as grpo_command
    import rl_apps.run_setup as run_setup
    from rl_apps import recipe_path
    from rl_apps.cli import main
    from rl_core.logging import read_jsonl_metrics

    log: list[tuple[str, float, float, float]] = []
    # The policy is built by the run (run_setup.Run.backend), the engine by the command.
    build_policy, build_generation = run_setup.build_training_backend, grpo_command.build_generation_backend
    monkeypatch.setattr(run_setup, "build_training_backend", lambda *a, **k: MemoryProbe(
        build_policy(*a, **k), {"logprobs": "logprobs", "train": "train"}, log))
    monkeypatch.setattr(grpo_command, "build_generation_backend", lambda *a, **k: MemoryProbe(
        build_generation(*a, **k), {"generate": "generate", "sleep": "engine asleep", "wake": "engine awake",
                                    "update_weights": "refit"}, log))
    out = tmp_path / "run"
    code = main(["grpo", "--config", recipe_path("grpo_smoke_tiny.yaml"), f"output_dir={out}",
                 f"grpo.max_steps={STEPS}", "grpo.val_every=0", "grpo.placement=colocated", "generation.device=cuda",
                 "logger.progress_bar=false", "logger.tensorboard=false", "logger.plot=false"])
    assert code == 0
    train = [r for r in read_jsonl_metrics(out / "metrics.jsonl") if "train/skipped" in r]
    assert [r["step"] for r in train] == list(range(1, STEPS + 1))
    assert all(math.isfinite(r["train/loss"]) for r in train if r["train/skipped"] == 0.0)

    lines = [f"{'phase':<14} {'allocated GiB':>13} {'reserved GiB':>12} {'device used GiB':>15}"]
    lines += [f"{phase:<14} {alloc:13.3f} {reserved:12.3f} {used:15.3f}" for phase, alloc, reserved, used in log]
    (report_dir / "grpo_memory.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    phases = [phase for phase, *_ in log]
    assert phases.count("generate") >= STEPS and phases.count("engine asleep") == STEPS
    assert phases.count("refit") == sum(r["train/skipped"] == 0.0 for r in train)
    # The native engine's sleep() moves its weights and KV cache off the GPU: allocated memory drops.
    for index, phase in enumerate(phases):
        if phase == "engine asleep":
            generated = [alloc for p, alloc, *_ in log[:index] if p == "generate"][-1]
            assert log[index][1] < generated, log[index]
