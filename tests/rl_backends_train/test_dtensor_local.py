"""The DTensor backend with one in-process worker (world size 1): exactness of micro-batching,
packing and dynamic batching, logprob conventions, weights, checkpoints and errors."""

from __future__ import annotations

import pytest
import torch
from backend_testlib import MaskedNLL, SequenceMeanNLL, make_batch, make_grouped_batch
from safetensors.torch import load_file

from rl_backends_train import TrainBackendConfig, build_training_backend
from rl_core.cluster import WorkerError

VOCAB = 500


# Adam's first step is ~lr * sign(grad): a gradient that is zero up to rounding could flip a weight by
# 2 lr. A large eps makes the update smooth in the gradient, so layouts can be compared to 1e-6.
SMOOTH_ADAM = {"lr": 1e-3, "eps": 1e-3}


def local_cfg(**overrides) -> TrainBackendConfig:
    base = {"use_ray": False, "optimizer": SMOOTH_ADAM, "reference_model": False}
    return TrainBackendConfig(**(base | overrides))


def params_after_one_step(model_dir, batch, loss_fn, **cfg):
    with build_training_backend(local_cfg(**cfg), model_dir) as policy:
        metrics = policy.train(batch, loss_fn)
        return metrics, dict(policy.named_weights()), policy.logprobs(batch)


def hf_logits(model_dir, batch, temperature=1.0):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits / temperature


def assert_weights_close(a, b, atol=1e-6):
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=atol, msg=name)


def test_logprobs_follow_the_convention(tiny_model_dir, skewed_lengths):
    batch = make_batch(VOCAB, skewed_lengths)
    with build_training_backend(local_cfg(), tiny_model_dir) as policy:
        got = policy.logprobs(batch, temperature=0.7)
    logits = hf_logits(tiny_model_dir, batch, 0.7)
    expected = torch.log_softmax(logits[:, :-1], -1).gather(-1, batch["input_ids"][:, 1:, None])[..., 0]
    mask = batch["attention_mask"][:, 1:].bool()
    assert (got[:, 0] == 0).all() and (got[:, 1:][~mask] == 0).all()
    torch.testing.assert_close(got[:, 1:][mask], expected[mask], rtol=0, atol=1e-5)


@pytest.mark.parametrize("layout", ["micro_batch_1", "packing", "dynamic_batching"])
def test_layouts_equal_padded_micro_batch_4(tiny_model_dir, skewed_lengths, layout):
    batch = make_batch(VOCAB, skewed_lengths)
    ref_metrics, ref_weights, ref_logprobs = params_after_one_step(tiny_model_dir, batch, MaskedNLL(), micro_batch_size=4)
    other = {
        "micro_batch_1": {"micro_batch_size": 1},
        "packing": {"packing": {"enabled": True, "max_tokens_per_micro_batch": 48}},
        "dynamic_batching": {"dynamic_batching": {"enabled": True, "max_tokens_per_micro_batch": 80}},
    }[layout]
    metrics, weights, logprobs = params_after_one_step(tiny_model_dir, batch, MaskedNLL(), **other)
    assert metrics["num_valid_tokens"] == ref_metrics["num_valid_tokens"] == sum(n - 2 for n in skewed_lengths)
    assert metrics["loss"] == pytest.approx(ref_metrics["loss"], rel=1e-6)
    assert metrics["grad_norm"] == pytest.approx(ref_metrics["grad_norm"], rel=1e-5)
    assert_weights_close(weights, ref_weights)
    torch.testing.assert_close(logprobs, ref_logprobs, rtol=0, atol=1e-5)


def test_packed_logprobs_and_sequence_loss_equal_padded(tiny_model_dir, skewed_lengths):
    batch = make_batch(VOCAB, skewed_lengths, seed=3)
    with build_training_backend(local_cfg(micro_batch_size=8), tiny_model_dir) as padded, \
            build_training_backend(local_cfg(packing={"enabled": True, "max_tokens_per_micro_batch": 64}),
                                   tiny_model_dir) as packed:
        torch.testing.assert_close(packed.logprobs(batch), padded.logprobs(batch), rtol=0, atol=1e-5)
        a, b = padded.train(batch, SequenceMeanNLL()), packed.train(batch, SequenceMeanNLL())
    assert a["loss"] == pytest.approx(b["loss"], rel=1e-6)
    assert a["num_valid_sequences"] == b["num_valid_sequences"] == len(skewed_lengths)


