"""The native engine with FP8 weights (``generation.quantization: fp8``), on CPU (the dequantized
reference matmul; ``torch._scaled_mm`` is checked in tests/gpu_checks/test_fp8_generation_cuda.py).

The reference for every check is an HF model whose linears went through the same
``rl_core.fp8.quantize_linear_weights_``: the engine must compute what that model computes."""

from __future__ import annotations

import pytest
import torch

from rl_backends_gen.native import NativeEngine
from rl_core.fp8 import E4M3, Fp8Linear, quantize_linear_weights_
from rl_core.types import SamplingParams

GREEDY = SamplingParams(max_new_tokens=12, temperature=0.0)
LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
           "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


@pytest.fixture(scope="module")
def fp8_engine(tiny_model_dir):
    engine = NativeEngine(tiny_model_dir, max_batch_size=8, max_seq_len=128, quantization="fp8")
    yield engine
    engine.shutdown()


def quantized_hf(path: str, load_hf_model, scheme: str = "per_channel", weights: dict | None = None):
    model = load_hf_model(path)
    if weights is not None:
        model.load_state_dict(weights, strict=False)
    quantize_linear_weights_(model, scheme)
    return model


def completions(engine, prompts, sampling=GREEDY):
    return [r[0] for r in engine.generate(prompts, sampling)]


def assert_computes_the_quantized_model(greedy, expected: list[torch.Tensor]) -> None:
    """The engine's logprobs of its completions equal the quantized reference's, but where an
    activation's rounding flips.

    Activations are quantized per token on the fly: where the engine's decode and the reference's full
    forward sum in a different order, an activation can round to the neighbouring e4m3 value, and that
    token (and, through its keys and values, the rest of its row) moves by up to ~1e-2 (measured: 2 of
    60 tokens off, by 4e-3 at most; how many depends on the CPU's kernels). Elsewhere the two agree; the
    unquantized model is ~4e-3 off at the median, so most tokens within 2e-4 tells them apart."""
    diff = torch.cat([(torch.tensor(c.logprobs) - e).abs() for c, e in zip(greedy, expected)])
    assert float(diff.max()) < 2e-2, diff
    assert float((diff <= 2e-4).float().mean()) >= 0.75, diff


def test_fp8_engine_converts_the_linears_and_keeps_head_embeddings_norms(fp8_engine, tiny_model_dir, load_hf_model):
    assert fp8_engine.fp8_layers == [f"model.layers.{i}.{name}" for i in range(2) for name in LINEARS]
    model, original = fp8_engine.model, load_hf_model(tiny_model_dir)
    assert type(model.lm_head) is torch.nn.Linear and model.lm_head.weight.dtype == torch.float32
    assert model.model.embed_tokens.weight.dtype == torch.float32
    assert model.model.norm.weight.dtype == torch.float32
    for fqn in fp8_engine.fp8_layers:
        layer, weight = model.get_submodule(fqn), original.get_submodule(fqn).weight.detach()
        assert isinstance(layer, Fp8Linear) and layer.weight.dtype == E4M3
        assert layer.weight_scale.shape == (weight.shape[0], 1)  # one scale per output channel
        # e4m3 round to nearest: relative error <= 2**-4 (normal range), absolute <= 2**-10 * scale below it.
        error = (layer.fp8_weight.dequantize() - weight).abs()
        assert bool((error <= weight.abs() * 2**-4 + layer.weight_scale * 2**-10 + 1e-12).all())
        assert float(error.max()) > 0  # it really is rounded


def test_fp8_engine_computes_what_the_quantized_model_computes(fp8_engine, tiny_model_dir, tiny_prompts,
                                                              load_hf_model, training_logprobs):
    greedy = completions(fp8_engine, tiny_prompts)
    reference = quantized_hf(tiny_model_dir, load_hf_model)
    expected = training_logprobs(reference, tiny_prompts, [c.token_ids for c in greedy], 1.0)
    assert_computes_the_quantized_model(greedy, expected)


def test_fp8_greedy_mostly_equals_full_precision_greedy(fp8_engine, llama_engine, tiny_prompts):
    fp8 = completions(fp8_engine, tiny_prompts)
    full = completions(llama_engine, tiny_prompts)
    # Tokens agree until the first flip (after it the rows see different prefixes): count the prefix
    # (measured: 46 of 60 tokens, the first flip after 7 tokens at the earliest).
    agreed = [next((i for i, (a, b) in enumerate(zip(x.token_ids, y.token_ids)) if a != b), len(x.token_ids))
              for x, y in zip(fp8, full)]
    assert sum(agreed) >= 0.5 * sum(len(x.token_ids) for x in full), agreed
    assert any(x.logprobs != y.logprobs for x, y in zip(fp8, full))


