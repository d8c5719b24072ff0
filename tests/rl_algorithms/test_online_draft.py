"""generation.speculative.train_draft: the native engine's draft is distilled from the policy on rollouts
(the library's DistillationKLLoss, passed in by rl_algorithms.draft), acceptance recovers after the policy
moves, and speculative greedy stays token-for-token plain greedy."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

from rl_algorithms.checkpointing import CheckpointError
from rl_algorithms.draft import DRAFT_FILE, draft_files, export_draft, restore_draft, train_draft
from rl_backends_gen.config import GenerationConfig, SpeculativeConfig
from rl_backends_gen.native import NativeEngine
from rl_core.types import SamplingParams

# The tiny random model's distributions are flat: the whole vocabulary (512) makes the top-k KL exact.
TRAINED = SpeculativeConfig(method="draft", num_tokens=3, draft_model="policy_layers:1", train_draft=True,
                            draft_lr=3e-3, draft_steps=4, draft_top_k=512)
GREEDY = SamplingParams(max_new_tokens=24, temperature=0.0)
TEXTS = ["the answer is", "What is 12 + 7?", "move left, move up", "solve the puzzle step by step",
         "print the result", "one two three four"]


@pytest.fixture(scope="module")
def prompts(tiny_tokenizer):
    return [tiny_tokenizer.encode(text) for text in TEXTS]


def rollout_batch(results, prompts) -> dict[str, torch.Tensor]:
    """Right-padded prompt + completion rows, the completion tokens in ``loss_mask`` (as episodes_to_batch)."""
    rows = [(p, c.token_ids) for p, samples in zip(prompts, results) for c in samples]
    length = max(len(p) + len(c) for p, c in rows)
    batch = {"input_ids": torch.zeros(len(rows), length, dtype=torch.long),
             "attention_mask": torch.zeros(len(rows), length, dtype=torch.long),
             "loss_mask": torch.zeros(len(rows), length)}
    for row, (p, c) in enumerate(rows):
        batch["input_ids"][row, : len(p) + len(c)] = torch.tensor(p + c)
        batch["attention_mask"][row, : len(p) + len(c)] = 1
        batch["loss_mask"][row, len(p): len(p) + len(c)] = 1.0
    return batch


def moved(engine: NativeEngine, seed: int, scale: float = 0.0):
    """The policy's weights with layer 1 made the identity (its output projections zeroed: the
    policy_layers:1 draft then computes exactly the policy) and ``scale`` x std noise on layer 0 (the
    layer the draft copied when it was built: the policy moves away from the draft)."""
    generator = torch.Generator().manual_seed(seed)
    for name, param in engine.model.named_parameters():
        value = param.detach().clone()
        if ".layers.1." in name and ("o_proj" in name or "down_proj" in name):
            value.zero_()
        if ".layers.0." in name and scale:
            value += scale * param.detach().std() * torch.randn(param.shape, generator=generator)
        yield name, value


def acceptance(engine: NativeEngine, prompts) -> tuple[float, list[list[int]]]:
    results = engine.generate(prompts, GREEDY)
    stats = engine.speculative.last_call
    return stats.accepted_tokens / stats.proposed_tokens, [samples[0].token_ids for samples in results]


def test_draft_loss_falls_its_parameters_move_and_the_policys_do_not(tiny_model_dir, prompts):
    engine = NativeEngine(tiny_model_dir, max_batch_size=8, max_seq_len=128, seed=0, speculative=TRAINED)
    engine.update_weights(list(moved(engine, seed=1, scale=0.5)))
    batch = rollout_batch(engine.generate(prompts, SamplingParams(max_new_tokens=16, temperature=1.0, n=2, seed=3)),
                          prompts)
    policy = {name: p.detach().clone() for name, p in engine.model.named_parameters()}
    trainer = engine.speculative.trainer
    owned = {id(p) for p in trainer.parameters}
    assert owned and not owned & {id(p) for p in engine.model.parameters()}  # copies, not the policy's tensors
    draft_before = [p.detach().clone() for p in trainer.parameters]
    losses = [train_draft(engine, batch)["draft/distill_loss"] for _ in range(3)]
    assert losses[2] < 0.5 * losses[0], losses
    assert all(not torch.equal(a, b) for a, b in zip(draft_before, trainer.parameters))
    assert all(torch.equal(policy[name], p) for name, p in engine.model.named_parameters())
    # the shared embeddings and head are the policy's own tensors: a refit moves them for the draft too
    assert engine.speculative.proposer.head is engine.head
    assert engine.speculative.proposer.decoder.get_input_embeddings() is engine.decoder.get_input_embeddings()
    # sleep / wake on CUDA move the draft's own layers and AdamW moments with the policy (the meta device
    # stands in for the other device here; AdamW's step counters stay where AdamW keeps them)
    engine.speculative.move_weights("meta")
    assert all(p.device.type == "meta" for p in engine.speculative.proposer.decoder.parameters())
    moments = [v for state in trainer.optimizer.state.values() for k, v in state.items() if k != "step"]
    assert moments and all(v.device.type == "meta" for v in moments)


def test_acceptance_recovers_after_the_policy_moves_and_greedy_stays_exact(tiny_model_dir, prompts):
    engine = NativeEngine(tiny_model_dir, max_batch_size=4, max_seq_len=128, seed=0, speculative=TRAINED)
    plain = NativeEngine(tiny_model_dir, max_batch_size=4, max_seq_len=128, seed=0)
    engine.update_weights(list(moved(engine, seed=0)))
    assert acceptance(engine, prompts)[0] == 1.0  # the draft is the policy
    policy = list(moved(engine, seed=1, scale=0.5))  # a training step moves the policy away from the draft
    engine.update_weights(policy)
    plain.update_weights(policy)
    owned = [p.detach().clone() for p in engine.speculative.trainer.parameters]
    before, _ = acceptance(engine, prompts)
    assert before < 0.5
    for step in range(4):  # GRPO-shaped: sample rollouts from the policy, train the draft on them
        sampled = engine.generate(prompts, SamplingParams(max_new_tokens=24, temperature=1.0, n=4, seed=step))
        metrics = train_draft(engine, rollout_batch(sampled, prompts))
        assert metrics["draft/tokens"] > 0 and metrics["draft/train_seconds"] > 0
    after, tokens = acceptance(engine, prompts)
    assert after > before + 0.2, (before, after)
    # exact: the verifier keeps the target's greedy whatever the draft proposes
    assert tokens == [samples[0].token_ids for samples in plain.generate(prompts, GREEDY)]
    # a refit writes the policy and the shared tensors, never what the draft trained
    trained = [p.detach().clone() for p in engine.speculative.trainer.parameters]
    assert any(not torch.equal(a, b) for a, b in zip(owned, trained))
    engine.update_weights(list(moved(engine, seed=2, scale=0.5)))
    assert all(torch.equal(a, b) for a, b in zip(trained, engine.speculative.trainer.parameters))


def test_the_trained_draft_is_an_hf_model_and_a_checkpoint_carries_it_on(tiny_model_dir, prompts, tmp_path):
    from transformers import AutoModelForCausalLM

    def engine_with(spec: SpeculativeConfig) -> NativeEngine:
        engine = NativeEngine(tiny_model_dir, max_batch_size=4, max_seq_len=128, seed=0, speculative=spec)
        engine.update_weights(policy)
        return engine

    engine = NativeEngine(tiny_model_dir, max_batch_size=4, max_seq_len=128, seed=0, speculative=TRAINED)
    policy = list(moved(engine, seed=1, scale=0.5))
    engine.update_weights(policy)
    batch = rollout_batch(engine.generate(prompts, SamplingParams(max_new_tokens=24, temperature=1.0, n=4, seed=0)),
                          prompts)
    for _ in range(2):
        train_draft(engine, batch)
    trainer = engine.speculative.trainer

    # the draft as an HF model: its logits are the engine's draft's, and an engine drafting with that
    # directory proposes and accepts exactly what this one does
    export_draft(engine, tmp_path / "draft")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "draft", dtype=torch.float32)
    assert loaded.config.num_hidden_layers == 1
    ids = batch["input_ids"][:3]
    proposer = engine.speculative.proposer
    with torch.no_grad():
        ours = proposer.head(trainer._hidden(proposer.forward, proposer.cache, ids)).float()
        theirs = loaded(input_ids=ids).logits.float()
    assert (ours - theirs).abs().max() < 1e-5
    from_dir = engine_with(SpeculativeConfig(method="draft", num_tokens=3, draft_model=str(tmp_path / "draft")))
    rate, tokens = acceptance(engine, prompts)
    assert (rate, tokens) == acceptance(from_dir, prompts) and rate > 0
    assert export_draft(from_dir, tmp_path / "none") is None and not (tmp_path / "none").exists()  # trains none

    # a checkpoint's draft.pt: a fresh engine that loads it trains on exactly as this one does
    (tmp_path / "step").mkdir()
    for name, state in draft_files(engine).items():
        torch.save(state, tmp_path / "step" / name)
    resumed = engine_with(TRAINED)
    assert not all(torch.equal(a, b) for a, b in zip(trainer.parameters, resumed.speculative.trainer.parameters))
    restore_draft(resumed, tmp_path / "step")
    assert all(torch.equal(a, b) for a, b in zip(trainer.parameters, resumed.speculative.trainer.parameters))
    train_draft(engine, batch), train_draft(resumed, batch)  # AdamW's moments came back too
    assert all(torch.equal(a, b) for a, b in zip(trainer.parameters, resumed.speculative.trainer.parameters))
    other = engine_with(TRAINED.model_copy(update={"draft_model": str(tmp_path / "draft")}))  # owns its embeddings
    with pytest.raises(CheckpointError, match="draft.pt: the saved draft has other parameters.*draft_model"):
        restore_draft(other, tmp_path / "step")
    (tmp_path / "step" / DRAFT_FILE).write_bytes(b"not a torch file")
    with pytest.raises(CheckpointError, match="draft.pt: corrupt"):
        restore_draft(other, tmp_path / "step")


def test_a_checkpoint_carries_the_draft_vocabulary_on(tiny_model_dir, prompts, tmp_path):
    """train_draft with draft_vocab_size: draft.pt keeps the vocabulary's token counts, so a resumed engine
    picks the same tokens as the one that saved it."""
    spec = TRAINED.model_copy(update={"draft_vocab_size": 64, "draft_steps": 1})
    engine = NativeEngine(tiny_model_dir, max_batch_size=4, max_seq_len=128, seed=0, speculative=spec)
    results = engine.generate(prompts, SamplingParams(max_new_tokens=16, temperature=1.0, n=2, seed=0))
    train_draft(engine, rollout_batch(results, prompts))
    (tmp_path / "step").mkdir()
    for name, state in draft_files(engine).items():
        torch.save(state, tmp_path / "step" / name)
    resumed = NativeEngine(tiny_model_dir, max_batch_size=4, max_seq_len=128, seed=0, speculative=spec)
    restore_draft(resumed, tmp_path / "step")
    counts = engine.speculative.proposer.vocab.counts
    assert int(counts.sum()) > 0 and torch.equal(resumed.speculative.proposer.vocab.counts, counts)
    engine.generate(prompts, GREEDY), resumed.generate(prompts, GREEDY)
    assert torch.equal(resumed.speculative.proposer.vocab.ids, engine.speculative.proposer.vocab.ids)
    state = torch.load(tmp_path / "step" / DRAFT_FILE)
    state["vocab_counts"] = state["vocab_counts"][:100]
    torch.save(state, tmp_path / "step" / DRAFT_FILE)
    with pytest.raises(CheckpointError, match="draft.pt: the saved draft vocabulary counts 100 tokens"):
        restore_draft(resumed, tmp_path / "step")


def test_train_draft_config_is_strict():
    with pytest.raises(ValidationError, match="method=ngram has none"):
        SpeculativeConfig(method="ngram", train_draft=True)
    with pytest.raises(ValidationError, match="draft_lr only apply with train_draft: true"):
        SpeculativeConfig(method="draft", draft_lr=1e-3)
    spec = {"method": "draft", "train_draft": True}
    with pytest.raises(ValidationError, match="num_replicas=2 each Ray replica holds its own"):
        GenerationConfig(backend="native", num_replicas=2, speculative=spec)
    with pytest.raises(ValidationError, match="backend=vllm keeps its draft fixed"):
        GenerationConfig(backend="vllm", speculative={**spec, "draft_model": "/some/draft"})
    with pytest.raises(ValidationError, match="quantization=fp8 holds them in fp8"):
        GenerationConfig(backend="native", quantization="fp8", speculative=spec)
    assert GenerationConfig(backend="native", speculative=spec).speculative.train_draft
