"""LoRA on CUDA: adapters trained, merged into HF-named weights and refit into the native engine on the
GPU, which then generates what HF generates with the merged weights."""

from __future__ import annotations

import pytest
from backend_testlib import MaskedNLL, make_batch

from rl_backends_gen.hf import HFGenerationBackend
from rl_backends_gen.native import NativeEngine
from rl_backends_train import TrainBackendConfig, build_training_backend
from rl_core.types import SamplingParams

pytestmark = pytest.mark.gpu

VOCAB = 500
GREEDY = SamplingParams(max_new_tokens=24, temperature=0.0)
LORA = {"rank": 4, "alpha": 8.0, "target_modules": ["q_proj", "v_proj", "down_proj"]}


def test_lora_merge_and_refit_into_the_native_engine_on_cuda(tiny_model_dir, tiny_prompts):
    cfg = TrainBackendConfig(use_ray=False, reference_model=False, optimizer={"lr": 5e-2}, lora=LORA)
    batch = make_batch(VOCAB, [12, 9, 15, 6])
    with build_training_backend(cfg, tiny_model_dir) as policy:
        for _ in range(3):
            metrics = policy.train(batch, MaskedNLL())
        merged = dict(policy.named_weights())
    assert metrics["grad_norm"] > 0
    engine = NativeEngine(tiny_model_dir, device="cuda", max_batch_size=8, max_seq_len=128)
    before = engine.generate(tiny_prompts, GREEDY)
    engine.update_weights(merged.items())
    after = engine.generate(tiny_prompts, GREEDY)
    engine.shutdown()
    reference = HFGenerationBackend(tiny_model_dir, device="cuda", batch_size=1)
    reference.update_weights(merged.items())
    expected = reference.generate(tiny_prompts, GREEDY)
    assert [r[0].token_ids for r in after] == [r[0].token_ids for r in expected]
    assert max(abs(a - b) for r, e in zip(after, expected) for a, b in zip(r[0].logprobs, e[0].logprobs)) <= 1e-4
    moved = max(abs(a - b) for r, s in zip(after, before) for a, b in zip(r[0].logprobs, s[0].logprobs))
    assert moved > 1e-3  # the refit reached the engine
