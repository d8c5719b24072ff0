"""A megatron-core GPTModel built from an HF config (the families of ``megatron/families.py``), wearing an
HF-style interface.

``MegatronCausalLM.forward(input_ids, attention_mask, position_ids)`` returns an object with
``.logits`` like an HF causal LM, so micro-batching, packing and the logprob code are shared with
the DTensor backend. Masks: a 2-D padding mask (right padding) becomes Megatron's causal mask; a
4-D boolean packing mask (True = may attend) is inverted to Megatron's True = masked out.

With tensor parallelism each rank holds its shards (``tp_shards``); the vocab-parallel logits are
gathered to full ``[b, t, V]`` on every rank, and the HF-name views gather the full tensors (collectives
over the tensor-parallel group: every rank of the group must call them).

With LoRA (``megatron/lora.py``) the adapters live inside the GPTModel's linears; ``hf_state_dict``
folds them into the HF weights unless ``merged=False``, ``hf_adapter_state_dict`` gives them alone
under PEFT names, and ``load_hf_state_dict`` takes base and adapter tensors together.

RoPE follows ``position_ids`` when they are given (packed rows): megatron-core rotates by the
position in the row, which for a plain packed row gives the same attention scores (RoPE is
relative, and every sequence is contiguous), but not for shared-prompt packing, where an answer
continues its prompt's positions after other answers (``PositionedRotary``).

With pipeline parallelism (``megatron/stages.py``) each rank builds its stage's part of the GPTModel
(``pre_process`` on the first stage, ``post_process`` on the last); a stage that is not the last
returns its hidden states ``[t, b, hidden]`` (the input of the next stage, which Megatron's schedule
sets with ``set_input_tensor``). The HF-name views cover this stage's tensors only, under their
global names (layer indices of the whole model); ``load_hf_state_dict`` takes the whole model or any
part of it and keeps what this stage holds.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from rl_backends_train.megatron import context, experts, families, fp8, lora, stages, tp_shards


class MegatronCausalLM(nn.Module):
    """A GPTModel (local layer spec) with an HF causal-LM calling convention: this rank's
    tensor-parallel shard of its pipeline stage (the whole model with TP = PP = 1)."""

    def __init__(self, hf_config, dtype: torch.dtype, *, recompute: bool = False, chunk: int = 0,
                 chunks: int = 1, sequence_parallel: bool = False, precision=None) -> None:
        """``chunk`` / ``chunks``: this model chunk of the rank's ``chunks`` (virtual pipeline stages);
        ``precision``: a ``PrecisionConfig`` (FP8 through Transformer Engine's linears, ``fp8.py``)."""
        super().__init__()
        from megatron.core import parallel_state
        from megatron.core.models.gpt import GPTModel
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

        self.config = hf_config
        self.lora_scale: float | None = None  # alpha / rank once lora.apply_lora has run
        self.tp_size = parallel_state.get_tensor_model_parallel_world_size()
        self.tp_rank = parallel_state.get_tensor_model_parallel_rank()
        self.tp_group = parallel_state.get_tensor_model_parallel_group()
        pp_size = parallel_state.get_pipeline_model_parallel_world_size()
        pp_rank = parallel_state.get_pipeline_model_parallel_rank()
        self.cp_size = parallel_state.get_context_parallel_world_size()
        self.cp_rank = parallel_state.get_context_parallel_rank()
        self.cp_group = parallel_state.get_context_parallel_group()
        self.sequence_parallel = sequence_parallel and self.tp_size > 1
        ep_size = parallel_state.get_expert_model_parallel_world_size()
        self.ep_group = parallel_state.get_expert_model_parallel_group() if ep_size > 1 else None
        self.experts = experts.ExpertShard(parallel_state.get_expert_model_parallel_rank(), ep_size,
                                           experts.num_experts(hf_config))
        experts.check_fits(hf_config, ep_size)
        tp_shards.check_fits(hf_config, self.tp_size)
        stages.check_fits(hf_config, pp_size, chunks)
        tied = bool(hf_config.tie_word_embeddings)
        if self.experts.num_experts:
            experts.patch_router_without_transformer_engine()
        layer_spec = get_gpt_layer_local_spec(num_experts=self.experts.num_experts or None, moe_grouped_gemm=False,
                                              qk_layernorm=families.qk_layernorm(hf_config), normalization="RMSNorm")
        if self.cp_size > 1:
            layer_spec.submodules.self_attention.submodules.core_attention = context.attention_class()
        quantization = fp8.transformer_config_fields(precision)
        if quantization:  # only Transformer Engine modules compute in FP8
            layer_spec = fp8.with_te_linears(layer_spec)
        config = families.transformer_config(hf_config, dtype, tensor_parallel_size=self.tp_size, pipeline_parallel_size=pp_size,
                                    context_parallel_size=self.cp_size, expert_parallel_size=ep_size,
                                    recompute=recompute, virtual_pipeline_size=chunks,
                                    sequence_parallel=self.sequence_parallel,
                                    quantization=quantization)
        if self.sequence_parallel:
            layer_spec = _sequence_parallel_block(layer_spec, config, chunk if chunks > 1 else None)
        self.gpt = GPTModel(
            config,
            layer_spec,
            vocab_size=hf_config.vocab_size,
            max_sequence_length=hf_config.max_position_embeddings,
            pre_process=pp_rank == 0 and chunk == 0,
            post_process=pp_rank == pp_size - 1 and chunk == chunks - 1,
            vp_stage=chunk if chunks > 1 else None,
            position_embedding_type="rope",
            rotary_base=int(families.rope_theta(hf_config)),
            # With several stages the last one keeps its own copy of tied embeddings (stages.py), loaded
            # from the HF weights like the first stage's; Megatron's own set-up of that copy (an
            # all-reduce after moving it to CUDA) is not needed then.
            share_embeddings_and_output_weights=tied and pp_size == 1,
        )
        self.stage = stages.stage_of(self.gpt, pp_rank, pp_size, tied, chunk, chunks)
        self.gpt.rotary_pos_emb = PositionedRotary(self.gpt.rotary_pos_emb)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, logits_to_keep: int = 0) -> SimpleNamespace:
        """HF-style call; ``logits_to_keep > 0`` returns the logits of the last that many positions
        (computed in full: GPTModel has no hook before its output layer). A stage other than the
        last returns ``hidden_states`` [t, b, hidden] instead of logits (the first stage embeds
        ``input_ids``; later ones start from the tensor set by ``gpt.set_input_tensor``)."""
        b, t = input_ids.shape
        if attention_mask is not None and attention_mask.dim() == 4:
            masked_out = ~attention_mask.bool()  # [b, 1, t, t]
        else:
            # Right padding: the causal mask alone keeps real tokens from seeing padding.
            masked_out = torch.ones(t, t, dtype=torch.bool, device=input_ids.device).triu(1)[None, None]
        masked_out = masked_out.expand(b, 1, t, t)
        # Context parallel cuts the width into 2 x cp chunks, sequence parallel the (local) width into
        # tp parts: pad to a multiple of both (padding attends to and is attended by nothing).
        multiple = (2 * self.cp_size if self.cp_size > 1 else 1) * (self.tp_size if self.sequence_parallel else 1)
        width = t + (-t % multiple)
        if width > t:
            input_ids = F.pad(input_ids, (0, width - t))
            if position_ids is not None:
                position_ids = F.pad(position_ids, (0, width - t))
            masked_out = F.pad(masked_out, (0, width - t, 0, width - t), value=True)
        if self.cp_size > 1:
            input_ids, position_ids, masked_out = self._context_part(input_ids, position_ids, masked_out)
        rotary = self.gpt.rotary_pos_emb
        if position_ids is None:
            position_ids = torch.arange(width, device=input_ids.device)[None].expand(b, -1)
        else:
            rotary.positions = position_ids
        try:
            out = self.gpt(input_ids, position_ids, masked_out)
        finally:
            rotary.positions = None
        if not self.stage.last:
            return SimpleNamespace(hidden_states=out)  # [width (/ cp) (/ tp with sequence parallel), b, hidden]
        logits = out  # [b, width (/ cp), V / tp]
        if self.tp_size > 1:
            logits = tp_shards.GatherVocabShards.apply(logits, self.tp_group)
        if self.cp_size > 1:
            logits = self._full_width(logits)
        logits = logits[:, :t]
        if logits_to_keep > 0:
            logits = logits[:, -logits_to_keep:]
        return SimpleNamespace(logits=logits)

    def _context_part(self, input_ids: torch.Tensor, position_ids: torch.Tensor | None,
                      masked_out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """This context-parallel rank's positions (``megatron/context.py``) of a width that divides by
        2 x cp: its ids and position ids, and its query rows of the mask with the key columns in the
        order the attention gathers them."""
        b, width = input_ids.shape
        if position_ids is None:
            position_ids = torch.arange(width, device=input_ids.device)[None].expand(b, -1)
        mine = context.split_index(width, self.cp_size, self.cp_rank).to(input_ids.device)
        order = context.gathered_order(width, self.cp_size).to(input_ids.device)
        return input_ids[:, mine], position_ids[:, mine], masked_out[:, :, mine][..., order]

    def _full_width(self, logits: torch.Tensor) -> torch.Tensor:
        """``[b, width / cp, V]`` of every context-parallel rank -> ``[b, width, V]`` in position order."""
        gathered = context.gather_keep_slice(logits, 1, self.cp_group)
        order = context.gathered_order(gathered.shape[1], self.cp_size).to(logits.device)
        return gathered.index_select(1, torch.argsort(order))

    # HF names <-> Megatron names through rl_checkpoint's mapping (the converter's, shared).
    def hf_shapes(self) -> dict[str, torch.Tensor]:
        """Meta tensors with the full (unsharded) HF shapes and dtypes of this stage's tensors; no
        communication."""
        from rl_checkpoint.megatron_mapping import megatron_to_hf

        meta = {every: torch.empty(tp_shards.full_shape(name, t.shape, self.tp_size), dtype=t.dtype, device="meta")
                for name, t in self._global_state().items() for every in self.experts.all_global(name)}
        return megatron_to_hf(meta, self._mapping_config())

    def hf_state_dict(self, names: list[str] | None = None, *, merged: bool = True) -> dict[str, torch.Tensor]:
        """Full HF tensors of this stage (all of them, or those of ``names`` it holds), LoRA folded in
        unless ``merged=False``. With TP > 1 a collective over the tensor-parallel group that gathers
        only the Megatron tensors ``names`` come from."""
        from rl_checkpoint.megatron_mapping import megatron_to_hf

        own = self._global_state()
        adapters = self._global_adapters() if merged else {}
        if names is not None:
            sources = _hf_sources(names)
            own = {k: v for k, v in own.items() if _megatron_source(k) & sources}
            adapters = {k: v for k, v in adapters.items() if _megatron_source(k) & sources}
        full = {k: tp_shards.gather_full(k, v, self.tp_group) for k, v in own.items()}
        if self.ep_group is not None:
            full = self._gather_experts(full)
        hf = megatron_to_hf(full, self._mapping_config())
        if adapters:
            hf = lora.merge_into(hf, self._gather_adapters(adapters), self.lora_scale)
        return hf if names is None else {name: hf[name] for name in names if name in hf}

    def hf_adapter_state_dict(self) -> dict[str, torch.Tensor]:
        """Full LoRA tensors of this stage under PEFT names (``model.layers.0.self_attn.q_proj.lora_A.weight``);
        a collective over the tensor-parallel group. Empty without LoRA."""
        return self._gather_adapters(self._global_adapters())

    def load_hf_state_dict(self, state_dict: dict[str, torch.Tensor]) -> None:
        """Load full HF tensors (LoRA tensors under PEFT names too) of the whole model or a part of it;
        each rank keeps its stage's tensors, and of those its tensor-parallel shards."""
        from rl_checkpoint.megatron_mapping import hf_to_megatron

        state_dict = {k: v for k, v in state_dict.items() if self.stage.holds_hf_layer(k)}
        base = {k: v for k, v in state_dict.items() if not (".lora_A." in k or ".lora_B." in k)}
        adapters = {lora.megatron_adapter_name(k): v for k, v in state_dict.items() if k not in base}
        mapped = (hf_to_megatron(base, self.config.to_dict()) if base else {}) | adapters
        local = {}
        for name, tensor in mapped.items():
            local_name = self.to_local_name(name)
            if local_name is not None:
                local[local_name] = tp_shards.split_for_rank(local_name, tensor, self.tp_size, self.tp_rank)
        missing, unexpected = self.gpt.load_state_dict(local, strict=False)
        # Base and adapters may come separately (HF weights at build, a PEFT adapter later): what
        # was given must be complete.
        required = (set(self._own_state()) if base else set()) | (set(self._adapter_state()) if adapters else set())
        missing = [k for k in missing if k in required]
        if missing or unexpected:
            raise RuntimeError(f"HF weights do not fit the GPTModel: missing {missing}, unexpected {unexpected}")

    def _own_state(self) -> dict[str, torch.Tensor]:
        """The base model's tensors (Megatron names), adapters left out."""
        return {k: v for k, v in self.gpt.state_dict().items()
                if not k.endswith("_extra_state") and not lora.is_adapter_name(k)}

    def _adapter_state(self) -> dict[str, torch.Tensor]:
        return {k: v for k, v in self.gpt.state_dict().items() if lora.is_adapter_name(k)}

    @property
    def model_chunks(self) -> list[MegatronCausalLM]:
        return [self]

    @property
    def holds_tied_copy(self) -> bool:
        return self.stage.holds_tied_copy

    def global_fqn(self, fqn: str) -> str:
        """A parameter's FQN in this module (``gpt.<name>``) -> ``gpt.<name in the whole model>``
        (optimizer-state keys of checkpoints)."""
        return "gpt." + self.to_global_name(fqn.removeprefix("gpt."))

    def local_fqn(self, fqn: str) -> str:
        """Inverse of ``global_fqn``."""
        return "gpt." + self.to_local_name(fqn.removeprefix("gpt."))

    def to_global_name(self, name: str) -> str:
        """A tensor name of this rank's GPTModel -> its name in the whole model (layers of every
        pipeline stage, experts of every expert-parallel rank)."""
        return self.experts.to_global(self.stage.to_global(name))

    def to_local_name(self, name: str) -> str | None:
        """Inverse of ``to_global_name``; None for a tensor another stage or expert rank holds."""
        local = self.stage.to_local(name)
        return None if local is None else self.experts.to_local(local)

    def _global_state(self) -> dict[str, torch.Tensor]:
        """``_own_state`` under the names of the whole model (``to_global_name``)."""
        return {self.to_global_name(k): v for k, v in self._own_state().items()}

    def _global_adapters(self) -> dict[str, torch.Tensor]:
        return {self.to_global_name(k): v for k, v in self._adapter_state().items()}

    def _gather_experts(self, full: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Add the experts the other expert-parallel ranks hold (a collective over the expert group;
        every rank of it calls with the same layers)."""
        mine = {k: v.detach().cpu() for k, v in full.items() if experts.is_expert(k)}
        parts: list[dict] = [{} for _ in range(self.experts.size)]
        dist.all_gather_object(parts, mine, group=self.ep_group)
        device = next(iter(full.values())).device if full else torch.device("cpu")
        return full | {k: v.to(device) for part in parts for k, v in part.items() if k not in full}

    def _mapping_config(self) -> dict:
        """The HF config for ``megatron_to_hf`` of this stage's tensors. A stage without the output
        layer maps as if tied, so the mapping does not take its embedding for a missing lm_head."""
        config = self.config.to_dict()
        if not self.stage.last:
            config["tie_word_embeddings"] = True
        return config

    def _gather_adapters(self, local: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {lora.hf_adapter_name(k): tp_shards.gather_full(k, v, self.tp_group) for k, v in local.items()}


class SequenceParallelRMSNorm(nn.Module):
    """RMSNorm for the local layer spec under sequence parallel (megatron-core's ``WrappedTorchNorm``,
    used without Apex, asserts ``not sequence_parallel``): the same ``F.rms_norm`` as torch's
    ``nn.RMSNorm``, with the weight marked ``sequence_parallel`` so ``grads.reduce_gradients`` sums its
    gradient (one per rank's positions) over the tensor-parallel group."""

    def __init__(self, config, hidden_size: int, eps: float = 1e-5, **_unused) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=config.params_dtype))
        self.weight.sequence_parallel = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


def _sequence_parallel_block(layer_spec, config, vp_stage: int | None):
    """The decoder block's spec with ``SequenceParallelRMSNorm`` for every norm (the layers' and the
    final one, which a layer spec alone cannot set)."""
    from megatron.core.transformer.identity_op import IdentityOp
    from megatron.core.transformer.transformer_block import TransformerBlockSubmodules, get_num_layers_to_build

    sub = layer_spec.submodules
    sub.input_layernorm = SequenceParallelRMSNorm
    if sub.pre_mlp_layernorm is not IdentityOp:
        sub.pre_mlp_layernorm = SequenceParallelRMSNorm
    layers = get_num_layers_to_build(config, vp_stage=vp_stage)
    return TransformerBlockSubmodules(layer_specs=[layer_spec] * layers, layer_norm=SequenceParallelRMSNorm)


class ModelChunks(nn.Module):
    """The model chunks of one pipeline rank with virtual pipeline stages (megatron-core's interleaved
    schedule), with ``MegatronCausalLM``'s weight, name and state views over all of them. Calls that
    run the model go to a chunk (``pipeline.py`` picks it)."""

    def __init__(self, chunks: list[MegatronCausalLM]) -> None:
        super().__init__()
        self.parts = nn.ModuleList(chunks)
        self.config = chunks[0].config

    @property
    def model_chunks(self) -> list[MegatronCausalLM]:
        return list(self.parts)

    @property
    def holds_tied_copy(self) -> bool:
        return any(c.stage.holds_tied_copy for c in self.model_chunks)

    def hf_shapes(self) -> dict[str, torch.Tensor]:
        return {k: v for c in self.model_chunks for k, v in c.hf_shapes().items()}

    def hf_state_dict(self, names: list[str] | None = None, *, merged: bool = True) -> dict[str, torch.Tensor]:
        return {k: v for c in self.model_chunks for k, v in c.hf_state_dict(names, merged=merged).items()}

    def hf_adapter_state_dict(self) -> dict[str, torch.Tensor]:
        return {k: v for c in self.model_chunks for k, v in c.hf_adapter_state_dict().items()}

    def load_hf_state_dict(self, state_dict: dict[str, torch.Tensor]) -> None:
        for c in self.model_chunks:
            c.load_hf_state_dict(state_dict)

    def global_fqn(self, fqn: str) -> str:
        """``parts.<v>.gpt.<name>`` -> ``gpt.<name in the whole model>``."""
        _, v, rest = fqn.split(".", 2)
        return self.model_chunks[int(v)].global_fqn(rest)

    def local_fqn(self, fqn: str) -> str:
        name = fqn.removeprefix("gpt.")
        for v, c in enumerate(self.model_chunks):
            local = c.to_local_name(name)
            if local is not None:
                return f"parts.{v}.gpt.{local}"
        raise KeyError(f"{fqn}: no model chunk of this rank holds it")


class PositionedRotary(nn.Module):
    """megatron-core's RotaryEmbedding at given positions: while ``positions`` [b, t] is set, the
    GPTModel's call (``rotary(seq_len, ...)``, positions 0 .. t-1 of every row) returns the
    frequencies of ``positions`` instead, ``[t, b, 1, dim]`` (Megatron's ``[t, 1, 1, dim]`` broadcast
    over rows; the unfused RoPE this backend configures multiplies them elementwise with
    ``[t, b, heads, dim]`` queries and keys). With context parallel the positions are those of this
    rank's part (always set). Applied inside the attention of every layer and every pipeline stage
    (each stage's GPTModel computes its own)."""

    def __init__(self, rotary: nn.Module) -> None:
        super().__init__()
        self.rotary = rotary
        self.positions: torch.Tensor | None = None

    def get_rotary_seq_len(self, *args, **kwargs) -> int:
        return self.rotary.get_rotary_seq_len(*args, **kwargs)

    def forward(self, max_seq_len: int, *args, **kwargs) -> torch.Tensor:
        if self.positions is None:
            return self.rotary(max_seq_len, *args, **kwargs)
        emb = self.rotary.get_emb(int(self.positions.max()) + 1)  # [max position + 1, 1, 1, dim]
        return emb[self.positions.to(emb.device).t(), 0]  # [t, b, 1, dim]


def _hf_sources(hf_names: list[str]) -> set[str]:
    """Keys of the Megatron tensors that HF tensors ``hf_names`` are made from (see ``_megatron_source``)."""
    keys = set()
    for name in hf_names:
        parts = name.split(".")
        if name.startswith("model.layers."):
            keys.add(f"layer{parts[2]}")
        elif name == "model.norm.weight":
            keys.add("final_norm")
        else:  # embed_tokens, lm_head (the embedding too, when Megatron shares it with the output layer)
            keys |= {"embedding", "output"}
    return keys


def _megatron_source(megatron_name: str) -> set[str]:
    parts = megatron_name.split(".")
    if megatron_name.startswith("decoder.layers."):
        return {f"layer{parts[2]}"}
    if megatron_name.startswith("decoder.final_layernorm"):
        return {"final_norm"}
    if megatron_name.startswith("embedding."):
        return {"embedding"}
    return {"output"}
