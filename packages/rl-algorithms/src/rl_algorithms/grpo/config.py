"""Strict configs of GRPO and its variants (DAPO, GSPO, GDPO are presets of these switches)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from rl_algorithms.loop import LoopConfig
from rl_algorithms.losses import ClippedPolicyGradientLoss, ImportanceSampling
from rl_algorithms.rollout.config import EnvRunnerConfig
from rl_core.config import StrictModel


class AdvantageConfig(StrictModel):
    """How rewards become advantages."""

    estimator: Literal["grpo", "gdpo", "reinforce_pp"] = "grpo"
    """grpo: group baseline (optionally / std). gdpo: each reward component normalised within its
    group, weighted, summed, renormalised over the batch. reinforce_pp: group mean baseline, then
    whitened over all valid tokens of the batch."""
    baseline: Literal["mean", "leave_one_out"] = "mean"
    """grpo only: the group mean, or the mean of the other samples of the group."""
    normalize_std: bool = True
    """grpo only: divide by the group std (False is Dr. GRPO)."""
    gdpo_weights: dict[str, float] = Field(default_factory=dict)
    """gdpo only: weight of each named reward component (e.g. {correct: 1.0, format: 0.2})."""
    clip_low: float | None = None
    """Clamp advantages below at this value (None: no bound)."""
    clip_high: float | None = None
    """Clamp advantages above at this value (None: no bound)."""

    @model_validator(mode="after")
    def _check(self) -> AdvantageConfig:
        if self.estimator == "gdpo" and not self.gdpo_weights:
            raise ValueError("grpo.advantage.estimator=gdpo needs grpo.advantage.gdpo_weights, e.g. {correct: 1.0, format: 0.2}")
        if self.clip_low is not None and self.clip_high is not None and self.clip_low > self.clip_high:
            raise ValueError(f"grpo.advantage.clip_low ({self.clip_low}) is above grpo.advantage.clip_high ({self.clip_high})")
        return self


class DAPOConfig(StrictModel):
    """DAPO's extras; all off by default."""

    dynamic_sampling: bool = False
    """Drop groups whose rewards are all equal and generate more prompts until the batch is full."""
    max_extra_rounds: int = Field(3, ge=0)
    """At most this many extra generation rounds per step; then train on the groups collected."""
    overlong_buffer_length: int | None = Field(None, gt=0)
    """Linear reward penalty over the last this-many tokens before max_new_tokens (None: off)."""
    overlong_penalty: float = Field(1.0, ge=0.0)
    """The penalty reached at max_new_tokens."""
    overlong_filtering: bool = False
    """Mask samples that hit the length limit out of the loss."""


class ImportanceSamplingConfig(StrictModel):
    """Correction for generation-vs-training logprob mismatch (see rl_algorithms.losses.importance_sampling)."""

    level: Literal["token", "sequence"] = "token"
    truncation: Literal["clamp", "mask", "none"] = "clamp"
    """clamp: truncated IS (TIS). mask: ICEPOP (drop weights outside the range). none: raw weights."""
    weight_min: float = Field(0.0, ge=0.0)
    weight_max: float = Field(2.0, gt=0.0)
    seq_mask_low: float | None = Field(None, ge=0.0)
    """Drop sequences whose geometric-mean ratio pi_old/pi_gen is below this."""
    seq_mask_high: float | None = Field(None, gt=0.0)
    """Drop sequences whose geometric-mean ratio pi_old/pi_gen is above this."""

    def build(self) -> ImportanceSampling:
        return ImportanceSampling(**self.model_dump())


KIND_DEFAULTS: dict[str, dict[str, object]] = {
    "clipped_pg": {},
    # A length-normalised sequence ratio moves far less than a token ratio: the GSPO paper's clip range.
    "gspo": {"ratio_clip_low": 3e-4, "ratio_clip_high": 4e-4, "reduction": "sequence"},
}
"""The defaults of each ``loss.kind`` that differ from the field defaults; a value the config sets wins."""


