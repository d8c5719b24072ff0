"""Image datasets as chats: JSONL (relative paths, data: URLs, OpenAI parts, placeholders), parquet
(bytes and HF image structs), datasets saved to disk; every bad image named by file and row."""

from __future__ import annotations

import base64
import io
import json

import numpy as np
import pytest
from PIL import Image

from rl_core.data_files import DataError
from rl_core.image_files import load_image_chats, write_image_jsonl
from rl_core.images import ImageChat, ImageDataError, decode_image, jsonable_messages, message_images

RED, GREEN, BLUE = (255, 0, 0), (0, 255, 0), (0, 0, 255)


def _image(colour, size=(6, 4)) -> Image.Image:
    image = Image.new("RGB", size, colour)
    image.putpixel((1, 1), (7, 8, 9))  # not a flat colour: a decode that loses pixels would show
    return image


def _png(colour, size=(6, 4)) -> bytes:
    buffer = io.BytesIO()
    _image(colour, size).save(buffer, format="PNG")
    return buffer.getvalue()


def _data_url(colour) -> str:
    return "data:image/png;base64," + base64.b64encode(_png(colour)).decode()


def _same(image: Image.Image, colour, size=(6, 4)) -> bool:
    return np.array_equal(np.asarray(image.convert("RGB")), np.asarray(_image(colour, size)))


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_jsonl_paths_data_urls_openai_parts_and_placeholders(tmp_path):
    (tmp_path / "imgs").mkdir()
    (tmp_path / "imgs" / "red.png").write_bytes(_png(RED))
    (tmp_path / "green.png").write_bytes(_png(GREEN))
    path = _write_jsonl(tmp_path / "data.jsonl", [
        {"messages": [{"role": "user", "content": [{"type": "image", "image": "imgs/red.png"},
                                                    {"type": "text", "text": "colour?"}]},
                      {"role": "assistant", "content": "\\boxed{red}"}], "answer": "red"},
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": _data_url(BLUE)}},
                                                    {"type": "text", "text": "and this?"}]}]},
        {"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "image"},
                                                    {"type": "text", "text": "two"}]}],
         "images": ["green.png", str(tmp_path / "imgs" / "red.png")]},
        {"problem": "what colour?", "images": _data_url(GREEN), "answer": "green"},
    ])
    chats = load_image_chats(path)
    assert [c.where for c in chats] == [f"{path}, line {n}" for n in (1, 2, 3, 4)]
    first = chats[0]
    assert first.fields == {"answer": "red"}
    assert first.messages[1] == {"role": "assistant", "content": "\\boxed{red}"}
    assert first.messages[0]["content"][1] == {"type": "text", "text": "colour?"}
    assert _same(message_images(first.messages)[0], RED)
    assert _same(message_images(chats[1].messages)[0], BLUE)
    assert [_same(i, c) for i, c in zip(message_images(chats[2].messages), (GREEN, RED))] == [True, True]
    prompt = chats[3].messages
    assert len(prompt) == 1 and prompt[0]["role"] == "user"
    assert [p["type"] for p in prompt[0]["content"]] == ["image", "text"]  # images first, then the question
    assert prompt[0]["content"][1]["text"] == "what colour?" and _same(prompt[0]["content"][0]["image"], GREEN)
    assert jsonable_messages(first.messages)[0]["content"][0] == {"type": "image", "size": [6, 4]}


