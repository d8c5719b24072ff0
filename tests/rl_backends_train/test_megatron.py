"""The Megatron-core backend on CPU (megatron-core 0.16.1) against the DTensor backend and itself:
mapping, steps, packing, checkpoints, data and tensor parallel (gloo, also with sequence parallel),
activation recompute."""

from __future__ import annotations

import contextlib
import sys

import pytest
import torch
from backend_testlib import MaskedNLL, assert_export_scores_like, make_batch, make_grouped_batch
from safetensors.torch import load_file

from rl_backends_train import TrainBackendConfig, build_training_backend

VOCAB = 500
BASE = {"use_ray": False, "optimizer": {"lr": 1e-3, "eps": 1e-3}, "reference_model": False}


def test_missing_megatron_names_the_extra(monkeypatch):
    from rl_backends_train.megatron import require_megatron

    monkeypatch.setitem(sys.modules, "megatron.core", None)  # what an absent package looks like to import
    with pytest.raises(ImportError, match=r'pip install|rl-backends-train\[megatron\]'):
        require_megatron()


def test_unsupported_megatron_options_fail_before_start(tiny_model_dir):
    pytest.importorskip("megatron.core")
    cfg = TrainBackendConfig(backend="megatron", use_ray=False, task="reward_model")
    with pytest.raises(ValueError, match="does not support: task='reward_model'"):
        build_training_backend(cfg, tiny_model_dir)
    cfg = TrainBackendConfig(backend="megatron", num_workers=2, tensor_parallel_size=2, sequence_parallel=True,
                             lora={"rank": 4})
    with pytest.raises(ValueError, match="does not support: sequence_parallel with lora"):
        build_training_backend(cfg, tiny_model_dir)
    cfg = TrainBackendConfig(backend="megatron", num_workers=2, tensor_parallel_size=2, optimizer={"name": "muon"})
    with pytest.raises(ValueError, match="does not support: optimizer muon with tensor_parallel_size > 1"):
        build_training_backend(cfg, tiny_model_dir)


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_hf_to_megatron_to_hf_is_exact(family, tiny_model_dir, tiny_qwen2_dir):
    """HF safetensors -> GPTModel parameters (fused qkv / fc1) -> named_weights in HF names."""
    pytest.importorskip("megatron.core")
    model_dir = tiny_model_dir if family == "llama" else tiny_qwen2_dir
    hf = load_file(f"{model_dir}/model.safetensors")
    with build_training_backend(TrainBackendConfig(backend="megatron", **BASE), model_dir) as megatron:
        back = dict(megatron.named_weights())
    assert back.keys() == hf.keys()
    for name, tensor in hf.items():
        assert torch.equal(back[name], tensor), name


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_megatron_matches_dtensor(family, tiny_model_dir, tiny_qwen2_dir, skewed_lengths):
    pytest.importorskip("megatron.core")
    model_dir = tiny_model_dir if family == "llama" else tiny_qwen2_dir
    batch = make_batch(VOCAB, skewed_lengths)
    with build_training_backend(TrainBackendConfig(**BASE), model_dir) as dtensor, \
            build_training_backend(TrainBackendConfig(backend="megatron", **BASE), model_dir) as megatron:
        torch.testing.assert_close(megatron.logprobs(batch), dtensor.logprobs(batch), rtol=0, atol=1e-5)
        a, b = dtensor.train(batch, MaskedNLL()), megatron.train(batch, MaskedNLL())
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-6)
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-5)
        weights_a, weights_b = dict(dtensor.named_weights()), dict(megatron.named_weights())
    assert weights_a.keys() == weights_b.keys()
    for name in weights_a:
        torch.testing.assert_close(weights_b[name], weights_a[name], rtol=0, atol=1e-6, msg=name)


