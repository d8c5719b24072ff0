"""One rank of the Megatron-core backend.

Shares the DTensor worker's operations (micro-batching, packing, losses, logprobs, top-k,
checkpoint layout) and replaces what is model-specific: building a GPTModel from the HF weights,
data-parallel gradient sums (an all-reduce over the data-parallel group), the gradient norm over
tensor-parallel shards, and HF names for refit, export and checkpoints. Covered: causal_lm, LoRA,
tensor parallel (Megatron's layers; ranks of a tensor-parallel group are neighbours, as in the
DTensor backend's mesh; LoRA included), activation recompute.

LoRA (``megatron/lora.py``): one adapter pair per HF projection on Megatron's fused linears, PEFT
names. Only adapters train; ``reference_logprobs`` runs the base (adapters off, no copy); refit and
export get merged HF weights; ``save_adapter`` writes the PEFT adapter alone and ``load_adapter``
reads one. Checkpoints hold the base HF weights and the adapters unmerged (``model.<hf name>`` and
``model.<...>.q_proj.lora_A.weight``, as the DTensor backend's), so a resume is exact.
"""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict

from rl_backends_train.config import TrainBackendConfig
from rl_backends_train.dtensor.worker import DTensorWorker
from rl_backends_train.lora import adapter_config, write_adapter
from rl_backends_train.megatron import lora, tp_shards
from rl_backends_train.megatron.cpu_shims import apply_cpu_shims
from rl_backends_train.megatron.model import MegatronCausalLM
from rl_backends_train.optim import build_optimizers, build_schedulers, clip_grad_norm

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def check_megatron_config(cfg: TrainBackendConfig) -> None:
    unsupported = []
    if cfg.task != "causal_lm":
        unsupported.append(f"task={cfg.task!r} (only causal_lm)")
    unknown = sorted(set(cfg.lora.target_modules) - set(lora.HF_PROJECTIONS)) if cfg.lora else []
    if unknown:
        unsupported.append(f"lora.target_modules {unknown} (it adapts {', '.join(lora.HF_PROJECTIONS)}; "
                           "use backend=dtensor for other nn.Linear names)")
    if cfg.sequence_parallel:
        unsupported.append("sequence_parallel (use backend=dtensor; Megatron's sequence-parallel collectives "
                           "allocate on CUDA)")
    if unsupported:
        raise ValueError("the Megatron backend does not support: " + "; ".join(unsupported))


def build_megatron_model(model_path: str, cfg: TrainBackendConfig, device: torch.device, *,
                         seed: int = 0) -> MegatronCausalLM:
    """The GPTModel with the HF weights; with ``cfg.lora`` frozen, adapters added (A drawn from ``seed``)."""
    from safetensors.torch import load_file
    from transformers import AutoConfig

    hf_config = AutoConfig.from_pretrained(model_path)
    model = MegatronCausalLM(hf_config, _DTYPES[cfg.dtype], recompute=cfg.activation_checkpointing)
    model.load_hf_state_dict(_read_hf_weights(model_path, load_file))
    if cfg.lora is not None:
        lora.apply_lora(model, cfg.lora, seed=seed)
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


def init_model_parallel(tensor_parallel_size: int) -> None:
    """Megatron's process groups (order tp-cp-ep-dp-pp: tensor-parallel ranks are neighbours)."""
    from megatron.core import parallel_state

    if parallel_state.model_parallel_is_initialized():
        if parallel_state.get_tensor_model_parallel_world_size() == tensor_parallel_size:
            return
        parallel_state.destroy_model_parallel()
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tensor_parallel_size,
                                             pipeline_model_parallel_size=1)


