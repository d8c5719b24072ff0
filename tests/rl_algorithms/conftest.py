"""Fixtures shared by the rollout tests: the tiny model's tokenizer and a native engine on it
(helpers they share live in rollout_testlib.py, importable from this folder)."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    from rl_backends_gen.native import NativeEngine

    return NativeEngine(tiny_model_dir, max_batch_size=16, seed=0)


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)
