"""Fixtures for the generation-backend tests: tiny engines, prompts, and a training-style forward."""

from __future__ import annotations

import pytest
import torch

PROMPT_TEXTS = [
    "What is 12 + 7?",
    "the answer is",
    "Please compute 345 * 2 and write the final answer in a box.",
    "x",
    "solve the puzzle: move the tile left, then up, then right, then down again",
]


@pytest.fixture(scope="session")
def tiny_prompts(tiny_tokenizer):
    """Token ids of prompts of different lengths (1 to ~20 tokens)."""
    return [tiny_tokenizer.encode(text) for text in PROMPT_TEXTS]


@pytest.fixture(scope="module")
def llama_engine(tiny_model_dir):
    from rl_backends_gen.native import NativeEngine

    engine = NativeEngine(tiny_model_dir, max_batch_size=16, max_seq_len=256)
    yield engine
    engine.shutdown()


@pytest.fixture(scope="module")
def hf_llama(tiny_model_dir):
    """The HF reference backend, one prompt at a time (no padding), over the same tiny Llama."""
    from rl_backends_gen.hf import HFGenerationBackend

    return HFGenerationBackend(tiny_model_dir, batch_size=1)


def _training_logprobs(model, prompts, completions, temperature: float) -> list[torch.Tensor]:
    """What a training backend computes: ONE forward over right-padded prompt+completion rows, then
    ``log_softmax(logits / T)`` gathered at each completion token. Returns one [len(completion)] per row."""
    rows = [list(p) + list(c) for p, c in zip(prompts, completions)]
    width = max(len(r) for r in rows)
    input_ids = torch.zeros(len(rows), width, dtype=torch.long)
    attention_mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, row in enumerate(rows):
        input_ids[i, : len(row)] = torch.tensor(row)
        attention_mask[i, : len(row)] = 1
    with torch.no_grad():
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits.float()
    logprobs = torch.log_softmax(logits / temperature, dim=-1)
    out = []
    for i, (p, c) in enumerate(zip(prompts, completions)):
        positions = torch.arange(len(p) - 1, len(p) + len(c) - 1)
        out.append(logprobs[i, positions, torch.tensor(c, dtype=torch.long)])
    return out


def _load_hf_model(path: str):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa").eval()


@pytest.fixture(scope="session")
def training_logprobs():
    """The training-style logprob function (see ``_training_logprobs``)."""
    return _training_logprobs


@pytest.fixture(scope="session")
def load_hf_model():
    """Loads a plain HF model (sdpa attention, fp32, eval) from a directory."""
    return _load_hf_model
