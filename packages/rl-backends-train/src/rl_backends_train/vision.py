"""Vision-language models (``AutoModelForImageTextToText``: Qwen2.5-VL, Qwen3-VL, Idefics3 / SmolVLM) on the
DTensor backend.

A VLM is a language model whose input embeddings get image features at the image tokens. The model's
inner module (``model.model``) holds the language model (``language_model``, Idefics3: ``text_model``) and
the image-only parts beside it: Qwen-VL's ``visual`` (vision tower and merger), Idefics3's ``vision_model``
and ``connector``. Those image-only parts are what ``policy.freeze_vision`` freezes and what LoRA leaves
alone (adapters go to the language model only).

Batches carry each row's image tensors (:mod:`rl_core.vision_batch`); :func:`forward_inputs` turns a
micro-batch's rows into the forward's keyword arguments.

FSDP2 shards the vision blocks and the image-only parts as their own units. A unit all-gathers its
weights when it runs and reduce-scatters its gradients after backward, on every data-parallel rank at
once; a micro-batch without images (text-only rows, or the dummy of a rank with fewer micro-batches) would
skip the vision tower on one rank while another runs it, and the collectives would pair up wrongly. So
such a forward runs the image-only parts on a tiny dummy image, where the real ones would run (just before
the language model), and adds its features times zero to the input embeddings: the same collectives in
the same order, zero gradients, unchanged outputs (:func:`vision_pass_without_images`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn

from rl_backends_train.config import TrainBackendConfig
from rl_core.batch import Batch
from rl_core.models.processor import is_vision_language_model
from rl_core.vision_batch import forward_image_inputs

_LANGUAGE_MODEL_NAMES = ("language_model", "text_model")


@dataclass
class VisionParts:
    """Where a VLM's language model and image-only modules are."""

    inner: nn.Module
    """``model.model``: embeds tokens, runs the image parts, merges their features and runs the language model."""
    language_model: nn.Module
    language_prefix: str
    """The language model's qualified name (``model.language_model``): LoRA targets modules under it only."""
    image_modules: dict[str, nn.Module]
    """Qualified name -> each image-only module (``model.visual``; ``model.vision_model``, ``model.connector``)."""


def vision_parts(model: nn.Module) -> VisionParts | None:
    """The parts of a VLM (None for a text-only model)."""
    inner = getattr(model, "model", None)
    if inner is None or getattr(model.config, "vision_config", None) is None:
        return None
    for name in _LANGUAGE_MODEL_NAMES:
        language_model = getattr(inner, name, None)
        if isinstance(language_model, nn.Module):
            break
    else:
        raise ValueError(f"{type(model).__name__}: no language model at model.{' / model.'.join(_LANGUAGE_MODEL_NAMES)}; "
                         "this vision-language family is not supported yet")
    images = {f"model.{n}": m for n, m in inner.named_children() if m is not language_model}
    return VisionParts(inner, language_model, f"model.{name}", images)