@contextlib.contextmanager
def _single_rank_group():
    """A one-rank gloo default group for building a GPTModel outside a worker."""
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("budget", [64, 1000])
def test_megatron_shared_prompt_packing_equals_padded(tiny_model_dir, budget):
    """Each prompt packed once for its answers, RoPE at the answers' own positions (which continue
    the prompt's, not the packed row's): the same logprobs and step as padded rows, and as DTensor's
    shared-prompt packing (budget 64 splits a group, 1000 packs every row into one)."""
    pytest.importorskip("megatron.core")
    batch = make_grouped_batch(VOCAB, [11, 6, 17], [[5, 9, 1, 7], [12, 3, 8, 2], [4, 6, 10, 5]], seed=5)
    shared = {"packing": {"enabled": True, "share_prompts": True, "max_tokens_per_micro_batch": budget}}
    results = {}
    for name, cfg in {"padded": TrainBackendConfig(backend="megatron", **BASE),
                      "shared": TrainBackendConfig(backend="megatron", **BASE, **shared),
                      "dtensor": TrainBackendConfig(**BASE, **shared)}.items():
        with build_training_backend(cfg, tiny_model_dir) as policy:
            before = policy.logprobs(batch)
            step = policy.train(batch, MaskedNLL())
            results[name] = before, step, dict(policy.named_weights()), policy.logprobs(batch)
    padded = results["padded"]
    for name in ("shared", "dtensor"):
        before, step, weights, after = results[name]
        torch.testing.assert_close(before, padded[0], rtol=0, atol=1e-5, msg=name)
        assert step["num_valid_tokens"] == padded[1]["num_valid_tokens"] == 72
        assert step["loss"] == pytest.approx(padded[1]["loss"], rel=1e-6)
        assert step["grad_norm"] == pytest.approx(padded[1]["grad_norm"], rel=1e-5)
        for key in padded[2]:
            torch.testing.assert_close(weights[key], padded[2][key], rtol=0, atol=1e-6, msg=f"{name} {key}")
        torch.testing.assert_close(after, padded[3], rtol=0, atol=1e-5, msg=name)


def test_megatron_rope_follows_position_ids(tiny_model_dir):
    """A row run with position ids offset by 7 scores as HF's model with the same position ids (the
    offset changes nothing in exact math; it shows RoPE reads position_ids, not the row index)."""
    pytest.importorskip("megatron.core")
    from transformers import AutoModelForCausalLM

    from rl_backends_train.megatron.worker import build_megatron_model, init_model_parallel

    batch = make_batch(VOCAB, [13])
    ids = batch["input_ids"]
    positions = torch.arange(13)[None] + 7
    segments = torch.ones(1, 1, 13, 13, dtype=torch.bool).tril()
    hf = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    with _single_rank_group():
        init_model_parallel(1)
        model = build_megatron_model(tiny_model_dir, TrainBackendConfig(backend="megatron", **BASE), torch.device("cpu"))
        with torch.no_grad():
            shifted = model(ids, attention_mask=segments, position_ids=positions).logits
            plain = model(ids, attention_mask=segments).logits
            expected = hf(input_ids=ids, position_ids=positions).logits
        assert model.gpt.rotary_pos_emb.positions is None
    torch.testing.assert_close(shifted, expected, rtol=0, atol=1e-5)
    assert not torch.equal(shifted, plain)  # the positions did reach RoPE
    torch.testing.assert_close(shifted, plain, rtol=0, atol=1e-4)  # ... which is relative


def test_megatron_packing_checkpoint_and_export(tiny_model_dir, skewed_lengths, tmp_path):
    pytest.importorskip("megatron.core")

    batches = [make_batch(VOCAB, skewed_lengths, seed=s) for s in range(2)]
    packed = {"packing": {"enabled": True, "max_tokens_per_micro_batch": 48}}
    cfg = TrainBackendConfig(backend="megatron", **BASE, **packed)
    with build_training_backend(TrainBackendConfig(backend="megatron", **BASE), tiny_model_dir) as padded, \
            build_training_backend(cfg, tiny_model_dir) as policy:
        torch.testing.assert_close(policy.logprobs(batches[0]), padded.logprobs(batches[0]), rtol=0, atol=1e-5)
        policy.train(batches[0], MaskedNLL())
        policy.save(str(tmp_path / "ckpt"))
        expected = policy.train(batches[1], MaskedNLL())
        policy.export_hf(str(tmp_path / "hf"))
        after = policy.logprobs(batches[1])
    with build_training_backend(cfg, tiny_model_dir) as fresh:
        assert fresh.load(str(tmp_path / "ckpt")) == 1
        assert fresh.train(batches[1], MaskedNLL()) == expected  # bitwise resume
    assert_export_scores_like(tmp_path / "hf", batches[1], after)


def test_two_megatron_workers_equal_one(ray_session, tiny_model_dir, skewed_lengths):
    """Data parallel Megatron: replicated parameters, gradients summed over the ranks."""
    pytest.importorskip("megatron.core")
    batch = make_batch(VOCAB, skewed_lengths)
    results = []
    two_ranks = TrainBackendConfig(backend="megatron", **(BASE | {"use_ray": True, "num_workers": 2}))
    for cfg in (two_ranks, TrainBackendConfig(backend="megatron", **BASE)):
        with build_training_backend(cfg, tiny_model_dir) as policy:
            results.append((policy.train(batch, MaskedNLL()), dict(policy.named_weights())))
    (two, weights_two), (one, weights_one) = results
    assert two["loss"] == pytest.approx(one["loss"], rel=1e-6)
    assert two["grad_norm"] == pytest.approx(one["grad_norm"], rel=1e-5)
    for name in weights_one:
        torch.testing.assert_close(weights_two[name], weights_one[name], rtol=0, atol=1e-6, msg=name)


