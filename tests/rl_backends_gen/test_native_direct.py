"""The engine's own decode forward on CPU (``native/direct.py``: Llama-style decoders; ``direct_qwen3_5.py``:
Qwen3.5's hybrid layers) computes what transformers' forward computes: bitwise on the same weights, and the
same generations."""

from __future__ import annotations

import pytest
import torch

from rl_backends_gen.config import GenerationConfig, SpeculativeConfig
from rl_backends_gen.local import build_local_backend
from rl_backends_gen.native import NativeEngine
from rl_backends_gen.native.steps import DecodeStep
from rl_core.types import SamplingParams

SAMPLING = SamplingParams(max_new_tokens=20, temperature=1.0, n=2, seed=5)
NGRAM = SpeculativeConfig(method="ngram", num_tokens=3, ngram={"min_n": 1, "max_n": 3}, max_batch_rows=4096)


@pytest.fixture(scope="module")
def tiny_mistral_dir(tmp_path_factory, tiny_tokenizer):
    from transformers import AutoConfig, AutoModelForCausalLM

    from rl_core.models.tiny import tiny_model_config

    llama = tiny_model_config(tiny_tokenizer, "llama").to_dict()
    keys = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "head_dim", "eos_token_id", "pad_token_id", "bos_token_id")
    config = AutoConfig.for_model("mistral", sliding_window=None, **{key: llama[key] for key in keys if key in llama})
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("tiny-mistral")
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(path)
    tiny_tokenizer.save_pretrained(path)
    return str(path)


def _outputs(engine: NativeEngine, prompts) -> list:
    return [c for samples in engine.generate(prompts, SAMPLING) for c in samples]


def _assert_same_generations(got: list, want: list) -> None:
    """The same tokens; float32 logprobs within rounding (packed weights sit at another alignment)."""
    assert [c.token_ids for c in got] == [c.token_ids for c in want]
    assert max(abs(a - b) for g, w in zip(got, want) for a, b in zip(g.logprobs, w.logprobs)) <= 1e-6
    assert sum(len(c.token_ids) for c in got) > 4 * len(got)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3", "mistral", "qwen3_moe", "mixtral", "qwen3_5_text",
                                    "qwen3_5_moe_text"])
def test_a_direct_decode_step_equals_the_transformers_forward_bitwise(family, dtype, tiny_family_dir,
                                                                     tiny_mistral_dir):
    """One engine, its weights: decode steps of 1-3 rows at different positions, 1 and 4 queries per row
    (a plain step, a speculative verification; 1 for Qwen3.5, whose recurrent layers refuse speculation),
    through both forwards from the same cache, which both leave the same (recurrent states updated in place)."""
    path = tiny_mistral_dir if family == "mistral" else tiny_family_dir(family)
    engine = NativeEngine(path, dtype=dtype, max_batch_size=3, max_seq_len=64)
    direct = engine.direct_decode
    assert direct is not None
    engine.cache.ensure_clean(64)
    generator = torch.Generator().manual_seed(0)
    for buffer in engine.cache.buffers():  # a cache of earlier positions (keys, values, recurrent states)
        buffer.copy_(torch.randn(buffer.shape, generator=generator) * 0.5)
    widths = [1] if family.startswith("qwen3_5") else [1, 4]
    with torch.inference_mode():
        for rows, queries, position in [(1, 1, 9), (3, 1, 30), (2, 4, 17), (3, 4, 40)]:
            if queries not in widths:
                continue
            tokens = torch.randint(0, engine.vocab_size, (rows, queries), generator=generator)
            positions = position - torch.arange(rows)[:, None] * 3 + torch.arange(queries)  # rows of different lengths
            before = [buffer.clone() for buffer in engine.cache.buffers()]
            hidden, after = {}, {}
            for name, forward in (("direct", direct), ("transformers", None)):
                for buffer, saved in zip(engine.cache.buffers(), before):
                    buffer.copy_(saved)
                engine.direct_decode = forward
                step = DecodeStep(engine.cache, positions[:, 0] if queries == 1 else positions)
                hidden[name] = engine._forward(tokens, positions, step)
                after[name] = [buffer.clone() for buffer in engine.cache.buffers()]
            assert torch.equal(hidden["direct"], hidden["transformers"]), (rows, queries)
            assert all(torch.equal(a, b) for a, b in zip(after["direct"], after["transformers"]))
            assert not all(torch.equal(a, b) for a, b in zip(after["direct"], before))  # the step wrote its cache
            engine.direct_decode = direct


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3_moe", "qwen3_5_text", "qwen3_5_moe_text"])
def test_generations_with_and_without_the_direct_forward_agree(family, tiny_family_dir, tiny_prompts):
    # 3 rows for 5 prompts x 2 samples: rows join and leave (continuous batching) at different positions.
    path = tiny_family_dir(family)
    direct = NativeEngine(path, max_batch_size=3, max_seq_len=96)
    plain = build_local_backend(GenerationConfig(max_batch_size=3, max_seq_len=96, direct_decode=False), path)
    assert plain.direct_decode is None  # generation.direct_decode reaches the engine
    _assert_same_generations(_outputs(direct, tiny_prompts), _outputs(plain, tiny_prompts))