@pytest.mark.parametrize("budget", [64, 1000])
def test_shared_prompt_packing_equals_padded(tiny_model_dir, budget):
    """GRPO-shaped batch: each prompt packed once for its answers; the same step and logprobs as the
    padded layout (budget 64 splits a group, 1000 packs everything into one row)."""
    batch = make_grouped_batch(VOCAB, [11, 6, 17], [[5, 9, 1, 7], [12, 3, 8, 2], [4, 6, 10, 5]], seed=5)
    ref_metrics, ref_weights, ref_logprobs = params_after_one_step(tiny_model_dir, batch, MaskedNLL(), micro_batch_size=4)
    packing = {"enabled": True, "share_prompts": True, "max_tokens_per_micro_batch": budget}
    metrics, weights, logprobs = params_after_one_step(tiny_model_dir, batch, MaskedNLL(), packing=packing)
    assert metrics["num_valid_tokens"] == ref_metrics["num_valid_tokens"] == 72
    assert metrics["loss"] == pytest.approx(ref_metrics["loss"], rel=1e-6)
    assert metrics["grad_norm"] == pytest.approx(ref_metrics["grad_norm"], rel=1e-5)
    assert_weights_close(weights, ref_weights)
    torch.testing.assert_close(logprobs, ref_logprobs, rtol=0, atol=1e-5)


def test_topk_logits_match_a_plain_forward(tiny_model_dir, skewed_lengths):
    batch = make_batch(VOCAB, skewed_lengths[:4])
    with build_training_backend(local_cfg(micro_batch_size=3), tiny_model_dir) as policy:
        values, indices = policy.topk_logits(batch, k=5, temperature=2.0)
    logits = hf_logits(tiny_model_dir, batch, 2.0)[:, :-1]  # row t-1 scores token t
    expected = logits.topk(5, dim=-1)
    mask = batch["attention_mask"][:, 1:].bool()
    torch.testing.assert_close(values[:, 1:][mask], expected.values[mask], rtol=0, atol=1e-5)
    assert torch.equal(indices[:, 1:][mask], expected.indices[mask])


def test_named_weights_equal_the_checkpoint(tiny_model_dir):
    on_disk = load_file(f"{tiny_model_dir}/model.safetensors")
    with build_training_backend(local_cfg(weights_bucket_bytes=20_000), tiny_model_dir) as policy:
        streamed = dict(policy.named_weights())
    assert streamed.keys() == on_disk.keys()
    for name, tensor in on_disk.items():
        assert torch.equal(streamed[name], tensor), name


def test_reference_logprobs_stay_at_the_initial_weights(tiny_model_dir, skewed_lengths):
    batch = make_batch(VOCAB, skewed_lengths)
    with build_training_backend(local_cfg(reference_model=True), tiny_model_dir) as policy:
        before = policy.logprobs(batch)
        policy.train(batch, MaskedNLL())
        assert not torch.allclose(policy.logprobs(batch), before)
        assert torch.equal(policy.reference_logprobs(batch), before)
    with build_training_backend(local_cfg(reference_model=False), tiny_model_dir) as policy:
        with pytest.raises(WorkerError, match="reference_model=True"):
            policy.reference_logprobs(batch)


def test_save_load_resumes_bitwise(tiny_model_dir, skewed_lengths, tmp_path):
    batches = [make_batch(VOCAB, skewed_lengths, seed=s) for s in range(3)]
    cfg = {"optimizer": {"lr": 1e-3, "weight_decay": 0.01}, "scheduler": {"kind": "cosine", "warmup_steps": 1,
                                                                          "total_steps": 4}}
    with build_training_backend(local_cfg(**cfg), tiny_model_dir) as policy:
        policy.train(batches[0], MaskedNLL())
        policy.save(str(tmp_path / "ckpt"))
        expected = [policy.train(b, MaskedNLL()) for b in batches[1:]]
        expected_weights = dict(policy.named_weights())
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["dcp", "hf_config", "meta.json", "trainer_state"]
    assert (tmp_path / "ckpt" / "hf_config" / "tokenizer.json").is_file()
    with build_training_backend(local_cfg(**cfg), tiny_model_dir) as fresh:
        assert fresh.load(str(tmp_path / "ckpt")) == 1
        resumed = [fresh.train(b, MaskedNLL()) for b in batches[1:]]
        resumed_weights = dict(fresh.named_weights())
    assert resumed == expected  # loss, grad norm, lr: bitwise
    for name in expected_weights:
        assert torch.equal(resumed_weights[name], expected_weights[name]), name


