"""Image inputs per sequence and their collation: a padded batch (and any micro-batch of it) gives each
sequence the logits it gets alone, for every tiny VLM family."""

from __future__ import annotations

import pytest
import torch
from PIL import Image

from rl_core.vision_inputs import collate_image_inputs, encode_chat, image_layout

FAMILIES = ["qwen2_5_vl", "qwen3_vl", "idefics3"]


@pytest.fixture(scope="module", params=FAMILIES)
def vlm(request, tmp_path_factory):
    from transformers import AutoModelForImageTextToText

    from rl_core.models.processor import load_processor
    from rl_core.models.tiny_vlm import save_tiny_vlm

    path = save_tiny_vlm(tmp_path_factory.mktemp(request.param), family=request.param)
    return request.param, AutoModelForImageTextToText.from_pretrained(path).eval(), load_processor(path)


def _chats():
    red, blue = Image.new("RGB", (32, 32), (255, 0, 0)), Image.new("RGB", (48, 24), (0, 0, 255))
    green = Image.new("RGB", (20, 30), (0, 160, 0))
    return [
        [{"role": "user", "content": [{"type": "image", "image": red}, {"type": "text", "text": "colour?"}]},
         {"role": "assistant", "content": "\\boxed{red}"}],
        [{"role": "user", "content": [{"type": "image", "image": blue}, {"type": "text", "text": "and"},
                                      {"type": "image", "image": green}, {"type": "text", "text": "these two?"}]}],
        [{"role": "user", "content": "no image here, just words"}],
    ]


def _forward(model, encoded):
    """Logits of right-padded ``encoded`` sequences run as one batch: a list of [T_i, V]."""
    length = max(len(e.input_ids) for e in encoded)
    pad = lambda values: values + [0] * (length - len(values))  # noqa: E731
    batch = {"input_ids": torch.tensor([pad(e.input_ids) for e in encoded]),
             "attention_mask": torch.tensor([pad([1] * len(e.input_ids)) for e in encoded])}
    if encoded[0].mm_token_type_ids is not None:
        batch["mm_token_type_ids"] = torch.tensor([pad(e.mm_token_type_ids) for e in encoded])
    batch |= collate_image_inputs([e.image_inputs for e in encoded])
    with torch.no_grad():
        logits = model(**batch).logits
    return [logits[i, :len(e.input_ids)] for i, e in enumerate(encoded)]


def test_batch_and_micro_batches_match_each_sequence_alone(vlm):
    family, model, processor = vlm
    encoded = [encode_chat(processor, chat) for chat in _chats()]
    image_token = processor.tokenizer.convert_tokens_to_ids("<image>" if family == "idefics3" else "<|image_pad|>")
    assert [e.input_ids.count(image_token) for e in encoded] == [4, 8, 0]
    assert [bool(e.image_inputs) for e in encoded] == [True, True, False]
    assert image_layout(encoded[0].image_inputs) == ("batched" if family == "idefics3" else "flat")
    if family != "idefics3":
        assert encoded[1].mm_token_type_ids.count(1) == 8
    alone = [_forward(model, [e])[0] for e in encoded]
    for subset in ([0, 1, 2], [1, 2], [2, 0], [1]):
        together = _forward(model, [encoded[i] for i in subset])
        for i, logits in zip(subset, together):
            assert (logits - alone[i]).abs().max() <= 1e-5, (family, subset, i)
    # The image really enters the forward: the same text with another image changes the logits.
    other = encode_chat(processor, [{"role": "user", "content": [
        {"type": "image", "image": Image.new("RGB", (32, 32), (0, 0, 0))}, {"type": "text", "text": "colour?"}]},
        {"role": "assistant", "content": "\\boxed{red}"}])
    assert other.input_ids == encoded[0].input_ids
    assert (_forward(model, [other])[0] - alone[0]).abs().max() > 1e-4


def test_collate_shapes_and_refusals():
    flat = [{"pixel_values": torch.ones(16, 384), "image_grid_thw": torch.tensor([[1, 4, 4]])},
            {}, {"pixel_values": torch.zeros(32, 384), "image_grid_thw": torch.tensor([[1, 4, 4], [1, 4, 4]])}]
    out = collate_image_inputs(flat)
    assert out["pixel_values"].shape == (48, 384) and out["image_grid_thw"].tolist() == [[1, 4, 4]] * 3
    batched = [{"pixel_values": torch.ones(1, 2, 3, 8, 8), "pixel_attention_mask": torch.ones(1, 2, 8, 8)}, {},
               {"pixel_values": torch.ones(1, 1, 3, 8, 8), "pixel_attention_mask": torch.ones(1, 1, 8, 8)}]
    out = collate_image_inputs(batched)
    assert out["pixel_values"].shape == (3, 2, 3, 8, 8)
    assert out["pixel_values"].flatten(2).sum(-1).tolist() == [[192.0, 192.0], [0.0, 0.0], [192.0, 0.0]]
    assert out["pixel_attention_mask"].shape == (3, 2, 8, 8)
    assert collate_image_inputs([{}, {}]) == {}
    with pytest.raises(ValueError, match="mix the flat and batched layouts"):
        collate_image_inputs([flat[0], batched[0]])
    with pytest.raises(ValueError, match="different keys"):
        collate_image_inputs([flat[0], {"pixel_values": torch.ones(4, 384)}])
