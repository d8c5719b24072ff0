"""The training backend's config: one strict section, ``policy`` in recipes (``teacher.backend`` for a
distillation teacher)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from rl_core.config import StrictModel
from rl_core.fp8 import DEFAULT_SKIP_MODULES


class LoRAConfig(StrictModel):
    """Low-rank adapters on chosen linear layers; the base weights stay frozen."""

    rank: int = Field(8, gt=0)
    """Rank r of the update B @ A (A: [r, in], B: [out, r])."""
    alpha: float = Field(16.0, gt=0)
    """The update is scaled by alpha / rank."""
    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    """Dropout on the adapter's input during training."""
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )
    """Names (last path component) of the nn.Linear modules that get adapters."""


class PackingConfig(StrictModel):
    """Sequence packing: sequences placed end to end in rows of a token budget (first-fit-decreasing)."""

    enabled: bool = False
    max_tokens_per_micro_batch: int = Field(4096, gt=0)
    """Token budget of one packed row (one micro-batch). A longer sequence gets a row of its own."""
    share_prompts: bool = False
    """Rows with the same prompt (the tokens before the first ``loss_mask`` token; GRPO's n
    generations of one prompt) are packed with one copy of it: each answer attends to the shared
    prompt and to itself, so the prompt's forward and backward run once per group instead of once per
    row. The same function as the padded layout (equal within fp32 rounding). Needs ``enabled``; rows
    without a ``loss_mask`` are packed whole. Both backends. Keep the budget near one group's tokens: the packed
    row's attention is computed densely, masked."""

    @model_validator(mode="after")
    def _check_share_prompts(self) -> PackingConfig:
        if self.share_prompts and not self.enabled:
            raise ValueError("packing.share_prompts=true packs rows and needs packing.enabled=true")
        return self


class DynamicBatchingConfig(StrictModel):
    """Length-sorted micro-batches whose padded size (rows x longest) stays within a token budget."""

    enabled: bool = False
    max_tokens_per_micro_batch: int = Field(4096, gt=0)
    """Budget on rows x longest sequence of a micro-batch."""


class MoEConfig(StrictModel):
    """Settings of mixture-of-experts models."""

    router_replay: bool = False
    """backend=dtensor: MoE router replay. Every MoE layer sends each token to the experts the generation
    engine chose for it (the batch's ``routed_experts``, recorded with ``generation.record_routing``),
    weighted by the router's own probabilities for them (the router keeps its gradients), so generation
    and training logprobs agree for MoE models as for dense ones (``router_replay.py``). Tokens without a
    record keep the router's own choice. On a dense model: an error."""


class OptimizerConfig(StrictModel):
    """AdamW, or Muon for 2-D hidden weights with AdamW for the rest."""

    name: Literal["adamw", "muon"] = "adamw"
    lr: float = Field(1e-5, ge=0.0)
    """Peak learning rate of AdamW (and of every parameter when ``name`` is adamw)."""
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = Field(1e-8, gt=0.0)
    weight_decay: float = Field(0.0, ge=0.0)
    muon_lr: float | None = Field(None, ge=0.0)
    """Peak learning rate of the Muon group (None: 0.02)."""
    muon_momentum: float = Field(0.95, ge=0.0, lt=1.0)
    """Muon's momentum coefficient."""


class SchedulerConfig(StrictModel):
    """Linear warmup from lr / warmup_steps to lr, then constant or cosine decay."""

    kind: Literal["constant", "cosine"] = "constant"
    warmup_steps: int = Field(0, ge=0)
    total_steps: int = Field(1000, gt=0)
    """Steps until the cosine reaches ``min_lr_ratio`` (held there afterwards)."""
    min_lr_ratio: float = Field(0.0, ge=0.0, le=1.0)
    """Final learning rate of the cosine, as a fraction of the peak."""


FP8_RECIPES: dict[str, tuple[str, ...]] = {
    "dtensor": ("tensorwise", "rowwise", "rowwise_with_gw_hp", "blockwise"),
    "megatron": ("tensorwise", "delayed", "blockwise", "mxfp8"),
}
"""The ``precision.recipe`` values each backend runs (torchao's float8 recipes; Transformer Engine's)."""


