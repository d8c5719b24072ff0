"""`rl eval` on images: a tiny VLM on the shapes task's validation split (procedural, drawn images) and on an image
JSONL through the native engine; each greedy answer equals HF `generate` on the item's chat with its image, the
grader scores it, the report holds the images as their sizes; a missing image names its file and row; a
text-only generation backend is refused."""

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
    for item, result in zip(items, report["items"]):
        text = hf_greedy(vlm_dir, item.messages, 6)
        assert result["greedy"]["text"] == text
        assert result["greedy"]["correct"] is (f"\\boxed{{{item.metadata['answer']}}}" == text.strip())
        assert len(result["samples"]) == 2


def hf_greedy(model_dir: str, messages: list, max_new_tokens: int) -> str:
    """HF ``generate``'s greedy answer to ``messages`` (with their images), decoded."""
    from transformers import AutoModelForImageTextToText

    from rl_core.models.processor import load_processor
    from rl_core.vision_inputs import encode_chat

    model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.float32).eval()
    processor = load_processor(model_dir)
    encoded = encode_chat(processor, messages, add_generation_prompt=True)
    inputs = {"input_ids": torch.tensor([encoded.input_ids]),
              "mm_token_type_ids": torch.tensor([encoded.mm_token_type_ids]), **encoded.image_inputs}
    tokens = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)[0, len(encoded.input_ids):]
    return processor.tokenizer.decode(tokens, skip_special_tokens=True)


def test_eval_on_an_image_jsonl(vlm_dir, tmp_path, capsys):
    from PIL import Image

    (tmp_path / "imgs").mkdir()
    Image.new("RGB", (48, 32), (220, 30, 30)).save(tmp_path / "imgs" / "red.png")
    Image.new("RGB", (32, 32), (30, 30, 220)).save(tmp_path / "imgs" / "blue.png")
    rows = [{"prompt": "What colour is it?", "images": "imgs/red.png", "answer": "red"},
            {"prompt": "And this one?", "images": ["imgs/blue.png"], "answer": "blue"}]
    data = tmp_path / "colours.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    dataset = (f"datasets=[{{data: {{kind: file, path: {data}, images_field: images, "
               "instruction: 'One word.'}, grader: {name: shapes}}]")
    args = [f"model={vlm_dir}", dataset, "greedy=true", "sampling.max_new_tokens=5", "progress=false",
            f"report_path={tmp_path / 'r.json'}"]
    assert main(args) == 0, capsys.readouterr().err
    report = json.loads((tmp_path / "r.json").read_text())["results"][0]
    assert report["dataset"] == "colours" and report["num_items"] == 2
    red = Image.open(tmp_path / "imgs" / "red.png")
    messages = [{"role": "user", "content": [{"type": "image", "image": red},
                                             {"type": "text", "text": "What colour is it? One word."}]}]
    assert report["items"][0]["messages"] == [{"role": "user", "content": [
        {"type": "image", "size": [48, 32]}, {"type": "text", "text": "What colour is it? One word."}]}]
    assert report["items"][0]["greedy"]["text"] == hf_greedy(vlm_dir, messages, 5)

    rows.append({"prompt": "Gone?", "images": "imgs/gone.png", "answer": "red"})
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    capsys.readouterr()
    assert main(args) == 2
    err = capsys.readouterr().err
    assert f"{data}, line 3" in err and "gone.png does not exist" in err


def test_a_text_only_generation_backend_is_refused(vlm_dir, capsys):
    assert main([f"model={vlm_dir}", SHAPES, "generation.backend=sglang", "progress=false"]) == 2
    assert "is a vision-language model; generation.backend='sglang' takes text prompts only" in capsys.readouterr().err


def test_rl_eval_dry_run_shows_the_item_with_its_image_tokens(vlm_dir, capsys):
    pytest.importorskip("rl_apps")
    from rl_apps.cli import main as rl_main

    assert rl_main(["eval", f"model={vlm_dir}", SHAPES, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "sample    shapes-validation, item 1: " in out and "(4 image tokens, ⟨ ⟩)" in out
    assert "<|vision_start|>⟨image 32x32 px: 4 tokens⟩<|vision_end|>What colour is the largest shape?" in out
