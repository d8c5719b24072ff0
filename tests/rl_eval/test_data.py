"""Evaluation datasets: files with configurable fields, clear errors, procedural sets, graders."""

from __future__ import annotations

import json

import pytest

from rl_eval.data import FileEvalDataset, HFDiskEvalDataset, ProceduralEvalDataset
from rl_eval.errors import EvalError
from rl_eval.graders import MultipleChoiceEnvironment, extract_choice, voting_answer

ROWS = [{"q": "What is 2+2?", "gold": "4", "level": 1}, {"q": "What is 3*3?", "gold": "9", "level": 2}]


def test_jsonl_and_parquet_with_field_names(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "d.jsonl").write_text("\n".join(json.dumps(r) for r in ROWS) + "\n")
    pq.write_table(pa.Table.from_pylist(ROWS), tmp_path / "d.parquet")
    for name in ("d.jsonl", "d.parquet"):
        cfg = FileEvalDataset(path=str(tmp_path / name), prompt_field="q", answer_field="gold",
                              metadata_fields=["level"], instruction=None)
        samples = cfg.build()
        assert [s.messages for s in samples] == [[{"role": "user", "content": r["q"]}] for r in ROWS]
        assert [s.metadata for s in samples] == [{"level": r["level"], "answer": r["gold"]} for r in ROWS]


def test_missing_field_names_file_and_row(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps(ROWS[0]) + "\n" + json.dumps({"q": "no answer here"}) + "\n")
    with pytest.raises(EvalError) as err:
        FileEvalDataset(path=str(path), prompt_field="q", answer_field="gold").build()
    assert str(path) in str(err.value) and "line 2" in str(err.value) and "'gold'" in str(err.value)


def test_empty_dataset_is_an_error(tmp_path):
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(EvalError, match="empty"):
        FileEvalDataset(path=str(tmp_path / "empty.jsonl")).build()
    with pytest.raises(EvalError, match="does not exist"):
        FileEvalDataset(path=str(tmp_path / "missing.jsonl")).build()


def test_procedural_sets():
    arithmetic = ProceduralEvalDataset(size=5).build()
    assert len(arithmetic) == 5 and all("answer" in s.metadata for s in arithmetic)
    again = ProceduralEvalDataset(size=5).build()
    assert [s.messages for s in again] == [s.messages for s in arithmetic]
    countdown = ProceduralEvalDataset.model_validate({"source": {"kind": "countdown"}, "size": 3}).build()
    assert len(countdown) == 3


def test_hf_datasets_directory(tmp_path):
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_list(ROWS).save_to_disk(str(tmp_path / "hf"))
    samples = HFDiskEvalDataset(path=str(tmp_path / "hf"), prompt_field="q", answer_field="gold").build()
    assert [s.metadata["answer"] for s in samples] == ["4", "9"]


def test_multiple_choice_grader_and_voting_answers():
    assert extract_choice(r"I pick \boxed{B}") == "B"
    assert extract_choice("The answer is (d).") == "D"
    assert extract_choice("C") == "C"
    assert extract_choice("no idea") is None
    env = MultipleChoiceEnvironment()
    step = env.step([{"role": "assistant", "content": "the answer is B"}], {"answer": "B"}, None)
    assert step.reward == 1.0
    assert env.step([{"role": "assistant", "content": "A"}], {"answer": "B"}, None).reward == 0.0
    # equal numbers vote together
    assert voting_answer(r"\boxed{1,000}", "boxed") == voting_answer(r"\boxed{1000.0}", "boxed") == "1000"
    assert voting_answer("so 12 then 15", "last_number") == "15"
    assert voting_answer("nothing", "boxed") is None
