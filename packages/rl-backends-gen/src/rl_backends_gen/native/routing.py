"""MoE router replay, the engine's half: record the experts every MoE layer chose for every token.

With ``record_routing=True`` the engine keeps, next to its cache, one more positional entry:
``RoutingRecord``, the chosen expert ids ``[rows, moe_layers, max_seq_len, k]`` (int16) of each row's
tokens. Being a cache entry, it moves with its row when rows compact, is copied from a shared prompt
prefix to every sample, and is freed by ``sleep``. A finished sample's record (the prompt and every
generated token but the last, which no forward has seen) goes back with its ``Completion`` as
``routed_experts`` ``[positions, moe_layers, k]``, for the trainer to replay
(``policy.moe.router_replay``).

A speculative verify forward writes the experts of its ``q`` positions per row like the keys and values it
writes: a position past the row's accepted tokens is written again by the forward that next runs it.

Recording takes no change to the model's code: a forward hook on each router keeps the indices it
returned (``rl_core.models.moe``), and hooks around the decoder's forward read the step the engine
passed down (``rl_step=``) and write those indices to the step's rows and positions.
"""

from __future__ import annotations

import torch
from torch import nn

from rl_backends_gen.native.cache import EngineCache, LayerCache
from rl_backends_gen.native.steps import DecodeStep, PrefillStep
from rl_core.models.moe import ROUTING_DTYPE, experts_per_token, moe_routers


class RoutingRecord(LayerCache):
    """Expert ids ``[rows, moe_layers, max_seq_len, k]``: position ``p`` of a row at index ``p`` of axis 2."""

    def __init__(self, rows: int, max_seq_len: int, moe_layers: int, k: int, device: torch.device):
        super().__init__({"experts": (rows, moe_layers, max_seq_len, k)}, {"experts": ROUTING_DTYPE}, device)


class RoutingRecorder:
    """Records the chosen experts of every forward of ``decoder`` into a ``RoutingRecord`` of ``cache``."""

    def __init__(self, model: nn.Module, decoder: nn.Module, cache: EngineCache, device: torch.device):
        self.routers = routers_to_record(model)
        self.record = RoutingRecord(cache.max_rows, cache.max_seq_len, len(self.routers),
                                    experts_per_token(self.routers), device)
        self.record.allocate()
        cache.extras.append(self.record)  # moved, freed and reallocated with the layers' caches
        self._indices: list[torch.Tensor | None] = [None] * len(self.routers)
        self._step = None
        for layer, router in enumerate(self.routers):
            router.register_forward_hook(self._keep(layer))
        decoder.register_forward_pre_hook(self._begin, with_kwargs=True)
        decoder.register_forward_hook(self._write)

    def read(self, slot: int, length: int) -> torch.Tensor:
        """``[length, moe_layers, k]``: the experts of positions ``0 .. length - 1`` of cache row ``slot``."""
        return self.record["experts"][slot, :, :length].transpose(0, 1).cpu().clone()

    # ------------------------------------------------------------------------------------- hooks

    def _keep(self, layer: int):
        def hook(_router, _args, output) -> None:
            self._indices[layer] = output[2]  # [N, k]: tokens of the forward in row-major order
        return hook

    def _begin(self, _decoder, _args, kwargs) -> None:
        self._step = kwargs.get("rl_step")
        self._shape = kwargs["input_ids"].shape  # [B, L]

    def _write(self, _decoder, _args, _output) -> None:
        step, (batch, length) = self._step, self._shape
        experts = torch.stack(self._indices, dim=1).to(ROUTING_DTYPE)  # [B * L, moe_layers, k]
        experts = experts.view(batch, length, *experts.shape[1:]).transpose(1, 2)  # [B, moe_layers, L, k]
        buffer = self.record["experts"]
        if isinstance(step, DecodeStep) and length == 1:
            buffer[step.rows, :, step.positions] = experts[:, :, 0]
        elif isinstance(step, DecodeStep):  # a speculative verify: each row's last token and its proposals
            buffer[step.rows[:, None], :, step.positions] = experts.transpose(1, 2)  # [R, q, moe_layers, k]
        elif isinstance(step, PrefillStep):  # prompt rows (after a shared prefix at ``start``) to their samples' slots
            buffer[step.slots, :, step.start : step.start + step.width] = experts[step.row_of_slot]
        # else a SequenceStep (an online draft's training forward): no cache row, nothing to record
        self._indices = [None] * len(self.routers)
        self._step = None


def routers_to_record(model: nn.Module) -> list[nn.Module]:
    """``model``'s mixture-of-experts routers; ValueError for a model without any (nothing to record)."""
    routers = moe_routers(model)
    if not routers:
        raise ValueError(f"generation.record_routing=true: {model.config.model_type} has no mixture-of-experts "
                         "router to record; set record_routing=false for a dense model")
    return routers
