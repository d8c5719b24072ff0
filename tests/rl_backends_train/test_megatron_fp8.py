"""FP8 on the Megatron backend (Transformer Engine): the config mapping and errors on CPU; the real run
on a GPU with Transformer Engine installed (``gpu`` marker)."""

from __future__ import annotations

import sys

import pytest
import torch
from backend_testlib import MaskedNLL, make_batch

from rl_backends_train import TrainBackendConfig, build_training_backend
from rl_backends_train.config import PrecisionConfig

pytest.importorskip("megatron.core", reason="needs rl-backends-train[megatron]")

from rl_backends_train.megatron import fp8  # noqa: E402


@pytest.mark.parametrize("precision, fields", [
    ({}, {}),
    ({"linear": "fp8"}, {"fp8": "hybrid", "fp8_recipe": "tensorwise"}),
    ({"linear": "fp8", "recipe": "delayed", "fp8_format": "e4m3"}, {"fp8": "e4m3", "fp8_recipe": "delayed"}),
    ({"linear": "fp8", "recipe": "blockwise", "fp8_format": "hybrid"}, {"fp8": "hybrid", "fp8_recipe": "blockwise"}),
])
def test_precision_maps_to_transformer_config_fields(tiny_tokenizer, precision, fields):
    from rl_backends_train.megatron.families import transformer_config
    from rl_core.models import tiny_model_config

    cfg = TrainBackendConfig(backend="megatron", precision=precision)
    assert fp8.transformer_config_fields(cfg.precision) == fields
    config = transformer_config(tiny_model_config(tiny_tokenizer), torch.bfloat16,
                                quantization=fp8.transformer_config_fields(cfg.precision))
    assert config.fp8 == fields.get("fp8")  # None: no FP8
    if fields:
        assert config.fp8_recipe == fields["fp8_recipe"]


def test_without_transformer_engine_the_error_names_the_extra(monkeypatch, tiny_model_dir):
    monkeypatch.setitem(sys.modules, "transformer_engine", None)  # what an absent package looks like to import
    cfg = TrainBackendConfig(backend="megatron", use_ray=False, precision={"linear": "fp8"})
    with pytest.raises(ImportError, match=r'rl-backends-train\[megatron-fp8\]'):
        build_training_backend(cfg, tiny_model_dir)


def test_cpu_ranks_are_refused_before_start(monkeypatch):
    monkeypatch.setattr(fp8, "require_transformer_engine", lambda: None)  # as if TE were installed
    cfg = TrainBackendConfig(backend="megatron", num_workers=2, precision={"linear": "fp8"})  # gpus_per_worker 0
    with pytest.raises(ValueError, match="needs CUDA GPUs"):
        fp8.check_before_start(cfg)
    fp8.check_before_start(TrainBackendConfig(backend="megatron"))  # no FP8: nothing to check


@pytest.mark.gpu
@pytest.mark.parametrize("recipe", ["tensorwise", "delayed"])
def test_megatron_fp8_step_tracks_bf16_with_te_linears(tiny_model_dir, skewed_lengths, recipe):
    pytest.importorskip("transformer_engine.pytorch", reason="needs rl-backends-train[megatron-fp8]")
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("FP8 needs compute capability 8.9+")
    from megatron.core.extensions.transformer_engine import TEColumnParallelLinear, TERowParallelLinear

    batch = make_batch(500, skewed_lengths)
    common = {"backend": "megatron", "use_ray": False, "reference_model": False, "dtype": "bfloat16",
              "optimizer": {"lr": 1e-3}, "gpus_per_worker": 1}
    with build_training_backend(TrainBackendConfig(**common), tiny_model_dir) as bf16:
        expected = bf16.train(batch, MaskedNLL())
        expected_weights = dict(bf16.named_weights())
    precision = PrecisionConfig(linear="fp8", recipe=recipe)
    with build_training_backend(TrainBackendConfig(**common, precision=precision), tiny_model_dir) as policy:
        layer = policy.group._local.worker.model.gpt.decoder.layers[0]
        assert isinstance(layer.self_attention.linear_qkv, TEColumnParallelLinear)
        assert isinstance(layer.mlp.linear_fc2, TERowParallelLinear)
        metrics = policy.train(batch, MaskedNLL())
        weights = dict(policy.named_weights())
    # The same rounding bounds as the DTensor backend's FP8 step (test_fp8_training.py).
    assert metrics["loss"] == pytest.approx(expected["loss"], rel=1e-3)
    assert metrics["grad_norm"] == pytest.approx(expected["grad_norm"], rel=0.05)
    assert weights.keys() == expected_weights.keys()
    assert all(weights[n].dtype == expected_weights[n].dtype == torch.float32 for n in weights)