class LossConfig(StrictModel):
    """The policy loss. kind=gspo uses the sequence-level ratio exp(mean log-ratio), with its own defaults
    (``KIND_DEFAULTS``) for the fields the config does not set."""

    kind: Literal["clipped_pg", "gspo"] = "clipped_pg"
    objective: Literal["clipped", "reinforce", "cispo"] = "clipped"
    """clipped: PPO-style min of clipped/unclipped. reinforce: -A logp (no ratio). cispo: -A sg(clip(r)) logp."""
    ratio_clip_low: float = Field(0.2, ge=0.0, le=1.0)
    """eps_low: the ratio is clipped below at 1 - ratio_clip_low (gspo default: 3e-4; 1: no lower bound,
    as CISPO's truncated IS weight)."""
    ratio_clip_high: float = Field(0.2, ge=0.0)
    """eps_high; DAPO clip-higher sets this above ratio_clip_low (e.g. 0.28) (gspo default: 4e-4)."""
    dual_clip: float | None = Field(None, gt=1.0)
    """Bound the loss of negative-advantage tokens at -A * dual_clip (None: off)."""
    reduction: Literal["token", "sequence", "constant"] = "token"
    """token: mean over all valid tokens of the batch. sequence: mean of per-sequence means (gspo default).
    constant (Dr. GRPO): sum over valid tokens / (valid sequences x constant_normalizer)."""
    constant_normalizer: int | None = Field(None, gt=0)
    """The fixed length of reduction=constant, in tokens (TRL's dr_grpo: max_completion_length). Unset:
    ``rl grpo`` fills in grpo.max_new_tokens."""
    kl_coef: float = Field(0.0, ge=0.0)
    """beta of the KL-to-reference penalty. 0 (and kl_in_reward false): no reference model is kept."""
    kl_estimator: Literal["k1", "k2", "k3"] = "k3"
    kl_in_reward: bool = False
    """Subtract kl_coef * sum_t KL_t from each sample's reward instead of adding KL to the loss."""
    importance_sampling: ImportanceSamplingConfig | None = None
    """Generation/training mismatch correction (None: off)."""
    positive_nll_coef: float = Field(0.0, ge=0.0)
    """Add this times the NLL of samples with reward > 0 (VAPO)."""
    positive_nll_normalizer: Literal["all_tokens", "positive_tokens"] = "positive_tokens"
    """Divide that NLL's sum by: positive_tokens, the tokens of the step's samples with reward > 0 (VAPO,
    NeMo RL); or all_tokens, reduced like the policy loss (loss.reduction) over every valid sample."""

    @property
    def needs_reference(self) -> bool:
        return self.kl_coef > 0

    def build(self) -> ClippedPolicyGradientLoss:
        if self.reduction == "constant" and self.constant_normalizer is None:
            raise ValueError("loss.reduction=constant needs loss.constant_normalizer (a length in tokens; "
                             "Dr. GRPO and TRL use the max response length, grpo.max_new_tokens)")
        return ClippedPolicyGradientLoss(
            ratio_clip_low=self.ratio_clip_low,
            ratio_clip_high=self.ratio_clip_high,
            dual_clip=self.dual_clip,
            objective=self.objective,
            ratio_level="sequence" if self.kind == "gspo" else "token",
            reduction=self.reduction,
            constant_normalizer=self.constant_normalizer,
            kl_coef=0.0 if self.kl_in_reward else self.kl_coef,
            kl_estimator=self.kl_estimator,
            importance_sampling=self.importance_sampling.build() if self.importance_sampling else None,
            positive_nll_coef=self.positive_nll_coef,
            positive_nll_normalizer=self.positive_nll_normalizer,
        )

    @model_validator(mode="before")
    @classmethod
    def _kind_defaults(cls, data: Any) -> Any:
        """Fill the kind's own defaults into the fields the config leaves unset."""
        if isinstance(data, dict) and isinstance(data.get("kind"), str):
            return {**KIND_DEFAULTS.get(data["kind"], {}), **data}
        return data

    @model_validator(mode="after")
    def _check(self) -> LossConfig:
        if self.kind == "gspo" and self.objective != "clipped":
            raise ValueError("loss.kind=gspo needs loss.objective=clipped")
        if self.dual_clip is not None and self.objective != "clipped":
            raise ValueError("loss.dual_clip only applies to loss.objective=clipped")
        return self


