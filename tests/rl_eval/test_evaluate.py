"""End-to-end evaluation of a tiny model: metrics recomputed from the per-item results, same seed ->
same report, a training checkpoint evaluates like its HF export, and bad input fails clearly."""

from __future__ import annotations

import json

import pytest

from rl_core.types import SamplingParams, StepResult
from rl_environments.answers import last_assistant_text
from rl_environments.registry import list_environments, register_environment
from rl_eval import EvalConfig, EvalError, evaluate, pass_at_k
from rl_eval.data import ProceduralEvalDataset
from rl_eval.metrics import cons_at_k, mean_at_k


class EvenLengthGrader:
    """Correct when the reply has an even number of characters: a deterministic grader a random tiny
    model passes about half the time, so every metric is exercised with non-trivial values."""

    def step(self, messages, metadata, state) -> StepResult:
        correct = float(len(last_assistant_text(messages)) % 2 == 0)
        return StepResult(reward=correct, reward_components={"correct": correct})


if "test_even_length" not in list_environments():
    register_environment("test_even_length", EvenLengthGrader)

SAMPLING = SamplingParams(max_new_tokens=6, temperature=1.0, n=4, seed=123)


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    from rl_backends_gen.native import NativeEngine

    eng = NativeEngine(tiny_model_dir, max_batch_size=16)
    yield eng
    eng.shutdown()


@pytest.fixture(scope="module")
def items():
    return ProceduralEvalDataset(size=6).build()


def test_end_to_end_metrics_match_per_item_results(engine, tiny_tokenizer, items):
    report = evaluate(engine, tiny_tokenizer, items, EvenLengthGrader(), SAMPLING, [1, 2, 4],
                      model_name="tiny", dataset_name="arith", answer_format="last_number", batch_size=4)
    assert report.num_items == 6 and report.num_samples == 4
    assert all(len(item.samples) == 4 for item in report.items)
    grader = EvenLengthGrader()
    for item in report.items:
        for s in item.samples:
            assert s.correct == bool(grader.step([{"role": "assistant", "content": s.text}], {}, None).reward)
            assert 1 <= s.num_tokens <= 6
        correct = [s.correct for s in item.samples]
        answers = [s.answer for s in item.samples]
        for k in (1, 2, 4):
            assert item.metrics[f"pass@{k}"] == pass_at_k(4, sum(correct), k)
            assert item.metrics[f"cons@{k}"] == cons_at_k(answers, correct, k)
            assert item.metrics[f"mean@{k}"] == mean_at_k(correct, k)
    for name, value in report.metrics.items():
        assert value == pytest.approx(sum(i.metrics[name] for i in report.items) / 6)
    total_correct = sum(i.num_correct for i in report.items)
    assert 0 < total_correct < 24, "the grader should pass some samples and fail others"
    assert report.metrics["mean@4"] == pytest.approx(total_correct / 24)
    line = next(x for x in report.summary_lines() if " pass@4 " in x)
    assert line.startswith("model=tiny dataset=arith temperature=1.0 ")
    passed = sum(i.num_correct > 0 for i in report.items)
    assert line.endswith(f"n=4 pass@4 score={passed / 6:.4f} ({passed}/6)")


def test_same_seed_same_report_and_batching_does_not_matter(engine, tiny_tokenizer, items):
    grader = EvenLengthGrader()
    a = evaluate(engine, tiny_tokenizer, items, grader, SAMPLING, [1, 4], batch_size=4).to_dict()
    b = evaluate(engine, tiny_tokenizer, items, grader, SAMPLING, [1, 4], batch_size=3).to_dict()
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
    other = SamplingParams(max_new_tokens=6, temperature=1.0, n=4, seed=124)
    c = evaluate(engine, tiny_tokenizer, items, grader, other, [1, 4], batch_size=4).to_dict()
    texts = lambda r: [s["text"] for i in r["items"] for s in i["samples"]]  # noqa: E731
    assert texts(a) != texts(c)


def test_greedy_and_prompt_template(engine, tiny_tokenizer, items):
    report = evaluate(engine, tiny_tokenizer, items[:2], EvenLengthGrader(), SAMPLING, [1], greedy=True,
                      prompt_template="Q: {question} (answer {answer})")
    assert "greedy" in report.metrics
    assert all(item.greedy is not None and item.greedy.num_tokens >= 1 for item in report.items)
    with pytest.raises(EvalError, match="prompt_template names"):
        evaluate(engine, tiny_tokenizer, items[:1], EvenLengthGrader(), SAMPLING, [1], prompt_template="{nope}")


def test_bad_input(engine, tiny_tokenizer, items):
    with pytest.raises(EvalError, match="k=5 needs at least k samples per item but n=4"):
        evaluate(engine, tiny_tokenizer, items, EvenLengthGrader(), SAMPLING, [1, 5])
    with pytest.raises(EvalError, match="empty"):
        evaluate(engine, tiny_tokenizer, [], EvenLengthGrader(), SAMPLING, [1])
    with pytest.raises(ValueError, match="k_values"):
        EvalConfig.model_validate({"sampling": {"n": 2}, "k_values": [1, 4]})


