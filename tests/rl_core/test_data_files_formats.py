"""One reader for every dataset: JSONL, JSON, parquet and `datasets` save_to_disk directories give the same
rows; a DatasetDict needs a split; a directory that is no dataset, or no `datasets` package, is one clear error."""

from __future__ import annotations

import os
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


def _truncated(path: str) -> str:
    data = open(path, "rb").read()
    with open(path, "wb") as f:
        f.write(data[: len(data) // 2])
    return path


@pytest.mark.parametrize(("make", "says"), [
    (lambda d, write_rows: _truncated(write_rows(ROWS, d, "parquet")), "Parquet magic bytes not found in footer"),
    (lambda d, write_rows: _text(d / "garbage.parquet", "not parquet at all\n"), "Parquet magic bytes not found"),
    (lambda d, write_rows: _text(d / "zero.parquet", ""), "Parquet file size is 0 bytes"),
])
def test_an_unreadable_parquet_file_is_one_data_error_naming_it(tmp_path, write_rows, make, says):
    path = make(tmp_path, write_rows)
    with pytest.raises(DataError) as err:
        load_rows(path, dict)
    message = str(err.value)
    assert message.startswith(f"{path}: not a readable parquet file ({says}") and "write it again" in message
    assert "\n" not in message and "Could not open" not in message  # pyarrow's prefix repeats the path


def test_jsonl_read_as_parquet_says_to_set_the_format_to_auto(tmp_path, write_rows):
    path = write_rows(ROWS, tmp_path, "jsonl")
    with pytest.raises(DataError, match=rf"^{path}: not a readable parquet file \(Parquet magic bytes .*\); .*name it "
                                        r"\.jsonl or \.json and set the dataset's format to auto$"):
        load_rows(path, dict, file_format="parquet")


def test_a_corrupt_parquet_page_is_one_printable_line(tmp_path, write_rows):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "pages.parquet"
    pq.write_table(pa.Table.from_pylist([{"prompt": "x" * 100}] * 1000), path, compression="none")
    data = bytearray(path.read_bytes())
    data[200:400] = b"\xff" * 200  # footer intact, a page header overwritten
    path.write_bytes(bytes(data))
    with pytest.raises(DataError) as err:
        load_rows(path, dict)
    message = str(err.value)
    assert message.startswith(f"{path}: not a readable parquet file (") and message.isprintable()


@pytest.mark.parametrize(("damage", "says"), [
    ("truncate", "Expected to read"),
    ("delete", "No such file or directory"),
    ("state", "line 1 column 2"),
])
def test_an_unreadable_saved_dataset_is_one_data_error_naming_it(tmp_path, write_rows, damage, says):
    path = write_rows(ROWS, tmp_path, "datasets")
    [arrow] = [os.path.join(path, f) for f in os.listdir(path) if f.endswith(".arrow")]
    if damage == "truncate":
        _text(arrow, open(arrow, "rb").read()[:100])
    elif damage == "delete":
        os.remove(arrow)
    else:
        _text(os.path.join(path, "state.json"), "{oops")
    with pytest.raises(DataError) as err:
        load_rows(path, dict)
    assert str(err.value).startswith(f"{path}: not a readable datasets save_to_disk directory (")
    assert says in str(err.value) and str(err.value).endswith("save the dataset again with save_to_disk (one of its "
                                                               "files may be truncated or corrupt)")


def test_format_datasets_on_a_file_says_it_is_a_file(tmp_path, write_rows):
    path = write_rows(ROWS, tmp_path, "jsonl")
    with pytest.raises(DataError, match=rf"^{path}: a file, but the dataset's format is datasets \(a save_to_disk "
                                        r"directory\); set it to auto or to the file's format"):
        load_rows(path, dict, file_format="datasets")


def _text(path, content: str | bytes):
    with open(path, "wb") as f:
        f.write(content.encode() if isinstance(content, str) else content)
    return path
