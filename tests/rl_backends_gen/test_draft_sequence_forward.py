"""The online draft's teacher is the policy: the engine's whole-sequence forward (``SequenceStep``: causal,
no cache) gives the HF model's own logits, for full attention, sliding windows and attention sinks."""

from __future__ import annotations

import pytest
import torch

from rl_backends_gen.config import SpeculativeConfig
from rl_backends_gen.native import NativeEngine

TRAINED = SpeculativeConfig(method="draft", num_tokens=2, draft_model="policy_layers:1", train_draft=True)


@pytest.mark.parametrize("family", ["llama", "gemma3_text", "gpt_oss"])
def test_sequence_forward_is_the_hf_forward(family, tiny_family_dir):
    from transformers import AutoModelForCausalLM

    path = tiny_family_dir(family)
    engine = NativeEngine(path, max_batch_size=4, max_seq_len=64, speculative=TRAINED)
    lengths = [20, 13, 7]  # right-padded rows, longer than gemma3's window of 8
    input_ids = torch.zeros(len(lengths), max(lengths), dtype=torch.long)
    generator = torch.Generator().manual_seed(0)
    for row, length in enumerate(lengths):
        input_ids[row, :length] = torch.randint(5, 500, (length,), generator=generator)
    trainer = engine.speculative.trainer
    with torch.no_grad():
        got = engine.head(trainer._hidden(engine._forward, engine.cache, input_ids)).float()
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager").eval()
    for row, length in enumerate(lengths):
        with torch.no_grad():
            want = model(input_ids=input_ids[row : row + 1, :length]).logits[0].float()
        assert (got[row, :length] - want).abs().max().item() <= 1e-4
