"""Procedural datasets (seeded, disjoint splits, difficulty) and file datasets (field mapping, errors)."""

from __future__ import annotations

import json

import pytest
from pydantic import TypeAdapter, ValidationError

from rl_core.data_files import BadRow, DataError
from rl_environments import (
    ArithmeticDatasetConfig,
    CountdownDatasetConfig,
    DatasetConfig,
    FileDatasetConfig,
)
from rl_environments.calculator import evaluate
from rl_environments.countdown import check_expression
from rl_environments.splits import SPLITS


def keys(samples) -> list[str]:
    return [s.messages[-1]["content"] for s in samples]


@pytest.mark.parametrize("cfg", [
    ArithmeticDatasetConfig(digits=1, num_operands=2, operators=["+", "-"], train_size=150, validation_size=8,
                            test_size=8),
    ArithmeticDatasetConfig(digits=2, num_operands=3, operators=["*"], train_size=300, validation_size=30,
                            test_size=30, seed=5),
    CountdownDatasetConfig(num_operands=3, max_number=9, train_size=200, validation_size=20, test_size=20),
])
def test_splits_are_disjoint_seeded_and_distinct(cfg):
    splits = {split: keys(cfg.build(split)) for split in SPLITS}
    for split, items in splits.items():
        assert len(items) == getattr(cfg, f"{split}_size") == len(set(items))
    assert not set(splits["train"]) & set(splits["validation"])
    assert not set(splits["train"]) & set(splits["test"])
    assert not set(splits["validation"]) & set(splits["test"])
    assert keys(cfg.build("test")) == splits["test"]  # same seed, same problems
    other_seed = cfg.model_copy(update={"seed": cfg.seed + 1})
    assert keys(other_seed.build("test")) != splits["test"]


def test_arithmetic_difficulty_and_answers():
    cfg = ArithmeticDatasetConfig(digits=3, num_operands=4, operators=["+", "*"], seed=1)
    for sample in cfg.build("train", 50):
        problem = sample.metadata["problem"]
        numbers = problem.replace("+", " ").replace("*", " ").split()
        assert len(numbers) == 4 and all(0 <= int(n) <= 999 for n in numbers)
        assert int(sample.metadata["answer"]) == evaluate(problem)  # precedence: * before +
        assert "\\boxed{ANSWER}" in sample.messages[-1]["content"] and sample.env == "arithmetic"


def test_arithmetic_instruction_and_system_prompt():
    base = ArithmeticDatasetConfig(train_size=20, validation_size=4, test_size=4)
    worded = base.model_copy(update={"instruction": "Add, then box.", "system_prompt": "Be exact."})
    plain, custom = base.build("train"), worded.build("train")
    assert [s.metadata for s in plain] == [s.metadata for s in custom]  # same problems, only the wording differs
    problem = custom[0].metadata["problem"]
    assert custom[0].messages == [{"role": "system", "content": "Be exact."},
                                  {"role": "user", "content": f"What is {problem}? Add, then box."}]
    bare = base.model_copy(update={"instruction": ""}).build("train")
    assert bare[0].messages[-1]["content"] == f"What is {plain[0].metadata['problem']}?"


def test_countdown_problems_are_solvable():
    cfg = CountdownDatasetConfig(num_operands=4, max_number=12, operators=["+", "-", "*", "/"], seed=2)
    for sample in cfg.build("validation", 30):
        numbers, target = sample.metadata["numbers"], sample.metadata["target"]
        assert len(numbers) == 4 and target > 0
        assert _solvable(numbers, target)


def _solvable(numbers, target) -> bool:
    import itertools

    for order in itertools.permutations(numbers):
        for ops in itertools.product("+-*/", repeat=len(numbers) - 1):
            expr = str(order[0])
            for op, n in zip(ops, order[1:]):
                expr = f"({expr} {op} {n})"
            if check_expression(expr, list(numbers), target):
                return True
    return False


def test_too_small_problem_space_is_a_clear_error():
    cfg = ArithmeticDatasetConfig(digits=1, num_operands=2, operators=["+"], test_size=50)
    with pytest.raises(ValueError, match="too few problems"):
        cfg.build("test")


def test_dataset_config_is_strict_and_discriminated():
    adapter = TypeAdapter(DatasetConfig)
    assert isinstance(adapter.validate_python({"kind": "countdown", "num_operands": 4}), CountdownDatasetConfig)
    with pytest.raises(ValidationError):
        adapter.validate_python({"kind": "arithmetic", "digit": 3})  # typo: unknown key
    with pytest.raises(ValidationError):
        adapter.validate_python({"kind": "arithmetic", "operators": ["^"]})


def test_jsonl_and_parquet_files_with_field_mapping(tmp_path):
    rows = [{"question": "What is 1 + 1?", "solution": 2, "level": 1},
            {"question": "What is 2 + 2?", "solution": 4, "level": 2}]
    jsonl = tmp_path / "train.jsonl"
    jsonl.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    cfg = FileDatasetConfig(train_path=str(jsonl), prompt_field="question", answer_field="solution",
                            metadata_fields=["level"], system_prompt="Be brief.", env="math",
                            instruction="Put your final answer in \\boxed{}.")
    samples = cfg.build("train")
    assert samples[1].messages == [{"role": "system", "content": "Be brief."},
                                   {"role": "user", "content": "What is 2 + 2? Put your final answer in \\boxed{}."}]
    assert samples[1].metadata == {"level": 2, "answer": "4"} and samples[1].env == "math"
    import pyarrow as pa
    import pyarrow.parquet as pq

    parquet = tmp_path / "test.parquet"
    pq.write_table(pa.Table.from_pylist(rows), parquet)
    from_parquet = cfg.model_copy(update={"test_path": str(parquet)}).build("test")
    assert [s.metadata for s in from_parquet] == [s.metadata for s in samples]