def test_speculative_verification_runs_the_direct_forward(tiny_model_dir, tiny_prompts):
    """A verification forward is q = k + 1 queries per row: the direct forward's [R, q] shapes."""
    direct = NativeEngine(tiny_model_dir, max_batch_size=4, max_seq_len=96, speculative=NGRAM)
    plain = NativeEngine(tiny_model_dir, max_batch_size=4, max_seq_len=96, speculative=NGRAM, direct_decode=False)
    widths = []
    forward = direct.direct_decode.forward
    direct.direct_decode.forward = lambda tokens, rotary, step: widths.append(tokens.shape[1]) or forward(tokens, rotary,
                                                                                                       step)
    _assert_same_generations(_outputs(direct, tiny_prompts), _outputs(plain, tiny_prompts))
    assert max(widths) == NGRAM.num_tokens + 1  # some steps verified proposals through it


@pytest.mark.parametrize("family", ["llama", "qwen3_5_text"])
def test_packed_weights_are_the_models_own_and_follow_a_refit(family, tiny_family_dir, tiny_prompts):
    """The packed weights (q/k/v, gate/up; Qwen3.5's delta-net input projections) are row slices of the packs (no
    second copy), so a refit's in-place copy reaches the direct forward: after the same new weights both engines
    still agree."""
    path = tiny_family_dir(family)
    direct = NativeEngine(path, max_batch_size=4, max_seq_len=96)
    plain = NativeEngine(path, max_batch_size=4, max_seq_len=96, direct_decode=False)
    for layer, packed in zip(direct.decoder.layers, direct.direct_decode.layers):
        mlp = layer.mlp
        assert mlp.up_proj.weight.data_ptr() == packed.mlp.gate_up_weight[mlp.gate_proj.out_features].data_ptr()
        if getattr(layer, "linear_attn", None) is not None:
            mixer, pack, first = layer.linear_attn, packed.weight, layer.linear_attn.conv_dim
            assert mixer.in_proj_z.weight.data_ptr() == pack[first].data_ptr()
            assert mixer.in_proj_a.weight.data_ptr() == pack[-mixer.num_v_heads].data_ptr()
        else:
            attention = layer.self_attn
            pack = packed.weight if family == "qwen3_5_text" else packed.qkv_weight
            assert attention.k_proj.weight.data_ptr() == pack[attention.q_proj.out_features].data_ptr()
    before = _outputs(direct, tiny_prompts)
    generator = torch.Generator().manual_seed(1)
    new = {name: tensor + 0.05 * torch.randn(tensor.shape, generator=generator)
           for name, tensor in plain.model.state_dict().items() if "proj" in name and name.endswith(".weight")}
    direct.update_weights(new.items())
    plain.update_weights(new.items())
    after = _outputs(direct, tiny_prompts)
    _assert_same_generations(after, _outputs(plain, tiny_prompts))
    assert [c.token_ids for c in after] != [c.token_ids for c in before]


@pytest.mark.parametrize("family", ["gemma3_text", "nemotron_h", "glm4_moe_lite", "gpt_oss"])
def test_other_families_keep_the_transformers_forward(family, tiny_family_dir):
    """Gemma's norms, Nemotron-H's Mamba-2 blocks, GLM's latent attention and GPT-OSS's sinks are layers the direct
    forward does not reproduce."""
    assert NativeEngine(tiny_family_dir(family), max_batch_size=2, max_seq_len=64).direct_decode is None


def test_a_routing_record_keeps_the_transformers_forward(tiny_family_dir):
    """The routing record's hooks sit on transformers' decoder forward, which the direct forward skips."""
    path = tiny_family_dir("qwen3_moe")
    assert NativeEngine(path, max_batch_size=2, max_seq_len=64).direct_decode is not None
    assert NativeEngine(path, max_batch_size=2, max_seq_len=64, record_routing=True).direct_decode is None
