"""Shapes: questions about procedurally drawn images (count the shapes, name the colour of the largest one).

A scene is a few coloured circles, squares and triangles, each inside its own cell of a ``grid`` x ``grid``
layout on a white ``image_size``-pixel canvas, every shape a different colour. For ``colour`` questions
exactly one shape is large (its side at least 1.6 times any other side, so it is also the largest by
area whatever the kinds). Scenes are drawn with PIL without anti-aliasing: the same scene gives the same
pixels on every machine. Each scene belongs to one split by a hash of its description
(:mod:`rl_environments.splits`), so validation scenes never appear in training.

The prompt is one user turn: the image, then the question and the boxed-answer instruction. The grader is
strict: exactly one ``\\boxed{}``, holding a palette colour name (any case) or a plain integer.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Literal

from PIL import Image, ImageDraw
from pydantic import Field, model_validator

from rl_core.types import PromptSample, StepResult
from rl_environments.answers import count_boxed, extract_boxed, last_assistant_text
from rl_environments.dataset_base import PromptDatasetConfig
from rl_environments.prompts import BOXED_INSTRUCTION
from rl_environments.splits import SPLITS, Split, generate_split

PALETTE = {"red": (220, 30, 30), "green": (30, 160, 50), "blue": (30, 60, 220), "yellow": (235, 200, 0),
           "purple": (140, 40, 170), "orange": (245, 130, 0)}
KINDS = ("circle", "square", "triangle")
QUESTIONS = {"count": "How many shapes are in the image?", "colour": "What colour is the largest shape?"}
LARGE_OVER_SMALL = 1.6
"""The large shape's side over any other side (colour questions): large by area too, even triangle vs square."""

Shape = tuple[str, str, tuple[int, int, int, int]]  # (kind, colour, (x0, y0, x1, y1) box, inclusive)


class ShapesDatasetConfig(PromptDatasetConfig):
    """Settings of the procedural shapes dataset (images drawn on the fly, deterministic per seed)."""

    kind: Literal["shapes"] = "shapes"
    seed: int = 0
    """Seed of the scene space: same seed, same scenes, same images and same split assignment."""
    question: Literal["count", "colour"] = "colour"
    """``count``: how many shapes; ``colour``: the colour name of the largest shape."""
    image_size: int = Field(32, ge=16, le=512)
    """Side of the square image in pixels (the processor resizes it to the model's own size)."""
    grid: int = Field(2, ge=1, le=6)
    """Cells per side; each shape sits in its own cell, so at most grid**2 shapes."""
    min_shapes: int = Field(1, ge=1)
    max_shapes: int = Field(3, ge=1)
    train_size: int = Field(2000, gt=0)
    validation_size: int = Field(100, ge=0)
    test_size: int = Field(100, ge=0)
    system_prompt: str | None = None
    instruction: str = BOXED_INSTRUCTION
    """Put after the question (empty: the bare question)."""

    @model_validator(mode="after")
    def _fits(self) -> ShapesDatasetConfig:
        if self.min_shapes > self.max_shapes:
            raise ValueError(f"min_shapes ({self.min_shapes}) must be <= max_shapes ({self.max_shapes})")
        if self.max_shapes > self.grid**2 or self.max_shapes > len(PALETTE):
            raise ValueError(f"max_shapes ({self.max_shapes}) must be <= grid**2 ({self.grid**2}) and <= the "
                             f"{len(PALETTE)} palette colours: raise grid or lower max_shapes")
        if self.image_size // self.grid < 8:
            raise ValueError(f"cells of {self.image_size // self.grid} pixels are too small to draw in: raise "
                             "image_size or lower grid (cells need 8 pixels)")
        return self

    def generate(self, split: Split, size: int | None) -> list[PromptSample]:
        return shapes_split(self, split, size)


