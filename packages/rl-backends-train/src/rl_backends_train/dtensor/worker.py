"""One rank of the DTensor backend: a shard of the model, its optimizer, and the operations.

Every public method is called on ALL ranks at once by the driver (DTensorPolicy): they run
collectives (FSDP all-gathers, gradient reduce-scatters, metric all-reduces) that need every rank.
Ranks form a ("dp", "tp") mesh; the batch is split over "dp", the ranks of one "tp" group see the
same rows.
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from rl_backends_train import checkpoint as ckpt
from rl_backends_train.batching import (
    MicroBatch,
    dummy_micro_batch,
    local_normalizer_counts,
    normalizer_from_counts,
    plan_micro_batches,
)
from rl_backends_train.config import TrainBackendConfig
from rl_backends_train.dtensor.parallelize import build_mesh, build_parallel_model
from rl_backends_train.forward import model_outputs
from rl_backends_train.lora import (
    adapted_names,
    adapter_config,
    is_adapter_name,
    lora_modules,
    set_adapters_enabled,
    write_adapter,
)
from rl_backends_train.optim import build_optimizers, build_schedulers, clip_grad_norm
from rl_core.batch import Batch, shard
from rl_core.protocols import LossFn
from rl_core.types import ModelOutputs


class DTensorWorker:
    """Holds one rank's shard; built by rl_core.cluster.WorkerGroup after torch.distributed is up."""

    def __init__(self, cfg: TrainBackendConfig, model_path: str, seed: int = 0) -> None:
        self.cfg = cfg
        self.model_path = model_path
        self.on_gpu = torch.cuda.is_available()
        self.device = torch.device("cuda", torch.cuda.current_device()) if self.on_gpu else torch.device("cpu")
        if dist.get_world_size() != cfg.num_workers:
            raise ValueError(f"world size {dist.get_world_size()} != num_workers {cfg.num_workers}")
        self.mesh = build_mesh(cfg, self.device.type)
        self.dp_group = self.mesh["dp"].get_group()
        self.dp_rank = self.mesh["dp"].get_local_rank()
        self.rank = dist.get_rank()
        # Same seed on every rank while building: LoRA initialisation must agree across shards.
        torch.manual_seed(seed)
        self.model = build_parallel_model(model_path, cfg, self.mesh, on_gpu=self.on_gpu)
        self.model_class = _hf_class(self.model)
        self.hf_config = self.model.config
        self.score_head = getattr(self.model, "score", None) if cfg.task == "reward_model" else None
        self.reference = None
        if cfg.reference_model and cfg.lora is None:
            self.reference = build_parallel_model(model_path, cfg, self.mesh, on_gpu=self.on_gpu, trainable=False)
            self.reference.eval()
        self.optimizers = build_optimizers(self.model, cfg.optimizer)
        self.schedulers = build_schedulers(self.optimizers, cfg.scheduler)
        self.trainable = [p for p in self.model.parameters() if p.requires_grad]
        self.step = 0
        torch.manual_seed(seed + 1 + self.dp_rank)  # dropout streams differ between data shards

    # ------------------------------------------------------------------------------------ training

    def train(self, batch: Batch, loss_fn: LossFn, temperature: float = 1.0) -> dict[str, float]:
        """One optimizer step over this rank's shard of ``batch``; metrics summed over all shards."""
        local = shard(batch, self.dp_rank, self.cfg.data_parallel_size)
        counts = local_normalizer_counts(local)
        dist.all_reduce(counts, group=self.dp_group)
        normalizer = normalizer_from_counts(counts)
        self.model.train()
        for opt in self.optimizers:
            opt.zero_grad(set_to_none=True)
        sums: dict[str, float] = defaultdict(float)

        def loss_of(mb: MicroBatch, outputs: ModelOutputs) -> torch.Tensor:
            if mb.dummy:
                return _zero_loss(outputs)
            loss, metrics = loss_fn(outputs, _to_device(mb.batch, self.device), normalizer)
            sums["loss"] += float(loss.detach())
            for key, value in metrics.items():
                sums[key] += float(value)
            return loss

        self._run_micro_batches(self.model, self._micro_batches(local), loss_of, backward=True, temperature=temperature,
                                need_logits=loss_fn.needs_logits, need_entropy=True, loss_tokens_only=True)
        self._reduce_gradients()
        grad_norm = self._clip_gradients()
        lrs = [opt.param_groups[0]["lr"] for opt in self.optimizers]
        for opt, sched in zip(self.optimizers, self.schedulers):
            opt.step()
            sched.step()
        self.step += 1
        result = self._sum_over_dp(dict(sums))
        result.update(grad_norm=grad_norm, lr=lrs[-1], num_valid_tokens=normalizer.num_valid_tokens,
                      num_valid_sequences=normalizer.num_valid_sequences)
        if len(lrs) > 1:
            result["muon_lr"] = lrs[0]
        return result

    # ----------------------------------------------------------------------------------- inference

    @torch.no_grad()
    def logprobs(self, batch: Batch, temperature: float = 1.0, reference: bool = False) -> torch.Tensor:
        """[B_local, T] logprobs of this rank's shard (policy or reference weights)."""
        local = shard(batch, self.dp_rank, self.cfg.data_parallel_size)
        out = torch.zeros(local["input_ids"].shape, dtype=torch.float32)

        def keep(mb: MicroBatch, outputs: ModelOutputs) -> None:
            if not mb.dummy:
                out[mb.rows, : outputs.logprobs.shape[1]] = outputs.logprobs.float().cpu()

        with self._reference_weights(reference) as model:
            self._run_micro_batches(model, self._micro_batches(local), keep, backward=False, temperature=temperature,
                                    need_logits=False, need_entropy=False)
        return self._from_last_stage(out)

    @torch.no_grad()
    def scores(self, batch: Batch) -> torch.Tensor:
        """[B_local] reward-model scores of this rank's shard."""
        if self.score_head is None:
            raise ValueError("scores() needs task='reward_model'")
        local = shard(batch, self.dp_rank, self.cfg.data_parallel_size)
        out = torch.zeros(local["input_ids"].shape[0], dtype=torch.float32)
        self.model.eval()
        for mb in self._micro_batches(local):
            outputs = self._outputs(self.model, mb, 1.0, need_logits=False, need_entropy=False)
            if not mb.dummy:
                out[mb.rows] = outputs.scores.float().cpu()
        return out

    @torch.no_grad()
    def topk_logits(self, batch: Batch, k: int, temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
        """``(values, indices)`` [B_local, T, k] of the temperature-scaled logits scoring each token."""
        local = shard(batch, self.dp_rank, self.cfg.data_parallel_size)
        b, t = local["input_ids"].shape
        values = torch.zeros(b, t, k, dtype=torch.float32)
        indices = torch.zeros(b, t, k, dtype=torch.long)

        def keep(mb: MicroBatch, outputs: ModelOutputs) -> None:
            if mb.dummy:
                return
            top = outputs.logits.topk(k, dim=-1)
            width = outputs.logits.shape[1]
            values[mb.rows, :width] = top.values.float().cpu()
            indices[mb.rows, :width] = top.indices.cpu()

        self.model.eval()
        self._run_micro_batches(self.model, self._micro_batches(local), keep, backward=False, temperature=temperature,
                                need_logits=True, need_entropy=False)
        return self._from_last_stage(values), self._from_last_stage(indices)

    # ------------------------------------------------------------------------------------- weights

    def weight_buckets(self, bucket_bytes: int) -> list[list[str]]:
        """Names of the merged HF weights grouped into buckets of about ``bucket_bytes``."""
        buckets: list[list[str]] = [[]]
        size = 0
        for name, tensor in self.model.state_dict().items():
            if is_adapter_name(name):
                continue
            nbytes = tensor.numel() * tensor.element_size()
            if buckets[-1] and size + nbytes > bucket_bytes:
                buckets.append([])
                size = 0
            buckets[-1].append(name)
            size += nbytes
        return buckets

    def gather_weights(self, names: list[str]) -> dict[str, torch.Tensor] | None:
        """Full tensors of ``names`` (LoRA merged), on CPU, returned by rank 0 (others: None).
        A collective: every rank must call it with the same names."""
        state = self.model.state_dict()
        modules = lora_modules(self.model)
        out = {}
        for name in names:
            tensor = _full(state[name])
            owner = name.rsplit(".", 1)[0]
            if owner in modules and name.endswith(".weight"):
                a, b = _full(state[f"{owner}.lora_A.weight"]), _full(state[f"{owner}.lora_B.weight"])
                tensor = modules[owner].merged_weight(tensor, a, b)
            if self.rank == 0:
                out[name] = tensor.detach().cpu()
        return out if self.rank == 0 else None

    def export_hf(self, path: str) -> None:
        """Consolidated HF directory (merged weights, config, tokenizer) written by rank 0."""
        tensors = {}
        for names in self.weight_buckets(self.cfg.weights_bucket_bytes):
            tensors.update(self.gather_weights(names) or {})
        if self.rank == 0:
            ckpt.write_hf_model(self.model_class, self.hf_config, tensors, self.model_path, path)
        dist.barrier()

    def save_adapter(self, path: str) -> None:
        """PEFT-format adapter (adapter_model.safetensors + adapter_config.json), written by rank 0."""
        if self.cfg.lora is None:
            raise ValueError("save_adapter() needs a LoRA config (policy.training.lora)")
        state = self.model.state_dict()
        adapters = {n: _full(t).detach().cpu() for n, t in state.items() if is_adapter_name(n)}
        if self.rank == 0:
            write_adapter(path, adapters, adapter_config(self.cfg.lora, self.model_path, self.cfg.task,
                                                         targets=adapted_names(adapters)))
        dist.barrier()

    # ---------------------------------------------------------------------------------- checkpoints

    def save(self, path: str) -> None:
        """DCP checkpoint of model + optimizer, per-rank trainer state, HF config and meta.json."""
        staging = ckpt.staging_dir(path)
        if self.rank == 0 and staging.exists():
            import shutil

            shutil.rmtree(staging)
        dist.barrier()
        dcp.save(self._checkpoint_state(), checkpoint_id=str(staging / "dcp"))
        state_dir = staging / "trainer_state"
        state_dir.mkdir(parents=True, exist_ok=True)
        torch.save(
            {"step": self.step, "schedulers": [s.state_dict() for s in self.schedulers], "rng": ckpt.rng_state()},
            state_dir / f"rank_{self.rank}.pt",
        )
        dist.barrier()
        if self.rank == 0:
            ckpt.copy_model_files(self.model_path, staging / "hf_config")
            # The live config (e.g. num_labels=1, pad id of a reward model) wins over the source's.
            self.hf_config.to_json_file(str(staging / "hf_config" / "config.json"))
            ckpt.write_json(staging / "meta.json", {
                "format": ckpt.CHECKPOINT_FORMAT,
                "step": self.step,
                "task": self.cfg.task,
                "lora": self.cfg.lora.model_dump() if self.cfg.lora else None,
                "model_type": self.hf_config.model_type,
                "world_size": dist.get_world_size(),
                "tensor_parallel_size": self.cfg.tensor_parallel_size,
                "pipeline_parallel_size": self.cfg.pipeline_parallel_size,
            })
            ckpt.publish(staging, path)
        dist.barrier()

    def load(self, path: str) -> int:
        """Restore a checkpoint written by ``save``; returns its step."""
        meta = ckpt.read_meta(path)
        if meta["task"] != self.cfg.task or (meta["lora"] is None) != (self.cfg.lora is None):
            raise ValueError(f"{path}: saved with task={meta['task']!r}, lora={meta['lora']}; this backend has "
                             f"task={self.cfg.task!r}, lora={self.cfg.lora}")
        state = self._checkpoint_state()
        dcp.load(state, checkpoint_id=str(Path(path) / "dcp"))
        self._restore_checkpoint_state(state)
        rank_file = Path(path) / "trainer_state" / f"rank_{self.rank}.pt"
        if not rank_file.exists():  # saved with fewer ranks: take rank 0's schedule and step
            rank_file = rank_file.with_name("rank_0.pt")
        trainer_state = torch.load(rank_file, weights_only=False)
        for sched, sched_state in zip(self.schedulers, trainer_state["schedulers"]):
            sched.load_state_dict(sched_state)
        ckpt.set_rng_state(trainer_state["rng"])
        self.step = trainer_state["step"]
        return self.step

    def shutdown(self) -> None:
        self.model = self.reference = None
        self.optimizers = self.schedulers = []

    # ------------------------------------------------------------------------------------- helpers

    def _reduce_gradients(self) -> None:
        """Nothing to do: FSDP2 reduce-scatters (sums) gradients over "dp" during backward."""

    def _clip_gradients(self) -> float:
        """Global gradient norm (DTensors made full), clipped to ``max_grad_norm``."""
        return clip_grad_norm(self.trainable, self.cfg.max_grad_norm)

    def _checkpoint_state(self) -> dict:
        """What DCP saves / loads into: ``{"model": {hf_name: tensor}, "optimizer": ...}``."""
        model_sd, optim_sd = get_state_dict(self.model, self.optimizers)
        return {"model": model_sd, "optimizer": optim_sd}

    def _restore_checkpoint_state(self, state: dict) -> None:
        set_state_dict(self.model, self.optimizers, model_state_dict=state["model"], optim_state_dict=state["optimizer"])

    def _run_micro_batches(self, model, mbs: list[MicroBatch],
                           on_outputs: Callable[[MicroBatch, ModelOutputs], torch.Tensor | None], *, backward: bool,
                           **output_kwargs) -> None:
        """Each micro-batch's ModelOutputs (``_outputs(model, mb, **output_kwargs)``) handed to
        ``on_outputs``; with ``backward``, the loss it returns is back-propagated. (The Megatron
        backend runs this as a pipeline schedule, with ``on_outputs`` on the last stage.)"""
        for mb in mbs:
            result = on_outputs(mb, self._outputs(model, mb, **output_kwargs))
            if backward:
                result.backward()

    def _from_last_stage(self, value):
        """A result computed by the last pipeline stage, on every rank (no pipeline here: itself)."""
        return value

    def _micro_batches(self, local: Batch) -> list[MicroBatch]:
        """This rank's micro-batches, topped up with dummies so every rank runs as many forwards
        (FSDP collectives inside each forward/backward must pair up across ranks)."""
        mbs = plan_micro_batches(local, self.cfg)
        count = torch.tensor([len(mbs)], dtype=torch.long)
        dist.all_reduce(count, op=dist.ReduceOp.MAX)
        dummy = dummy_micro_batch(local, self.cfg.packing.enabled)
        return mbs + [dummy] * (int(count) - len(mbs))

    def _outputs(self, model, mb: MicroBatch, temperature: float, *, need_logits: bool,
                 need_entropy: bool, loss_tokens_only: bool = False) -> ModelOutputs:
        score_head = getattr(model, "score", None) if self.cfg.task == "reward_model" else None
        return model_outputs(model, mb, device=self.device, temperature=temperature, need_logits=need_logits,
                             need_entropy=need_entropy and score_head is None, score_head=score_head,
                             loss_tokens_only=loss_tokens_only, keep_positions=not self.cfg.sequence_parallel)

    @contextlib.contextmanager
    def _reference_weights(self, reference: bool):
        """The model to run: the policy, the frozen reference copy, or the policy with adapters off."""
        if not reference:
            self.model.eval()
            yield self.model
            return
        if self.cfg.lora is not None:
            self.model.eval()
            set_adapters_enabled(self.model, False)
            try:
                yield self.model
            finally:
                set_adapters_enabled(self.model, True)
            return
        if self.reference is None:
            raise ValueError("reference_logprobs() needs reference_model=True in the training backend config "
                             "(algorithms set it False when the KL coefficient is 0)")
        yield self.reference

    def _sum_over_dp(self, local: dict[str, float]) -> dict[str, float]:
        gathered: list[dict[str, float]] = [{} for _ in range(dist.get_world_size(self.dp_group))]
        dist.all_gather_object(gathered, local, group=self.dp_group)
        total: dict[str, float] = defaultdict(float)
        for part in gathered:
            for key, value in part.items():
                total[key] += value
        return dict(total)


def _hf_class(model) -> type:
    """The HF class of a model that FSDP2 has re-classed as ``FSDP<Name>(FSDPModule, <Name>)``."""
    from torch.distributed.fsdp import FSDPModule

    return next(c for c in type(model).__mro__ if not issubclass(c, FSDPModule))  # noqa: B023


def _full(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


def _zero_loss(outputs: ModelOutputs) -> torch.Tensor:
    """A zero that still depends on every parameter used in the forward (so backward runs the
    same FSDP reduce-scatters as on the other ranks)."""
    value = outputs.scores if outputs.scores is not None else outputs.logprobs
    return value.sum() * 0.0


def _to_device(batch: Batch, device: torch.device) -> Batch:
    return {k: v.to(device) for k, v in batch.items()}
