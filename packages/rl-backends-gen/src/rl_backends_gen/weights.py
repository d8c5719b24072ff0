"""In-place weight updates (refit) of an HF model from ``(name, tensor)`` pairs."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping

import torch


def copy_weights_in_place(model: torch.nn.Module, named_tensors: Iterable[tuple[str, torch.Tensor]] | Mapping) -> int:
    """Copy each tensor into the parameter or buffer of the same HF name; return how many were copied.

    Tied weights (``lm_head.weight`` sharing ``model.embed_tokens.weight``) answer to both names, so
    either name updates the shared tensor. Storage is never reallocated, so anything holding views
    of the weights (and the KV cache) stays valid. An unknown name or a shape mismatch raises
    ValueError; tensors copied before the bad one stay copied (the stream may be a generator).
    """
    targets = model.state_dict(keep_vars=True)  # includes tied duplicates under both names
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
            target.copy_(tensor)
            copied += 1
    return copied