def test_parquet_bytes_and_hf_image_structs(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    table = pa.table({
        "problem": ["first", "second"],
        "images": [_png(RED), _png(BLUE)],
        "answer": ["red", "blue"],
    })
    pq.write_table(table, tmp_path / "bytes.parquet")
    chats = load_image_chats(tmp_path / "bytes.parquet")
    assert [c.fields["answer"] for c in chats] == ["red", "blue"]
    assert _same(message_images(chats[1].messages)[0], BLUE)
    assert chats[1].where == f"{tmp_path / 'bytes.parquet'}, row 2"

    (tmp_path / "blue.png").write_bytes(_png(BLUE))
    structs = pa.table({"problem": ["a", "b"], "images": [[{"bytes": _png(GREEN), "path": "x.png"}],
                                                        [{"bytes": None, "path": "blue.png"}]]})
    pq.write_table(structs, tmp_path / "structs.parquet")
    chats = load_image_chats(tmp_path / "structs.parquet")
    assert _same(message_images(chats[0].messages)[0], GREEN)  # bytes win over the path
    assert _same(message_images(chats[1].messages)[0], BLUE)  # no bytes: the path, relative to the file


def test_datasets_saved_to_disk_with_image_features(tmp_path):
    datasets = pytest.importorskip("datasets")
    features = datasets.Features({"problem": datasets.Value("string"), "image": datasets.Image(),
                                  "images": datasets.List(datasets.Image()), "answer": datasets.Value("string")})
    rows = {"problem": ["q1", "q2"], "image": [_image(RED), _image(GREEN)],
            "images": [[_image(BLUE)], [_image(RED), _image(GREEN)]], "answer": ["red", "green"]}
    datasets.DatasetDict({"train": datasets.Dataset.from_dict(rows, features=features)}).save_to_disk(tmp_path / "ds")
    chats = load_image_chats(tmp_path / "ds", split="train", images_field="image")
    assert [c.fields["answer"] for c in chats] == ["red", "green"]
    assert _same(message_images(chats[1].messages)[0], GREEN)
    assert chats[1].where == f"{tmp_path / 'ds'} (train), row 2"
    lists = load_image_chats(tmp_path / "ds", split="train", images_field="images")
    assert [[_same(i, c) for i, c in zip(message_images(ch.messages), cs)] for ch, cs in
            zip(lists, [(BLUE,), (RED, GREEN)])] == [[True], [True, True]]
    with pytest.raises(ImageDataError, match=r"the dataset has the splits \['train'\]: choose one \(no split 'test'\)"):
        load_image_chats(tmp_path / "ds", split="test")


def test_saved_dataset_with_a_broken_image_names_its_row(tmp_path):
    datasets = pytest.importorskip("datasets")
    features = datasets.Features({"problem": datasets.Value("string"), "images": datasets.Image()})
    good = {"bytes": _png(RED), "path": None}
    broken = {"bytes": _png(RED)[:40], "path": None}  # a truncated PNG
    datasets.Dataset.from_dict({"problem": ["a", "b", "c"], "images": [good, good, broken]},
                               features=features).save_to_disk(tmp_path / "ds")
    with pytest.raises(ImageDataError) as err:
        load_image_chats(tmp_path / "ds")
    assert str(err.value).startswith(f"{tmp_path / 'ds'}, row 3: images[0]: cannot decode the image bytes (40 bytes)")
    assert str(err.value).endswith("; fix or remove the row")


@pytest.mark.parametrize("row, problem", [
    ({"problem": "q", "images": "missing.png"}, "images[0]: image file {dir}/missing.png does not exist"),
    ({"problem": "q", "images": "bad.png"}, "images[0]: cannot decode image file {dir}/bad.png (UnidentifiedImageError"),
    ({"problem": "q", "images": "data:image/png;base64,@@@"}, "images[0]: data: URL image is not valid base64"),
    ({"problem": "q", "images": "data:image/png,abc"}, "images[0]: data: URL 'data:image/png,abc'... is not a base64 image"),
    ({"problem": "q", "images": "https://example.com/a.png"}, "images[0]: image 'https://example.com/a.png' is a remote URL"),
    ({"problem": "q", "images": 7}, "images[0]: an image must be a path, a data: URL, bytes or {bytes, path}, got int"),
    ({"problem": "q"}, "the row has no image"),
    ({"text": "q", "images": "red.png"}, "the row has neither 'messages' nor 'problem'"),
    ({"messages": [{"role": "user", "content": [{"type": "image"}]}]},
     "messages[0].content[0] is an image placeholder but 'images' has no image left for it"),
    ({"messages": [{"role": "user", "content": [{"type": "image"}]}], "images": ["red.png", "red.png"]},
     "'images' holds 2 images but the messages have only 1 image placeholders"),
    ({"messages": [{"role": "user", "content": [{"type": "audio", "audio": "a.wav"}]}]},
     "messages[0].content[0] must be a text part"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "nope.png"}}]}]},
     "messages[0].content[0]: image file {dir}/nope.png does not exist"),
])
def test_bad_rows_name_file_line_and_image(tmp_path, row, problem):
    (tmp_path / "red.png").write_bytes(_png(RED))
    (tmp_path / "bad.png").write_bytes(b"not an image at all")
    path = _write_jsonl(tmp_path / "data.jsonl", [{"problem": "fine", "images": "red.png"}, row])
    with pytest.raises(ImageDataError) as err:
        load_image_chats(path)
    assert str(err.value).startswith(f"{path}, line 2: " + problem.replace("{dir}", str(tmp_path)))


