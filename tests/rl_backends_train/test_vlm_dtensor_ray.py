"""Vision-language models on two FSDP2 ranks (Ray, gloo) equal one rank, for each tiny family; rank 1's shard
holds only text rows, so its forwards run the sharded vision tower on a dummy image to stay in step."""

from __future__ import annotations

import pytest
import torch
from backend_testlib import MaskedNLL
from vlm_testlib import FAMILIES, chats, image_module_prefixes, vlm_batch

from rl_backends_train import TrainBackendConfig, build_training_backend
from rl_core.batch import select
from rl_core.models.processor import load_processor

SMOOTH_ADAM = {"lr": 1e-3, "eps": 1e-3}  # see test_dtensor_local.py


def one_step(path, batch, **overrides):
    cfg = TrainBackendConfig(**({"optimizer": SMOOTH_ADAM, "reference_model": False, "micro_batch_size": 1} | overrides))
    with build_training_backend(cfg, path) as policy:
        before = policy.logprobs(batch)
        metrics = policy.train(batch, MaskedNLL())
        return before, metrics, dict(policy.named_weights()), policy.logprobs(batch)


@pytest.mark.parametrize("family", FAMILIES)
def test_two_ranks_equal_one_with_a_text_only_shard(ray_session, family, tmp_path):
    from rl_core.models.tiny_vlm import save_tiny_vlm

    path = str(save_tiny_vlm(tmp_path / family, family=family))
    image_one, image_two, text = chats()
    # Rows 0-1 (images) go to rank 0, rows 2-3 (text only) to rank 1; rank 0 plans two micro-batches of one row.
    batch = vlm_batch(load_processor(path), [image_one, image_two, text, text[:1] + [{"role": "assistant",
                                                                                      "content": "fine"}]])
    freeze = family == "qwen2_5_vl"  # one family also with a frozen vision tower (forward collectives only)
    single = one_step(path, batch, use_ray=False, freeze_vision=freeze)
    double = one_step(path, batch, num_workers=2, freeze_vision=freeze)
    for a, b in zip((single[0], single[3]), (double[0], double[3])):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
    assert single[1]["loss"] == pytest.approx(double[1]["loss"], rel=1e-6)
    assert single[1]["grad_norm"] == pytest.approx(double[1]["grad_norm"], rel=1e-5)
    for name, tensor in single[2].items():
        torch.testing.assert_close(double[2][name], tensor, rtol=0, atol=1e-6, msg=name)
    if freeze:
        initial = load_initial(path)
        vision = [n for n in initial if n.startswith(image_module_prefixes(family))]
        assert vision and all(torch.equal(double[2][n], initial[n]) for n in vision)
    # The text-only rows alone give the same logprobs as beside image rows.
    torch.testing.assert_close(single[0][2:], one_step(path, select(batch, [2, 3]), use_ray=False)[0], rtol=0,
                               atol=1e-6)


def load_initial(path) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForImageTextToText

    return dict(AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32).state_dict())
