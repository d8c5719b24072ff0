"""Losses and batches for the training-backend tests (imported by the tests through conftest's path)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from rl_core.types import ModelOutputs, Normalizer


class MaskedNLL:
    """Token-level NLL over ``loss_mask``, divided by the GLOBAL number of valid tokens."""

    needs_logits = False

    def __call__(self, outputs: ModelOutputs, batch, normalizer: Normalizer):
        mask = batch["loss_mask"]
        nll = -(outputs.logprobs * mask).sum() / normalizer.num_valid_tokens
        return nll, {"nll": float(nll.detach()), "tokens": float(mask.sum())}


class SequenceMeanNLL:
    """Sequence-level NLL (mean per sequence, then over the GLOBAL number of valid sequences);
    needs logits, to exercise that path."""

    needs_logits = True

    def __call__(self, outputs: ModelOutputs, batch, normalizer: Normalizer):
        mask = batch["loss_mask"]
        per_seq = -(outputs.logprobs * mask).sum(1) / mask.sum(1).clamp(min=1)
        loss = per_seq.sum() / normalizer.num_valid_sequences
        return loss, {"logits_abs_mean": float(outputs.logits.detach().abs().mean())}


class BradleyTerry:
    """Reward-model loss on rows laid out (chosen_0, rejected_0, chosen_1, ...)."""

    needs_logits = False

    def __call__(self, outputs: ModelOutputs, batch, normalizer: Normalizer):
        chosen, rejected = outputs.scores[0::2], outputs.scores[1::2]
        loss = -torch.nn.functional.logsigmoid(chosen - rejected).sum() / (normalizer.num_valid_sequences / 2)
        return loss, {"accuracy_sum": float((chosen > rejected).sum())}


class Exploding:
    """A loss that raises, to test error reporting."""

    needs_logits = False

    def __call__(self, outputs, batch, normalizer):
        raise RuntimeError("boom: this loss always fails")


def make_batch(vocab: int, lengths: list[int], prompt_len: int = 2, seed: int = 0) -> dict[str, torch.Tensor]:
    """Right-padded rows of the given lengths; the loss sees every token after the prompt."""
    gen = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.zeros(len(lengths), width, dtype=torch.long)
    attention = torch.zeros(len(lengths), width, dtype=torch.long)
    loss_mask = torch.zeros(len(lengths), width)
    for i, n in enumerate(lengths):
        # Ids 0-3 are the tiny tokenizer's special tokens; 3 is <pad>, whose embedding HF never
        # trains (padding_idx) while Megatron does: keep it out of real tokens.
        ids[i, :n] = torch.randint(4, vocab, (n,), generator=gen)
        attention[i, :n] = 1
        loss_mask[i, prompt_len:n] = 1.0
    return {"input_ids": ids, "attention_mask": attention, "loss_mask": loss_mask}


class FailsOnRank1:
    """A masked NLL that raises on rank 1 only: rank 0 then waits in a collective for it."""

    needs_logits = False

    def __call__(self, outputs, batch, normalizer):
        if dist.get_rank() == 1:
            raise RuntimeError("rank 1 gives up")
        return MaskedNLL()(outputs, batch, normalizer)


def make_grouped_batch(vocab: int, prompt_lengths: list[int], answer_lengths: list[list[int]],
                       seed: int = 0) -> dict[str, torch.Tensor]:
    """GRPO-shaped rows: each prompt followed by several answers (loss on the answers), with the
    groups' rows interleaved (row order: answer 0 of every prompt, then answer 1, ...)."""
    gen = torch.Generator().manual_seed(seed)
    rows = []
    prompts = [torch.randint(4, vocab, (p,), generator=gen) for p in prompt_lengths]
    for j in range(max(len(a) for a in answer_lengths)):
        for g, prompt in enumerate(prompts):
            if j < len(answer_lengths[g]):
                rows.append((prompt, torch.randint(4, vocab, (answer_lengths[g][j],), generator=gen)))
    width = max(len(p) + len(a) for p, a in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    attention = torch.zeros(len(rows), width, dtype=torch.long)
    loss_mask = torch.zeros(len(rows), width)
    for i, (prompt, answer) in enumerate(rows):
        n = len(prompt) + len(answer)
        ids[i, :n] = torch.cat([prompt, answer])
        attention[i, :n] = 1
        loss_mask[i, len(prompt):n] = 1.0
    return {"input_ids": ids, "attention_mask": attention, "loss_mask": loss_mask}


# Runs of one backend layout against another (Megatron pipeline / context parallel tests).
def two_steps(policy, batches, checkpoint=None) -> dict:
    """Logprobs and top-k before, a step, weights and logprobs after, (a save,) a second step."""
    batch, next_batch = batches
    values, indices = policy.topk_logits(batch, 3)
    scored = batch["attention_mask"].bool()
    scored[:, 0] = False  # top-k of padding (all-zero logits) depends on the micro-batch plan
    out = {"initial": dict(policy.named_weights()), "before": policy.logprobs(batch),
           "topk": (values, torch.where(scored[..., None], indices, -1)), "step": policy.train(batch, MaskedNLL())}
    out |= {"weights": dict(policy.named_weights()), "after": policy.logprobs(batch)}
    if checkpoint is not None:
        policy.save(checkpoint)
    out |= {"next_step": policy.train(next_batch, MaskedNLL()), "next_weights": dict(policy.named_weights())}
    return out


def assert_same_step(actual: dict, expected: dict) -> None:
    assert actual["loss"] == pytest.approx(expected["loss"], rel=1e-6)
    assert actual["nll"] == pytest.approx(expected["nll"], rel=1e-6)
    assert actual["tokens"] == expected["tokens"]
    assert actual["grad_norm"] == pytest.approx(expected["grad_norm"], rel=1e-5)


def assert_same_weights(actual: dict, expected: dict, atol: float = 1e-5) -> None:
    assert actual.keys() == expected.keys()
    for name in expected:
        torch.testing.assert_close(actual[name], expected[name], rtol=0, atol=atol, msg=name)


def assert_same_run(pp2: dict, pp1: dict) -> None:
    torch.testing.assert_close(pp2["before"], pp1["before"], rtol=0, atol=1e-5)
    torch.testing.assert_close(pp2["topk"][0], pp1["topk"][0], rtol=0, atol=1e-5)
    assert torch.equal(pp2["topk"][1], pp1["topk"][1])
    assert_same_step(pp2["step"], pp1["step"])
    assert_same_weights(pp2["weights"], pp1["weights"])
    torch.testing.assert_close(pp2["after"], pp1["after"], rtol=0, atol=1e-5)
    assert_same_step(pp2["next_step"], pp1["next_step"])
    assert_same_weights(pp2["next_weights"], pp1["next_weights"])


def megatron_config(base: dict, **overrides):
    """A Megatron backend config: ``base`` updated by ``overrides``, one rank in this process unless
    ``num_workers`` asks for Ray ranks."""
    from rl_backends_train import TrainBackendConfig

    fields = base | {"use_ray": overrides.get("num_workers", 1) > 1} | overrides
    return TrainBackendConfig(backend="megatron", **fields)


def assert_megatron_steps_like_dtensor(model_dir: str, batch, base: dict) -> tuple[dict, dict]:
    """The HF files load into the GPTModel and come back from ``named_weights`` as ``from_pretrained``'s
    tensors bit-exactly; logprobs (1e-5), one step (loss 1e-6, grad norm 1e-5) and the weights after it
    (1e-6) equal the DTensor backend's (transformers' own modules). Returns the Megatron backend's
    weights before and after the step."""
    from transformers import AutoModelForCausalLM

    from rl_backends_train import TrainBackendConfig, build_training_backend

    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).state_dict()
    with build_training_backend(TrainBackendConfig(use_ray=False, **base), model_dir) as dtensor, \
            build_training_backend(megatron_config(base), model_dir) as policy:
        initial = dict(policy.named_weights())
        torch.testing.assert_close(policy.logprobs(batch), dtensor.logprobs(batch), rtol=0, atol=1e-5)
        a, b = dtensor.train(batch, MaskedNLL()), policy.train(batch, MaskedNLL())
        weights_a, weights_b = dict(dtensor.named_weights()), dict(policy.named_weights())
    assert initial.keys() == hf.keys()
    for name, tensor in hf.items():
        assert torch.equal(initial[name], tensor), name
    assert b["loss"] == pytest.approx(a["loss"], rel=1e-6)
    assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-5)
    assert_same_weights(weights_b, weights_a, atol=1e-6)
    return initial, weights_b


