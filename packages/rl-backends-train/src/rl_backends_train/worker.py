"""One rank of a training backend: the operations every backend shares, over a few hooks.

Every public method is called on ALL ranks at once by the driver (``TrainPolicy``): they run
collectives (all-gathers, gradient reductions, metric sums) that need every rank. A backend
(``dtensor/worker.py``, ``megatron/worker.py``) subclasses ``TrainWorker`` and says how to set up its
process groups, build its model, gather full weights and lay out checkpoints; micro-batching, the
training step, logprobs, top-k, scores, export, adapters and checkpoint files are written once here.

Hooks with a default (overridden by backends that need more): ``_run_micro_batches`` (sequential;
Megatron: a pipeline schedule), ``_from_last_stage`` (itself; Megatron: sent from the last pipeline
stage), ``_micro_batches``, ``_compute_precision`` (nothing: FSDP2 casts; Megatron: fp32 master
weights swapped for bf16 copies), ``_reduce_gradients`` (nothing: FSDP2 already reduced them),
``_sum_over_dp``.
"""

from __future__ import annotations

import contextlib
import shutil
from abc import ABC, abstractmethod
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn

from rl_backends_train import checkpoint as ckpt
from rl_backends_train import memory
from rl_backends_train.batching import (
    MicroBatch,
    dummy_micro_batch,
    local_normalizer_counts,
    normalizer_from_counts,
    plan_micro_batches,
)
from rl_backends_train.config import TrainBackendConfig
from rl_backends_train.forward import model_outputs
from rl_backends_train.lora import adapted_names, adapter_config, write_adapter
from rl_backends_train.optim import build_optimizers, build_schedulers, clip_grad_norm
from rl_backends_train.vision import vision_parts
from rl_core.batch import Batch, shard
from rl_core.protocols import LossFn
from rl_core.types import ModelOutputs