def test_megatron_recompute_gives_the_same_step(tiny_model_dir, skewed_lengths, monkeypatch):
    """activation_checkpointing maps to Megatron's full recompute, one decoder layer per unit."""
    pytest.importorskip("megatron.core")
    from megatron.core import tensor_parallel

    calls = []
    checkpoint = tensor_parallel.checkpoint
    monkeypatch.setattr(tensor_parallel, "checkpoint", lambda *a: calls.append(1) or checkpoint(*a))
    batch = make_batch(VOCAB, skewed_lengths)
    results = {}
    for recompute in (False, True):
        cfg = TrainBackendConfig(backend="megatron", activation_checkpointing=recompute, **BASE)
        with build_training_backend(cfg, tiny_model_dir) as policy:
            results[recompute] = policy.train(batch, MaskedNLL()), dict(policy.named_weights())
        # 8 rows in micro-batches of 4: 2 forwards x 2 decoder layers, each recomputed in backward
        assert len(calls) == (4 if recompute else 0)
    (plain, weights_plain), (recomputed, weights_recomputed) = results[False], results[True]
    assert recomputed["loss"] == plain["loss"]
    assert recomputed["grad_norm"] == pytest.approx(plain["grad_norm"], rel=1e-6)
    for name in weights_plain:
        torch.testing.assert_close(weights_recomputed[name], weights_plain[name], rtol=0, atol=1e-6, msg=name)


def test_megatron_tensor_parallel_2_equals_1(ray_session, tiny_tp_dir, skewed_lengths, tmp_path):
    """Megatron's TP layers over 2 gloo ranks: each rank loads its shards of the HF weights, logits
    are gathered over the vocabulary, named_weights gathers full HF tensors (small buckets here), and
    a TP=2 checkpoint resumes on one rank (optimizer shards resharded by DCP)."""
    pytest.importorskip("megatron.core")
    batch, next_batch = make_batch(VOCAB, skewed_lengths[:4]), make_batch(VOCAB, skewed_lengths[4:], seed=1)
    tp2 = TrainBackendConfig(backend="megatron", **(BASE | {"use_ray": True, "num_workers": 2,
                                                           "tensor_parallel_size": 2, "weights_bucket_bytes": 20_000}))
    tp1 = TrainBackendConfig(backend="megatron", **BASE)
    results = []
    for cfg in (tp2, tp1):
        with build_training_backend(cfg, tiny_tp_dir) as policy:
            initial = dict(policy.named_weights())
            before = policy.logprobs(batch)
            metrics = policy.train(batch, MaskedNLL())
            results.append((initial, before, metrics, dict(policy.named_weights()), policy.logprobs(batch)))
            if cfg is tp2:
                policy.save(str(tmp_path / "ckpt"))
                expected_next = policy.train(next_batch, MaskedNLL())
                expected_weights = dict(policy.named_weights())
    (initial_2, before_2, metrics_2, weights_2, after_2), (_, before_1, metrics_1, weights_1, after_1) = results
    on_disk = load_file(f"{tiny_tp_dir}/model.safetensors")
    assert initial_2.keys() == on_disk.keys()
    for name, tensor in on_disk.items():
        assert torch.equal(initial_2[name], tensor), name  # HF -> shards -> gathered HF is exact
    torch.testing.assert_close(before_2, before_1, rtol=0, atol=1e-5)
    assert metrics_2["loss"] == pytest.approx(metrics_1["loss"], rel=1e-6)
    assert metrics_2["grad_norm"] == pytest.approx(metrics_1["grad_norm"], rel=1e-5)
    for name in weights_1:
        torch.testing.assert_close(weights_2[name], weights_1[name], rtol=0, atol=1e-5, msg=name)
    torch.testing.assert_close(after_2, after_1, rtol=0, atol=1e-5)

    with build_training_backend(tp1, tiny_tp_dir) as resumed:
        assert resumed.load(str(tmp_path / "ckpt")) == 1
        next_step = resumed.train(next_batch, MaskedNLL())
        weights = dict(resumed.named_weights())
    assert next_step["loss"] == pytest.approx(expected_next["loss"], rel=1e-6)
    for name in expected_weights:
        torch.testing.assert_close(weights[name], expected_weights[name], rtol=0, atol=1e-5, msg=name)


