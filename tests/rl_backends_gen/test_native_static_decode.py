"""The decode step at a CUDA graph's static shapes (``native/graphs.py``), run eagerly on the CPU
(``decode_graphs="static"``): rows padded to a bucket, keys read up to a length bucket, the mask built on
the device. It must give what the eager step gives; the capture itself runs only on CUDA
(tests/gpu_checks/test_engine_features_cuda.py)."""

from __future__ import annotations

import logging

import pytest
from pydantic import ValidationError

from rl_backends_gen import GenerationConfig, build_generation_backend
from rl_backends_gen.native import NativeEngine
from rl_backends_gen.native.graphs import row_buckets
from rl_core.models.tiny import FAMILIES
from rl_core.types import SamplingParams

ELIGIBLE = ["llama", "qwen2", "qwen3", "gemma3_text"]  # gemma3_text: sliding layers (window 8) and full ones
# max_seq_len 56 with prompts of 1 to 40 tokens: rows reach their limit at different steps, and
# length buckets of 8 make the steps cross several key-length buckets.
MAX_SEQ_LEN = 56
GREEDY = SamplingParams(max_new_tokens=40, temperature=0.0)
SAMPLED = SamplingParams(max_new_tokens=40, temperature=0.9, top_p=0.95, n=2, seed=7)


def engines(path: str, **kwargs) -> tuple[NativeEngine, NativeEngine]:
    """(eager, static) engines over the same model; 3 rows, so 10 requests join as rows finish."""
    eager = NativeEngine(path, max_batch_size=3, max_seq_len=MAX_SEQ_LEN, decode_graphs="off", **kwargs)
    static = NativeEngine(path, max_batch_size=3, max_seq_len=MAX_SEQ_LEN, decode_graphs="static", **kwargs)
    static.decode_graphs.length_step = 8
    return eager, static


def assert_same(got, want, tolerance: float = 1e-5) -> None:
    assert [[c.token_ids for c in r] for r in got] == [[c.token_ids for c in r] for r in want]
    assert [[c.finish_reason for c in r] for r in got] == [[c.finish_reason for c in r] for r in want]
    diffs = [abs(a - b) for g, w in zip(got, want) for cg, cw in zip(g, w) for a, b in zip(cg.logprobs, cw.logprobs)]
    assert max(diffs) <= tolerance


@pytest.mark.parametrize("family", ELIGIBLE)
def test_static_shapes_decode_like_the_eager_step(family, tiny_family_dir, tiny_prompts):
    eager, static = engines(tiny_family_dir(family))
    prompts = tiny_prompts * 2  # more requests than rows: continuous batching
    want = eager.generate(prompts, GREEDY)
    got = static.generate(prompts, GREEDY)
    assert_same(got, want)
    lengths = {len(c.token_ids) for r in got for c in r}
    assert len(lengths) > 1  # rows finished at different steps
    assert static.stats.static_decode_steps == static.stats.decode_steps == eager.stats.decode_steps > 0
    assert eager.stats.static_decode_steps == 0
    if family == "llama":  # sampling stays eager, outside the static shapes: one family is enough
        assert_same(static.generate(prompts, SAMPLED), eager.generate(prompts, SAMPLED))


def test_static_shapes_in_bfloat16_keep_greedy_tokens(tiny_model_dir, tiny_prompts):
    eager, static = engines(tiny_model_dir, dtype="bfloat16")
    assert_same(static.generate(tiny_prompts * 2, GREEDY), eager.generate(tiny_prompts * 2, GREEDY), tolerance=0.05)


def test_refit_sleep_and_wake_with_static_shapes(tiny_model_dir, tiny_prompts, load_hf_model):
    eager, static = engines(tiny_model_dir)
    before = static.generate(tiny_prompts, GREEDY)
    weights = {name: p.detach() * 1.5 for name, p in load_hf_model(tiny_model_dir).named_parameters()}
    for engine in (eager, static):
        engine.update_weights(weights.items())
    after = static.generate(tiny_prompts, GREEDY)
    assert [r[0].token_ids for r in after] != [r[0].token_ids for r in before]
    assert_same(after, eager.generate(tiny_prompts, GREEDY))
    static.sleep()
    assert static.decode_graphs.inputs is None
    static.wake()
    assert_same(static.generate(tiny_prompts, GREEDY), after)


def test_a_failed_capture_falls_back_to_eager_steps(tiny_model_dir, tiny_prompts, caplog):
    """On the CPU every capture fails (no CUDA): generation goes on eagerly, with one warning."""
    eager, static = engines(tiny_model_dir)
    static.decode_graphs.capture = True
    with caplog.at_level(logging.WARNING, logger="rl_backends_gen.native.graphs"):
        got = static.generate(tiny_prompts * 2, GREEDY)
    assert_same(got, eager.generate(tiny_prompts * 2, GREEDY))
    assert static.decode_graphs.failed and static.stats.graph_captures == 0 and static.stats.graph_replays == 0
    assert sum("CUDA graph failed" in r.getMessage() for r in caplog.records) == 1


@pytest.mark.parametrize("family", sorted(set(FAMILIES) - set(ELIGIBLE)))
def test_models_whose_decode_shapes_depend_on_data_are_not_eligible(family, tiny_family_dir):
    with pytest.raises(ValueError, match="decode_graphs='static' needs a model"):
        NativeEngine(tiny_family_dir(family), max_batch_size=2, max_seq_len=32, decode_graphs="static")
    assert NativeEngine(tiny_family_dir(family), max_batch_size=2, max_seq_len=32).decode_graphs is None  # auto: eager


def test_speculative_decoding_is_not_eligible(tiny_model_dir):
    from rl_backends_gen.config import SpeculativeConfig

    speculative = SpeculativeConfig(method="ngram", num_tokens=2, ngram={"min_n": 1, "max_n": 2})
    with pytest.raises(ValueError, match="speculative decoding"):
        NativeEngine(tiny_model_dir, max_seq_len=32, decode_graphs="static", speculative=speculative)


def test_the_config_knob_reaches_the_engine(tiny_model_dir, monkeypatch):
    import rl_backends_gen.native

    built = []
    monkeypatch.setattr(rl_backends_gen.native, "NativeEngine", lambda path, **kwargs: built.append(kwargs))
    build_generation_backend(GenerationConfig(decode_graphs="off"), tiny_model_dir)
    build_generation_backend(GenerationConfig(), tiny_model_dir)
    assert [kwargs["decode_graphs"] for kwargs in built] == ["off", "auto"]
    with pytest.raises(ValidationError, match="decode_graphs"):
        GenerationConfig(decode_graphs="static")  # the engine's test mode, not a config value
    monkeypatch.undo()
    assert NativeEngine(tiny_model_dir, max_seq_len=32).decode_graphs is None  # auto on the CPU: eager steps
    with pytest.raises(ValueError, match="decode_graphs must be one of"):
        NativeEngine(tiny_model_dir, max_seq_len=32, decode_graphs="on")


def test_row_buckets():
    assert row_buckets(64) == [1, 2, 4, 8, 16, 32, 64]
    assert row_buckets(3) == [1, 2, 3]
    assert row_buckets(100) == [1, 2, 4, 8, 16, 32, 64, 96, 100]
    assert row_buckets(32) == [1, 2, 4, 8, 16, 32]
    assert row_buckets(1) == [1]
