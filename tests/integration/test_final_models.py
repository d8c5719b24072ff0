"""Every run ends with a model and says where (issue 18): GRPO exports `hf/` like every other command
(LoRA: merged weights, plus the adapter alone in PEFT format), the best checkpoint's policy goes to
`hf_best/` with `checkpointing.keep_best`; every command that takes a model accepts a run directory, a
checkpoint step or its `policy/`, as the docs' `rl eval model=...` examples do."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

TINY_GRPO = ("grpo", "--config", "grpo_smoke_tiny", "grpo.batch_size=2", "grpo.num_generations_per_prompt=2",
             "grpo.max_new_tokens=4", "grpo.val_num_prompts=2")
DOCS = Path(__file__).parents[2] / "docs"


def weights(folder: Path) -> dict[str, torch.Tensor]:
    tensors = {}
    for path in sorted(folder.glob("*.safetensors")):
        tensors.update(load_file(str(path)))
    return tensors


def test_grpo_lora_exports_merged_model_adapter_and_best(rl, tmp_path):
    from rl_checkpoint import to_hf

    out = tmp_path / "run"
    result = rl(*TINY_GRPO, f"output_dir={out}", "grpo.max_steps=2", "grpo.val_every=1", "policy.lora.rank=4",
                "checkpointing.every_n_steps=1", "checkpointing.keep_last=1", "checkpointing.keep_best=1",
                "checkpointing.best_metric=val/reward_mean")
    assert result.code == 0, result.err
    assert f"model saved to {out / 'hf'}" in result.out.splitlines()
    assert f"LoRA adapter saved to {out / 'adapter'}" in result.out.splitlines()

    adapter = load_file(str(out / "adapter" / "adapter_model.safetensors"))
    assert adapter and all(".lora_A." in name or ".lora_B." in name for name in adapter)
    assert json.loads((out / "adapter" / "adapter_config.json").read_text())["r"] == 4
    merged = weights(out / "hf")
    assert merged and not any("lora" in name for name in merged)

    # The best of the checkpoints by val/reward_mean (ties: the later one), converted, is hf_best.
    scores = {}
    for state_file in (out / "checkpoints").glob("step_*/trainer_state.json"):
        state = json.loads(state_file.read_text())
        scores[state_file.parent] = (state["metrics"]["val/reward_mean"], state["step"])
    best = max(scores, key=scores.get)
    [line] = [line for line in result.out.splitlines() if line.startswith("best model")]
    assert line == (f"best model ({best.name}, val/reward_mean={scores[best][0]:.4g}) saved to {out / 'hf_best'}")
    to_hf(best / "policy", tmp_path / "best_converted")
    expected, exported = weights(tmp_path / "best_converted"), weights(out / "hf_best")
    assert expected.keys() == exported.keys()
    for name, tensor in exported.items():
        torch.testing.assert_close(tensor, expected[name], rtol=0, atol=1e-6, msg=name)


@pytest.mark.parametrize("command", ["sft", "dpo", "rm", "distill", "xtoken-distill"])
def test_every_training_command_says_where_its_model_is(command, rl, tmp_path):
    recipes = {"sft": "sft_tiny", "dpo": "dpo_tiny", "rm": "rm_tiny", "distill": "distill_tiny",
               "xtoken-distill": "xtoken_tiny"}
    section = {"xtoken-distill": "xtoken"}.get(command, command)
    out = tmp_path / "run"
    result = rl(command, "--config", recipes[command], f"output_dir={out}", f"{section}.max_steps=1",
                f"{section}.val_every=0")
    assert result.code == 0, result.err
    assert f"model saved to {out / 'hf'}" in result.out.splitlines()
    assert (out / "hf" / "config.json").is_file() and weights(out / "hf")


def test_without_export_the_model_is_the_last_checkpoint(rl, tmp_path):
    out = tmp_path / "run"
    result = rl("sft", "--config", "sft_tiny", f"output_dir={out}", "sft.max_steps=1", "sft.val_every=0",
                "export_hf=false")
    assert result.code == 0, result.err
    assert f"model saved to {out / 'checkpoints' / 'step_000001' / 'policy'}" in result.out
    assert not (out / "hf").exists()


@pytest.fixture(scope="module")
def tiny_grpo_run(tmp_path_factory):
    """A finished 5-step tiny GRPO run laid out as the docs' examples say: ``runs/grpo`` with its
    checkpoint ``checkpoints/step_000005`` and its final ``hf/``."""
    from rl_apps.cli import main

    root = tmp_path_factory.mktemp("docs")
    out = root / "runs" / "grpo"
    assert main([*TINY_GRPO, f"output_dir={out}", "grpo.max_steps=5", "grpo.val_every=0", "logger.plot=false",
                 "logger.tensorboard=false"]) == 0
    assert (out / "checkpoints" / "step_000005" / "policy").is_dir() and (out / "hf").is_dir()
    return root


def docs_commands(page: str, prefix: str) -> list[str]:
    """The command lines of ``docs/<page>`` that start with ``prefix``, without their comments."""
    text = (DOCS / page).read_text()
    return [re.sub(r"\s+#.*$", "", line).strip() for line in text.splitlines() if line.startswith(prefix)]


def test_docs_eval_examples_run_on_the_real_layout(tiny_grpo_run, rl, monkeypatch):
    lines = docs_commands("eval.md", "rl eval model=") + docs_commands("checkpoint.md", "rl eval model=")
    assert {"runs/grpo", "runs/grpo/checkpoints/step_000005", "runs/grpo/hf"} <= {
        shlex.split(line)[2].removeprefix("model=") for line in lines}
    monkeypatch.chdir(tiny_grpo_run)
    for line in lines:
        argv = shlex.split(line)[1:]
        result = rl(*argv, "--config", "eval_tiny")  # the docs' model, on the tiny offline dataset
        assert result.code == 0, f"{line}\n{result.err}"
        name = Path(argv[1].removeprefix("model=")).name
        assert re.search(rf"^model={name} dataset=arithmetic-tiny .* pass@1 score=", result.out, re.M), result.out


@pytest.mark.parametrize("model", ["runs/grpo", "runs/grpo/checkpoints/step_000005",
                                   "runs/grpo/checkpoints/step_000005/policy"])
def test_a_training_command_starts_from_a_run_step_or_policy_dir(model, tiny_grpo_run, rl, monkeypatch, tmp_path):
    from rl_checkpoint import to_hf

    monkeypatch.chdir(tiny_grpo_run)
    result = rl("sft", "--config", "sft_tiny", f"model={model}", f"output_dir={tmp_path / 'sft'}", "sft.max_steps=1",
                "sft.val_every=0", "policy.optimizer.lr=0.0", "checkpointing.enabled=false")
    assert result.code == 0, result.err
    # lr 0: the exported model is the checkpoint the run started from.
    to_hf(tiny_grpo_run / "runs/grpo/checkpoints/step_000005/policy", tmp_path / "expected")
    started, exported = weights(tmp_path / "expected"), weights(tmp_path / "sft" / "hf")
    assert started.keys() == exported.keys()
    for name, tensor in exported.items():
        assert torch.equal(tensor, started[name]), name
