"""The ``rl-eval`` / ``rl eval`` config: model, backend, sampling, datasets with their graders."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from rl_backends_gen import GenerationConfig
from rl_core.cluster import ClusterConfig
from rl_core.config import StrictModel
from rl_core.types import SamplingParams
from rl_eval.data import EvalDatasetSource, ProceduralEvalDataset


class GraderConfig(StrictModel):
    """An rl-environments environment used as a grader (``build_environment(name, **kwargs)``)."""

    name: str = "arithmetic"
    """arithmetic, countdown, math (math-verify), multiple_choice, or any registered environment."""
    kwargs: dict[str, Any] = Field(default_factory=dict)
    """Constructor arguments, e.g. ``{answer_format: either}``."""
    answer_format: Literal["boxed", "last_number", "either", "choice"] | None = None
    """How answers are extracted for cons@k voting (None: the grader's answer_format, else boxed;
    choice for multiple_choice)."""

    def voting_format(self) -> str:
        if self.answer_format is not None:
            return self.answer_format
        if self.name == "multiple_choice":
            return "choice"
        return str(self.kwargs.get("answer_format", "boxed"))


class EvalDatasetConfig(StrictModel):
    """One dataset to evaluate and the grader that scores it."""

    name: str | None = None
    """Shown in the summary and report (default: from the source)."""
    data: EvalDatasetSource = Field(default_factory=ProceduralEvalDataset)
    grader: GraderConfig | None = None
    """Default: the procedural dataset's own environment (arithmetic / countdown), else math."""
    prompt_template: str | None = None
    """Format string for the last user message; ``{question}`` is its text, metadata fields may be used."""

    def grader_config(self) -> GraderConfig:
        return self.grader if self.grader is not None else GraderConfig(name=self.data.default_grader())


class EvalSamplingConfig(StrictModel):
    """Sampling for evaluation (``temperature: 0`` is greedy)."""

    temperature: float = Field(1.0, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=0)
    """0 disables top-k."""
    max_new_tokens: int = Field(256, gt=0)
    n: int = Field(1, gt=0)
    """Samples per item; every k in ``k_values`` must be <= n."""
    seed: int = 0
    """Item i uses seed + i: the same seed gives the same report."""
    stop_strings: list[str] = Field(default_factory=list)

    def params(self) -> SamplingParams:
        return SamplingParams(max_new_tokens=self.max_new_tokens, temperature=self.temperature, top_p=self.top_p,
                              top_k=self.top_k, n=self.n, seed=self.seed, stop_strings=tuple(self.stop_strings))


class EvalConfig(StrictModel):
    """Evaluate one model on one or more datasets."""

    model: str = "tiny-llama"
    """An HF directory, a model name known to rl_core.models.resolve_model, or any checkpoint
    rl-checkpoint reads (training checkpoint, DCP, Megatron, GGUF): converted to HF in a temp dir."""
    model_name: str | None = None
    """Name shown in summaries (default: the model path's last part)."""
    cluster: ClusterConfig = Field(default_factory=ClusterConfig)
    """Ray, started from this section when the generation backend runs replicas (``generation.num_replicas``)."""
    generation: GenerationConfig = Field(default_factory=GenerationConfig)
    """The generation backend, as in the training recipes' ``generation:`` section: ``backend`` (native,
    hf, vllm, sglang), ``dtype``, ``device``, ``max_batch_size`` (rows decoded together), ..."""
    batch_size: int = Field(32, gt=0)
    """Items per generate call (progress bar granularity)."""
    sampling: EvalSamplingConfig = Field(default_factory=EvalSamplingConfig)
    k_values: list[int] = Field(default_factory=lambda: [1], min_length=1)
    """Report pass@k, cons@k and mean@k for each k."""
    greedy: bool = False
    """Also run one greedy sample per item and report greedy accuracy."""
    datasets: list[EvalDatasetConfig] = Field(default_factory=lambda: [EvalDatasetConfig()], min_length=1)
    report_path: str | None = None
    """Write the JSON report (summary + per-item results) here, atomically."""
    progress: bool = True
    """Show a progress bar."""

    @model_validator(mode="after")
    def _k_not_above_n(self) -> EvalConfig:
        too_big = [k for k in self.k_values if k > self.sampling.n or k < 1]
        if too_big:
            raise ValueError(f"k_values {too_big} must be in [1, sampling.n={self.sampling.n}]; "
                             "raise sampling.n or lower k_values")
        return self

    @model_validator(mode="after")
    def _no_draft_training(self) -> EvalConfig:
        spec = self.generation.speculative
        if spec is not None and spec.train_draft:
            raise ValueError("generation.speculative.train_draft=true: evaluation trains no draft (it decodes "
                             "with the draft as given); remove train_draft and the draft_lr / draft_steps / "
                             "draft_top_k keys")
        return self