class MegatronWorker(DTensorWorker):
    """A rank holding its tensor-parallel shard of a GPTModel (data parallel over the shard groups)."""

    def __init__(self, cfg: TrainBackendConfig, model_path: str, seed: int = 0) -> None:
        from megatron.core import parallel_state

        check_megatron_config(cfg)
        apply_cpu_shims()
        self.cfg = cfg
        self.model_path = model_path
        self.on_gpu = torch.cuda.is_available()
        self.device = torch.device("cuda", torch.cuda.current_device()) if self.on_gpu else torch.device("cpu")
        if dist.get_world_size() != cfg.num_workers:
            raise ValueError(f"world size {dist.get_world_size()} != num_workers {cfg.num_workers}")
        init_model_parallel(cfg.tensor_parallel_size)
        self.dp_group = parallel_state.get_data_parallel_group()
        self.dp_rank = parallel_state.get_data_parallel_rank()
        self.tp_group = parallel_state.get_tensor_model_parallel_group()
        self.tp_mesh = None  # the checkpoints' view of the tensor-parallel group
        if cfg.tensor_parallel_size > 1:
            from torch.distributed.device_mesh import init_device_mesh

            self.tp_mesh = init_device_mesh(self.device.type, (cfg.data_parallel_size, cfg.tensor_parallel_size),
                                            mesh_dim_names=("dp", "tp"))["tp"]
        self.rank = dist.get_rank()
        torch.manual_seed(seed)
        self.model = build_megatron_model(model_path, cfg, self.device, seed=seed)
        self.hf_config = self.model.config
        self.model_class = _hf_causal_lm_class(self.hf_config)
        self.score_head = None
        self.reference = None
        if cfg.reference_model and cfg.lora is None:  # with LoRA the reference is the base: adapters off
            self.reference = build_megatron_model(model_path, cfg, self.device).requires_grad_(False).eval()
        self.optimizers = build_optimizers(self.model, cfg.optimizer)
        self.schedulers = build_schedulers(self.optimizers, cfg.scheduler)
        self.trainable = [p for p in self.model.parameters() if p.requires_grad]
        self.step = 0
        torch.manual_seed(seed + 1 + self.dp_rank)

    # Weights in HF names (refit, export).
    def weight_buckets(self, bucket_bytes: int) -> list[list[str]]:
        """Called on rank 0 alone: sizes come from shapes, without gathering."""
        buckets: list[list[str]] = [[]]
        size = 0
        for name, tensor in self.model.hf_shapes().items():
            nbytes = tensor.numel() * tensor.element_size()
            if buckets[-1] and size + nbytes > bucket_bytes:
                buckets.append([])
                size = 0
            buckets[-1].append(name)
            size += nbytes
        return buckets

    def gather_weights(self, names: list[str]) -> dict[str, torch.Tensor] | None:
        """Full HF tensors of ``names`` on rank 0 (others: None); every rank must call it (TP gathers)."""
        if self.rank != 0 and self.cfg.tensor_parallel_size == 1:
            return None
        state = self.model.hf_state_dict(names)
        return {name: state[name].detach().cpu().clone() for name in names} if self.rank == 0 else None

    def save_adapter(self, path: str) -> None:
        """PEFT-format adapter (adapter_model.safetensors + adapter_config.json), written by rank 0;
        the same files as the DTensor backend's for the same adapters."""
        if self.cfg.lora is None:
            raise ValueError("save_adapter() needs a LoRA config (policy.training.lora)")
        adapters = self.model.hf_adapter_state_dict()  # a tensor-parallel gather: every rank calls it
        if self.rank == 0:
            write_adapter(path, {k: v.detach().cpu() for k, v in adapters.items()},
                          adapter_config(self.cfg.lora, self.model_path, self.cfg.task))
        dist.barrier()

    def load_adapter(self, path: str) -> None:
        """Replace the adapters by a PEFT-format adapter (``save_adapter``'s files, from either
        backend) with this config's rank, alpha and target modules. The optimizer state is kept."""
        import json
        from pathlib import Path

        from safetensors.torch import load_file

        if self.cfg.lora is None:
            raise ValueError("load_adapter() needs a LoRA config (policy.training.lora)")
        saved = json.loads((Path(path) / "adapter_config.json").read_text())
        ours = adapter_config(self.cfg.lora, self.model_path, self.cfg.task)
        differ = {k: (saved.get(k), ours[k]) for k in ("r", "lora_alpha", "target_modules") if saved.get(k) != ours[k]}
        if differ:
            raise ValueError(f"{path}/adapter_config.json does not match policy.training.lora "
                             f"(saved, configured): {differ}")
        tensors = load_file(str(Path(path) / "adapter_model.safetensors"))
        self.model.load_hf_state_dict({k.removeprefix("base_model.model."): v for k, v in tensors.items()})

    def _reduce_gradients(self) -> None:
        """Sum each gradient over the data-parallel ranks (Megatron's TP layers already did the
        tensor-parallel reductions inside backward)."""
        if dist.get_world_size(self.dp_group) == 1:
            return
        for param in self.trainable:
            if param.grad is not None:
                dist.all_reduce(param.grad, group=self.dp_group)

    def _clip_gradients(self) -> float:
        if self.cfg.tensor_parallel_size == 1:
            return clip_grad_norm(self.trainable, self.cfg.max_grad_norm)
        return clip_tensor_parallel_grad_norm(self.model, self.cfg.max_grad_norm, self.tp_group)

    def _checkpoint_state(self) -> dict:
        """Model tensors under HF names (the rl-checkpoint contract; gathered to full with TP > 1):
        with LoRA the base weights unmerged plus the adapters under PEFT names, which rl-checkpoint
        merges on conversion; optimizer under Megatron FQNs, tensor-parallel shards as DTensors (see
        ``tp_shards``)."""
        optimizer = get_optimizer_state_dict(self.model, self.optimizers)
        return {"model": self.model.hf_state_dict(merged=False) | self.model.hf_adapter_state_dict(),
                "optimizer": tp_shards.optimizer_state_to_global(optimizer, self.tp_mesh)}

    def _restore_checkpoint_state(self, state: dict) -> None:
        self.model.load_hf_state_dict(state["model"])
        set_optimizer_state_dict(self.model, self.optimizers, tp_shards.optimizer_state_to_local(state["optimizer"]))

    @contextlib.contextmanager
    def _reference_weights(self, reference: bool):
        """With LoRA the reference is this model with its adapters switched off (no copy)."""
        if not (reference and self.cfg.lora is not None):
            with super()._reference_weights(reference) as model:
                yield model
            return
        self.model.eval()
        with lora.adapters_disabled(self.model) as model:
            yield model


def clip_tensor_parallel_grad_norm(model: MegatronCausalLM, max_norm: float | None, tp_group) -> float:
    """Global L2 norm of the full model's gradient: the squares of tensor-parallel shards are summed
    over the group, replicated parameters (norms; same gradient on every TP rank) counted once."""
    sharded = torch.zeros((), dtype=torch.float64)
    replicated = torch.zeros((), dtype=torch.float64)
    grads = []
    for name, param in model.gpt.named_parameters():
        if param.grad is None:
            continue
        grads.append(param.grad)
        sq = param.grad.detach().double().pow(2).sum().cpu()
        if tp_shards.shard_dim(name) is None:
            replicated += sq
        else:
            sharded += sq
    dist.all_reduce(sharded, group=tp_group)
    total = float((sharded + replicated).sqrt())
    if max_norm is not None and total > max_norm:
        coef = max_norm / (total + 1e-6)
        for g in grads:
            g.mul_(coef)
    return total


def _hf_causal_lm_class(config) -> type:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM._model_mapping[type(config)]