class PrecisionConfig(StrictModel):
    """Which matmuls run in FP8. Master weights, optimizer state, gradient reductions, checkpoints,
    export and refit stay in high precision whatever is set here."""

    linear: Literal["dtype", "fp8"] = "dtype"
    """dtype: linear layers compute in ``policy.dtype`` like the rest. fp8: the matmuls of eligible
    linear layers (forward and backward) run in float8 with dynamic scales: backend=dtensor through
    torchao's float8 training (extra ``rl-backends-train[fp8]``; emulated on CPU), backend=megatron
    through Transformer Engine (extra ``rl-backends-train[megatron-fp8]``, CUDA only)."""
    recipe: Literal["tensorwise", "rowwise", "rowwise_with_gw_hp", "blockwise", "delayed", "mxfp8"] = "tensorwise"
    """How the FP8 scales are computed. backend=dtensor (torchao): tensorwise (one scale per tensor;
    e4m3 activations and weights, e5m2 gradients), rowwise (one per row, all e4m3, power-of-two
    scales), rowwise_with_gw_hp (rowwise; the weight gradient in high precision), blockwise (1 x 128
    activation and 128 x 128 weight blocks; CUDA SM90 and dtype bfloat16 only: torchao's prototype,
    no CPU emulation). backend=megatron (Transformer Engine): tensorwise (current scaling), delayed
    (scales from an amax history), blockwise, mxfp8 (Blackwell GPUs)."""
    fp8_format: Literal["hybrid", "e4m3"] | None = None
    """backend=megatron only (``TransformerConfig.fp8``): hybrid (e4m3 forward, e5m2 gradients; the
    default) or e4m3 everywhere. backend=dtensor: the recipe fixes the formats; leave it unset."""
    skip_modules: list[str] = Field(default_factory=lambda: list(DEFAULT_SKIP_MODULES))
    """backend=dtensor: linear layers kept in high precision, by module path or its last components
    (the LM head, a reward model's score head, MoE routers). Kept as well, always: linears whose in or
    out features are not multiples of 16 (blockwise: 128, and linears with a bias); embeddings and
    norms are never FP8."""
    fsdp_float8_all_gather: bool = True
    """backend=dtensor, recipe=tensorwise, when FSDP2 shards the model: weights are cast to float8
    before FSDP's all-gather (half the bytes of bf16), torchao's ``enable_fsdp_float8_all_gather``."""


