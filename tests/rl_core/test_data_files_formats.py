"""One reader for every dataset: JSONL, JSON, parquet and `datasets` save_to_disk directories give the same
rows; a DatasetDict needs a split; a directory that is no dataset, or no `datasets` package, is one clear error."""

from __future__ import annotations

import sys

import pytest

from rl_core.data_files import DataError, detect_format, load_rows, read_rows

ROWS = [{"prompt": "What is 2 + 3?", "answer": "5", "level": 1},
        {"prompt": "café ☕", "answer": "8", "level": 2}]


@pytest.mark.parametrize("fmt", ["jsonl", "json", "parquet", "datasets"])
def test_every_format_gives_the_same_rows_with_their_location(tmp_path, write_rows, fmt):
    path = write_rows(ROWS, tmp_path, fmt)
    assert detect_format(path) == fmt
    rows = list(read_rows(path))
    assert [record for _, record in rows] == ROWS
    unit = "line" if fmt == "jsonl" else "row"
    assert [str(location) for location, _ in rows] == [f"{path}, {unit} 1", f"{path}, {unit} 2"]
    loaded = load_rows(path, lambda record: record["answer"])
    assert loaded.items == ["5", "8"] and loaded.report.summary() == f"{path}: 2 rows used, 0 bad rows skipped"


def test_a_dataset_dict_gives_the_named_split_or_says_which_exist(tmp_path):
    import datasets

    datasets.disable_progress_bars()
    folder = tmp_path / "saved"
    datasets.DatasetDict({"train": datasets.Dataset.from_list(ROWS[:1]),
                          "test": datasets.Dataset.from_list(ROWS[1:])}).save_to_disk(str(folder))
    assert [r["answer"] for _, r in read_rows(folder, split="test")] == ["8"]
    assert [r["answer"] for _, r in read_rows(folder / "train")] == ["5"]  # <dir>/<split> is a Dataset
    with pytest.raises(DataError, match=r"a DatasetDict with the splits \['test', 'train'\] \(no split was named\); "
                                        r"point the path at one of them, e.g. .*saved/test"):
        list(read_rows(folder))
    with pytest.raises(DataError, match="it has no split 'validation'"):
        list(read_rows(folder, split="validation"))


def test_a_directory_that_is_no_dataset_is_a_data_error(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(DataError, match="not one written by datasets' save_to_disk"):
        list(read_rows(tmp_path))
    with pytest.raises(DataError, match="a directory, but the dataset's format is jsonl"):
        list(read_rows(tmp_path, "jsonl"))


def test_without_the_datasets_package_the_error_names_the_extra(tmp_path, write_rows, monkeypatch):
    path = write_rows(ROWS, tmp_path, "datasets")
    monkeypatch.setitem(sys.modules, "datasets", None)  # `import datasets` raises ImportError
    with pytest.raises(DataError, match=r'needs the datasets package: pip install "rl-core\[datasets\]"'):
        list(read_rows(path))
