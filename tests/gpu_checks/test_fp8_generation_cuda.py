"""FP8 generation on CUDA (skipped without a GPU): the native engine with ``quantization="fp8"`` in
bf16, its linears through ``torch._scaled_mm`` (per channel, SM 8.9+), against the same engine in
bf16 and against an HF model with the same FP8 linears; refit and sleep/wake on the GPU."""

from __future__ import annotations

import pytest
import torch

from rl_backends_gen.native import NativeEngine
from rl_core.fp8 import Fp8Linear, can_use_scaled_mm, quantize, quantize_linear_weights_, quantize_weight
from rl_core.fp8.numerics import activation_block
from rl_core.types import SamplingParams

pytestmark = pytest.mark.gpu

GREEDY = SamplingParams(max_new_tokens=24, temperature=0.0)


def fp8_engine(path: str, scheme: str = "per_channel") -> NativeEngine:
    return NativeEngine(path, dtype="bfloat16", device="cuda", max_batch_size=8, max_seq_len=128,
                        quantization="fp8", fp8_scheme=scheme)


def hf_logprobs(model, prompt, completion) -> torch.Tensor:
    """[len(completion)] logprobs of ``completion`` after ``prompt`` under ``model`` (one forward)."""
    ids = torch.tensor([list(prompt) + completion], device="cuda")
    with torch.no_grad():
        logprobs = torch.log_softmax(model(input_ids=ids).logits.float()[0], dim=-1)
    steps = logprobs[len(prompt) - 1 : len(prompt) - 1 + len(completion)]
    return steps.gather(-1, torch.tensor(completion, device="cuda")[:, None])[:, 0].cpu()


def test_cuda_fp8_engine_takes_scaled_mm_and_matches_the_quantized_hf_model(tiny_model_dir, tiny_prompts):
    from transformers import AutoModelForCausalLM

    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("torch._scaled_mm needs compute capability >= 8.9")
    engine = fp8_engine(tiny_model_dir)
    layer = engine.model.model.layers[0].mlp.down_proj
    assert isinstance(layer, Fp8Linear) and layer.weight.is_cuda
    x = torch.randn(4, layer.in_features, device="cuda", dtype=torch.bfloat16)
    assert can_use_scaled_mm(quantize(x, activation_block(layer.fp8_weight)), layer.fp8_weight)
    results = engine.generate(tiny_prompts, GREEDY)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.bfloat16,
                                                 attn_implementation="sdpa").to("cuda").eval()
    quantize_linear_weights_(model, "per_channel")
    worst = max(float((hf_logprobs(model, p, r[0].token_ids) - torch.tensor(r[0].logprobs)).abs().max())
                for p, r in zip(tiny_prompts, results))
    print(f"FP8 engine vs HF with the same FP8 linears (bf16, CUDA): |logprob diff| <= {worst:.2e}")
    assert worst <= 3e-2  # the bf16 engine's own bound against HF bf16 (test_native_cuda.py)
    engine.shutdown()


def test_cuda_fp8_greedy_mostly_equals_bf16_greedy(tiny_model_dir, tiny_prompts):
    fp8 = [r[0] for r in fp8_engine(tiny_model_dir).generate(tiny_prompts, GREEDY)]
    bf16 = [r[0] for r in NativeEngine(tiny_model_dir, dtype="bfloat16", device="cuda", max_batch_size=8,
                                       max_seq_len=128).generate(tiny_prompts, GREEDY)]
    agreed = [next((i for i, (a, b) in enumerate(zip(x.token_ids, y.token_ids)) if a != b), len(x.token_ids))
              for x, y in zip(fp8, bf16)]
    print(f"FP8 vs bf16 greedy on CUDA: tokens agreed before the first flip {agreed}")
    assert sum(agreed) >= 0.4 * sum(len(y.token_ids) for y in bf16)


@pytest.mark.parametrize("scheme", ["per_channel", "block"])
def test_cuda_fp8_refit_requantizes_in_place_and_sleep_wake_keep_it(scheme, tiny_model_dir, tiny_tokenizer,
                                                                   tiny_prompts):
    from rl_core.models import build_tiny_model

    engine = fp8_engine(tiny_model_dir, scheme)
    layer = engine.model.model.layers[1].self_attn.q_proj
    new = {k: v.float() for k, v in build_tiny_model(tiny_tokenizer, seed=1).state_dict().items()}
    engine.update_weights(new.items())
    expected = quantize_weight(new["model.layers.1.self_attn.q_proj.weight"].to(torch.bfloat16).cuda(), scheme)
    assert torch.equal(layer.weight.view(torch.uint8), expected.data.view(torch.uint8))
    assert torch.equal(layer.weight_scale, expected.scale)
    before = [r[0].token_ids for r in engine.generate(tiny_prompts, GREEDY)]
    engine.sleep()
    assert not layer.weight.is_cuda and layer.weight.dtype == torch.float8_e4m3fn  # moved to CPU memory
    engine.wake()
    assert layer.weight.is_cuda
    assert [r[0].token_ids for r in engine.generate(tiny_prompts, GREEDY)] == before
    engine.shutdown()
