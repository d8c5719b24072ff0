"""Fixtures shared by every test folder: tiny models, one Ray per session, GPU skipping."""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture(scope="session")
def tiny_tokenizer():
    from rl_core.models import build_tiny_tokenizer

    return build_tiny_tokenizer()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """An HF directory holding a tiny Llama (head_dim 32) and its tokenizer."""
    from rl_core.models import save_tiny_model

    return str(save_tiny_model(tmp_path_factory.mktemp("tiny-llama"), family="llama"))


@pytest.fixture(scope="session")
def tiny_qwen2_dir(tmp_path_factory):
    from rl_core.models import save_tiny_model

    return str(save_tiny_model(tmp_path_factory.mktemp("tiny-qwen2"), family="qwen2"))


@pytest.fixture(scope="session")
def ray_session():
    """One local Ray for the whole test session (each start costs seconds here)."""
    import ray

    if not ray.is_initialized():
        ray.init(address="local", num_cpus=8, include_dashboard=False, log_to_driver=True, configure_logging=False)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def write_rows():
    """``write_rows(rows, folder, fmt) -> path``: ``rows`` as a .jsonl, .json or .parquet file, or a
    ``datasets`` save_to_disk directory (``fmt``: jsonl, json, parquet or datasets; every form
    rl_core.data_files reads)."""
    import json

    def write(rows: list[dict], folder, fmt: str) -> str:
        path = os.path.join(str(folder), f"rows_{fmt}" + ("" if fmt == "datasets" else f".{fmt}"))
        if fmt == "jsonl":
            with open(path, "w") as f:
                f.writelines(json.dumps(row) + "\n" for row in rows)
        elif fmt == "json":
            with open(path, "w") as f:
                json.dump(rows, f)
        elif fmt == "parquet":
            import pyarrow as pa
            import pyarrow.parquet as pq

            pq.write_table(pa.Table.from_pylist(rows), path)
        else:
            import datasets

            datasets.disable_progress_bars()
            datasets.Dataset.from_list(rows).save_to_disk(path)
        return path

    return write


@pytest.fixture(scope="session")
def tiny_family_dir(tmp_path_factory):
    """``tiny_family_dir(family)``: an HF directory holding the tiny model of ``family`` (any key of
    ``rl_core.models.tiny.FAMILIES``) and its tokenizer, built once per session."""
    from rl_core.models import save_tiny_model

    return _built_once_per_family(tmp_path_factory, save_tiny_model)


def _built_once_per_family(tmp_path_factory, save):
    """``get(family)``: the directory ``save(folder, family=family)`` writes, built on the first call."""
    built: dict[str, str] = {}

    def get(family: str) -> str:
        if family not in built:
            built[family] = str(save(tmp_path_factory.mktemp(f"tiny-{family}"), family=family))
        return built[family]

    return get


@pytest.fixture(scope="session")
def documented_families() -> dict[str, dict[str, str]]:
    """The support table of docs/models.md ("Model families: what runs where"):
    ``{model_type: {column header: cell}}``, backticks stripped."""
    from pathlib import Path

    text = (Path(__file__).parents[1] / "docs" / "models.md").read_text()
    section = text.split("## Model families: what runs where", 1)[1].split("\n## ", 1)[0]
    rows = [[cell.strip().replace("`", "") for cell in line.strip().strip("|").split("|")]
            for line in section.splitlines() if line.startswith("|") and not line.startswith("|---")]
    header, body = rows[0], rows[1:]
    return {row[0].split()[0]: dict(zip(header, row)) for row in body}


@pytest.fixture(scope="session")
def tiny_vlm_dir(tmp_path_factory):
    """``tiny_vlm_dir(family)``: an HF directory holding the tiny vision-language model of ``family``
    (``rl_core.models.tiny_vlm.VLM_FAMILIES``, default size: 32 px images, 4 tokens each) and its processor."""
    from rl_core.models.tiny_vlm import save_tiny_vlm

    return _built_once_per_family(tmp_path_factory, save_tiny_vlm)


@pytest.fixture(scope="session")
def vlm_training_logprobs():
    """``vlm_training_logprobs(model, prompts, completions, temperature)``: what the DTensor backend computes for
    a vision-language model: ONE forward over right-padded prompt + completion rows with each row's image tensors
    (``rl_core.vision_batch``) and Qwen-VL's ``mm_token_type_ids`` (the prompt's, zeros after it), then
    ``log_softmax(logits / T)`` at each completion token. ``prompts``: EncodedChats; one [len(completion)] per row."""
    from rl_core.vision_batch import forward_image_inputs, image_rows

    def compute(model, prompts, completions, temperature: float = 1.0) -> list[torch.Tensor]:
        rows = [list(p.input_ids) + list(c) for p, c in zip(prompts, completions)]
        width = max(len(r) for r in rows)
        input_ids = torch.zeros(len(rows), width, dtype=torch.long)
        attention_mask = torch.zeros_like(input_ids)
        token_types = torch.zeros_like(input_ids)
        for i, (row, prompt) in enumerate(zip(rows, prompts)):
            input_ids[i, : len(row)] = torch.tensor(row)
            attention_mask[i, : len(row)] = 1
            if prompt.mm_token_type_ids is not None:
                token_types[i, : len(prompt.input_ids)] = torch.tensor(prompt.mm_token_type_ids)
        extra = forward_image_inputs(image_rows([p.image_inputs for p in prompts]))
        if prompts[0].mm_token_type_ids is not None:
            extra["mm_token_type_ids"] = token_types
        with torch.no_grad():
            logits = model(input_ids=input_ids, attention_mask=attention_mask, **extra).logits.float()
        logprobs = torch.log_softmax(logits / temperature, dim=-1)
        out = []
        for i, (p, c) in enumerate(zip(prompts, completions)):
            positions = torch.arange(len(p.input_ids) - 1, len(p.input_ids) + len(c) - 1)
            out.append(logprobs[i, positions, torch.tensor(c, dtype=torch.long)])
        return out

    return compute


@pytest.fixture
def sigint_as_in_a_terminal():
    """SIGINT raises KeyboardInterrupt, as in a terminal, for tests that send one: a job started in the
    background by a non-interactive shell (a CI script) starts with SIGINT ignored, and a test run before may
    have left another handler."""
    import signal

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)
