"""The mismatch of FP8 generation against bf16 training, measured and corrected on a tiny model.

Generation: an HF model whose linear layers hold FP8 weights with per-channel scales and quantize
their activations per token (``rl_core.fp8.quantize_linear_weights_``, what an FP8 engine computes),
sampling at temperature 1. Training: the DTensor backend in bf16 (fp32 masters). The engine's
logprobs become ``gen_logprobs``, the trainer's ``prev_logprobs``; the mismatch metrics are those
GRPO logs every step (``train/token_mult_prob_error``, ``train/gen_kl_error``), and the GRPO step runs
with the importance-sampling correction on (``loss.importance_sampling``).
"""

from __future__ import annotations

import pytest
import torch

from rl_algorithms.grpo import ImportanceSamplingConfig, LossConfig
from rl_algorithms.losses import mismatch_metrics
from rl_backends_train import TrainBackendConfig, build_training_backend
from rl_core.fp8 import Fp8Linear, quantize_linear_weights_

PROMPT, NEW_TOKENS, ROWS = 8, 24, 16
GEN_KL_BOUND = 0.05  # NeMo RL's published bound for FP8-class rollouts


@pytest.fixture(scope="module")
def peaked_model_dir(tmp_path_factory):
    """A tiny Llama with weights drawn at std 0.1 instead of 0.02, so its next-token distributions are
    not near uniform (entropy ~5.9 nats of log(500) = 6.2) and rounding moves them measurably."""
    from rl_core.models import save_tiny_model

    return str(save_tiny_model(tmp_path_factory.mktemp("tiny-llama-peaked"), initializer_range=0.1))


def fp8_rollouts(model_dir: str) -> dict[str, torch.Tensor]:
    """ROWS sampled continuations of random prompts from the FP8 model, with its logprobs [B, T]."""
    from transformers import AutoModelForCausalLM

    engine = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    converted = quantize_linear_weights_(engine, "per_channel")
    assert len(converted) == 14 and isinstance(engine.model.layers[0].mlp.down_proj, Fp8Linear)
    gen = torch.Generator().manual_seed(0)
    prompts = torch.randint(4, 500, (ROWS, PROMPT), generator=gen)
    torch.manual_seed(0)
    with torch.no_grad():
        ids = engine.generate(prompts, attention_mask=torch.ones_like(prompts), do_sample=True, top_k=0, top_p=1.0,
                              temperature=1.0, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, pad_token_id=3)
        logits = engine(ids).logits.float()
    scored = torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None])[..., 0]  # row t-1 scores token t
    loss_mask = torch.zeros(ids.shape)
    loss_mask[:, PROMPT:] = 1.0
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "loss_mask": loss_mask,
            "gen_logprobs": torch.nn.functional.pad(scored, (1, 0))}


def test_fp8_generation_against_bf16_training_is_within_the_bound_and_corrected(peaked_model_dir):
    batch = fp8_rollouts(peaked_model_dir)
    batch["advantages"] = torch.linspace(-1.0, 1.0, ROWS)
    cfg = TrainBackendConfig(use_ray=False, dtype="bfloat16", reference_model=False, micro_batch_size=8,
                             optimizer={"lr": 1e-3})
    corrected = LossConfig(importance_sampling=ImportanceSamplingConfig()).build()
    with build_training_backend(cfg, peaked_model_dir) as policy:
        batch["prev_logprobs"] = policy.logprobs(batch)
        measured = mismatch_metrics(batch["prev_logprobs"], batch["gen_logprobs"], batch["loss_mask"])
        step = policy.train(batch, corrected)
    with build_training_backend(cfg, peaked_model_dir) as policy:
        uncorrected = policy.train(batch, LossConfig().build())

    # Measured on this model: gen_kl_error ~0.004, token_mult_prob_error ~1.07 (FP8 vs bf16).
    assert 1e-4 < measured["gen_kl_error"] < GEN_KL_BOUND
    assert 1.01 < measured["token_mult_prob_error"] < 1.5
    # The GRPO step reports the same figures...
    assert step["gen_kl_error"] == pytest.approx(measured["gen_kl_error"], rel=1e-4)
    assert step["token_mult_prob_error"] == pytest.approx(measured["token_mult_prob_error"], rel=1e-4)
    # ...and weighted each token's loss by clamp(pi_old / pi_gen, 0, 2).
    mask = batch["loss_mask"]
    weights = torch.exp(batch["prev_logprobs"] - batch["gen_logprobs"]).clamp(0.0, 2.0)
    assert step["is_weight_mean"] == pytest.approx(float((weights * mask).sum() / mask.sum()), rel=1e-4)
    assert float(((weights - 1).abs() * mask).max()) > 0.05  # E_gen[pi_old / pi_gen] = 1: the mean stays ~1
    assert "is_weight_mean" not in uncorrected and step["loss"] != pytest.approx(uncorrected["loss"], rel=1e-4)