def test_file_level_errors(tmp_path):
    with pytest.raises(ImageDataError, match="the dataset file does not exist"):
        load_image_chats(tmp_path / "none.jsonl")
    (tmp_path / "x.csv").write_text("a,b\n")
    with pytest.raises(ImageDataError, match="unsupported dataset format '.csv'"):
        load_image_chats(tmp_path / "x.csv")
    (tmp_path / "bad.jsonl").write_text('{"problem": "q", "images": "a.png"}\n{oops\n')
    with pytest.raises(ImageDataError, match=r"bad.jsonl, line 1: images\[0\]: image file .*a.png does not exist"):
        load_image_chats(tmp_path / "bad.jsonl")
    (tmp_path / "bad2.jsonl").write_text('\n{oops\n')
    with pytest.raises(ImageDataError, match=r"bad2.jsonl, line 2: invalid JSON"):
        load_image_chats(tmp_path / "bad2.jsonl")


def test_decode_image_accepts_every_reference_form(tmp_path):
    (tmp_path / "r.png").write_bytes(_png(RED))
    forms = [_image(RED), _png(RED), {"bytes": _png(RED), "path": None}, {"bytes": None, "path": "r.png"},
             _data_url(RED), "r.png", str(tmp_path / "r.png")]
    assert all(_same(decode_image(ref, tmp_path), RED) for ref in forms)


def test_write_image_jsonl_round_trips(tmp_path):
    chats = [ImageChat([{"role": "user", "content": [{"type": "image", "image": _image(c)},
                                                     {"type": "text", "text": f"colour {i}?"}]},
                        {"role": "assistant", "content": f"\\boxed{{{i}}}"}], {"answer": str(i)})
             for i, c in enumerate((RED, GREEN, BLUE))]
    path = write_image_jsonl(tmp_path / "out" / "train.jsonl", chats)
    assert sorted(p.name for p in (tmp_path / "out" / "images").iterdir()) == [
        "train-000001-1.png", "train-000002-1.png", "train-000003-1.png"]
    assert not [p for p in (tmp_path / "out").rglob(".*")]  # no temporary files left
    first = json.loads(path.read_text().splitlines()[0])
    assert first["messages"][0]["content"][0] == {"type": "image", "image": "images/train-000001-1.png"}
    back = load_image_chats(path)
    assert [c.fields for c in back] == [{"answer": "0"}, {"answer": "1"}, {"answer": "2"}]
    assert [_same(message_images(c.messages)[0], col) for c, col in zip(back, (RED, GREEN, BLUE))] == [True] * 3
    assert back[2].messages[1] == {"role": "assistant", "content": "\\boxed{2}"}


def test_an_image_path_that_is_a_directory_says_so(tmp_path):
    (tmp_path / "red.png").write_bytes(_png(RED))
    (tmp_path / "adir.png").mkdir()
    path = _write_jsonl(tmp_path / "data.jsonl", [{"problem": "fine", "images": "red.png"},
                                                  {"problem": "q", "images": "adir.png/"}])
    with pytest.raises(ImageDataError) as err:
        load_image_chats(path)
    assert str(err.value) == (f"{path}, line 2: images[0]: image {tmp_path / 'adir.png'} is a directory, not an image "
                              "file; point the row at an image file; fix or remove the row")


def test_an_unreadable_parquet_file_or_saved_dataset_is_one_data_error(tmp_path):
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    datasets.disable_progress_bars()
    rows = [{"problem": "q", "images": _png(RED)}] * 4
    parquet = tmp_path / "rows.parquet"
    pq.write_table(pa.Table.from_pylist(rows), parquet)
    parquet.write_bytes(parquet.read_bytes()[:200])
    with pytest.raises(DataError) as err:
        load_image_chats(parquet)
    assert str(err.value).startswith(f"{parquet}: not a readable parquet file (Parquet magic bytes not found")
    saved = tmp_path / "saved"
    datasets.Dataset.from_list(rows).save_to_disk(saved)
    [arrow] = saved.glob("*.arrow")
    arrow.write_bytes(arrow.read_bytes()[:100])
    with pytest.raises(DataError) as err:
        load_image_chats(saved)
    assert str(err.value).startswith(f"{saved}: not a readable datasets save_to_disk directory (Expected to read")