def image_blocks(parts: VisionParts) -> list[nn.Module]:
    """The transformer blocks of the image-only modules (FSDP2 units of their own), in module order."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    return [m for module in parts.image_modules.values() for m in module.modules()
            if isinstance(m, GradientCheckpointingLayer)]


def check_vision_support(cfg: TrainBackendConfig, model_path: str) -> None:
    """Refuse, in the driver, what the training backends cannot do with (or without) a VLM at ``model_path``."""
    if not is_vision_language_model(model_path):
        if cfg.freeze_vision:
            raise ValueError(f"freeze_vision=true, but {model_path} is a text-only model (no vision_config); "
                             "set freeze_vision=false")
        return
    if cfg.backend == "megatron":
        raise ValueError(f"{model_path} is a vision-language model, which backend=megatron does not build (no vision "
                         "tower in its model path); set backend=dtensor (FSDP2 over the vision tower and the "
                         "language model)")
    if cfg.packing.enabled:
        raise ValueError("packing.enabled=true with a vision-language model: packed rows would need each sequence's "
                         "image inputs and multimodal positions inside one row, which is not implemented; set "
                         "packing.enabled=false (dynamic_batching.enabled=true also groups rows by length)")
    if cfg.tensor_parallel_size > 1:
        raise ValueError(f"tensor_parallel_size={cfg.tensor_parallel_size} with a vision-language model: there are no "
                         "tensor-parallel plans for vision towers; set tensor_parallel_size=1 and shard with "
                         "data parallel (FSDP2 shards the vision tower and the language model)")
    if cfg.task != "causal_lm":
        raise ValueError(f"task={cfg.task!r} with a vision-language model: only task=causal_lm is supported")


def freeze_image_modules(model: nn.Module) -> None:
    """No gradient (and so no optimizer state) for the image-only modules."""
    parts = vision_parts(model)
    if parts is None:
        raise ValueError("freeze_vision=true needs a vision-language model")
    for module in parts.image_modules.values():
        module.requires_grad_(False)


def forward_inputs(batch: Batch, device: torch.device) -> dict[str, torch.Tensor]:
    """The keyword arguments a VLM's forward takes beside ``input_ids`` / ``attention_mask`` for these rows:
    ``mm_token_type_ids`` (Qwen-VL) and the image tensors; ``{}`` for a text-only batch."""
    extra = dict(forward_image_inputs(batch))
    if "mm_token_type_ids" in batch:
        extra["mm_token_type_ids"] = batch["mm_token_type_ids"]
    return {key: value.to(device) for key, value in extra.items()}


@contextlib.contextmanager
def vision_pass_without_images(model: nn.Module, has_images: bool) -> Iterator[None]:
    """Inside, a forward of ``model`` without images runs the image-only modules on a dummy image (see the
    module doc) when FSDP2 shards them; otherwise nothing changes."""
    parts = vision_parts(model)
    if has_images or parts is None or not _sharded(parts):
        yield
        return

    def add_zero_features(_module, args, kwargs):
        embeds = kwargs["inputs_embeds"]  # [b, t, hidden]
        features = parts.inner.get_image_features(**dummy_image_inputs(model.config, embeds.device))
        kwargs["inputs_embeds"] = embeds + (_sum_of_tensors(features) * 0.0).to(embeds.dtype)
        return args, kwargs

    handle = parts.language_model.register_forward_pre_hook(add_zero_features, with_kwargs=True)
    try:
        yield
    finally:
        handle.remove()


def _sharded(parts: VisionParts) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return any(isinstance(m, FSDPModule) for m in parts.image_modules.values())


def dummy_image_inputs(config, device: torch.device) -> dict[str, torch.Tensor]:
    """The smallest image input the family's ``get_image_features`` takes: a 2 x 2-merge patch grid (Qwen-VL)
    or one ``image_size`` image (Idefics3)."""
    vision = config.vision_config
    if hasattr(vision, "temporal_patch_size"):  # Qwen-VL: flat patches of in_channels x t x p x p values
        merge = vision.spatial_merge_size
        width = vision.in_channels * vision.temporal_patch_size * vision.patch_size**2
        return {"pixel_values": torch.ones(merge * merge, width, device=device),
                "image_grid_thw": torch.tensor([[1, merge, merge]], device=device)}
    if hasattr(vision, "image_size"):  # Idefics3: [batch, images, channels, H, W]; an all-zero image would be skipped
        size = vision.image_size
        return {"pixel_values": torch.ones(1, 1, vision.num_channels, size, size, device=device),
                "pixel_attention_mask": torch.ones(1, 1, size, size, dtype=torch.bool, device=device)}
    raise ValueError(f"{config.model_type}: no dummy image for this vision-language family; it is not supported yet")


def _sum_of_tensors(output) -> torch.Tensor:
    """The sum of every floating tensor of a (nested) model output: each image-only parameter's work reaches it."""
    tensors = list(_float_tensors(output))
    if not tensors:
        raise ValueError("the dummy image pass returned no tensor")
    return torch.stack([t.float().sum() for t in tensors]).sum()


def _float_tensors(value) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        if value.is_floating_point():
            yield value
    elif isinstance(value, dict):  # HF ModelOutput is a dict
        for item in value.values():
            yield from _float_tensors(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _float_tensors(item)
