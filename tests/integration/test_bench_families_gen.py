"""bench/families_gen.py: the SmolLM2-sized hybrid and MoE models it benchmarks, and its --tiny mode end to end;
bench/families_profile.py's --tiny and --kernels modes."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "families_gen.py"


def load(name: str = "families_gen"):
    spec = importlib.util.spec_from_file_location(name, SCRIPT.parent / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_benchmarked_models_have_smollm2s_size():
    from rl_core.models.tiny import build_tiny_tokenizer, tiny_model_config

    bench, tokenizer = load(), build_tiny_tokenizer()
    hybrid = tiny_model_config(tokenizer, "qwen3_5_text", **bench.SIZES["qwen3_5_text"])
    assert hybrid.num_hidden_layers == len(hybrid.layer_types) == 30
    assert hybrid.layer_types.count("full_attention") == 8 and hybrid.hidden_size == 576
    moe = tiny_model_config(tokenizer, "qwen3_moe", **bench.SIZES["qwen3_moe"])
    # the experts a token runs hold the parameters of SmolLM2's dense MLP
    assert moe.num_experts_per_tok * moe.moe_intermediate_size == bench.SMOLLM2["intermediate_size"] == 1536
    assert moe.vocab_size == 49152 and moe.num_hidden_layers == 30


def test_tiny_mode_runs_both_engines_on_both_families(capsys):
    results = load().main(["--tiny"])
    assert set(results) == {"qwen3_5_text", "qwen3_moe"}
    for family, r in results.items():
        assert r["native"] > 0 and r["hf"] > 0 and abs(r["ratio"] - r["native"] / r["hf"]) < 1e-9, family
    out = capsys.readouterr().out
    assert "qwen3_moe   float32     4   ratio native/hf = " in out


def test_profile_tiny_mode_times_the_decode_step_per_module_kind(capsys):
    """bench/families_profile.py --tiny: ms per decode step of the layers and of the modules the engine
    replaced (experts, gated delta-net), each layer timed once per step."""
    results = load("families_profile").main(["--tiny", "--new-tokens", "4"])
    assert set(results) == {"qwen3_5_text", "qwen3_moe"}
    assert results["qwen3_moe"]["Qwen3MoeExperts"] > 0 and results["qwen3_5_text"]["Qwen3_5GatedDeltaNet"] > 0
    for family, kinds in results.items():  # a layer contains its modules, the decoder its layers
        layer = next(ms for kind, ms in kinds.items() if kind.endswith("DecoderLayer"))
        decoder, linears = kinds.pop("decoder (no LM head)"), kinds.pop("Linear")  # the linears: the LM head too
        assert all(ms <= layer for kind, ms in kinds.items()), family
        assert decoder >= layer and linears > 0, family
    out = capsys.readouterr().out
    assert "(2 calls/step)" in out  # the tiny models' 2 layers, once per decode step
    assert "# qwen3_moe float32, chat prompts:" in out  # families-gen's prompts, its default kind


def test_profile_counts_decode_forwards_only():
    """The decoder's own line times its decode forwards (ids [rows, 1]), not the prefill's [rows, L] ids, which
    share their first axis; the layers' hidden states are [rows, 1, hidden] (an MoE's experts: [rows, hidden])."""
    import torch

    is_decode = load("families_profile").is_decode
    assert is_decode(torch.zeros(4, 1, dtype=torch.long), 4) and not is_decode(torch.zeros(4, 9, dtype=torch.long), 4)
    assert is_decode(torch.zeros(4, 1, 8), 4) and is_decode(torch.zeros(4, 8), 4)
    assert not is_decode(torch.zeros(4, 9, 8), 4) and not is_decode(torch.zeros(2, 1, 8), 4)


def test_the_sdpa_decode_variant_runs_the_engine_with_sdpa_decode_attention(monkeypatch):
    """--sdpa-decode (bfloat16): a third engine, the native one with its decode attention on CPU SDPA (an A/B
    of the grouped matmuls the engine runs on CPU), which only that engine's decode steps call."""
    import torch.nn.functional as F

    from rl_backends_gen.native import attention

    calls = []

    def counting(query, *args, **kwargs):
        calls.append(query.shape[2])  # query tokens: 1 in a decode step
        return F.scaled_dot_product_attention(query, *args, **kwargs)

    monkeypatch.setattr(attention, "F", type("F", (), {"scaled_dot_product_attention": staticmethod(counting)}))
    result = load().main(["--tiny", "--families", "qwen3_5_text", "--dtype", "bfloat16", "--sdpa-decode"])
    assert set(result["qwen3_5_text"]) == {"native", "hf", "sdpa", "ratio"}
    assert all(result["qwen3_5_text"][name] > 0 for name in ("native", "hf", "sdpa"))
    # 4 new tokens: 3 decode steps of the sdpa engine's one round, its one full-attention layer; the native
    # engine's decode steps (warm-up and round) add none
    assert calls.count(1) == 3


