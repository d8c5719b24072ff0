"""rl-checkpoint and rl-eval on every model family (tiny random models of ``rl_core.models.tiny.FAMILIES``):
the DTensor trainer's checkpoint after a training step, converted with ``rl-checkpoint dcp-to-hf``, loads
in transformers with the trainer's weights bit for bit and its logprobs; ``rl-eval`` on the checkpoint
(converted on the fly) gives the report of the converted HF directory."""

from __future__ import annotations

import json

import pytest
import torch

from rl_algorithms.losses.nll import NLLLoss
from rl_backends_train import build_training_backend
from rl_backends_train.config import TrainBackendConfig
from rl_checkpoint.cli import main
from rl_core.models.tiny import FAMILIES

EVAL = ["sampling.n=2", "k_values=[1,2]", "sampling.max_new_tokens=5", "progress=false", "model_name=m",
        "datasets=[{data: {kind: procedural, size: 3}, grader: {name: arithmetic}}]"]


def a_batch() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    lengths = [12, 7, 20, 9]
    ids = torch.zeros(len(lengths), max(lengths), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, n in enumerate(lengths):
        ids[row, :n] = torch.randint(4, 500, (n,), generator=gen)
        mask[row, :n] = 1
    loss_mask = mask.float()
    loss_mask[:, :2] = 0
    return {"input_ids": ids, "attention_mask": mask, "loss_mask": loss_mask}


@pytest.mark.parametrize("family", FAMILIES)
def test_trained_checkpoint_to_hf_is_the_trained_model_and_evaluates_alike(family, tiny_family_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    from rl_eval.cli import main as eval_main

    batch = a_batch()
    cfg = TrainBackendConfig(use_ray=False, reference_model=False, optimizer={"lr": 1e-2})
    with build_training_backend(cfg, tiny_family_dir(family)) as policy:
        before = {name: w.clone() for name, w in policy.named_weights()}
        policy.train(batch, NLLLoss())
        weights = {name: w.clone() for name, w in policy.named_weights()}
        logprobs = policy.logprobs(batch)
        policy.save(str(tmp_path / "ckpt"))
    assert any(not torch.equal(weights[n], before[n]) for n in weights)  # the step moved the weights

    assert main(["dcp-to-hf", str(tmp_path / "ckpt"), str(tmp_path / "hf")]) == 0
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32).eval()
    state = model.state_dict()
    assert set(weights) <= set(state), sorted(set(weights) - set(state))
    for name, tensor in weights.items():
        assert torch.equal(state[name], tensor), name
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    expected = torch.log_softmax(logits[:, :-1], -1).gather(-1, batch["input_ids"][:, 1:, None])[..., 0]
    real = batch["attention_mask"][:, 1:].bool()
    torch.testing.assert_close(logprobs[:, 1:][real], expected[real], rtol=0, atol=1e-5)

    for name, model_dir in (("hf", tmp_path / "hf"), ("ckpt", tmp_path / "ckpt")):
        assert eval_main(EVAL + [f"model={model_dir}", f"report_path={tmp_path / f'{name}.json'}"]) == 0
    hf, ckpt = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("hf", "ckpt"))
    assert hf["results"] == ckpt["results"] and hf["summary"] == ckpt["summary"]
    assert hf["results"][0]["num_items"] == 3


def test_the_documented_matrix_says_so(documented_families):
    assert set(documented_families) == set(FAMILIES)
    assert all(row["rl-checkpoint, rl-eval"] == "yes" for row in documented_families.values())