def test_run_eval_on_a_training_checkpoint_equals_hf_dir(tiny_model_dir, tmp_path, capsys):
    """A checkpoint of this library is converted on the fly; its report equals the HF directory's."""
    from rl_checkpoint import hf_to_dcp
    from rl_eval.cli import main

    hf_to_dcp(tiny_model_dir, tmp_path / "ckpt")
    base = ["sampling.n=2", "k_values=[1,2]", "sampling.max_new_tokens=5", "progress=false", "model_name=m",
            "datasets=[{data: {kind: procedural, size: 3}, grader: {name: test_even_length}}]"]
    assert main(base + [f"model={tiny_model_dir}", f"report_path={tmp_path / 'hf.json'}"]) == 0
    assert main(base + [f"model={tmp_path / 'ckpt'}", f"report_path={tmp_path / 'ckpt.json'}"]) == 0
    hf, ckpt = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("hf", "ckpt"))
    assert hf["results"] == ckpt["results"]
    assert hf["summary"] == ckpt["summary"] and len(hf["summary"]) == 6
    out = capsys.readouterr().out
    assert "model=m dataset=arithmetic-test temperature=1.0" in out and " pass@2 score=" in out
    assert not list(tmp_path.glob(".*.tmp-*"))

    capsys.readouterr()
    assert main([f"model={tmp_path / 'nope'}"]) == 2
    assert "nope" in capsys.readouterr().err
    assert main(["k_values=[3]"]) == 2
    # a speculative draft that cannot fit the model: one line, exit 2, no report
    assert main(base + [f"model={tiny_model_dir}", f"report_path={tmp_path / 'draft.json'}",
                        "generation.speculative={method: draft, draft_model: 'policy_layers:2'}"]) == 2
    assert "generation.speculative.draft_model: policy_layers:2: the policy" in capsys.readouterr().err
    assert not (tmp_path / "draft.json").exists()


def test_rl_apps_eval_command(tiny_model_dir, tmp_path):
    pytest.importorskip("rl_apps")
    from rl_apps import recipe_path
    from rl_apps.commands import eval as eval_cmd
    from rl_core.config import load_config

    full = load_config(eval_cmd.CONFIG_CLASS, eval_cmd.DEFAULT_RECIPE, [])
    assert full.model == "smollm2-135m-instruct" and full.k_values == [1, 4]
    cfg = load_config(eval_cmd.CONFIG_CLASS, recipe_path("eval_tiny.yaml"),
                      [f"model={tiny_model_dir}", "sampling.n=1", "k_values=[1]", "progress=false",
                       f"report_path={tmp_path / 'r.json'}"])
    assert eval_cmd.run(cfg) == 0
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["results"][0]["num_items"] == 8
    assert report["results"][0]["dataset"] == "arithmetic-tiny"


def test_a_named_model_is_blamed_only_for_its_own_resolution():
    """An error raised in the body of ``hf_model_dir(<name>)`` is the body's, not the model name's."""
    from rl_eval.models import hf_model_dir

    with pytest.raises(ValueError, match="the caller's own"), hf_model_dir("tiny-llama"):
        raise ValueError("the caller's own error")
    with pytest.raises(EvalError, match="not a path and not a known model name"), hf_model_dir("no-such-model"):
        pass


@pytest.mark.parametrize(("override", "said"), [
    ("generation.backend=megatron", "generation.backend: megatron decodes on the Megatron training workers"),
    ("generation.max_seq_len=20", "dataset 'arithmetic-tiny', item 1: the prompt is 43 tokens, which leaves no room "
                                  "to generate in the backend's context of 20 tokens"),
    ("generation.speculative={method: draft, draft_model: 'policy_layers:1', train_draft: true, draft_lr: 1.0}",
     "generation.speculative.train_draft=true: evaluation trains no draft"),
], ids=["megatron", "max_seq_len", "train_draft"])
def test_rl_eval_of_a_named_model_says_what_is_wrong(override, said, tmp_path, capsys):
    """model given by name: one line naming the real problem, exit 2, no report (was: blamed on the model name,
    or a traceback, or a run that trained nothing)."""
    pytest.importorskip("rl_apps")
    from rl_apps import recipe_path
    from rl_eval.cli import main

    report = tmp_path / "r.json"
    code = main(["--config", recipe_path("eval_tiny.yaml"), "model=tiny-llama", "progress=false",
                 f"report_path={report}", override])
    err = capsys.readouterr().err
    assert code == 2
    [line] = [line for line in err.splitlines() if line.startswith(("rl-eval: error:", "Invalid config:"))]
    assert said in line and "model name" not in line
    assert not report.exists()


def test_a_report_path_that_cannot_be_written_is_refused_before_evaluating(tiny_model_dir, tmp_path, capsys):
    """A directory at report_path, or a file where its parent must be: one line, exit 2, before any generation
    (was: a traceback after the whole evaluation, and a temporary file left behind)."""
    from rl_eval.cli import main

    (tmp_path / "a-dir").mkdir()
    (tmp_path / "a-file").write_text("hi")
    cases = {tmp_path / "a-dir": "is a directory", tmp_path / "a-file" / "r.json": "is a file, so"}
    for report, said in cases.items():
        capsys.readouterr()
        code = main([f"model={tiny_model_dir}", "sampling.n=1", "k_values=[1]", "progress=false",
                     f"report_path={report}", "datasets=[{data: {kind: procedural, size: 2}, grader: {name: test_even_length}}]"])
        captured = capsys.readouterr()
        assert code == 2 and f"report_path: {tmp_path / report.relative_to(tmp_path).parts[0]}" in captured.err, captured.err
        assert said in captured.err and "pass@1" not in captured.out  # nothing was evaluated
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-dir", "a-file"] and not list((tmp_path / "a-dir").iterdir())