def test_dcp_keys_are_hf_names(tiny_model_dir, tmp_path):
    from torch.distributed.checkpoint import FileSystemReader

    with build_training_backend(local_cfg(), tiny_model_dir) as policy:
        policy.save(str(tmp_path / "ckpt"))
    keys = set(FileSystemReader(str(tmp_path / "ckpt" / "dcp")).read_metadata().state_dict_metadata)
    hf_names = set(load_file(f"{tiny_model_dir}/model.safetensors"))
    assert {f"model.{n}" for n in hf_names} <= keys


def test_muon_trains_and_reports_both_learning_rates(tiny_model_dir, skewed_lengths):
    batch = make_batch(VOCAB, skewed_lengths)
    cfg = local_cfg(optimizer={"name": "muon", "lr": 1e-3, "muon_lr": 0.02},
                    scheduler={"warmup_steps": 2, "kind": "constant"})
    with build_training_backend(cfg, tiny_model_dir) as policy:
        first = policy.train(batch, MaskedNLL())
        for _ in range(3):
            last = policy.train(batch, MaskedNLL())
    assert first["lr"] == pytest.approx(5e-4) and first["muon_lr"] == pytest.approx(0.01)
    assert last["muon_lr"] == pytest.approx(0.02)
    assert last["loss"] < first["loss"]


def test_activation_checkpointing_gives_the_same_step(tiny_model_dir, skewed_lengths):
    batch = make_batch(VOCAB, skewed_lengths)
    plain = params_after_one_step(tiny_model_dir, batch, MaskedNLL())
    checkpointed = params_after_one_step(tiny_model_dir, batch, MaskedNLL(), activation_checkpointing=True)
    assert checkpointed[0]["loss"] == pytest.approx(plain[0]["loss"], rel=1e-6)
    assert_weights_close(checkpointed[1], plain[1])


def test_a_failing_loss_surfaces_in_the_driver(tiny_model_dir, skewed_lengths):
    from backend_testlib import Exploding

    with build_training_backend(local_cfg(), tiny_model_dir) as policy:
        with pytest.raises(WorkerError, match="boom: this loss always fails"):
            policy.train(make_batch(VOCAB, skewed_lengths), Exploding())


def test_batch_not_divisible_by_micro_batch_or_workers(tiny_model_dir):
    batch = make_batch(VOCAB, [9, 4, 7])
    with build_training_backend(local_cfg(micro_batch_size=2), tiny_model_dir) as policy:
        assert policy.logprobs(batch).shape == (3, 9)
        assert policy.train(batch, MaskedNLL())["num_valid_tokens"] == 7 + 2 + 5


def test_loss_tokens_only_scores_loss_positions_exactly(tiny_model_dir):
    """Training runs the LM head only from the first loss-mask column: the logprobs and entropy of
    every loss token are the full forward's; the prompt columns before it hold 0."""
    from transformers import AutoModelForCausalLM

    from rl_backends_train.batching import MicroBatch
    from rl_backends_train.forward import logits_needed, model_outputs

    batch = make_batch(VOCAB, [12, 9, 16], prompt_len=6)
    batch["loss_mask"][1, 6] = 0.0  # rows need not start their loss at the same column
    assert logits_needed(batch) == 16 - 5
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    mb = MicroBatch(rows=torch.arange(3), batch=batch)
    kwargs = {"device": torch.device("cpu"), "temperature": 0.7, "need_logits": False, "need_entropy": True}
    with torch.no_grad():
        full = model_outputs(model, mb, **kwargs)
        part = model_outputs(model, mb, loss_tokens_only=True, **kwargs)
    mask = batch["loss_mask"].bool()
    assert part.logprobs.shape == full.logprobs.shape == (3, 16)
    assert (part.logprobs[:, :6] == 0).all() and (part.entropy[:, :6] == 0).all()
    torch.testing.assert_close(part.logprobs[mask], full.logprobs[mask], rtol=0, atol=1e-6)
    torch.testing.assert_close(part.entropy[mask], full.entropy[mask], rtol=0, atol=1e-6)
    # a batch without a loss mask, or a loss mask that covers nothing, is scored in full
    assert logits_needed({"input_ids": batch["input_ids"]}) == 16
    assert logits_needed({"input_ids": batch["input_ids"], "loss_mask": torch.zeros(3, 16)}) == 16