class GRPOConfig(LoopConfig):
    """The GRPO loop: how many prompts and samples per step, sampling, validation, variants."""

    batch_size: int = Field(8, gt=0)
    """Prompts (groups) per training step."""
    num_generations_per_prompt: int = Field(8, gt=1)
    """G: samples per prompt; advantages compare samples of the same prompt."""
    num_epochs: int = Field(1, gt=0)
    """Passes over each step's batch."""
    num_minibatches: int = Field(1, gt=0)
    """Optimizer steps per pass: the batch is split into this many minibatches (1: on-policy)."""
    prev_logprobs: Literal["auto", "recompute", "training_forward"] = "auto"
    """Where pi_old (the policy that generated the batch, as the trainer computes it) comes from.
    ``recompute``: a forward pass over the batch before training. ``training_forward``: the training
    forward's own logprobs, detached; exact only when the batch gets one optimizer step
    (num_epochs = num_minibatches = 1), and it saves that forward pass. ``auto``:
    ``training_forward`` when it is exact and nothing needs pi_old before training (KL in the
    reward does), else ``recompute``."""
    temperature: float = Field(1.0, gt=0.0)
    """Sampling temperature; training logprobs use the same temperature."""
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=0)
    """0 disables top-k."""
    max_new_tokens: int = Field(128, gt=0)
    """Per model turn; also L_max of DAPO's overlong shaping."""
    max_total_length: int = Field(1024, gt=0)
    """Prompt + all turns of an episode, in tokens."""
    max_turns: int = Field(1, gt=0)
    stop_strings: list[str] = Field(default_factory=list)
    """Extra strings that end a turn (the tokenizer's EOS always does)."""
    env_runner: EnvRunnerConfig = Field(default_factory=EnvRunnerConfig)
    """Where environment steps run (threads, a process pool or Ray actors) and their timeout."""
    placement: Literal["colocated", "separate"] = "colocated"
    """colocated: the generation backend sleeps while the policy trains (shared devices)."""
    val_num_prompts: int = Field(64, gt=0)
    """Held-out prompts per validation."""
    val_pass_k: int = Field(1, gt=0)
    """pass@k on held-out prompts from k samples at the training temperature (1: greedy accuracy only)."""
    test_at_end: bool = False
    """After the last step, evaluate the test split (disjoint from validation) the way validation is
    evaluated, logged as ``test/*``: the numbers to report, on prompts no checkpoint was chosen by."""
    test_num_prompts: int = Field(256, gt=0)
    """Test prompts evaluated with ``test_at_end``."""
    advantage: AdvantageConfig = Field(default_factory=AdvantageConfig)
    dapo: DAPOConfig = Field(default_factory=DAPOConfig)
    log_samples: int = Field(4, ge=0)
    """Episodes per step written to ``<output_dir>/samples.jsonl`` (prompt, turns, reward, parts)."""
    skip_steps_without_signal: bool = True
    """Skip the optimizer step when every advantage of the batch is 0 (nothing to learn)."""

    @property
    def single_update(self) -> bool:
        """Whether each step's batch gets exactly one optimizer step (fully on-policy)."""
        return self.num_epochs == 1 and self.num_minibatches == 1

    def recompute_prev_logprobs(self, loss_cfg: LossConfig) -> bool:
        """Whether pi_old needs its own forward pass before training (see ``prev_logprobs``)."""
        if self.prev_logprobs == "auto":
            return not self.single_update or loss_cfg.kl_in_reward
        return self.prev_logprobs == "recompute"

    @model_validator(mode="after")
    def _check(self) -> GRPOConfig:
        b = self.dapo.overlong_buffer_length
        if b is not None and b > self.max_new_tokens:
            raise ValueError(f"grpo.dapo.overlong_buffer_length ({b}) exceeds grpo.max_new_tokens ({self.max_new_tokens})")
        if self.prev_logprobs == "training_forward" and not self.single_update:
            raise ValueError("grpo.prev_logprobs=training_forward needs one optimizer step per batch "
                             f"(num_epochs=1, num_minibatches=1; got {self.num_epochs}, {self.num_minibatches}): "
                             "use 'recompute' or 'auto'")
        batch = self.batch_size * self.num_generations_per_prompt
        if batch % self.num_minibatches:
            raise ValueError(f"grpo.num_minibatches ({self.num_minibatches}) must divide the step's "
                             f"{batch} samples (grpo.batch_size x grpo.num_generations_per_prompt)")
        return self
