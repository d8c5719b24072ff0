"""Small procedural datasets for smoke recipes and tests, written as real JSONL files.

They go through the same loaders as user data. Each generator is a pure function of its seed.

* ``sft``: memorisable arithmetic chats ("What is 3 + 4?" -> "The answer is 7.").
* ``preference``: the chosen response answers in a fixed polite form, the rejected one rambles and
  ends in "wrong": a clear signal that DPO learns and that generalises to held-out pairs.
* ``prompts``: arithmetic questions (on-policy distillation).
* ``text``: short sentences (cross-tokenizer distillation).
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import Literal

from pydantic import Field

from rl_core.config import StrictModel

SyntheticKind = Literal["sft", "preference", "prompts", "text"]
_WORDS = "one two three four five six seven eight nine ten the a of and to in is it".split()


class SyntheticDataConfig(StrictModel):
    """Generate the training (and validation) JSONL into ``<output_dir>/data`` instead of reading files."""

    num_train: int = Field(32, gt=0)
    num_val: int = Field(16, ge=0)
    """Held-out rows (0: no validation file)."""
    seed: int = 0

    def write(self, kind: SyntheticKind, folder: str | Path) -> tuple[str, str | None]:
        """``(train_path, validation_path or None)`` of freshly written ``kind`` files in ``folder``."""
        rows = synthetic_rows(kind, self.num_train + self.num_val, self.seed)
        train = write_jsonl(rows[: self.num_train], Path(folder) / f"{kind}_train.jsonl")
        val = write_jsonl(rows[self.num_train :], Path(folder) / f"{kind}_val.jsonl") if self.num_val else None
        return train, val


def synthetic_rows(kind: SyntheticKind, count: int, seed: int) -> list[dict]:
    rng = random.Random(f"{kind}-{seed}")
    rows = []
    for _ in range(count):
        a, b = rng.randint(0, 20), rng.randint(0, 20)
        question = f"What is {a} + {b}?"
        if kind == "sft":
            rows.append({"prompt": question, "completion": f"The answer is {a + b}."})
        elif kind == "preference":
            filler = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(2, 5)))
            rows.append({"prompt": question, "chosen": f"The answer is {a + b}.",
                         "rejected": f"{filler} {rng.randint(0, 40)} wrong"})
        elif kind == "prompts":
            rows.append({"prompt": question})
        elif kind == "text":
            rows.append({"text": f"{question} The answer is {a + b}."})
        else:
            raise ValueError(f"unknown synthetic dataset kind {kind!r}")
    return rows


def write_jsonl(rows: list[dict], path: str | Path) -> str:
    """Write ``rows`` atomically (temp file + rename); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("".join(json.dumps(row) + "\n" for row in rows))
    os.replace(tmp, path)
    return str(path)


def write_synthetic_dataset(kind: SyntheticKind, cfg: SyntheticDataConfig, folder: str | Path) -> tuple[str, str | None]:
    """``(train_path, validation_path or None)`` of freshly written files in ``folder``: ``cfg.write(kind, folder)``
    (a command may offer other synthetic sets with the same ``write``, e.g. ``rl sft``'s image chats)."""
    return cfg.write(kind, folder)
