"""bench/rollout_cpu.py --tiny runs every local engine on a tiny model in seconds, with an in-run matmul peak."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def load_bench(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def test_tiny_rollout_bench_reports_every_engine(capsys):
    bench = load_bench("rollout_cpu")
    # 8 rows x 5 queries: speculation on at every step; greedy and T = 1 both run
    best = bench.run(bench.parse_args(["--tiny", "--no-vllm", "--max-batch-rows", "40", "--temperatures", "1", "0"]))
    assert list(best) == ["native", "ngram", "draft", "hf"]
    for result in best.values():
        assert 0 < result["tokens"] <= 4 * 2 * 16 and result["tok/s"] > 0
    for name in ("ngram", "draft"):
        assert 0 <= best[name]["acceptance_rate"] <= 1 and best[name]["tokens_per_row_step"] >= 1
    assert best["draft"]["proposed_tokens"] > 0
    out = capsys.readouterr().out
    assert "# matmul peak GFLOP/s (this run): float32 256^3:" in out
    assert out.count("\n") >= 12 and "# temperature 0.0 (greedy)" in out  # header, peak, 2 x (title, header, 4 engines)


def test_the_hf_forward_engine_is_the_plain_engine_without_its_direct_forward():
    bench = load_bench("rollout_cpu")
    args = bench.parse_args(["--tiny", "--no-vllm", "--engines", "native", "native-hf-forward"])
    best = bench.run(args)
    assert list(best) == ["native", "native-hf-forward"]
    assert best["native"]["tokens"] == best["native-hf-forward"]["tokens"] > 0  # the same samples
    runners = bench.build_runners(args, bench.tiny_model(args), None, 64, [])
    assert runners["native"].engine.direct_decode is not None
    assert runners["native-hf-forward"].engine.direct_decode is None


def test_matmul_peak_is_measured():
    peak = load_bench("peak")
    peaks = peak.measure_peaks(["float32", "bfloat16"], peak.TINY_SHAPES, seconds=0.05)
    assert set(peaks) == {(d, s) for d in ("float32", "bfloat16") for s in peak.TINY_SHAPES}
    assert all(value > 0.1 for value in peaks.values())


def test_prompts_take_a_recipes_task_settings(tmp_path):
    """``--recipe grpo_arithmetic_smollm2``: the main job's questions (its instruction, sums only)."""
    from transformers import AutoTokenizer

    from rl_core.models import save_tiny_model

    bench = load_bench("rollout_cpu")
    assert bench.parse_args(["--recipe", "grpo_arithmetic_smollm2"]).recipe == "grpo_arithmetic_smollm2"
    for bad in ("no_such_recipe", "sft_tiny"):  # unknown; not the arithmetic task
        with pytest.raises(SystemExit) as exit_info:
            bench.parse_args(["--recipe", bad])
        assert exit_info.value.code == 2
    tokenizer = AutoTokenizer.from_pretrained(save_tiny_model(tmp_path, family="llama"))
    main_job = [tokenizer.decode(p) for p in bench.make_prompts(tokenizer, 16, "grpo_arithmetic_smollm2")]
    default = [tokenizer.decode(p) for p in bench.make_prompts(tokenizer, 16)]
    assert all("First write the sum, then your final answer as \\boxed{ANSWER}." in p for p in main_job)
    assert not any(" - " in p for p in main_job) and any(" - " in p for p in default)
    assert not any("First write the sum" in p for p in default)


def test_the_draft_engine_takes_a_saved_draft(tmp_path):
    """``--draft-model DIR``: the draft engine drafts with that HF model (e.g. a run's trained ``draft/``)."""
    from rl_core.models import save_tiny_model

    bench = load_bench("rollout_cpu")
    with pytest.raises(SystemExit) as exit_info:
        bench.parse_args(["--draft-model", str(tmp_path / "missing")])
    assert exit_info.value.code == 2
    draft = save_tiny_model(tmp_path / "draft", family="llama")  # the tiny policy's vocabulary
    args = bench.parse_args(["--tiny", "--no-vllm", "--engines", "draft", "--draft-model", str(draft),
                             "--max-batch-rows", "40"])
    proposer = bench.build_runners(args, bench.tiny_model(args), None, 64, [])["draft"].engine.speculative.proposer
    assert not proposer.shared and len(proposer.decoder.layers) == 2  # the saved model's layers, not policy_layers:1
    assert bench.run(args)["draft"]["proposed_tokens"] > 0


def test_the_draft_vocab_engine_drafts_over_its_own_vocabulary(capsys):
    """``draft-vocab``: the draft engine with ``draft_vocab_size`` (64 of the tiny model's 512 with --tiny):
    the same samples as the plain engine, and the coverage of its vocabulary reported."""
    bench = load_bench("rollout_cpu")
    with pytest.raises(SystemExit) as exit_info:
        bench.parse_args(["--draft-vocab", "0"])
    assert exit_info.value.code == 2
    args = bench.parse_args(["--tiny", "--no-vllm", "--engines", "native", "draft-vocab", "--max-batch-rows", "40"])
    engine = bench.build_runners(args, bench.tiny_model(args), None, 64, [])["draft-vocab"].engine
    assert engine.speculative.proposer.vocab.size == 64
    best = bench.run(args)
    assert best["draft-vocab"]["tokens"] == best["native"]["tokens"] > 0
    assert best["draft-vocab"]["proposed_tokens"] > 0 and 0 < best["draft-vocab"]["draft_vocab_coverage"] <= 1
    assert "# draft-vocab: its draft vocabulary held " in capsys.readouterr().out
