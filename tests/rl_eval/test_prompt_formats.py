"""GRPO's and rl eval's prompt datasets read every form the training commands read: JSONL, JSON, parquet
and `datasets` directories (a DatasetDict gives each split path its split)."""

from __future__ import annotations

import pytest

from rl_environments.config import FileDatasetConfig
from rl_eval.data import FileEvalDataset

ROWS = [{"prompt": "What is 2 + 3?", "answer": 5}, {"prompt": "What is 1 + 1?", "answer": 2}]


@pytest.mark.parametrize("fmt", ["jsonl", "json", "parquet", "datasets"])
def test_grpo_and_eval_prompts_in_every_format(tmp_path, write_rows, fmt):
    path = write_rows(ROWS, tmp_path, fmt)
    samples = FileDatasetConfig(train_path=path).build("train")
    assert [s.messages for s in samples] == [[{"role": "user", "content": "What is 2 + 3?"}],
                                             [{"role": "user", "content": "What is 1 + 1?"}]]
    assert [s.metadata for s in samples] == [{"answer": "5"}, {"answer": "2"}]
    assert FileEvalDataset(path=path).build() == samples


def test_a_dataset_dict_gives_each_split_path_its_split(tmp_path):
    import datasets

    datasets.disable_progress_bars()
    folder = str(tmp_path / "saved")
    datasets.DatasetDict({"train": datasets.Dataset.from_list(ROWS[:1]),
                          "validation": datasets.Dataset.from_list(ROWS[1:])}).save_to_disk(folder)
    cfg = FileDatasetConfig(train_path=folder, validation_path=folder)
    assert [s.metadata["answer"] for s in cfg.build("train")] == ["5"]
    assert [s.metadata["answer"] for s in cfg.build("validation")] == ["2"]
    assert [s.metadata["answer"] for s in FileEvalDataset(path=folder, split="validation").build()] == ["2"]
