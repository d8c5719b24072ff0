"""The shapes environment: disjoint splits, answers that match the pixels, deterministic images, a strict
grader, the dataset config in the DatasetConfig union, and warm-up SFT data read back as image chats."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest
from pydantic import TypeAdapter, ValidationError

from rl_core.image_files import load_image_chats
from rl_core.images import message_images
from rl_environments import EnvConfig, build_environment
from rl_environments.config import DatasetConfig
from rl_environments.shapes import PALETTE, ShapesDatasetConfig, ShapesEnvironment, write_shapes_sft_data


def _image(sample):
    return message_images(sample.messages)[0]


def _pixel_counts(image) -> Counter:
    """Pixels per palette colour (white background left out)."""
    names = {rgb: name for name, rgb in PALETTE.items()}
    return Counter(names[tuple(p)] for p in np.asarray(image).reshape(-1, 3).tolist() if tuple(p) in names)


def test_splits_are_disjoint_and_sized():
    cfg = ShapesDatasetConfig(train_size=300, validation_size=40, test_size=40)
    splits = {split: cfg.build(split) for split in ("train", "validation", "test")}
    assert {split: len(samples) for split, samples in splits.items()} == {"train": 300, "validation": 40, "test": 40}
    keys = {split: {json.dumps(s.metadata["scene"]) for s in samples} for split, samples in splits.items()}
    assert len(keys["train"]) == 300  # distinct scenes within a split
    assert not keys["train"] & keys["validation"] and not keys["train"] & keys["test"]
    assert not keys["validation"] & keys["test"]
    # A bigger train split keeps the smaller one's scenes, and still never takes a validation scene.
    bigger = {json.dumps(s.metadata["scene"]) for s in cfg.build("train", 600)}
    assert keys["train"] <= bigger and not bigger & keys["validation"]


@pytest.mark.parametrize("question", ["colour", "count"])
def test_answers_match_the_pixels(question):
    cfg = ShapesDatasetConfig(question=question, image_size=48, grid=3, max_shapes=5)
    samples = cfg.build("train", 60)
    for sample in samples:
        counts = _pixel_counts(_image(sample))
        if question == "count":
            assert sample.metadata["answer"] == str(len(counts))  # every shape has its own colour
        else:
            assert sample.metadata["answer"] == counts.most_common(1)[0][0]  # the largest shape has the most pixels
    answers = Counter(s.metadata["answer"] for s in samples)
    assert len(answers) == (5 if question == "count" else 6)  # every answer occurs


def test_images_are_deterministic_per_seed():
    first = ShapesDatasetConfig(seed=3).build("validation", 20)
    again = ShapesDatasetConfig(seed=3).build("validation", 20)
    other = ShapesDatasetConfig(seed=4).build("validation", 20)
    assert all(_image(a).tobytes() == _image(b).tobytes() for a, b in zip(first, again))
    assert [s.metadata for s in first] == [s.metadata for s in again]
    assert sum(_image(a).tobytes() != _image(b).tobytes() for a, b in zip(first, other)) >= 15
    sample = first[0]
    assert _image(sample).size == (32, 32) and _image(sample).mode == "RGB"
    assert sample.env == "shapes"
    assert sample.messages[0]["content"][1] == {
        "type": "text", "text": "What colour is the largest shape? Write your final answer as \\boxed{ANSWER}."}


@pytest.mark.parametrize("reply, answer, correct, fmt", [
    ("\\boxed{red}", "red", 1.0, 1.0),
    ("The largest shape is red, so \\boxed{Red}.", "red", 1.0, 1.0),
    ("\\boxed{ red }", "red", 1.0, 1.0),
    ("\\boxed{blue}", "red", 0.0, 1.0),
    ("\\boxed{3}", "3", 1.0, 1.0),
    ("\\boxed{03}", "3", 1.0, 1.0),
    ("\\boxed{three}", "3", 0.0, 0.0),
    ("\\boxed{3.0}", "3", 0.0, 0.0),
    ("\\boxed{-3}", "3", 0.0, 0.0),
    ("red", "red", 0.0, 0.0),
    ("\\boxed{red} \\boxed{red}", "red", 0.0, 0.0),
    ("\\boxed{blue}, no wait \\boxed{red}", "red", 0.0, 0.0),
    ("\\boxed{dark red}", "red", 0.0, 0.0),
    ("\\boxed{}", "red", 0.0, 0.0),
    ("\\boxed{red", "red", 0.0, 0.0),
])
def test_grader_is_strict(reply, answer, correct, fmt):
    env = ShapesEnvironment(format_weight=0.5)
    messages = [{"role": "user", "content": [{"type": "text", "text": "q"}]}, {"role": "assistant", "content": reply}]
    result = env.step(messages, {"answer": answer}, None)
    assert result.reward_components == {"correct": correct, "format": fmt}
    assert result.reward == correct + 0.5 * fmt and result.done


def test_registered_and_built_from_configs():
    assert isinstance(build_environment("shapes"), ShapesEnvironment)
    assert EnvConfig(name="shapes", kwargs={"format_weight": 0.1}).build().format_weight == 0.1
    cfg = TypeAdapter(DatasetConfig).validate_python({"kind": "shapes", "question": "count", "train_size": 5})
    assert isinstance(cfg, ShapesDatasetConfig)
    samples = cfg.build("train")
    assert len(samples) == 5 and all(s.metadata["question"] == "count" for s in samples)
    assert len(cfg.build("validation", size=3)) == 3


@pytest.mark.parametrize("settings, message", [
    ({"min_shapes": 3, "max_shapes": 2}, "min_shapes (3) must be <= max_shapes (2)"),
    ({"grid": 2, "max_shapes": 5}, "max_shapes (5) must be <= grid**2 (4)"),
    ({"image_size": 32, "grid": 5}, "cells of 6 pixels are too small"),
    ({"colour": "red"}, "Extra inputs are not permitted"),
])
def test_bad_settings_are_refused(settings, message):
    with pytest.raises(ValidationError, match=message.replace("(", r"\(").replace(")", r"\)").replace("*", r"\*")):
        ShapesDatasetConfig(**settings)


def test_warmup_sft_data_round_trips_through_the_image_reader(tmp_path):
    cfg = ShapesDatasetConfig(train_size=12, validation_size=4)
    paths = write_shapes_sft_data(cfg, tmp_path / "warmup")
    assert sorted(paths) == ["train", "validation"]
    assert sorted(p.name for p in (tmp_path / "warmup").iterdir()) == ["images", "train.jsonl", "validation.jsonl"]
    env = ShapesEnvironment()
    for split, path in paths.items():
        chats = load_image_chats(path)
        samples = cfg.build(split)
        assert len(chats) == len(samples)
        for chat, sample in zip(chats, samples):
            assert chat.fields == {"answer": sample.metadata["answer"]}
            assert chat.messages[1] == {"role": "assistant", "content": f"\\boxed{{{sample.metadata['answer']}}}"}
            assert chat.messages[0]["content"][1] == sample.messages[0]["content"][1]
            assert np.array_equal(np.asarray(message_images(chat.messages)[0]), np.asarray(_image(sample)))
            assert env.step(chat.messages, chat.fields, None).reward == 1.0