def make_scene(rng: random.Random, cfg: ShapesDatasetConfig) -> tuple[Shape, ...]:
    """A random scene: shapes in distinct cells, distinct colours; one large shape for colour questions."""
    count = rng.randint(cfg.min_shapes, cfg.max_shapes)
    cells = rng.sample(range(cfg.grid**2), count)
    colours = rng.sample(list(PALETTE), count)
    cell = cfg.image_size // cfg.grid
    large = rng.randrange(count) if cfg.question == "colour" else None
    shapes = []
    for i, (index, colour) in enumerate(zip(cells, colours)):
        if large is None:
            side = rng.randint(max(4, cell * 2 // 5), cell - 2)
        elif i == large:
            side = rng.randint(cell * 4 // 5, cell - 2)
        else:  # at most the large shape's smallest side over 1.6
            side = rng.randint(max(3, cell // 5), max(3, int((cell * 4 // 5) / LARGE_OVER_SMALL)))
        row, col = divmod(index, cfg.grid)
        x0 = col * cell + rng.randint(1, cell - side - 1)
        y0 = row * cell + rng.randint(1, cell - side - 1)
        shapes.append((rng.choice(KINDS), colour, (x0, y0, x0 + side - 1, y0 + side - 1)))
    return tuple(sorted(shapes, key=lambda s: s[2]))


def render_scene(shapes: tuple[Shape, ...], image_size: int) -> Image.Image:
    """The scene drawn on a white RGB canvas (no anti-aliasing: identical pixels everywhere)."""
    image = Image.new("RGB", (image_size, image_size), (255, 255, 255))
    draw = ImageDraw.Draw(image)
    for kind, colour, (x0, y0, x1, y1) in shapes:
        fill = PALETTE[colour]
        if kind == "circle":
            draw.ellipse((x0, y0, x1, y1), fill=fill)
        elif kind == "square":
            draw.rectangle((x0, y0, x1, y1), fill=fill)
        else:
            draw.polygon([(x0, y1), (x1, y1), ((x0 + x1) // 2, y0)], fill=fill)
    return image


def scene_answer(shapes: tuple[Shape, ...], question: str) -> str:
    if question == "count":
        return str(len(shapes))
    return max(shapes, key=lambda s: s[2][2] - s[2][0])[1]


def shapes_split(cfg: ShapesDatasetConfig, split: Split, size: int | None = None) -> list[PromptSample]:
    """The ``split`` of the shapes dataset: distinct scenes, disjoint from the other splits."""
    size = getattr(cfg, f"{split}_size") if size is None else size
    name = f"shapes-{cfg.question}-s{cfg.image_size}-g{cfg.grid}-n{cfg.min_shapes}to{cfg.max_shapes}"
    scenes = generate_split(lambda rng: make_scene(rng, cfg), json.dumps, seed=cfg.seed, split=split,
                            size=size, name=name)
    return [_sample(scene, cfg) for scene in scenes]


def _sample(shapes: tuple[Shape, ...], cfg: ShapesDatasetConfig) -> PromptSample:
    question = f"{QUESTIONS[cfg.question]} {cfg.instruction}".rstrip()
    content = [{"type": "image", "image": render_scene(shapes, cfg.image_size)}, {"type": "text", "text": question}]
    messages = [{"role": "system", "content": cfg.system_prompt}] if cfg.system_prompt else []
    messages.append({"role": "user", "content": content})
    metadata = {"answer": scene_answer(shapes, cfg.question), "question": cfg.question,
                "scene": [[kind, colour, list(box)] for kind, colour, box in shapes]}
    return PromptSample(messages=messages, metadata=metadata, env="shapes")


def parse_shapes_answer(text: str) -> str | None:
    """The answer of a strictly formatted reply: the content of its only ``\\boxed{}`` when that is a palette
    colour (lower-cased) or a plain integer; None otherwise (no box, two boxes, anything else inside)."""
    if count_boxed(text) != 1:
        return None
    content = (extract_boxed(text) or "").strip()
    if content.lower() in PALETTE:
        return content.lower()
    return str(int(content)) if re.fullmatch(r"\d+", content) else None


class ShapesEnvironment:
    """Single-turn grader. ``correct``: the strict answer (:func:`parse_shapes_answer`) equals
    ``metadata['answer']``; ``format``: the reply is strictly formatted. Reward = correct + format_weight * format."""

    def __init__(self, format_weight: float = 0.0):
        self.format_weight = float(format_weight)

    def step(self, messages, metadata, state) -> StepResult:
        if "answer" not in metadata:
            raise KeyError("shapes environment needs metadata['answer']")
        answer = parse_shapes_answer(last_assistant_text(messages))
        correct = float(answer is not None and answer == str(metadata["answer"]).lower())
        fmt = float(answer is not None)
        return StepResult(reward=correct + self.format_weight * fmt,
                          reward_components={"correct": correct, "format": fmt}, done=True)


def write_shapes_sft_data(cfg: ShapesDatasetConfig, out_dir: str | Path,
                          splits: tuple[Split, ...] = ("train", "validation"),
                          answer_template: str = "\\boxed{{{answer}}}") -> dict[str, Path]:
    """Warm-up SFT data: ``<out_dir>/<split>.jsonl`` (prompt with its image + the correct reply) and the images as
    PNG files under ``<out_dir>/images/``, the layout :func:`rl_core.image_files.load_image_chats` reads.
    Returns the JSONL path of each split."""
    from rl_core.image_files import write_image_jsonl
    from rl_core.images import ImageChat

    unknown = [s for s in splits if s not in SPLITS]
    if unknown:
        raise ValueError(f"unknown splits {unknown}; use some of {SPLITS}")
    paths = {}
    for split in splits:
        chats = [ImageChat(sample.messages + [{"role": "assistant", "content": answer_template.format(
            answer=sample.metadata["answer"])}], {"answer": sample.metadata["answer"]}) for sample in cfg.build(split)]
        paths[split] = write_image_jsonl(Path(out_dir) / f"{split}.jsonl", chats)
    return paths
