"""Refit helpers: in-place weight updates of an HF model, and the chunks refit streams to an engine."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Iterator, Mapping

import torch

from rl_core.fp8 import fp8_layers_by_weight_name


def copy_weights_in_place(model: torch.nn.Module, named_tensors: Iterable[tuple[str, torch.Tensor]] | Mapping) -> int:
    """Copy each tensor into the parameter or buffer of the same HF name; return how many were copied.

    Tied weights (``lm_head.weight`` sharing ``model.embed_tokens.weight``) answer to both names, so
    either name updates the shared tensor. The weight of an FP8 layer (``rl_core.fp8.Fp8Linear``) is
    rounded to the model's high-precision dtype, then re-quantized into the layer's e4m3 weight and
    its scales (``load_weight``): a plain copy into the e4m3 buffer would keep the old scales. Storage
    is never reallocated, so anything holding views of the weights (and the KV cache) stays valid. An
    unknown name or a shape mismatch raises ValueError; tensors copied before the bad one stay copied
    (the stream may be a generator).
    """
    targets = model.state_dict(keep_vars=True)  # includes tied duplicates under both names
    fp8_layers = fp8_layers_by_weight_name(model)
    dtype = high_precision_dtype(model) if fp8_layers else None
    items = named_tensors.items() if isinstance(named_tensors, Mapping) else named_tensors
    copied = 0
    with torch.no_grad():
        for name, tensor in items:
            target = targets.get(name)
            if target is None:
                close = difflib.get_close_matches(name, list(targets), n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise ValueError(f"update_weights: the model has no weight named {name!r}{hint}")
            if tuple(tensor.shape) != tuple(target.shape):
                raise ValueError(
                    f"update_weights: {name!r} has shape {tuple(tensor.shape)}, the model's is {tuple(target.shape)}"
                )
            if name in fp8_layers:
                fp8_layers[name].load_weight(tensor.to(dtype))
            else:
                target.copy_(tensor)
            copied += 1
    return copied


def high_precision_dtype(model: torch.nn.Module) -> torch.dtype:
    """The dtype of the model's floating-point parameters (FP8 layers hold buffers, not parameters)."""
    return next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def chunk_named_tensors(named_tensors: Iterable[tuple[str, torch.Tensor]] | Mapping, max_bytes: int, *,
                        dtype: str | torch.dtype | None = None) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Group ``(name, tensor)`` pairs, in their order, into lists of at most ``max_bytes`` each.

    Each tensor is taken as it comes (a generator is streamed: one chunk is held at a time), detached,
    moved to CPU, made contiguous and, when ``dtype`` is given, floating-point tensors are cast to it
    (the engine's dtype: half the bytes of fp32 masters for bf16). Bytes are counted after the cast.
    A tensor larger than ``max_bytes`` travels alone in its own chunk.
    """
    if max_bytes <= 0:
        raise ValueError(f"max_bytes must be > 0, got {max_bytes}")
    target = DTYPES[dtype] if isinstance(dtype, str) else dtype
    items = named_tensors.items() if isinstance(named_tensors, Mapping) else named_tensors
    chunk: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, tensor in items:
        tensor = tensor.detach()
        if target is not None and tensor.is_floating_point():
            tensor = tensor.to(target)
        tensor = tensor.cpu().contiguous()
        nbytes = tensor.numel() * tensor.element_size()
        if chunk and size + nbytes > max_bytes:
            yield chunk
            chunk, size = [], 0
        chunk.append((name, tensor))
        size += nbytes
    if chunk:
        yield chunk
