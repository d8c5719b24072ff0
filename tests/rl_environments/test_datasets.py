"""Procedural datasets (seeded, disjoint splits, difficulty) and file datasets (field mapping, errors)."""

from __future__ import annotations

import json

import pytest
from pydantic import TypeAdapter, ValidationError

from rl_environments import (
    ArithmeticDatasetConfig,
    CountdownDatasetConfig,
    DatasetConfig,
    FileDatasetConfig,
    build_dataset,
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
    splits = {split: keys(build_dataset(cfg, split)) for split in SPLITS}
    for split, items in splits.items():
        assert len(items) == getattr(cfg, f"{split}_size") == len(set(items))
    assert not set(splits["train"]) & set(splits["validation"])
    assert not set(splits["train"]) & set(splits["test"])
    assert not set(splits["validation"]) & set(splits["test"])
    assert keys(build_dataset(cfg, "test")) == splits["test"]  # same seed, same problems
    other_seed = cfg.model_copy(update={"seed": cfg.seed + 1})
    assert keys(build_dataset(other_seed, "test")) != splits["test"]


def test_arithmetic_difficulty_and_answers():
    cfg = ArithmeticDatasetConfig(digits=3, num_operands=4, operators=["+", "*"], seed=1)
    for sample in build_dataset(cfg, "train", 50):
        problem = sample.metadata["problem"]
        numbers = problem.replace("+", " ").replace("*", " ").split()
        assert len(numbers) == 4 and all(0 <= int(n) <= 999 for n in numbers)
        assert int(sample.metadata["answer"]) == evaluate(problem)  # precedence: * before +
        assert "\\boxed{ANSWER}" in sample.messages[-1]["content"] and sample.env == "arithmetic"


def test_arithmetic_instruction_and_system_prompt():
    base = ArithmeticDatasetConfig(train_size=20, validation_size=4, test_size=4)
    worded = base.model_copy(update={"instruction": "Add, then box.", "system_prompt": "Be exact."})
    plain, custom = build_dataset(base, "train"), build_dataset(worded, "train")
    assert [s.metadata for s in plain] == [s.metadata for s in custom]  # same problems, only the wording differs
    problem = custom[0].metadata["problem"]
    assert custom[0].messages == [{"role": "system", "content": "Be exact."},
                                  {"role": "user", "content": f"What is {problem}? Add, then box."}]
    bare = build_dataset(base.model_copy(update={"instruction": ""}), "train")
    assert bare[0].messages[-1]["content"] == f"What is {plain[0].metadata['problem']}?"


def test_countdown_problems_are_solvable():
    cfg = CountdownDatasetConfig(num_operands=4, max_number=12, operators=["+", "-", "*", "/"], seed=2)
    for sample in build_dataset(cfg, "validation", 30):
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
        build_dataset(cfg, "test")


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
                            metadata_fields=["level"], system_prompt="Be brief.", env="math")
    samples = build_dataset(cfg, "train")
    assert samples[1].messages == [{"role": "system", "content": "Be brief."},
                                   {"role": "user", "content": "What is 2 + 2? Put your final answer in \\boxed{}."}]
    assert samples[1].metadata == {"level": 2, "answer": "4"} and samples[1].env == "math"
    import pyarrow as pa
    import pyarrow.parquet as pq

    parquet = tmp_path / "test.parquet"
    pq.write_table(pa.Table.from_pylist(rows), parquet)
    from_parquet = build_dataset(cfg.model_copy(update={"test_path": str(parquet)}), "test")
    assert [s.metadata for s in from_parquet] == [s.metadata for s in samples]


def test_file_errors_name_the_file_and_row(tmp_path):
    bad_json = tmp_path / "bad.jsonl"
    bad_json.write_text('{"problem": "a", "answer": 1}\n{"problem": oops}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: not valid JSON"):
        build_dataset(FileDatasetConfig(train_path=str(bad_json)), "train")
    missing = tmp_path / "missing_field.jsonl"
    missing.write_text('{"problem": "a", "answer": 1}\n{"problem": "b"}\n')
    with pytest.raises(KeyError, match=r"missing_field.jsonl: row 2: missing field 'answer'"):
        build_dataset(FileDatasetConfig(train_path=str(missing)), "train")
    chat = tmp_path / "chat.jsonl"
    chat.write_text('{"messages": [{"role": "user"}]}\n')
    with pytest.raises(ValueError, match=r"chat.jsonl: row 1: 'messages' must be a list"):
        build_dataset(FileDatasetConfig(train_path=str(chat), messages_field="messages", answer_field=None), "train")
    with pytest.raises(FileNotFoundError, match="nowhere.jsonl"):
        build_dataset(FileDatasetConfig(train_path=str(tmp_path / "nowhere.jsonl")), "train")
    with pytest.raises(ValueError, match="no validation_path"):
        build_dataset(FileDatasetConfig(train_path=str(chat)), "validation")
