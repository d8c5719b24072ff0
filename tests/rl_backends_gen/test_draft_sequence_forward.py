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


@pytest.mark.parametrize("family", ["llama", "gemma3_text", "gpt_oss"])
def test_the_teacher_runs_each_prompt_once_through_the_cache(family, tiny_family_dir):
    """The draft's teacher: a prompt shared by its samples prefilled once, the samples' tokens continuing from
    the cache, gives the whole-row forward's hidden states at every scored token (and so when asleep)."""
    path = tiny_family_dir(family)
    engine = NativeEngine(path, max_batch_size=2, max_seq_len=64, speculative=TRAINED)  # 3 samples: 2 chunks
    generator = torch.Generator().manual_seed(0)
    prompts = [torch.randint(5, 500, (length,), generator=generator).tolist() for length in (11, 6)]
    rows = [(prompt, completion) for prompt in prompts for completion in (14, 3, 9)]
    input_ids = torch.zeros(len(rows) + 1, 26, dtype=torch.long)
    scored = torch.zeros_like(input_ids, dtype=torch.bool)
    for row, (prompt, completion) in enumerate(rows):
        input_ids[row, : len(prompt) + completion] = torch.tensor(
            prompt + torch.randint(5, 500, (completion,), generator=generator).tolist())
        scored[row, len(prompt) : len(prompt) + completion] = True
    input_ids[-1, :5] = torch.tensor(prompts[1][:5])  # a row with nothing to score
    scored[2, 12] = False  # a gap in the scored tokens (a multi-turn episode's observation)
    trainer = engine.speculative.trainer
    prompt_runs = []
    run_prompt = trainer._prompt_then_rows
    trainer._prompt_then_rows = lambda prompt, *rest: prompt_runs.append(prompt) or run_prompt(prompt, *rest)
    where = scored.nonzero(as_tuple=True)
    with torch.no_grad():
        want = trainer._hidden(engine._forward, engine.cache, input_ids)[where[0], where[1] - 1]
        got = trainer._policy_hidden(input_ids, scored)
        assert sorted(map(len, prompt_runs)) == [6, 6, 11, 11]  # each prompt once a chunk of <= 2 of its samples
        engine.sleep()
        asleep = trainer._policy_hidden(input_ids, scored)
    assert len(prompt_runs) == 4  # asleep: whole rows
    assert got.shape == want.shape == (int(scored.sum()), want.shape[-1])
    assert (got - want).abs().max().item() <= 1e-5
    assert torch.equal(asleep, want)


def test_the_teachers_whole_sequence_forward_runs_beside_a_routing_record(tiny_family_dir):
    """``record_routing`` with an online draft: the teacher's cache-less forward (``SequenceStep``, as when the
    engine sleeps or a row outgrows the cache) records nothing and gives the same hidden states."""
    path = tiny_family_dir("qwen3_moe")
    input_ids = torch.randint(5, 500, (2, 12), generator=torch.Generator().manual_seed(0))
    hidden = []
    for record_routing in (False, True):
        engine = NativeEngine(path, max_batch_size=2, max_seq_len=64, speculative=TRAINED, record_routing=record_routing)
        with torch.no_grad():
            hidden.append(engine.speculative.trainer._hidden(engine._forward, engine.cache, input_ids))
    assert torch.equal(hidden[0], hidden[1])