def test_file_errors_name_the_file_and_row(tmp_path):
    bad_json = tmp_path / "bad.jsonl"
    bad_json.write_text('{"problem": "a", "answer": 1}\n{"problem": oops}\n')
    with pytest.raises(DataError, match=r"bad.jsonl, line 2: invalid JSON"):
        FileDatasetConfig(train_path=str(bad_json)).build("train")
    missing = tmp_path / "missing_field.jsonl"
    missing.write_text('{"problem": "a", "answer": 1}\n{"problem": "b"}\n')
    with pytest.raises(DataError, match=r"missing_field.jsonl, line 2: missing field 'answer'"):
        FileDatasetConfig(train_path=str(missing)).build("train")
    chat = tmp_path / "chat.jsonl"
    chat.write_text('{"messages": [{"role": "user"}]}\n')
    with pytest.raises(DataError, match=r"chat.jsonl, line 1: 'messages' must be a list"):
        FileDatasetConfig(train_path=str(chat), messages_field="messages", answer_field=None).build("train")
    with pytest.raises(DataError, match="nowhere.jsonl"):
        FileDatasetConfig(train_path=str(tmp_path / "nowhere.jsonl")).build("train")
    with pytest.raises(DataError, match="no validation_path"):
        FileDatasetConfig(train_path=str(chat)).build("validation")


BAD_PROMPT_ROWS = [
    (b'{"problem": ["What is", "1 + 1?"], "answer": 2}', "'problem' must be a list of {role, content} objects"),
    (b'{"problem": "What is 1 + 1?", "answer": null}', "field 'answer' must be a string or a number, got null"),
    (b'{"problem": "caf\xe9", "answer": 1}', "not valid UTF-8"),
    (b'{"problem": "   ", "answer": 1}', "field 'problem' is empty"),
    (b'[1, 2]', "expected a JSON object, got list"),
]


@pytest.mark.parametrize(("line", "reason"), BAD_PROMPT_ROWS)
def test_every_bad_row_is_named_or_skipped_and_counted(tmp_path, line, reason):
    """A list prompt or a null answer is never turned into text and trained on."""
    path = tmp_path / "train.jsonl"
    path.write_bytes(b'{"problem": "What is 2 + 2?", "answer": 4}\n' + line + b"\n")
    with pytest.raises(DataError) as err:
        FileDatasetConfig(train_path=str(path)).build("train")
    assert f"{path}, line 2: {reason}" in str(err.value) and "data.on_bad_row=skip" in str(err.value)
    loaded = FileDatasetConfig(train_path=str(path), on_bad_row="skip").load("train")
    assert [s.metadata["answer"] for s in loaded.items] == ["4"]
    assert (loaded.report.num_rows, loaded.report.num_skipped) == (2, 1)
    assert len(loaded.report.skipped_reasons) == 1
    assert loaded.report.skipped_reasons[0].startswith(f"{path}, line 2: {reason}")


def test_empty_file_json_list_and_caller_check(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(DataError, match="empty.jsonl: the dataset is empty"):
        FileDatasetConfig(train_path=str(empty)).build("train")
    rows = tmp_path / "rows.json"
    rows.write_text(json.dumps([{"problem": "short", "answer": 1}, {"problem": "x" * 50, "answer": 2}]))

    def at_most_20_chars(sample):
        if len(sample.messages[-1]["content"]) > 20:
            raise BadRow("prompt too long")

    cfg = FileDatasetConfig(train_path=str(rows), instruction=None)
    with pytest.raises(DataError, match=r"rows.json, row 2: prompt too long"):
        cfg.load("train", check=at_most_20_chars)
    skipped = cfg.model_copy(update={"on_bad_row": "skip"}).load("train", check=at_most_20_chars)
    assert [s.messages[-1]["content"] for s in skipped.items] == ["short"] and skipped.report.num_skipped == 1
    # Procedural datasets pass the same check, or name the problem.
    with pytest.raises(DataError, match="arithmetic dataset, train split, problem 1: prompt too long"):
        ArithmeticDatasetConfig().load("train", 3, check=at_most_20_chars)


@pytest.mark.parametrize("field", ["prompt", "messages"])
def test_an_empty_message_list_says_it_is_empty(tmp_path, field):
    path = tmp_path / "train.jsonl"
    path.write_text(json.dumps({field: [], "answer": 1}) + "\n")
    cfg = FileDatasetConfig(train_path=str(path), messages_field="messages" if field == "messages" else None)
    with pytest.raises(DataError) as err:
        cfg.build("train")
    assert f"{path}, line 1: {field!r} is an empty list; it needs at least one {{role, content}} message" in str(
        err.value)