def test_fp8_refit_requantizes_the_new_weights(tiny_model_dir, tiny_tokenizer, tiny_prompts, load_hf_model,
                                               training_logprobs):
    from rl_core.models import build_tiny_model

    engine = NativeEngine(tiny_model_dir, max_batch_size=8, max_seq_len=128, quantization="fp8")
    layer = engine.model.model.layers[0].mlp.down_proj
    pointers = (layer.weight.data_ptr(), layer.weight_scale.data_ptr())
    old_scale = layer.weight_scale.clone()
    before = completions(engine, tiny_prompts)
    weights = {k: v.float() for k, v in build_tiny_model(tiny_tokenizer, seed=1).state_dict().items()}  # a new policy
    engine.update_weights(weights.items())
    after = completions(engine, tiny_prompts)
    assert [c.token_ids for c in after] != [c.token_ids for c in before]
    assert (layer.weight.data_ptr(), layer.weight_scale.data_ptr()) == pointers  # re-quantized in place
    assert not torch.equal(layer.weight_scale, old_scale)  # new scales, not the old ones reused
    # Exactly what a model holding the quantized new weights predicts:
    reference = quantized_hf(tiny_model_dir, load_hf_model, weights=weights)
    expected = training_logprobs(reference, tiny_prompts, [c.token_ids for c in after], 1.0)
    for completion, logprobs in zip(after, expected):
        torch.testing.assert_close(torch.tensor(completion.logprobs), logprobs, atol=2e-4, rtol=0)
    expected_layer = reference.model.layers[0].mlp.down_proj
    assert torch.equal(layer.weight.view(torch.uint8), expected_layer.weight.view(torch.uint8))
    assert torch.equal(layer.weight_scale, expected_layer.weight_scale)
    engine.shutdown()


def test_fp8_block_scheme_engine(tiny_model_dir, tiny_prompts, load_hf_model, training_logprobs):
    engine = NativeEngine(tiny_model_dir, max_batch_size=8, max_seq_len=128, quantization="fp8", fp8_scheme="block")
    up = engine.model.model.layers[0].mlp.up_proj  # [128, 64]: one 128 x 64 partial block
    assert up.scheme == "block" and up.weight_scale.shape == (1, 1)
    greedy = completions(engine, tiny_prompts)
    reference = quantized_hf(tiny_model_dir, load_hf_model, scheme="block")
    expected = training_logprobs(reference, tiny_prompts, [c.token_ids for c in greedy], 1.0)
    assert_computes_the_quantized_model(greedy, expected)
    engine.shutdown()


def test_fp8_engine_sleep_and_wake_keep_the_weights(fp8_engine, tiny_prompts):
    before = completions(fp8_engine, tiny_prompts)
    layer = fp8_engine.model.model.layers[1].self_attn.q_proj
    weight, scale = layer.weight.clone(), layer.weight_scale.clone()
    fp8_engine.sleep()
    fp8_engine.wake()
    assert layer.weight.dtype == E4M3 and torch.equal(layer.weight.view(torch.uint8), weight.view(torch.uint8))
    assert torch.equal(layer.weight_scale, scale)
    assert completions(fp8_engine, tiny_prompts) == before


@pytest.mark.parametrize("family", ["glm4_moe_lite", "qwen3_5_moe_text", "nemotron_h", "gpt_oss"])
def test_fp8_engine_on_families_computes_what_the_quantized_model_computes(family, tiny_family_dir, tiny_prompts,
                                                                          training_logprobs):
    """Latent attention (its ``kv_b_proj`` weight absorbed by the engine stays high precision), gated
    delta-net and Mamba mixers, MoE routers and 3-D experts (high precision), attention sinks."""
    from transformers import AutoModelForCausalLM

    from rl_backends_gen.native.fp8 import ENGINE_READS_WEIGHT
    from rl_core.fp8 import DEFAULT_SKIP_MODULES

    path = tiny_family_dir(family)
    engine = NativeEngine(path, max_batch_size=8, max_seq_len=128, quantization="fp8")
    assert engine.fp8_layers and not any(name.endswith(("kv_b_proj", "mlp.gate", "router")) for name in engine.fp8_layers)
    greedy = completions(engine, tiny_prompts)
    reference = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()  # GPT-OSS: no SDPA
    assert quantize_linear_weights_(reference, skip_modules=DEFAULT_SKIP_MODULES + ENGINE_READS_WEIGHT) == engine.fp8_layers
    expected = training_logprobs(reference, tiny_prompts, [c.token_ids for c in greedy], 1.0)
    assert_computes_the_quantized_model(greedy, expected)