@pytest.mark.parametrize("packed", [False, True])
def test_policy_and_reference_logprobs_of_loss_tokens_only(tiny_model_dir, packed):
    """``logprobs(..., loss_tokens_only=True)`` (GRPO's pi_old and reference forwards, DPO's reference):
    each loss token's logprob is the full forward's, the columns before the first loss column hold 0;
    padded and shared-prompt packed layouts alike, policy and reference weights alike."""
    batch = make_grouped_batch(VOCAB, [11, 6, 17], [[5, 9, 1], [12, 3, 8], [4, 6, 10]], seed=3)
    layout = ({"packing": {"enabled": True, "share_prompts": True, "max_tokens_per_micro_batch": 64}} if packed
              else {"micro_batch_size": 4})
    with build_training_backend(local_cfg(reference_model=True, **layout), tiny_model_dir) as policy:
        policy.train(batch, MaskedNLL())  # policy and reference now differ
        got = {"policy": policy.logprobs(batch, temperature=0.7, loss_tokens_only=True),
               "reference": policy.reference_logprobs(batch, temperature=0.7, loss_tokens_only=True)}
        full = {"policy": policy.logprobs(batch, temperature=0.7),
                "reference": policy.reference_logprobs(batch, temperature=0.7)}
    mask = batch["loss_mask"].bool()
    first = int(torch.nonzero(mask.any(dim=0))[0, 0])
    assert first == 6
    assert not torch.allclose(full["policy"][mask], full["reference"][mask])
    for name in got:
        assert got[name].shape == full[name].shape
        assert (got[name][:, :first] == 0).all() and (full[name][:, 1:first] != 0).any()
        torch.testing.assert_close(got[name][mask], full[name][mask], rtol=0, atol=1e-6)


def test_bf16_on_cpu_keeps_fp32_masters(tiny_model_dir, skewed_lengths):
    """dtype=bfloat16 on the CPU is the GPU's mixed precision (FSDP2): bf16 compute, fp32 parameters
    and reductions. A step of ~1e-5 per element, below half a bf16 step of the weights, is kept, and
    equals the fp32 step within bf16 compute noise (3% of the update; up to ~1.5% seen)."""
    batch = make_batch(VOCAB, skewed_lengths)
    runs = {}
    for dtype in ("bfloat16", "float32"):
        with build_training_backend(local_cfg(dtype=dtype, optimizer={"lr": 1e-5, "eps": 1e-3}), tiny_model_dir) as p:
            before = {name: t.clone() for name, t in p.named_weights()}
            runs[dtype] = before, p.train(batch, MaskedNLL()), dict(p.named_weights()), p.logprobs(batch)
    (before, step, after, logprobs), (before32, step32, after32, logprobs32) = runs["bfloat16"], runs["float32"]
    assert step["loss"] == pytest.approx(step32["loss"], rel=1e-3)
    torch.testing.assert_close(logprobs, logprobs32, rtol=0, atol=5e-2)
    for name in before:
        assert after[name].dtype == torch.float32, name
        if name == "model.embed_tokens.weight":
            continue  # rows of tokens absent from the batch get no gradient
        update, expected = after[name] - before[name], after32[name] - before32[name]
        assert (update != 0).float().mean() > 0.95, name
        assert (after[name].bfloat16() == before[name].bfloat16()).float().mean() > 0.5, name  # lost in bf16
        assert (update - expected).norm() <= 3e-2 * expected.norm(), name
