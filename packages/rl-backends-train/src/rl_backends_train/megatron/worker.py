"""One rank of the Megatron-core backend.

Shares the operations of ``TrainWorker`` (``rl_backends_train/worker.py``: micro-batching, packing,
losses, logprobs, top-k, checkpoint layout) and supplies what is model-specific: building a GPTModel from the HF weights,
data-parallel gradient sums (an all-reduce over the data-parallel group), the gradient norm over
tensor-parallel shards and pipeline stages, and HF names for refit, export and checkpoints. Covered:
causal_lm, LoRA, tensor parallel (Megatron's layers; ranks of a tensor-parallel group are neighbours,
as in the DTensor backend's mesh; LoRA included), pipeline parallel (``megatron/pipeline.py``:
megatron-core's 1F1B schedule; results sent from the last stage to every rank; weights and
checkpoints gathered under the names of the whole model), context parallel, activation recompute.

Rank layout: Megatron's order tp-cp-ep-dp-pp,
``rank = tp_rank + tp * (cp_rank + cp * (dp_rank + dp * pp_rank))``. The ranks of a context-parallel
group (``megatron/context.py``) see the same rows and split their positions; their gradients are
summed with the data-parallel ones (Megatron's data x context parallel group).

LoRA (``megatron/lora.py``): one adapter pair per HF projection on Megatron's fused linears, PEFT
names. Only adapters train; ``reference_logprobs`` runs the base (adapters off, no copy); refit and
export get merged HF weights; ``save_adapter`` writes the PEFT adapter alone and ``load_adapter``
reads one. Checkpoints hold the base HF weights and the adapters unmerged (``model.<hf name>`` and
``model.<...>.q_proj.lora_A.weight``, as the DTensor backend's), so a resume is exact.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)

from rl_backends_train.batching import dummy_micro_batch
from rl_backends_train.config import TrainBackendConfig
from rl_backends_train.lora import adapter_config
from rl_backends_train.megatron import grads, lora, tp_shards
from rl_backends_train.megatron.cpu_shims import apply_cpu_shims
from rl_backends_train.megatron.model import MegatronCausalLM, ModelChunks
from rl_backends_train.megatron.pipeline import PipelineSchedule
from rl_backends_train.precision import MasterWeights
from rl_backends_train.worker import TrainWorker

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
# Optimizer state in checkpoints: flattened (``state.<fqn>.<entry>``, ``param_groups.<fqn>.<entry>``),
# so that stages holding different parameters do not collide on list positions.
_FLAT_OPTIMIZER = StateDictOptions(flatten_optimizer_state_dict=True)


def check_megatron_config(cfg: TrainBackendConfig) -> None:
    unsupported = []
    if cfg.task != "causal_lm":
        unsupported.append(f"task={cfg.task!r} (only causal_lm)")
    unknown = sorted(set(cfg.lora.target_modules) - set(lora.HF_PROJECTIONS)) if cfg.lora else []
    if unknown:
        unsupported.append(f"lora.target_modules {unknown} (it adapts {', '.join(lora.HF_PROJECTIONS)}; "
                           "use backend=dtensor for other nn.Linear names)")
    if cfg.sequence_parallel and cfg.lora is not None:
        unsupported.append("sequence_parallel with lora (the adapters would see the sequence-sharded input of "
                           "layers whose output covers the whole sequence; use one of them)")
    if cfg.optimizer.name == "muon" and cfg.tensor_parallel_size > 1:
        unsupported.append("optimizer muon with tensor_parallel_size > 1 (Muon would orthogonalise each rank's shard "
                           "of a split weight, not the whole matrix; use adamw, or tensor_parallel_size=1)")
    if unsupported:
        raise ValueError("the Megatron backend does not support: " + "; ".join(unsupported))


def build_megatron_model(model_path: str, cfg: TrainBackendConfig, device: torch.device, *,
                         seed: int = 0, fp32_params: bool = False) -> MegatronCausalLM:
    """The GPTModel with the HF weights (with virtual pipeline stages: this rank's chunks of it); with
    ``cfg.lora`` frozen, adapters added (A drawn from ``seed``). Layers compute in ``cfg.dtype``;
    ``fp32_params``: the parameters hold fp32 values nonetheless (``precision.MasterWeights``), loaded
    from the HF weights without rounding."""
    from safetensors.torch import load_file
    from transformers import AutoConfig

    hf_config = AutoConfig.from_pretrained(model_path)
    chunks = cfg.virtual_pipeline_parallel_size
    parts = [MegatronCausalLM(hf_config, _DTYPES[cfg.dtype], recompute=cfg.activation_checkpointing, chunk=v,
                              chunks=chunks, sequence_parallel=cfg.sequence_parallel, precision=cfg.precision)
             for v in range(chunks)]
    model = parts[0] if chunks == 1 else ModelChunks(parts)
    if fp32_params:
        for param in model.parameters():
            param.data = param.data.float()
    model.load_hf_state_dict(_read_hf_weights(model_path, load_file))
    if cfg.lora is not None:
        for part in parts:  # each draws every layer's adapters in order and keeps its own
            lora.apply_lora(part, cfg.lora, seed=seed)
    return model.to(device)


def _read_hf_weights(model_path: str, load_file) -> dict[str, torch.Tensor]:
    from pathlib import Path

    files = sorted(Path(model_path).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{model_path}: no *.safetensors weights to build the Megatron model from")
    weights: dict[str, torch.Tensor] = {}
    for f in files:
        weights.update(load_file(str(f)))
    return weights


def check_model_fits(cfg: TrainBackendConfig, model_path: str) -> None:
    """In the driver: the model's family must be one the backend builds (``families.check_family``), the
    decoder layers must split evenly over the pipeline stages, the experts over the expert-parallel
    ranks; mixture-of-experts models run with tensor_parallel_size 1."""
    from transformers import AutoConfig

    from rl_backends_train.megatron import experts, families, stages

    hf_config = AutoConfig.from_pretrained(model_path)
    families.check_family(hf_config)
    stages.check_fits(hf_config, cfg.pipeline_parallel_size, cfg.virtual_pipeline_parallel_size)
    experts.check_fits(hf_config, cfg.expert_parallel_size)
    if experts.num_experts(hf_config) and cfg.tensor_parallel_size > 1:
        raise ValueError(f"tensor_parallel_size={cfg.tensor_parallel_size} with a mixture-of-experts model is not "
                         "supported by backend=megatron (experts are not split over tensor-parallel ranks here); "
                         "split the experts with expert_parallel_size, or the layers with pipeline_parallel_size")
    if experts.num_experts(hf_config) and cfg.lora is not None:
        mlp = sorted(set(cfg.lora.target_modules) & {"gate_proj", "up_proj", "down_proj"})
        if mlp:
            raise ValueError(f"lora.target_modules {mlp}: a mixture-of-experts model has experts, not one MLP; "
                             "target the attention projections (q_proj, k_proj, v_proj, o_proj)")


_groups_made_in = None  # the default process group Megatron's groups were made in


def init_model_parallel(tensor_parallel_size: int, pipeline_parallel_size: int = 1, context_parallel_size: int = 1,
                        expert_parallel_size: int = 1, virtual_pipeline_size: int = 1) -> None:
    """Megatron's process groups (order tp-cp-ep-dp-pp: tensor-parallel ranks are neighbours, the
    pipeline stage varies slowest). Made again when the sizes differ, or when the default process
    group is a new one (in-process workers re-create it after the last one shut down)."""
    from megatron.core import parallel_state

    global _groups_made_in
    if parallel_state.model_parallel_is_initialized():
        if (_groups_made_in is dist.group.WORLD
                and parallel_state.get_tensor_model_parallel_world_size() == tensor_parallel_size
                and parallel_state.get_pipeline_model_parallel_world_size() == pipeline_parallel_size
                and parallel_state.get_context_parallel_world_size() == context_parallel_size
                and parallel_state.get_expert_model_parallel_world_size() == expert_parallel_size
                and (parallel_state.get_virtual_pipeline_model_parallel_world_size() or 1) == virtual_pipeline_size):
            return
        parallel_state.destroy_model_parallel()
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tensor_parallel_size,
                                             pipeline_model_parallel_size=pipeline_parallel_size,
                                             context_parallel_size=context_parallel_size,
                                             expert_model_parallel_size=expert_parallel_size,
                                             virtual_pipeline_model_parallel_size=(virtual_pipeline_size
                                                                                   if virtual_pipeline_size > 1 else None))
    _groups_made_in = dist.group.WORLD


def seed_model_parallel_rng(seed: int, on_gpu: bool) -> None:
    """On CUDA: megatron-core's named CUDA RNG states (data-parallel, ``model-parallel-rng`` for
    tensor-parallel regions, expert-parallel), which its RNG tracker forks in every attention forward
    ("cuda rng state model-parallel-rng is not added" otherwise); after the model-parallel groups
    exist (the tensor-parallel rank offsets the stream). On the CPU the tracker's ``fork`` is a no-op
    (``cpu_shims`` 2)."""
    if on_gpu:
        from megatron.core import tensor_parallel

        tensor_parallel.model_parallel_cuda_manual_seed(seed)


class MegatronWorker(TrainWorker):
    """A rank holding its tensor-parallel shard of its pipeline stage of a GPTModel (data parallel over
    the model-parallel groups)."""

    def _init_parallel(self, seed: int) -> None:
        from megatron.core import parallel_state

        cfg = self.cfg
        check_megatron_config(cfg)
        apply_cpu_shims()
        init_model_parallel(cfg.tensor_parallel_size, cfg.pipeline_parallel_size, cfg.context_parallel_size,
                            cfg.expert_parallel_size, cfg.virtual_pipeline_parallel_size)
        seed_model_parallel_rng(seed, self.on_gpu)
        self.dp_group = parallel_state.get_data_parallel_group()
        self.dp_rank = parallel_state.get_data_parallel_rank()
        # Gradients are summed over data x context parallel ranks: a CP rank's covers its positions.
        self.grad_group = parallel_state.get_data_parallel_group(with_context_parallel=True)
        self.cp_rank = parallel_state.get_context_parallel_rank()
        # Experts: each expert-parallel rank (a data-parallel rank) holds its own; their gradients are
        # summed over the ranks holding the same experts (Megatron's expert data-parallel group).
        self.ep_group = parallel_state.get_expert_model_parallel_group() if cfg.expert_parallel_size > 1 else None
        self.expert_grad_group = parallel_state.get_expert_data_parallel_group()
        self.expert_dp_rank = parallel_state.get_expert_data_parallel_rank()
        self.tp_group = parallel_state.get_tensor_model_parallel_group()
        self.tp_rank = parallel_state.get_tensor_model_parallel_rank()
        self.pp_group = parallel_state.get_pipeline_model_parallel_group()
        self.tp_mesh = None  # the checkpoints' view of the tensor-parallel group
        if cfg.tensor_parallel_size > 1:
            from torch.distributed.device_mesh import init_device_mesh

            shape = (cfg.pipeline_parallel_size, cfg.data_parallel_size, cfg.context_parallel_size,
                     cfg.tensor_parallel_size)
            self.tp_mesh = init_device_mesh(self.device.type, shape, mesh_dim_names=("pp", "dp", "cp", "tp"))["tp"]
        self.pipeline = None
        if cfg.pipeline_parallel_size > 1:
            self.pipeline = PipelineSchedule(cfg.pipeline_parallel_size, self.pp_group, self.device)

    def _build_model(self, seed: int) -> MegatronCausalLM | ModelChunks:
        """With bf16: fp32 master weights, bf16 compute (``precision.MasterWeights``), as the DTensor
        backend's FSDP2 mixed precision."""
        masters = self.cfg.dtype != "float32"
        model = build_megatron_model(self.model_path, self.cfg, self.device, seed=seed, fp32_params=masters)
        self.masters = MasterWeights(model, _DTYPES[self.cfg.dtype]) if masters else None
        self.hf_shapes = self._whole_model_hf_shapes(model)
        return model

    def _compute_precision(self):
        return self.masters.compute() if self.masters is not None else contextlib.nullcontext()

    def _build_reference(self) -> MegatronCausalLM | ModelChunks:
        return build_megatron_model(self.model_path, self.cfg, self.device).requires_grad_(False).eval()

    def _hf_model_class(self) -> type:
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM._model_mapping[type(self.hf_config)]

    # Weights in HF names (refit, export).
    def _weight_sizes(self) -> Iterator[tuple[str, int]]:
        """From shapes (of every stage, gathered at start): rank 0 alone is asked."""
        for name, (shape, dtype) in self.hf_shapes.items():
            yield name, torch.Size(shape).numel() * dtype.itemsize

    def gather_weights(self, names: list[str]) -> dict[str, torch.Tensor] | None:
        """TP gathers within each stage, then the stages' tensors to rank 0."""
        # Data/context-parallel replicas hold the same weights; with expert parallel, the ranks of the
        # first expert group together hold every expert.
        first_replica = self.dp_rank == 0 if self.ep_group is None else self.expert_dp_rank == 0
        if not first_replica or self.cp_rank != 0:
            return None
        ours = [name for name in names if name in self.stage_hf_names]
        state = self.model.hf_state_dict(ours) if ours else {}  # gathers experts over the expert group
        if self.tp_rank != 0 or self.dp_rank != 0:
            return None
        tensors = self._stages_to_rank0({name: state[name].detach().cpu().clone() for name in ours})
        return {name: tensors[name] for name in names} if self.rank == 0 else None

    def _adapter_tensors(self) -> dict[str, torch.Tensor] | None:
        adapters = self.model.hf_adapter_state_dict()  # a tensor-parallel gather: every rank calls it
        if self.dp_rank == 0 and self.cp_rank == 0 and self.tp_rank == 0:
            adapters = self._stages_to_rank0({k: v.detach().cpu() for k, v in adapters.items()})
        return adapters if self.rank == 0 else None

    def _adapters_disabled(self):
        return lora.adapters_disabled(self.model)

    def load_adapter(self, path: str) -> None:
        """Replace the adapters by a PEFT-format adapter (``save_adapter``'s files, from either
        backend) with this config's rank, alpha and target modules. The optimizer state is kept."""
        import json
        from pathlib import Path

        from safetensors.torch import load_file

        if self.cfg.lora is None:
            raise ValueError("load_adapter() needs a LoRA config (policy.lora)")
        saved = json.loads((Path(path) / "adapter_config.json").read_text())
        ours = adapter_config(self.cfg.lora, self.model_path, self.cfg.task)
        differ = {k: (saved.get(k), ours[k]) for k in ("r", "lora_alpha", "target_modules") if saved.get(k) != ours[k]}
        if differ:
            raise ValueError(f"{path}/adapter_config.json does not match policy.lora "
                             f"(saved, configured): {differ}")
        tensors = load_file(str(Path(path) / "adapter_model.safetensors"))
        self.model.load_hf_state_dict({k.removeprefix("base_model.model."): v for k, v in tensors.items()})

    # Generation on this rank's model (generation.backend: megatron; driver: megatron/generation.py).
    @torch.no_grad()
    def generate(self, prompts: list[list[int]], sampling, base_seed: int, slices: list[tuple[int, int]],
                 max_batch_size: int, max_seq_len: int) -> tuple[list, dict] | None:
        """This data-parallel rank's slice ``slices[dp_rank]`` of ``prompts`` decoded on the model
        (``megatron/generate.py``), with its model-parallel group; ``(completions, stats)`` from the
        first tensor-parallel rank of the first stage, None from the others. Weights offloaded for
        generation come back to the device; optimizer state stays offloaded until ``onload``."""
        from dataclasses import asdict

        from rl_backends_train.megatron.generate import SliceDecoder, StageRunner
        from rl_backends_train.megatron.generation import load_tokenizer

        if self._offloaded_weights is not None:
            self.model.to(self._offloaded_weights)  # onload() moves the rest (a no-op for these)
        start, end = slices[self.dp_rank]
        decoder = SliceDecoder(self.model, StageRunner(self.model, self.device), sampling=sampling,
                               base_seed=base_seed, first_index=start, stop_ids=sampling.stop_token_ids,
                               tokenizer=load_tokenizer(self.model_path), max_batch_size=max_batch_size,
                               max_seq_len=max_seq_len)
        self.model.eval()
        with self._compute_precision():
            results = decoder.generate_slice(prompts[start:end])
        if self.on_gpu:
            torch.cuda.empty_cache()  # the KV cache is gone: give its memory back before training
        first_stage = self.model.model_chunks[0].stage.first
        return (results, asdict(decoder.stats)) if self.tp_rank == 0 and first_stage else None

    # Pipeline parallel: the shared operations run their micro-batches through here.
    def _run_micro_batches(self, model, mbs, on_outputs, *, backward: bool, **output_kwargs) -> None:
        """With pipeline stages: megatron-core's 1F1B schedule (``megatron/pipeline.py``);
        ``on_outputs`` runs on the last stage only."""
        if self.pipeline is None:
            super()._run_micro_batches(model, mbs, on_outputs, backward=backward, **output_kwargs)
            return
        self.pipeline.run(model, mbs, lambda mb, chunk: on_outputs(mb, self._outputs(chunk, mb, **output_kwargs)),
                          forward_only=not backward)

    def _micro_batches(self, local):
        """With virtual pipeline stages, dummies fill up to a multiple of the pipeline size P
        (megatron-core's interleaved schedule runs micro-batches in groups of P) and to at least 2 x P:
        with fewer, every micro-batch falls in the schedule's warm-up phase, which hung on gloo (PP 4 x
        VP 2 with 4 micro-batches; 8 ran)."""
        mbs = super()._micro_batches(local)
        if self.cfg.virtual_pipeline_parallel_size > 1:
            p = self.cfg.pipeline_parallel_size
            wanted = max(2 * p, len(mbs) + (-len(mbs) % p))
            mbs += [dummy_micro_batch(local, self.cfg.packing.enabled)] * (wanted - len(mbs))
        return mbs

    def _from_last_stage(self, value):
        return value if self.pipeline is None else self.pipeline.from_last_stage(value)

    def _sum_over_dp(self, local: dict[str, float]) -> dict[str, float]:
        """Metrics summed over the data-parallel ranks, from the last stage (where the loss ran)."""
        return self._from_last_stage(super()._sum_over_dp(local))

    def _reduce_gradients(self) -> None:
        grads.reduce_gradients(self.model, self.trainable, self.grad_group, self.expert_grad_group, self.tp_group)

    def _weighted_gradients(self) -> tuple[list[torch.Tensor], list[float]]:
        return grads.weighted_gradients(self.model, self.grad_group, self.tp_group, self.ep_group,
                                        self.expert_grad_group)

    def _checkpoint_state(self) -> dict:
        """Model tensors of this stage under HF names (the rl-checkpoint contract; gathered to full with
        TP > 1): with LoRA the base weights unmerged plus the adapters under PEFT names, which
        rl-checkpoint merges on conversion. Optimizer state flattened, under the Megatron FQNs of the
        whole model (``stages.PipelineStage.to_global``), tensor-parallel shards as DTensors (see
        ``tp_shards``): a checkpoint loads at any tensor and pipeline size."""
        optimizer = get_optimizer_state_dict(self.model, self.optimizers, options=_FLAT_OPTIMIZER)
        optimizer = {self._optimizer_key(k, self.model.global_fqn): v for k, v in optimizer.items()}
        return {"model": self.model.hf_state_dict(merged=False) | self.model.hf_adapter_state_dict(),
                "optimizer": tp_shards.optimizer_state_to_global(optimizer, self.tp_mesh)}

    def _restore_checkpoint_state(self, state: dict) -> None:
        self.model.load_hf_state_dict(state["model"])
        optimizer = tp_shards.optimizer_state_to_local(state["optimizer"])
        optimizer = {self._optimizer_key(k, self.model.local_fqn): v for k, v in optimizer.items()}
        set_optimizer_state_dict(self.model, self.optimizers, optimizer, options=_FLAT_OPTIMIZER)

    @staticmethod
    def _optimizer_key(key: str, rename) -> str:
        """``state.<fqn>.<entry>`` / ``param_groups.<fqn>.<entry>`` with the parameter's ``<fqn>`` renamed."""
        section, fqn = key.split(".", 1)
        fqn, entry = fqn.rsplit(".", 1)
        return f"{section}.{rename(fqn)}.{entry}"

    def _whole_model_hf_shapes(self, model) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        """HF name -> (full shape, dtype) of the whole model (every stage's, gathered once at start);
        ``stage_hf_names``: the names this stage sends for refit and export."""
        ours = {name: (tuple(t.shape), t.dtype) for name, t in model.hf_shapes().items()}
        self.stage_hf_names = set(ours)
        if model.holds_tied_copy:
            self.stage_hf_names.discard("model.embed_tokens.weight")  # the first stage sends it
        if self.pipeline is None:
            return ours
        parts: list[dict] = [{} for _ in range(self.cfg.pipeline_parallel_size)]
        dist.all_gather_object(parts, ours, group=self.pp_group)
        return {name: value for part in parts for name, value in part.items()}

    def _stages_to_rank0(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Every stage's ``tensors`` merged on rank 0 (others get their own back). Called by the ranks
        of rank 0's pipeline group (data- and tensor-parallel rank 0 of every stage)."""
        if self.pipeline is None:
            return tensors
        parts: list[dict] | None = [{} for _ in range(self.cfg.pipeline_parallel_size)] if self.rank == 0 else None
        dist.gather_object(tensors, parts, dst=0, group=self.pp_group)
        if self.rank != 0:
            return tensors
        return {name: tensor for part in parts for name, tensor in part.items()}
