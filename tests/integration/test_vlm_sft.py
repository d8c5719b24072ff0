"""`rl sft` on images: the sft_vlm_shapes recipe on a tiny Qwen2.5-VL (3 steps, exact resume, HF export that
loads with its processor), a missing image stops the CLI with the file and row, --dry-run shows the image."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from rl_apps import recipe_path
from rl_apps.cli import main
from rl_apps.commands import sft
from rl_core.config import load_config
from rl_core.logging import read_jsonl_metrics

NOT_COMPARED = ("train/time/", "train/throughput/", "train/memory/", "timestamp")


@pytest.fixture(scope="module")
def tiny_vlm_dir(tmp_path_factory) -> str:
    from rl_core.models.tiny_vlm import save_tiny_vlm

    return str(save_tiny_vlm(tmp_path_factory.mktemp("tiny-qwen2_5_vl"), family="qwen2_5_vl"))


def overrides(model: str, out: Path, *extra: str) -> list[str]:
    return [f"model={model}", f"output_dir={out}", "synthetic_data.train_size=12", "synthetic_data.validation_size=4",
            "synthetic_data.image_size=32", "sft.batch_size=4", "policy.micro_batch_size=2", "sft.val_every=3",
            "sft.val_batch_size=4", "checkpointing.every_n_steps=1", *extra]


def run(model: str, out: Path, *extra: str) -> None:
    cfg = load_config(sft.CONFIG_CLASS, recipe_path("sft_vlm_shapes.yaml"), overrides(model, out, *extra))
    assert sft.run(cfg) == 0


def step_metrics(out: Path, step: int) -> dict:
    merged: dict = {}
    for record in read_jsonl_metrics(out / "metrics.jsonl"):
        if record["step"] == step:
            merged.update(record)
    return {k: v for k, v in merged.items() if not k.startswith(NOT_COMPARED)}


def hf_weights(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return {k: v for path in sorted(folder.glob("*.safetensors")) for k, v in load_file(str(path)).items()}


def test_three_steps_resume_exactly_and_the_export_loads(tiny_vlm_dir, tmp_path):
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    run(tiny_vlm_dir, straight, "sft.max_steps=3")
    run(tiny_vlm_dir, resumed, "sft.max_steps=2")
    run(tiny_vlm_dir, resumed, "sft.max_steps=3", "checkpointing.resume=true")
    expected = step_metrics(straight, 3)
    assert "train/loss" in expected and "val/nll" in expected and expected["train/num_valid_sequences"] == 4
    assert step_metrics(resumed, 3) == expected
    losses = [step_metrics(straight, s)["train/loss"] for s in (1, 2, 3)]
    assert losses[2] < losses[0]
    final, again = hf_weights(straight / "hf"), hf_weights(resumed / "hf")
    assert final.keys() == again.keys() and all(torch.equal(final[k], again[k]) for k in final)

    from transformers import AutoModelForImageTextToText

    from rl_core.image_files import load_image_chats
    from rl_core.models.processor import load_processor
    from rl_core.vision_inputs import encode_chat

    model = AutoModelForImageTextToText.from_pretrained(straight / "hf").eval()
    processor = load_processor(straight / "hf")
    chat = load_image_chats(straight / "data" / "validation.jsonl")[0]
    encoded = encode_chat(processor, chat.messages[:-1], add_generation_prompt=True)
    inputs = {"input_ids": torch.tensor([encoded.input_ids]), "mm_token_type_ids": torch.tensor([encoded.mm_token_type_ids]),
              **encoded.image_inputs}
    out = model.generate(**inputs, max_new_tokens=4, do_sample=False)
    prompt_length = len(encoded.input_ids)
    assert out[0, :prompt_length].tolist() == encoded.input_ids and prompt_length < out.shape[1] <= prompt_length + 4


def _image_row(image: str) -> dict:
    return {"messages": [{"role": "user", "content": [{"type": "image", "image": image},
                                                      {"type": "text", "text": "What colour?"}]},
                         {"role": "assistant", "content": "\\boxed{red}"}]}


def test_a_missing_image_stops_the_cli_with_its_file_and_row(tiny_vlm_dir, tmp_path, capsys):
    from PIL import Image

    Image.new("RGB", (32, 32), (220, 30, 30)).save(tmp_path / "red.png")
    data = tmp_path / "train.jsonl"
    data.write_text(json.dumps(_image_row("red.png")) + "\n" + json.dumps(_image_row("imgs/gone.png")) + "\n")
    code = main(["sft", "--config", "sft_vlm_shapes", f"output_dir={tmp_path / 'run'}", f"model={tiny_vlm_dir}",
                 "synthetic_data=null", f"data.train_path={data}", "sft.batch_size=1"])
    assert code == 2
    err = capsys.readouterr().err
    assert f"{data}, line 2: messages[0].content[0]: image file {tmp_path / 'imgs' / 'gone.png'} does not exist" in err
    assert not (tmp_path / "run").exists()


def test_dry_run_shows_the_image_as_its_size_and_tokens(tiny_vlm_dir, tmp_path, capsys):
    code = main(["sft", "--config", "sft_vlm_shapes", f"output_dir={tmp_path / 'run'}", f"model={tiny_vlm_dir}",
                 "synthetic_data.train_size=16", "synthetic_data.validation_size=2", "--dry-run"])
    out = capsys.readouterr().out
    assert code == 0
    assert "vision-language" in out and "(4 image tokens" in out  # 32 px images, 8 px patches merged 2 x 2
    assert "<|vision_start|>⟨image 32x32 px: 4 tokens⟩<|vision_end|>What colour is the largest shape?" in out
    assert "⟦\\boxed{" in out and not (tmp_path / "run").exists()
