"""VLM checkpoints: HF <-> DCP round trips of the tiny Qwen2.5-VL, Qwen3-VL and Idefics3 keep the vision
tower's weights and the processor files, and the result loads with AutoModelForImageTextToText."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from conftest import assert_same_tensors, read_hf_dir
from PIL import Image

from rl_checkpoint import hf_to_dcp, to_hf

PROCESSOR_FILES = ["chat_template.jinja", "processor_config.json", "tokenizer.json", "tokenizer_config.json",
                   "generation_config.json", "additional_chat_templates/short.jinja"]
VISION_PREFIX = {"qwen2_5_vl": "visual.", "qwen3_vl": "model.visual.", "idefics3": "model.vision_model."}


@pytest.fixture(scope="module", params=["qwen2_5_vl", "qwen3_vl", "idefics3"])
def vlm_dir(request, tmp_path_factory) -> tuple[str, Path]:
    from rl_core.models.tiny_vlm import save_tiny_vlm

    path = save_tiny_vlm(tmp_path_factory.mktemp(request.param) / "hf", family=request.param)
    # A named chat template as transformers saves one (a folder, not a file): it must travel too.
    (path / "additional_chat_templates").mkdir()
    (path / "additional_chat_templates" / "short.jinja").write_text("{{ messages[0]['content'] }}")
    return request.param, path


def _logits(model_dir: Path) -> torch.Tensor:
    from transformers import AutoModelForImageTextToText

    from rl_core.models.processor import load_processor

    model = AutoModelForImageTextToText.from_pretrained(model_dir).eval()
    processor = load_processor(model_dir)
    image = Image.new("RGB", (32, 32), (10, 200, 30))
    messages = [{"role": "user", "content": [{"type": "image", "image": image}, {"type": "text", "text": "colour?"}]}]
    inputs = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True,
                                           return_tensors="pt")
    with torch.no_grad():
        return model(**inputs).logits


def test_hf_dcp_hf_keeps_vision_weights_and_processor_files(vlm_dir, tmp_path):
    family, hf = vlm_dir
    hf_to_dcp(hf, tmp_path / "dcp")
    to_hf(tmp_path / "dcp", tmp_path / "back")
    original, back = read_hf_dir(hf), read_hf_dir(tmp_path / "back")
    assert_same_tensors(original, back)
    vision = [name for name in back if name.startswith(VISION_PREFIX[family])]
    assert len(vision) > 10, sorted(back)[:5]  # the vision tower, not only the language model
    for name in PROCESSOR_FILES:
        assert (tmp_path / "back" / name).read_bytes() == (hf / name).read_bytes(), name
    assert torch.equal(_logits(tmp_path / "back"), _logits(hf))


def test_dcp_with_training_names_exports_a_loadable_vlm(vlm_dir, tmp_path):
    """A DCP written from the in-memory model (transformers 5 names, e.g. ``model.language_model.*``, where
    Qwen2.5-VL's files say ``model.layers.*``) exports to an HF directory that loads to the same model."""
    from transformers import AutoModelForImageTextToText

    from rl_checkpoint.dcp_io import save_dcp

    family, hf = vlm_dir
    state = {k: v.detach().clone() for k, v in AutoModelForImageTextToText.from_pretrained(hf).state_dict().items()}
    ckpt = tmp_path / "policy"
    save_dcp({"model": state}, ckpt / "dcp")
    shutil.copytree(hf, ckpt / "hf_config", ignore=shutil.ignore_patterns("*.safetensors"))
    (ckpt / "meta.json").write_text(json.dumps({"format": "rl-dcp", "step": 3, "weights_only": True}))
    to_hf(ckpt, tmp_path / "export")
    assert_same_tensors(read_hf_dir(tmp_path / "export"), state)
    assert (tmp_path / "export" / "additional_chat_templates" / "short.jinja").is_file()
    assert torch.equal(_logits(tmp_path / "export"), _logits(hf))
