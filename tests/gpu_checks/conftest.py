"""GPU checks across packages (all ``gpu``-marked: skipped without CUDA; scripts/gpu_check.sh runs them).

They reuse the training tests' losses and batches (``backend_testlib``, which needs no Ray) and write
their measurements (memory per phase, ...) into ``$RL_GPU_CHECK_OUT`` when it is set.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "rl_backends_train"))


@pytest.fixture(scope="session")
def report_dir(tmp_path_factory) -> Path:
    """Where a GPU check leaves its measurements: ``$RL_GPU_CHECK_OUT`` or a temporary folder."""
    path = Path(os.environ.get("RL_GPU_CHECK_OUT") or tmp_path_factory.mktemp("gpu-report"))
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="session")
def tiny_prompts(tiny_tokenizer):
    """Token ids of a few prompts of different lengths."""
    texts = ["Compute 17 + 25.", "the answer is", "x", "move the tile left, then up, then right"]
    return [tiny_tokenizer.encode(text) for text in texts]


@pytest.fixture(scope="session")
def load_hf_model():
    """Loads a plain HF model (fp32, eval) from a directory."""
    from transformers import AutoModelForCausalLM

    return lambda path: AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
