"""``generation.backend: megatron``: a GenerationBackend that decodes on the Megatron policy's own workers.

The training policy's ranks run the decode loop (``generate.py``) on their GPTModel shards, so there is
no second copy of the weights, no HF-name conversion and nothing to refit: ``update_weights`` closes
the iterator it is given without reading it (``TrainPolicy.named_weights`` is lazy, so no weight is
gathered). Prompts are split into contiguous slices, one per data-parallel rank; each slice runs on its
model-parallel group (tensor parallel, pipeline stages) as the policy is configured.

Memory (colocated): the KV cache exists only inside a ``generate`` call (allocated per batch of samples,
dropped after it, the CUDA cache emptied at the end). A policy offloaded for generation
(the policy's ``offload(weights=True)``, GRPO's ``colocated`` placement) gets its weights back on the device
for decoding while its optimizer state and gradients stay offloaded until ``onload``. ``sleep`` /
``wake`` mark the backend unavailable / available (there is no cache to free between calls).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from dataclasses import replace

import torch

from rl_backends_gen.native.sampling import call_base_seed
from rl_backends_gen.requests import default_stop_token_ids, validate_prompts, validate_sampling
from rl_core.types import Completion, SamplingParams

DEFAULT_MAX_SEQ_LEN = 2048


def check_generation_config(policy_cfg, *, dtype: str, num_replicas: int = 0) -> None:
    """ValueError for what decoding on the training workers cannot do."""
    problems = []
    if dtype != policy_cfg.dtype:
        problems.append(f"generation.dtype={dtype!r} differs from policy.dtype={policy_cfg.dtype!r} (it decodes with "
                        "the policy's own weights: set them equal)")
    if num_replicas:
        problems.append(f"generation.num_replicas={num_replicas} (it runs in the policy's workers: set 0)")
    if policy_cfg.context_parallel_size > 1:
        problems.append("context_parallel_size > 1 (one new token has no positions to split)")
    if policy_cfg.expert_parallel_size > 1:
        problems.append("expert_parallel_size > 1 (the data-parallel ranks decode different numbers of steps; "
                        "their expert all-to-alls would not pair up)")
    if policy_cfg.sequence_parallel:
        problems.append("sequence_parallel (one new token cannot be split over the tensor-parallel ranks)")
    if problems:
        raise ValueError("generation.backend=megatron does not support: " + "; ".join(problems)
                         + "; use generation.backend=native")


class MegatronGeneration:
    """Decoding on a ``MegatronPolicy``'s workers (rl_core.protocols.GenerationBackend).

    Args:
        policy: the training policy (``MegatronPolicy``) whose workers and weights decode.
        max_batch_size: samples one data-parallel rank decodes together.
        max_seq_len: longest prompt + completion; default ``min(max_position_embeddings, 2048)``.
        seed: draws the base seed of calls whose ``SamplingParams.seed`` is None (None: fresh entropy).
    """

    def __init__(self, policy, *, max_batch_size: int = 64, max_seq_len: int | None = None,
                 seed: int | None = None) -> None:
        from transformers import AutoConfig, GenerationConfig

        self.policy = policy
        self.max_batch_size = max_batch_size
        config = AutoConfig.from_pretrained(policy.model_path)
        self.vocab_size = config.vocab_size
        limit = getattr(config, "max_position_embeddings", None) or DEFAULT_MAX_SEQ_LEN
        self.max_seq_len = int(max_seq_len or min(limit, DEFAULT_MAX_SEQ_LEN))
        self.tokenizer = load_tokenizer(policy.model_path)
        try:
            generation_config = GenerationConfig.from_pretrained(policy.model_path)
        except OSError:
            generation_config = None
        self.default_stop_token_ids = default_stop_token_ids(self.tokenizer, config, generation_config)
        self._seed_generator = torch.Generator().manual_seed(seed) if seed is not None else None
        self.stats: dict[str, int] = {}
        """Counters of the last call, summed over data-parallel ranks (``generate.GenerationStats``)."""
        self.asleep = False

    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingParams) -> list[list[Completion]]:
        """``sampling.n`` completions per prompt, ``result[i][j]`` for sample j of prompt i."""
        validate_sampling(sampling, has_tokenizer=self.tokenizer is not None)
        prompts = validate_prompts(prompts, vocab_size=self.vocab_size, max_seq_len=self.max_seq_len,
                                   backend="megatron")
        if self.asleep:
            raise RuntimeError("the Megatron generation backend is asleep; call wake() before generate()")
        if not prompts:
            return []
        shards = self.policy.cfg.data_parallel_size
        bounds = [len(prompts) * d // shards for d in range(shards + 1)]
        on_ranks = replace(sampling, stop_token_ids=tuple(sampling.stop_token_ids or self.default_stop_token_ids))
        base_seed = call_base_seed(sampling.seed, self._seed_generator)  # drawn once: every rank uses the same
        per_rank = self.policy.group.run_all("generate", prompts, on_ranks, base_seed, list(zip(bounds, bounds[1:])),
                                             self.max_batch_size, self.max_seq_len)
        parts = self.policy._per_data_shard(per_rank)
        self.stats = {key: sum(stats[key] for _, stats in parts) for key in parts[0][1]}
        return [completions for results, _ in parts for completions in results]

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Nothing to copy: decoding uses the policy's own parameters. The iterator is closed unread
        (``policy.named_weights()`` is lazy, so no weight is gathered)."""
        close = getattr(named_tensors, "close", None)
        if close is not None:
            close()

    def sleep(self) -> None:
        """The KV cache lives only inside ``generate``: nothing to free. Marks the backend asleep."""
        self.asleep = True

    def wake(self) -> None:
        self.asleep = False

    def shutdown(self) -> None:
        """The policy owns the workers (it shuts them down)."""


@functools.lru_cache(maxsize=4)
def load_tokenizer(model_path: str):
    """The tokenizer of ``model_path`` (loaded once per process), or None when it has none."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(model_path)
    except (OSError, ValueError):
        return None  # completions carry no text; stop strings are refused