def test_the_hf_forward_variant_runs_the_same_engine_through_transformers_forward(monkeypatch):
    """--hf-forward-decode: a third engine, the native one with its decode steps through transformers' forward
    instead of its own (native/direct.py); only that engine's decode steps skip the direct forward."""
    from rl_backends_gen.native.direct import DirectDecode

    calls = []
    forward = DirectDecode.forward
    monkeypatch.setattr(DirectDecode, "forward", lambda self, *a: calls.append(1) or forward(self, *a))
    result = load().main(["--tiny", "--families", "qwen3_moe", "--hf-forward-decode"])
    assert set(result["qwen3_moe"]) == {"native", "hf", "hf-fwd", "ratio"}
    assert all(result["qwen3_moe"][name] > 0 for name in ("native", "hf", "hf-fwd"))
    # the warm-up's 2 new tokens (1 decode step) and the native round's 4 (3 steps); none in hf-fwd's round
    assert len(calls) == 4


def test_profile_kernels_mode_times_reference_and_engine_kernels():
    times = load("families_profile").main(["--kernels", "--batch", "8"])["kernels"]
    assert set(times) == {"experts grouped_mm", "experts eager", "experts engine", "delta rule transformers",
                          "delta rule engine"}
    assert all(0 < ms < 10_000 for ms in times.values())


def test_chat_prompts_are_gen_cpus_and_random_prompts_share_no_prefix():
    """--prompts chat (the default) gives gen-cpu's prompts (SmolLM2's chat template: 49-54 tokens, the first
    27 shared, which the native engine prefills once); --prompts random shares no prefix."""
    from transformers import AutoTokenizer

    from rl_backends_gen.native.call import MIN_SHARED_PREFIX, common_prefix_length
    from rl_core.models.tiny import build_tiny_tokenizer

    bench = load()
    tiny = build_tiny_tokenizer()
    chat = bench.make_family_prompts("chat", tiny, 64, tiny=False)
    gen_cpu = load("gen_cpu")
    from rl_core.models import resolve_model

    assert chat == gen_cpu.make_prompts(AutoTokenizer.from_pretrained(resolve_model("smollm2-135m-instruct")), 64)
    assert (min(map(len, chat)), max(map(len, chat)), common_prefix_length(chat)) == (49, 54, 27)
    assert max(max(p) for p in chat) < bench.SMOLLM2["vocab_size"]
    random = bench.make_family_prompts("random", tiny, 64, tiny=False)
    assert common_prefix_length(random) < MIN_SHARED_PREFIX and max(max(p) for p in random) < tiny.vocab_size
    assert max(max(p) for p in bench.make_family_prompts("chat", tiny, 4, tiny=True)) < tiny.vocab_size


def test_phases_mode_times_prefill_and_decode_of_each_engine_and_the_chunked_prefill(capsys):
    results = load().main(["--tiny", "--phases", "--chunked-prefill", "--families", "qwen3_5_text"])
    engines = results["qwen3_5_text"]
    assert set(engines) == {"native", "hf", "chunked"}
    for name, r in engines.items():
        assert r["prefill_ms"] > 0 and r["workload_s"] == pytest.approx((r["prefill_ms"] + 4 * r["decode_ms"]) / 1e3), name
    assert "ratio native/hf = " in capsys.readouterr().out


def test_narrow_models_keep_smollm2s_layers_at_the_tiny_widths(tmp_path, capsys):
    """--narrow: the benchmarked models' layers (count, kinds, experts) at hidden 64 and vocab 512, so that a
    step's time is its cost beyond weights and FLOPs; --phases times each engine's decode step on them."""
    from transformers import AutoConfig

    from rl_core.models.tiny import build_tiny_tokenizer, tiny_model_config

    bench, tokenizer = load(), build_tiny_tokenizer()
    for family in bench.SIZES:
        config = AutoConfig.from_pretrained(bench.build(family, False, str(tmp_path / family), narrow=True))
        wide = tiny_model_config(tokenizer, family, **bench.SIZES[family])
        assert (config.hidden_size, config.vocab_size, config.num_hidden_layers) == (64, 512, 30), family
        assert getattr(config, "layer_types", None) == getattr(wide, "layer_types", None), family
        assert getattr(config, "num_experts", None) == getattr(wide, "num_experts", None), family
    results = bench.main(["--narrow", "--phases", "--families", "qwen3_moe", "--batch", "4", "--new-tokens", "4",
                          "--repeats", "1"])
    assert all(results["qwen3_moe"][name]["decode_ms"] > 0 for name in ("native", "hf"))
    assert "prompts=random" in capsys.readouterr().out  # the chat prompts' ids need SmolLM2's vocabulary
    for clash in (["--tiny"], ["--prompts", "chat"]):  # two model sizes; chat ids beyond the narrow vocabulary
        with pytest.raises(SystemExit) as error:
            bench.main(["--narrow", *clash])
        assert error.value.code == 2
