"""The narrow interfaces between packages. Algorithms talk only to these; apps/ picks concrete ones."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Protocol, runtime_checkable

import torch

from rl_core.batch import Batch
from rl_core.types import Completion, ModelOutputs, Normalizer, SamplingParams, StepResult
from rl_core.vision_inputs import EncodedChat

Prompt = Sequence[int] | EncodedChat
"""A prompt's token ids; or, for a vision-language model, its chat through the model's processor
(``rl_core.vision_inputs.encode_chat``): token ids with the image tokens expanded, the image tensors, the
images themselves (and Qwen-VL's ``mm_token_type_ids``)."""


@runtime_checkable
class GenerationBackend(Protocol):
    """Turns prompts (token ids, with images for a vision-language model) into completions with per-token logprobs."""

    def generate(self, prompts: Sequence[Prompt], sampling: SamplingParams) -> list[list[Completion]]:
        """``sampling.n`` completions for every prompt, in prompt order: ``result[i][j]``. A prompt with images
        (an ``EncodedChat``) runs its images once, shared by its n samples."""
        ...

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load new weights (HF parameter names, full tensors) in place."""
        ...

    def sleep(self) -> None:
        """Free the KV cache (and what else the engine can) until ``wake``."""
        ...

    def wake(self) -> None: ...

    def shutdown(self) -> None: ...


@runtime_checkable
class LossFn(Protocol):
    """A loss over one micro-batch.

    Returns ``(loss, metrics)``. The loss is already divided by the GLOBAL denominators in
    ``normalizer``, so summing it over micro-batches (and workers) gives the full-batch loss; every
    metric is a contribution that sums the same way.
    """

    needs_logits: bool
    """Ask the backend for ``ModelOutputs.logits`` ([B, T, V])."""

    def __call__(self, outputs: ModelOutputs, batch: Batch, normalizer: Normalizer) -> tuple[torch.Tensor, dict[str, float]]: ...


@runtime_checkable
class TrainingBackend(Protocol):
    """A policy being trained (possibly sharded over many workers)."""

    def train(self, batch: Batch, loss_fn: LossFn, *, temperature: float = 1.0) -> dict[str, float]:
        """One optimizer step over ``batch`` (micro-batched inside). Returns summed loss metrics plus
        ``loss``, ``grad_norm`` and ``lr``."""
        ...

    def logprobs(self, batch: Batch, *, temperature: float = 1.0, loss_tokens_only: bool = False) -> torch.Tensor:
        """[B, T] logprobs of ``batch['input_ids']`` under the current weights. ``loss_tokens_only``:
        only the columns from the first one any row's ``loss_mask`` covers get logprobs (the others
        hold 0), which spares the LM head and softmax the prompt columns."""
        ...

    def reference_logprobs(self, batch: Batch, *, temperature: float = 1.0,
                           loss_tokens_only: bool = False) -> torch.Tensor:
        """[B, T] logprobs under the frozen reference (initial or LoRA-base) weights (``loss_tokens_only``
        as in ``logprobs``)."""
        ...

    def topk_logits(self, batch: Batch, k: int, *, temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
        """``(values [B, T, k], indices [B, T, k])`` of the distribution scoring each token."""
        ...

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Full (unsharded, LoRA-merged) tensors in HF names, for refit and export."""
        ...

    def save(self, path: str) -> None: ...

    def load(self, path: str) -> None: ...

    def export_hf(self, path: str) -> None:
        """A consolidated HF directory (safetensors, config, tokenizer)."""
        ...

    def offload(self, *, weights: bool = False) -> None:
        """Free the device memory the policy holds between steps, for a phase that needs the device
        (generation on the same GPU): gradients freed, optimizer state moved to CPU memory, with
        ``weights`` the parameters too, then the allocator's cache emptied. The next operation (or
        ``onload``) brings them back; the step after the round trip equals one without it."""
        ...

    def onload(self) -> None:
        """Move back to the device what ``offload`` moved (nothing if it was not offloaded)."""
        ...

    def memory_metrics(self) -> dict[str, float]:
        """Memory figures in GiB for per-phase reporting (the largest over ranks): ``cpu_rss_gib``; on
        CUDA ``gpu_allocated_gib``, ``gpu_reserved_gib`` and ``gpu_peak_gib`` (the peak since the
        previous call)."""
        ...

    def shutdown(self) -> None: ...


@runtime_checkable
class Environment(Protocol):
    """Grades (and for multi-turn tasks, answers) the model's turns.

    ``messages`` is the conversation so far, the model's latest turn last. ``state`` is None on the
    first call and afterwards whatever the previous ``StepResult.state`` was. Implementations must be
    picklable (they may run in worker processes)."""

    def step(self, messages: list[dict[str, str]], metadata: dict[str, Any], state: dict | None) -> StepResult: ...