def assert_export_scores_like(export_dir, batch, logprobs, atol: float = 1e-5) -> None:
    """The HF directory ``export_dir`` loads with ``from_pretrained`` and gives ``logprobs`` [B, T]
    (the backend's, column t scoring token t) on the real tokens of ``batch``."""
    from transformers import AutoModelForCausalLM

    exported = AutoModelForCausalLM.from_pretrained(export_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = exported(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    lp = torch.log_softmax(logits[:, :-1], -1).gather(-1, batch["input_ids"][:, 1:, None])[..., 0]
    mask = batch["attention_mask"][:, 1:].bool()
    torch.testing.assert_close(lp[mask], logprobs[:, 1:][mask], rtol=0, atol=atol)


def two_rank_grad_norm(rank: int, init_file: str, results) -> None:
    """Rank ``rank`` of a 2-rank gloo world (``torch.multiprocessing.spawn``): the gradient norm of a
    set of full tensors held as Shard(0) (uneven: 5 rows) and Shard(1) DTensors, a Replicate DTensor and a
    plain tensor, clipped to 1; puts (rank, norm, all-reduce calls, clipped full tensors) on ``results``."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    from rl_backends_train.dtensor.worker import local_shard_and_weight
    from rl_backends_train.optim import clip_grad_norm

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        full = clipping_case_tensors()
        mesh = init_device_mesh("cpu", (2,))
        grads = [distribute_tensor(full[0].clone(), mesh, [Shard(0)]), distribute_tensor(full[1].clone(), mesh, [Shard(1)]),
                 distribute_tensor(full[2].clone(), mesh, [Replicate()]), full[3].clone()]
        pairs = [local_shard_and_weight(g) for g in grads]
        calls = []
        all_reduce = dist.all_reduce
        dist.all_reduce = lambda *a, **k: (calls.append(1), all_reduce(*a, **k))[1]
        try:
            norm = clip_grad_norm([g for g, _ in pairs], [w for _, w in pairs], 1.0, torch.device("cpu"))
        finally:
            dist.all_reduce = all_reduce
        clipped = [(g.full_tensor() if hasattr(g, "full_tensor") else g).tolist() for g in grads]  # no shared memory
        results.put((rank, norm, len(calls), clipped))
    finally:
        dist.destroy_process_group()


def clipping_case_tensors() -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(3)
    return [torch.randn(5, 3, generator=gen), torch.randn(3, 4, generator=gen), torch.randn(4, generator=gen),
            torch.randn(2, 2, generator=gen)]