class TrainBackendConfig(StrictModel):
    """How the policy (or reward model) is sharded, batched and optimised."""

    backend: Literal["dtensor", "megatron"] = "dtensor"
    """dtensor: PyTorch FSDP2 + tensor parallel (torch only). megatron: megatron-core (extra)."""
    num_workers: int = Field(1, gt=0)
    """Ranks in the worker group: data parallel size x tensor_parallel_size x pipeline_parallel_size
    x context_parallel_size."""
    tensor_parallel_size: int = Field(1, gt=0)
    """Ranks that split each layer's weights (Llama/Qwen2 plans). tensor x pipeline size must divide
    num_workers."""
    pipeline_parallel_size: int = Field(1, gt=0)
    """backend=megatron only: pipeline stages, each holding num_hidden_layers / pipeline_parallel_size
    consecutive decoder layers (the first also the embedding, the last the final norm and the output
    layer), run with megatron-core's 1F1B schedule over the micro-batches. num_hidden_layers must divide
    by it. backend=dtensor: 1 only (a larger value is a config error)."""
    virtual_pipeline_parallel_size: int = Field(1, gt=0)
    """backend=megatron, pipeline_parallel_size >= 3: model chunks per pipeline rank (megatron-core's
    virtual pipeline stages, its ``virtual_pipeline_model_parallel_size``), run by its interleaved
    schedule; shrinks the pipeline bubble by this factor. pipeline x virtual size must divide
    num_hidden_layers."""
    context_parallel_size: int = Field(1, gt=0)
    """backend=megatron only: ranks that split every sequence's positions (two chunks of 1 / (2 x cp)
    of the width each, balanced for causal attention); each attention layer all-gathers keys and
    values over them (``megatron/context.py``). Activation memory / cp. backend=dtensor: 1 only."""
    expert_parallel_size: int = Field(1, gt=0)
    """backend=megatron, mixture-of-experts models (Mixtral) only: ranks that split each MoE layer's
    experts. They are data-parallel ranks (it must divide the data-parallel size): each runs its own
    rows and exchanges tokens with the others (all-to-all) to reach their experts."""
    sequence_parallel: bool = False
    """tensor_parallel_size > 1 only (both backends; not with LoRA on megatron): the norms and the
    residual stream between the attention/MLP blocks are sharded over the sequence dimension across
    the tensor-parallel ranks (activation memory / tp there; all-gather + reduce-scatter instead of
    all-reduce)."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """The compute dtype (forward and backward). With bfloat16 the parameters the optimizer steps, the
    optimizer state, gradient accumulation and reductions stay fp32 (fp32 master weights), on CPU and
    GPU, in both backends."""
    task: Literal["causal_lm", "reward_model"] = "causal_lm"
    """causal_lm: AutoModelForCausalLM. reward_model: AutoModelForSequenceClassification, 1 label."""
    micro_batch_size: int = Field(4, gt=0)
    """Samples per forward/backward when neither packing nor dynamic batching is on."""
    packing: PackingConfig = Field(default_factory=PackingConfig)
    dynamic_batching: DynamicBatchingConfig = Field(default_factory=DynamicBatchingConfig)
    activation_checkpointing: bool = False
    """Recompute each decoder layer's activations in backward (less memory, ~1/3 more compute)."""
    cpu_offload: bool = False
    """GPU only: keep sharded parameters, gradients and optimizer state in CPU memory (FSDP2)."""
    precision: PrecisionConfig = Field(default_factory=PrecisionConfig)
    """FP8 linear layers (``precision.linear: fp8``); by default everything computes in ``dtype``."""
    optimizer: OptimizerConfig = Field(default_factory=OptimizerConfig)
    scheduler: SchedulerConfig = Field(default_factory=SchedulerConfig)
    max_grad_norm: float | None = Field(1.0, gt=0.0)
    """Clip the global gradient norm to this value (None: no clipping; the norm is still reported)."""
    moe: MoEConfig = Field(default_factory=MoEConfig)
    lora: LoRAConfig | None = None
    """Train low-rank adapters only (None: full fine-tuning). On a vision-language model the adapters go to
    the language model only (its vision tower stays frozen)."""
    freeze_vision: bool = False
    """Vision-language models: do not train the image-only modules (the vision tower and its projector:
    Qwen-VL's ``model.visual``, Idefics3's ``model.vision_model`` and ``model.connector``): they get no
    gradients and no optimizer state. backend=dtensor; true on a text-only model is an error."""
    reference_model: bool = True
    """Keep a frozen reference (the initial weights; with LoRA the base weights, no copy).
    Algorithms set this False when their KL coefficient is 0."""
    cpus_per_worker: float = Field(1.0, gt=0)
    gpus_per_worker: float = Field(0.0, ge=0)
    """GPUs each rank's Ray actor reserves; the rank runs on the first of them. 1 on a GPU machine (a
    rank that sees CUDA without a GPU of its own is refused). A fraction (sharing a GPU with a colocated
    generation engine) only with num_workers=1: ranks of one group on one GPU break NCCL."""
    use_ray: bool = True
    """False: one worker in this process (world size 1), for tests and tiny runs."""
    weights_bucket_bytes: int = Field(256 * 2**20, gt=0)
    """named_weights() moves tensors from the workers in buckets of about this many bytes."""

    @model_validator(mode="after")
    def _check_layout(self) -> TrainBackendConfig:
        model_parallel = self.tensor_parallel_size * self.pipeline_parallel_size * self.context_parallel_size
        if self.num_workers % model_parallel:
            raise ValueError(
                f"tensor_parallel_size={self.tensor_parallel_size} x pipeline_parallel_size="
                f"{self.pipeline_parallel_size} x context_parallel_size={self.context_parallel_size} = "
                f"{model_parallel} must divide num_workers={self.num_workers}"
            )
        if self.pipeline_parallel_size > 1 and self.backend == "dtensor":
            raise ValueError(
                f"pipeline_parallel_size={self.pipeline_parallel_size} is not supported by backend=dtensor: set "
                "backend=megatron (pipeline stages with megatron-core's schedule), or pipeline_parallel_size=1 "
                "and split the model with tensor_parallel_size")
        if self.virtual_pipeline_parallel_size > 1 and self.pipeline_parallel_size < 3:
            raise ValueError(
                f"virtual_pipeline_parallel_size={self.virtual_pipeline_parallel_size} needs pipeline_parallel_size >= 3 "
                f"(got {self.pipeline_parallel_size}; backend=megatron): it splits each pipeline stage into model "
                "chunks, and with 2 stages a rank's previous and next stage are the same rank, whose activation and "
                "gradient transfers in megatron-core's interleaved schedule were paired wrongly (gloo)")
        if self.context_parallel_size > 1 and self.backend == "dtensor":
            raise ValueError(
                f"context_parallel_size={self.context_parallel_size} is not supported by backend=dtensor: set "
                "backend=megatron (positions split over ranks, keys and values gathered per layer), or "
                "context_parallel_size=1 and use activation_checkpointing / sequence_parallel for long sequences")
        if self.expert_parallel_size > 1:
            if self.backend == "dtensor":
                raise ValueError(f"expert_parallel_size={self.expert_parallel_size} is not supported by backend=dtensor: "
                                 "set backend=megatron (experts split over ranks, tokens exchanged all-to-all), or "
                                 "expert_parallel_size=1 (FSDP shards the experts' weights like any other)")
            if self.data_parallel_size % self.expert_parallel_size:
                raise ValueError(f"expert_parallel_size={self.expert_parallel_size} must divide the data-parallel size "
                                 f"{self.data_parallel_size} (num_workers / (tensor x pipeline x context parallel)): "
                                 "expert-parallel ranks are data-parallel ranks")
            if self.context_parallel_size > 1:
                raise ValueError("expert_parallel_size > 1 with context_parallel_size > 1 is not supported: set one of "
                                 "them to 1")
        if self.moe.router_replay and self.backend != "dtensor":
            raise ValueError(f"moe.router_replay=true is implemented by backend=dtensor, not backend={self.backend}: set "
                             "backend=dtensor or moe.router_replay=false")
        if self.sequence_parallel and self.tensor_parallel_size == 1:
            raise ValueError("sequence_parallel=True shards activations over the tensor-parallel ranks and needs "
                             "tensor_parallel_size > 1; set tensor_parallel_size (e.g. 2) or sequence_parallel=False")
        if self.packing.enabled and self.dynamic_batching.enabled:
            raise ValueError("packing and dynamic_batching are alternatives: enable at most one")
        if self.lora is not None and self.tensor_parallel_size > 1 and self.backend == "dtensor":
            raise ValueError("lora with tensor_parallel_size > 1 is not supported by backend=dtensor: set "
                             "tensor_parallel_size=1, or backend=megatron (LoRA on tensor-parallel layers)")
        if self.gpus_per_worker % 1 and self.num_workers > 1:
            raise ValueError(
                f"gpus_per_worker={self.gpus_per_worker:g} with num_workers={self.num_workers}: Ray would pack several "
                "ranks onto one GPU, which NCCL refuses (duplicate GPU); give each rank a whole GPU "
                "(gpus_per_worker=1) or run one worker")
        if not self.use_ray and self.num_workers > 1:
            raise ValueError(f"use_ray=False runs one in-process worker; got num_workers={self.num_workers}")
        return self

    @model_validator(mode="after")
    def _check_precision(self) -> TrainBackendConfig:
        precision = self.precision
        if precision.linear != "fp8":
            # A field set to its default (as a dumped config.yaml holds every field) is not stray.
            stray = sorted(name for name in precision.model_fields_set - {"linear"}
                           if getattr(precision, name)
                           != type(precision).model_fields[name].get_default(call_default_factory=True))
            if stray:
                raise ValueError(f"precision.{stray[0]} only applies with precision.linear=fp8 (got linear="
                                 f"{precision.linear!r}): set precision.linear=fp8 or remove it")
            return self
        if precision.recipe not in FP8_RECIPES[self.backend]:
            raise ValueError(f"precision.recipe={precision.recipe!r} is not a recipe of backend={self.backend}: use one "
                             f"of {', '.join(FP8_RECIPES[self.backend])}")
        if self.lora is not None:
            raise ValueError("precision.linear=fp8 with lora is not supported (the adapted layers are LoRA layers, not "
                             "plain linears): drop one of them")
        if self.backend == "dtensor":
            if precision.fp8_format is not None:
                raise ValueError("precision.fp8_format applies to backend=megatron; with backend=dtensor the torchao "
                                 "recipe fixes the formats (tensorwise: e4m3 forward, e5m2 gradients; rowwise: e4m3)")
            if self.tensor_parallel_size > 1:
                raise ValueError("precision.linear=fp8 with tensor_parallel_size > 1 is not supported by backend=dtensor: "
                                 "use data parallel (FSDP2) only, or backend=megatron")
            if precision.recipe == "blockwise" and self.dtype != "bfloat16":
                raise ValueError("precision.recipe=blockwise runs torchao's bf16 kernels: set dtype=bfloat16")
        elif "skip_modules" in precision.model_fields_set or "fsdp_float8_all_gather" in precision.model_fields_set:
            raise ValueError("precision.skip_modules and precision.fsdp_float8_all_gather apply to backend=dtensor; "
                             "backend=megatron runs the decoder layers' linears in FP8 (embedding and output layer not)")
        return self

    @property
    def data_parallel_size(self) -> int:
        return self.num_workers // (self.tensor_parallel_size * self.pipeline_parallel_size * self.context_parallel_size)