@pytest.mark.parametrize("layout", ["padded", "packed"])
def test_megatron_sequence_parallel_equals_one_rank(ray_session, tiny_tp_dir, skewed_lengths, layout):
    """TP 2 with sequence parallel: the norms and the residual stream hold half of the positions
    (widths padded to even inside the model), Megatron's layers all-gather / reduce-scatter around
    attention and MLP, norm-weight gradients are summed over TP. Two steps equal one rank."""
    pytest.importorskip("megatron.core")
    from backend_testlib import assert_same_run, two_steps

    batches = make_batch(VOCAB, skewed_lengths), make_batch(VOCAB, skewed_lengths[::-1], seed=1)
    extra = {"packing": {"enabled": True, "max_tokens_per_micro_batch": 47}} if layout == "packed" else {}
    fields = BASE | {"micro_batch_size": 3} | extra
    sp = TrainBackendConfig(backend="megatron", **(fields | {"use_ray": True, "num_workers": 2, "tensor_parallel_size": 2,
                                                             "sequence_parallel": True}))
    with build_training_backend(sp, tiny_tp_dir) as policy:
        two = two_steps(policy, batches)
    with build_training_backend(TrainBackendConfig(backend="megatron", **fields), tiny_tp_dir) as policy:
        one = two_steps(policy, batches)
    assert_same_run(two, one)


def test_megatron_seeds_its_cuda_rng_states_on_cuda(monkeypatch, tiny_model_dir):
    """megatron-core's attention forks the tracker's "model-parallel-rng" CUDA state: on CUDA the worker
    seeds the tracker (with the run's seed) after making the model-parallel groups; on the CPU the
    shimmed fork needs nothing."""
    pytest.importorskip("megatron.core")
    from megatron.core import tensor_parallel

    from rl_backends_train.megatron import worker

    seeded = []
    monkeypatch.setattr(tensor_parallel, "model_parallel_cuda_manual_seed", seeded.append)
    worker.seed_model_parallel_rng(7, on_gpu=True)
    worker.seed_model_parallel_rng(8, on_gpu=False)
    assert seeded == [7]

    calls = []
    real = worker.seed_model_parallel_rng
    monkeypatch.setattr(worker, "seed_model_parallel_rng", lambda seed, on_gpu: (calls.append((seed, on_gpu)),
                                                                                 real(seed, on_gpu)))
    with build_training_backend(TrainBackendConfig(backend="megatron", **BASE), tiny_model_dir, seed=5):
        pass
    assert calls == [(5, torch.cuda.is_available())]


def _one_bf16_step(cfg, model_dir, batch):
    """(weights before, weights after one step, its metrics) of a backend."""
    with build_training_backend(cfg, model_dir) as policy:
        before = {name: t.clone() for name, t in policy.named_weights()}
        metrics = policy.train(batch, MaskedNLL())
        return before, dict(policy.named_weights()), metrics


def test_megatron_bf16_keeps_fp32_masters_and_steps_like_dtensor(tiny_model_dir, skewed_lengths):
    """bf16 compute, fp32 master weights: an AdamW step of ~1e-5 per element, far below half a bf16
    step of the weights (~6e-5 and more), moves them, by the same update as the DTensor backend's bf16
    step (FSDP2 mixed precision) and as an fp32 step, within bf16 compute noise (3% of the update)."""
    pytest.importorskip("megatron.core")
    batch = make_batch(VOCAB, skewed_lengths)
    small = {"use_ray": False, "reference_model": False, "optimizer": {"lr": 1e-5, "eps": 1e-3}}
    runs = {name: _one_bf16_step(TrainBackendConfig(**small, **cfg), tiny_model_dir, batch)
            for name, cfg in {"megatron": {"backend": "megatron", "dtype": "bfloat16"},
                              "dtensor": {"dtype": "bfloat16"}, "fp32": {}}.items()}
    before, after, metrics = runs["megatron"]
    assert metrics["loss"] == pytest.approx(runs["dtensor"][2]["loss"], rel=1e-3)
    assert metrics["grad_norm"] == pytest.approx(runs["dtensor"][2]["grad_norm"], rel=1e-2)
    for name in before:
        assert after[name].dtype == torch.float32, name
        if name == "model.embed_tokens.weight":
            continue  # rows of tokens absent from the batch get no gradient
        update = after[name] - before[name]
        assert (update != 0).float().mean() > 0.95, name
        # In bf16 parameters the same step would be lost: most updated weights round back.
        assert (after[name].bfloat16() == before[name].bfloat16()).float().mean() > 0.5, name
        for other in ("dtensor", "fp32"):
            expected = runs[other][1][name] - runs[other][0][name]
            # bf16 compute noise: the updates differ by up to 1.8% of their norm here (layer norms).
            assert (update - expected).norm() <= 3e-2 * expected.norm(), f"{name} vs {other}"
