"""`rl eval` on images: a tiny VLM on the shapes task's validation split (procedural, drawn images) through the
native engine; each greedy answer equals HF `generate` on the item's chat with its image, the shapes grader
scores it, the report holds the images as their sizes; a text-only generation backend is refused."""

from __future__ import annotations

import json

import pytest
import torch

from rl_eval.cli import main

SHAPES = "datasets=[{data: {kind: procedural, source: {kind: shapes, image_size: 64, validation_size: 3}, " \
         "split: validation}}]"


@pytest.fixture(scope="module")
def vlm_dir(tiny_vlm_dir) -> str:
    return tiny_vlm_dir("qwen2_5_vl")


def test_eval_on_the_shapes_validation_split_equals_hf_generate(vlm_dir, tmp_path, capsys):
    from transformers import AutoModelForImageTextToText

    from rl_core.models.processor import load_processor
    from rl_core.vision_inputs import encode_chat
    from rl_environments.shapes import ShapesDatasetConfig

    args = [f"model={vlm_dir}", "model_name=vlm", SHAPES, "sampling.n=2", "k_values=[1,2]", "greedy=true",
            "sampling.max_new_tokens=6", "progress=false", "generation.dtype=float32",
            f"report_path={tmp_path / 'r.json'}"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "model=vlm dataset=shapes-validation" in out and " greedy score=" in out
    report = json.loads((tmp_path / "r.json").read_text())["results"][0]
    assert report["num_items"] == 3
    first = report["items"][0]["messages"][-1]["content"][0]
    assert first == {"type": "image", "size": [64, 64]}

    items = ShapesDatasetConfig(image_size=64, validation_size=3).generate("validation", None)
    model = AutoModelForImageTextToText.from_pretrained(vlm_dir, dtype=torch.float32).eval()
    processor = load_processor(vlm_dir)
    for item, result in zip(items, report["items"]):
        encoded = encode_chat(processor, item.messages, add_generation_prompt=True)
        inputs = {"input_ids": torch.tensor([encoded.input_ids]),
                  "mm_token_type_ids": torch.tensor([encoded.mm_token_type_ids]), **encoded.image_inputs}
        tokens = model.generate(**inputs, max_new_tokens=6, do_sample=False)[0, len(encoded.input_ids):]
        text = processor.tokenizer.decode(tokens, skip_special_tokens=True)
        assert result["greedy"]["text"] == text
        assert result["greedy"]["correct"] is (f"\\boxed{{{item.metadata['answer']}}}" == text.strip())
        assert len(result["samples"]) == 2


def test_a_text_only_generation_backend_is_refused(vlm_dir, capsys):
    assert main([f"model={vlm_dir}", SHAPES, "generation.backend=sglang", "progress=false"]) == 2
    assert "is a vision-language model; generation.backend='sglang' takes text prompts only" in capsys.readouterr().err