class TrainWorker(ABC):
    """Holds one rank's part of the model and its optimizer; built by rl_core.cluster.WorkerGroup after
    torch.distributed is up. Subclasses set ``dp_group`` / ``dp_rank`` in ``_init_parallel``."""

    dp_group: dist.ProcessGroup
    dp_rank: int

    def __init__(self, cfg: TrainBackendConfig, model_path: str, seed: int = 0) -> None:
        self.cfg = cfg
        self.model_path = model_path
        self.on_gpu = torch.cuda.is_available()
        self.device = torch.device("cuda", torch.cuda.current_device()) if self.on_gpu else torch.device("cpu")
        if dist.get_world_size() != cfg.num_workers:
            raise ValueError(f"world size {dist.get_world_size()} != num_workers {cfg.num_workers}")
        self.rank = dist.get_rank()
        self._init_parallel(seed)
        # Same seed on every rank while building: LoRA initialisation must agree across shards.
        torch.manual_seed(seed)
        self.model = self._build_model(seed)
        self.hf_config = self.model.config
        self.model_class = self._hf_model_class()
        self.score_head = getattr(self.model, "score", None) if cfg.task == "reward_model" else None
        self.reference = None
        if cfg.reference_model and cfg.lora is None:  # with LoRA the reference is the base: adapters off
            self.reference = self._build_reference()
        self.optimizers = build_optimizers(self.model, cfg.optimizer)
        self.schedulers = build_schedulers(self.optimizers, cfg.scheduler)
        self.trainable = [p for p in self.model.parameters() if p.requires_grad]
        self.step = 0
        self._offloaded_state: memory.StateHomes | None = None  # where offload() took optimizer state from
        self._offloaded_weights: torch.device | None = None  # where offload(weights=True) took parameters from
        torch.manual_seed(seed + 1 + self.dp_rank)  # dropout streams differ between data shards

    # ------------------------------------------------------------------------------ backend hooks

    @abstractmethod
    def _init_parallel(self, seed: int) -> None:
        """Process groups of this backend; sets ``dp_group`` and ``dp_rank`` (the data shard)."""

    @abstractmethod
    def _build_model(self, seed: int) -> nn.Module:
        """This rank's part of the trainable model, on ``self.device`` (LoRA adapters drawn from ``seed``)."""

    @abstractmethod
    def _build_reference(self) -> nn.Module:
        """A frozen copy of the initial model, in eval mode."""

    @abstractmethod
    def _hf_model_class(self) -> type:
        """The HF class that ``export_hf`` saves the weights as."""

    @abstractmethod
    def _weight_sizes(self) -> Iterator[tuple[str, int]]:
        """``(hf name, bytes)`` of every merged HF weight, in refit order (rank 0 alone may be asked)."""

    @abstractmethod
    def gather_weights(self, names: list[str]) -> dict[str, torch.Tensor] | None:
        """Full tensors of ``names`` (HF names, LoRA merged), on CPU, returned by rank 0 (others: None).
        A collective: every rank must call it with the same names."""

    @abstractmethod
    def _adapter_tensors(self) -> dict[str, torch.Tensor] | None:
        """The full LoRA tensors under PEFT names on rank 0 (others: None); every rank calls it."""

    @abstractmethod
    def _adapters_disabled(self) -> contextlib.AbstractContextManager:
        """A context in which the model runs without its LoRA adapters (the reference)."""

    @abstractmethod
    def _weighted_gradients(self) -> tuple[list[torch.Tensor], list[float]]:
        """This rank's gradient tensors (local shards) and for each 1 / (ranks holding the same values),
        0 for a copy counted elsewhere (``optim.clip_grad_norm``)."""

    @abstractmethod
    def _checkpoint_state(self) -> dict:
        """What DCP saves / loads into: ``{"model": {hf_name: tensor}, "optimizer": ...}``."""

    @abstractmethod
    def _restore_checkpoint_state(self, state: dict) -> None:
        """Put a loaded ``_checkpoint_state`` back into the model and the optimizers."""

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

        with self._compute_precision():
            self._run_micro_batches(self.model, self._micro_batches(local), loss_of, backward=True,
                                    temperature=temperature, need_logits=loss_fn.needs_logits, need_entropy=True,
                                    loss_tokens_only=True)
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
    def logprobs(self, batch: Batch, temperature: float = 1.0, reference: bool = False,
                 loss_tokens_only: bool = False) -> torch.Tensor:
        """[B_local, T] logprobs of this rank's shard (policy or reference weights); ``loss_tokens_only``:
        only from the first ``loss_mask`` column on (``forward.model_outputs``)."""
        local = shard(batch, self.dp_rank, self.cfg.data_parallel_size)
        out = torch.zeros(local["input_ids"].shape, dtype=torch.float32)

        def keep(mb: MicroBatch, outputs: ModelOutputs) -> None:
            if not mb.dummy:
                out[mb.rows, : outputs.logprobs.shape[1]] = outputs.logprobs.float().cpu()

        with self._reference_weights(reference) as model, self._compute_precision():
            self._run_micro_batches(model, self._micro_batches(local), keep, backward=False, temperature=temperature,
                                    need_logits=False, need_entropy=False, loss_tokens_only=loss_tokens_only)
        return self._from_last_stage(out)

    @torch.no_grad()
    def scores(self, batch: Batch) -> torch.Tensor:
        """[B_local] reward-model scores of this rank's shard."""
        if self.score_head is None:
            raise ValueError("scores() needs task='reward_model'")
        local = shard(batch, self.dp_rank, self.cfg.data_parallel_size)
        out = torch.zeros(local["input_ids"].shape[0], dtype=torch.float32)
        self.model.eval()
        with self._compute_precision():
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
        with self._compute_precision():
            self._run_micro_batches(self.model, self._micro_batches(local), keep, backward=False,
                                    temperature=temperature, need_logits=True, need_entropy=False)
        return self._from_last_stage(values), self._from_last_stage(indices)

    # ------------------------------------------------------------------------------------- weights

    def weight_buckets(self, bucket_bytes: int) -> list[list[str]]:
        """Names of the merged HF weights grouped into buckets of about ``bucket_bytes``."""
        buckets: list[list[str]] = [[]]
        size = 0
        for name, nbytes in self._weight_sizes():
            if buckets[-1] and size + nbytes > bucket_bytes:
                buckets.append([])
                size = 0
            buckets[-1].append(name)
            size += nbytes
        return buckets

    def export_hf(self, path: str) -> None:
        """Consolidated HF directory (merged weights, config, tokenizer) written by rank 0."""
        tensors = {}
        for names in self.weight_buckets(self.cfg.weights_bucket_bytes):
            tensors.update(self.gather_weights(names) or {})
        if self.rank == 0:
            ckpt.write_hf_model(self.model_class, self.hf_config, tensors, self.model_path, path)
        dist.barrier()

    def save_adapter(self, path: str) -> None:
        """PEFT-format adapter (adapter_model.safetensors + adapter_config.json), written by rank 0;
        the same files from either backend for the same adapters."""
        if self.cfg.lora is None:
            raise ValueError("save_adapter() needs a LoRA config (policy.lora)")
        adapters = self._adapter_tensors()
        if self.rank == 0:
            parts = vision_parts(self.model)
            write_adapter(path, {k: v.detach().cpu() for k, v in adapters.items()},
                          adapter_config(self.cfg.lora, self.model_path, self.cfg.task,
                                         targets=adapted_names(adapters),
                                         within=parts.language_prefix if parts else None))
        dist.barrier()

    # ---------------------------------------------------------------------------------- checkpoints

    def save(self, path: str) -> None:
        """DCP checkpoint of model + optimizer, per-rank trainer state, HF config and meta.json."""
        staging = ckpt.staging_dir(path)
        if self.rank == 0 and staging.exists():
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

    # -------------------------------------------------------------------------------- device memory

    def offload(self, weights: bool = False) -> None:
        """Free this rank's device memory until ``onload`` (for a generation engine sharing the GPU):
        gradients freed (every step starts by zeroing them), optimizer state moved to CPU memory, with
        ``weights`` the parameters and the reference copy too; then the CUDA cache emptied."""
        for param in self.model.parameters():
            param.grad = None
        if self._offloaded_state is None:
            self._offloaded_state = memory.optimizer_state_to_cpu(self.optimizers)
        if weights and self._offloaded_weights is None:
            self._offloaded_weights = next(self.model.parameters()).device
            for model in (self.model, self.reference):
                if model is not None:
                    model.to("cpu")
        if self.on_gpu:
            torch.cuda.empty_cache()

    def onload(self) -> None:
        """Move back what ``offload`` moved to CPU memory (nothing if it was not offloaded)."""
        if self._offloaded_weights is not None:
            for model in (self.model, self.reference):
                if model is not None:
                    model.to(self._offloaded_weights)
            self._offloaded_weights = None
        if self._offloaded_state is not None:
            memory.optimizer_state_back(self.optimizers, self._offloaded_state)
            self._offloaded_state = None

    def memory_metrics(self) -> dict[str, float]:
        """This rank's memory in GiB (``memory.memory_metrics``: CPU resident set; on CUDA allocated,
        reserved, and peak since the previous call)."""
        return memory.memory_metrics(self.device)

    # ------------------------------------------------------------------- hooks with a default

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
        """A result computed by the last pipeline stage, on every rank (without pipeline: itself)."""
        return value

    def _micro_batches(self, local: Batch) -> list[MicroBatch]:
        """This rank's micro-batches, topped up with dummies so every rank runs as many forwards
        (collectives inside each forward/backward must pair up across ranks)."""
        mbs = plan_micro_batches(local, self.cfg)
        count = torch.tensor([len(mbs)], dtype=torch.long)
        dist.all_reduce(count, op=dist.ReduceOp.MAX)
        dummy = dummy_micro_batch(local, self.cfg.packing.enabled)
        return mbs + [dummy] * (int(count) - len(mbs))

    def _compute_precision(self) -> contextlib.AbstractContextManager:
        """The context forwards and backwards run in (default: nothing to do; FSDP2 casts for compute)."""
        return contextlib.nullcontext()

    def _reduce_gradients(self) -> None:  # noqa: B027 (a hook, a no-op unless a backend needs it)
        """Sum gradients over the data-parallel ranks (default: nothing, FSDP2 reduce-scatters in backward)."""

    def _clip_gradients(self) -> float:
        """The global gradient norm (every rank's shards, each value counted once), the gradients scaled
        to ``cfg.max_grad_norm``: one all-reduce and one device-to-host sync, whatever the model."""
        grads, weights = self._weighted_gradients()
        return clip_grad_norm(grads, weights, self.cfg.max_grad_norm, self.device)

    def _sum_over_dp(self, local: dict[str, float]) -> dict[str, float]:
        """Metrics summed over the data-parallel ranks."""
        gathered: list[dict[str, float]] = [{} for _ in range(dist.get_world_size(self.dp_group))]
        dist.all_gather_object(gathered, local, group=self.dp_group)
        total: dict[str, float] = defaultdict(float)
        for part in gathered:
            for key, value in part.items():
                total[key] += value
        return dict(total)

    # ------------------------------------------------------------------------------------- helpers

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
            with self._adapters_disabled():
                yield self.model
            return
        if self.reference is None:
            raise ValueError("reference_logprobs() needs reference_model=True in the training backend config "
                             "(algorithms set it False when the KL coefficient is 0)")
        yield self.reference


def _zero_loss(outputs: ModelOutputs) -> torch.Tensor:
    """A zero that still depends on every parameter used in the forward (so backward runs the
    same collectives as on the other ranks)."""
    value = outputs.scores if outputs.scores is not None else outputs.logprobs
    return value.sum() * 0.0


def _to_device(batch: Batch, device: torch.device) -> Batch:
    return {k: v.to(device) for k, v in batch.items()}
