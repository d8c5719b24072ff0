"""SFT data with images: rows of every layout and file form through the model's processor, loss only on the
assistant's reply (never on image tokens), batches with image rows; bad images name their file and row."""

from __future__ import annotations

import io
import json

import pytest
import torch
from PIL import Image

from rl_algorithms.data import ChatDataConfig, collate_samples, load_image_chat_dataset
from rl_algorithms.data.image_chats import expand_mask
from rl_core.data_files import DataError

FAMILIES = ["qwen2_5_vl", "qwen3_vl", "idefics3"]
END_OF_TURN = {"qwen2_5_vl": "<|im_end|>", "qwen3_vl": "<|im_end|>", "idefics3": "<end_of_utterance>"}


@pytest.fixture(scope="module", params=FAMILIES)
def processor(request, tmp_path_factory):
    from rl_core.models.processor import load_processor
    from rl_core.models.tiny_vlm import save_tiny_vlm

    processor = load_processor(save_tiny_vlm(tmp_path_factory.mktemp(request.param), family=request.param))
    processor.family = request.param
    return processor


def png(colour, size=(32, 32)) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, colour).save(buffer, format="PNG")
    return buffer.getvalue()


def rows(folder) -> list[dict]:
    """A chat with an image part, a chat with a placeholder filled from ``images``, a prompt row, a text chat."""
    (folder / "red.png").write_bytes(png((220, 30, 30)))
    (folder / "blue.png").write_bytes(png((30, 60, 220), (48, 24)))
    return [
        {"messages": [{"role": "user", "content": [{"type": "image", "image": "red.png"},
                                                   {"type": "text", "text": "colour?"}]},
                      {"role": "assistant", "content": "\\boxed{red}"}]},
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "and this?"}, {"type": "image"}]},
                      {"role": "assistant", "content": [{"type": "text", "text": "\\boxed{blue}"}]}],
         "images": ["blue.png"]},
        {"prompt": "what is drawn?", "images": "red.png", "completion": "a red square"},
        {"messages": [{"role": "user", "content": "no image"}, {"role": "assistant", "content": "fine"}]},
    ]


def trained_text(processor, sample) -> str:
    return processor.tokenizer.decode([t for t, m in zip(sample.input_ids, sample.loss_mask) if m])


def test_loss_on_the_replies_only_and_image_rows_in_the_batch(processor, tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows(tmp_path)))
    samples = load_image_chat_dataset(str(path), ChatDataConfig(), processor).items
    end = END_OF_TURN[processor.family]
    space = " " if processor.family == "idefics3" else ""  # SmolVLM's template: "Assistant: <reply>"
    assert [trained_text(processor, s) for s in samples] == [
        f"{space}\\boxed{{red}}{end}", f"{space}\\boxed{{blue}}{end}", f"{space}a red square{end}", f"{space}fine{end}"]
    image_token = processor.tokenizer.convert_tokens_to_ids(processor.image_token)
    for sample in samples:
        assert len(sample.loss_mask) == len(sample.input_ids)
        assert all(m == 0 for t, m in zip(sample.input_ids, sample.loss_mask) if t == image_token)
    assert [bool(s.image_inputs) for s in samples] == [True, True, True, False]
    assert [s.input_ids.count(image_token) > 0 for s in samples] == [True, True, True, False]

    batch = collate_samples(samples, pad_token_id=0)
    assert batch["pixel_values"].shape[0] == 4 and batch["loss_mask"].sum() == sum(sum(s.loss_mask) for s in samples)
    if processor.family == "idefics3":
        assert batch["pixel_values"].dim() == 5 and "mm_token_type_ids" not in batch
    else:
        assert batch["image_grid_thw"].shape == (4, 1, 3) and batch["image_grid_thw"][3].sum() == 0
        assert torch.equal(batch["mm_token_type_ids"].bool(), batch["input_ids"] == image_token)


@pytest.mark.parametrize("fmt", ["parquet", "datasets"])
def test_parquet_bytes_and_saved_datasets_give_the_jsonl_samples(tmp_path, fmt):
    from rl_core.models.processor import load_processor
    from rl_core.models.tiny_vlm import save_tiny_vlm

    processor = load_processor(save_tiny_vlm(tmp_path / "model", family="qwen2_5_vl"))
    record = {"prompt": "colour?", "completion": "\\boxed{red}"}
    (tmp_path / "red.png").write_bytes(png((220, 30, 30)))
    (tmp_path / "train.jsonl").write_text(json.dumps(record | {"images": "red.png"}) + "\n")
    expected = load_image_chat_dataset(str(tmp_path / "train.jsonl"), ChatDataConfig(), processor).items[0]
    if fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        path = tmp_path / "train.parquet"
        pq.write_table(pa.Table.from_pylist([record | {"images": png((220, 30, 30))}]), path)
    else:
        import datasets

        datasets.disable_progress_bars()
        path = tmp_path / "saved"
        features = datasets.Features({"prompt": datasets.Value("string"), "completion": datasets.Value("string"),
                                      "images": datasets.Image()})
        datasets.Dataset.from_list([record | {"images": str(tmp_path / "red.png")}], features=features).save_to_disk(path)
    got = load_image_chat_dataset(str(path), ChatDataConfig(), processor).items[0]
    assert got.input_ids == expected.input_ids and got.loss_mask == expected.loss_mask
    assert all(torch.equal(got.image_inputs[k], expected.image_inputs[k]) for k in expected.image_inputs)


def test_a_bad_image_names_file_row_and_image_or_is_skipped(tmp_path):
    from rl_core.models.processor import load_processor
    from rl_core.models.tiny_vlm import save_tiny_vlm

    processor = load_processor(save_tiny_vlm(tmp_path / "model", family="qwen2_5_vl"))
    good = rows(tmp_path)[2]
    (tmp_path / "broken.png").write_bytes(b"not a png")
    path = tmp_path / "train.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in [good, good | {"images": ["red.png", "gone.png"]},
                                                       good | {"images": "broken.png"}]) + "\n")
    with pytest.raises(DataError, match=rf"{path}, line 2: images\[1\]: image file .*gone.png does not exist"):
        load_image_chat_dataset(str(path), ChatDataConfig(), processor)
    loaded = load_image_chat_dataset(str(path), ChatDataConfig(on_bad_row="skip"), processor)
    assert len(loaded) == 1 and loaded.report.num_skipped == 2
    assert "line 3: images[0]: cannot decode image file" in loaded.report.skipped_reasons[1]
    with pytest.raises(DataError, match=r"line 1: \d+ tokens \(images included\), longer than data.max_length=20"):
        load_image_chat_dataset(str(path), ChatDataConfig(max_length=20), processor)


def test_expand_mask_carries_the_mask_over_inserted_image_tokens():
    assert expand_mask([1, 9, 2, 3], [0, 0, 1, 1], [1, 9, 9, 9, 2, 3], {9}) == [0, 0, 0, 0, 1, 1]
    assert expand_mask([1, 9, 2], [0, 0, 1], [1, 7, 9, 9, 7, 2], {7, 9}) == [0, 0, 0, 0, 0, 1]
    with pytest.raises(DataError, match="not the chat template's tokens"):
        expand_mask([1, 9, 2], [0, 0, 1], [1, 9, 5, 2], {9})
