"""One rank of the Megatron-core backend.

Shares the DTensor worker's operations (micro-batching, packing, losses, logprobs, top-k,
checkpoint layout) and replaces what is model-specific: building a GPTModel from the HF weights,
data-parallel gradient sums (an all-reduce; parameters are replicated), and HF names for refit,
export and checkpoints. Covered: tensor_parallel_size = 1, causal_lm, no LoRA.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict

from rl_backends_train.config import TrainBackendConfig
from rl_backends_train.dtensor.worker import DTensorWorker
from rl_backends_train.megatron.cpu_shims import apply_cpu_shims
from rl_backends_train.megatron.model import MegatronCausalLM
from rl_backends_train.optim import build_optimizers, build_schedulers

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def check_megatron_config(cfg: TrainBackendConfig) -> None:
    unsupported = []
    if cfg.tensor_parallel_size != 1:
        unsupported.append(f"tensor_parallel_size={cfg.tensor_parallel_size} (only 1)")
    if cfg.task != "causal_lm":
        unsupported.append(f"task={cfg.task!r} (only causal_lm)")
    if cfg.lora is not None:
        unsupported.append("lora (use backend=dtensor)")
    if cfg.activation_checkpointing:
        unsupported.append("activation_checkpointing")
    if unsupported:
        raise ValueError("the Megatron backend does not support: " + "; ".join(unsupported))


def build_megatron_model(model_path: str, cfg: TrainBackendConfig, device: torch.device) -> MegatronCausalLM:
    from safetensors.torch import load_file
    from transformers import AutoConfig

    hf_config = AutoConfig.from_pretrained(model_path)
    model = MegatronCausalLM(hf_config, _DTYPES[cfg.dtype])
    model.load_hf_state_dict(_read_hf_weights(model_path, load_file))
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


class MegatronWorker(DTensorWorker):
    """A rank holding a full GPTModel replica (data parallel over all ranks)."""

    def __init__(self, cfg: TrainBackendConfig, model_path: str, seed: int = 0) -> None:
        from megatron.core import parallel_state

        check_megatron_config(cfg)
        apply_cpu_shims()
        self.cfg = cfg
        self.model_path = model_path
        self.on_gpu = torch.cuda.is_available()
        self.device = torch.device("cuda", torch.cuda.current_device()) if self.on_gpu else torch.device("cpu")
        if not parallel_state.model_parallel_is_initialized():
            parallel_state.initialize_model_parallel(tensor_model_parallel_size=1, pipeline_model_parallel_size=1)
        self.dp_group = dist.group.WORLD
        self.dp_rank = dist.get_rank()
        self.rank = dist.get_rank()
        torch.manual_seed(seed)
        self.model = build_megatron_model(model_path, cfg, self.device)
        self.hf_config = self.model.config
        self.model_class = _hf_causal_lm_class(self.hf_config)
        self.score_head = None
        self.reference = None
        if cfg.reference_model:
            self.reference = build_megatron_model(model_path, cfg, self.device).requires_grad_(False).eval()
        self.optimizers = build_optimizers(self.model, cfg.optimizer)
        self.schedulers = build_schedulers(self.optimizers, cfg.scheduler)
        self.trainable = [p for p in self.model.parameters() if p.requires_grad]
        self.step = 0
        torch.manual_seed(seed + 1 + self.dp_rank)

    # Weights in HF names (refit, export).
    def weight_buckets(self, bucket_bytes: int) -> list[list[str]]:
        buckets: list[list[str]] = [[]]
        size = 0
        for name, tensor in self.model.hf_state_dict().items():
            nbytes = tensor.numel() * tensor.element_size()
            if buckets[-1] and size + nbytes > bucket_bytes:
                buckets.append([])
                size = 0
            buckets[-1].append(name)
            size += nbytes
        return buckets

    def gather_weights(self, names: list[str]) -> dict[str, torch.Tensor] | None:
        if self.rank != 0:
            return None
        state = self.model.hf_state_dict()
        return {name: state[name].detach().cpu().clone() for name in names}

    def save_adapter(self, path: str) -> None:
        raise ValueError("the Megatron backend has no LoRA adapters")

    def _reduce_gradients(self) -> None:
        """Replicated parameters: sum each gradient over the data-parallel ranks."""
        if dist.get_world_size() == 1:
            return
        for param in self.trainable:
            if param.grad is not None:
                dist.all_reduce(param.grad)

    def _checkpoint_state(self) -> dict:
        """Model tensors under HF names (the rl-checkpoint contract); optimizer under Megatron FQNs."""
        return {"model": self.model.hf_state_dict(), "optimizer": get_optimizer_state_dict(self.model, self.optimizers)}

    def _restore_checkpoint_state(self, state: dict) -> None:
        self.model.load_hf_state_dict(state["model"])
        set_optimizer_state_dict(self.model, self.optimizers, state["optimizer"])


def _hf_causal_lm_class(config) -> type:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM._model_mapping[type(config)]
