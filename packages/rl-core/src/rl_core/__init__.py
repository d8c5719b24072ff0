"""Shared interfaces, strict configs, Ray worker groups, logging and model loading for the rl post-training library."""

__version__ = "0.1.0"

from rl_core.batch import Batch
from rl_core.protocols import Environment, GenerationBackend, LossFn, TrainingBackend
from rl_core.types import Completion, ModelOutputs, Normalizer, PromptSample, SamplingParams, StepResult

__all__ = [
    "Batch",
    "Completion",
    "Environment",
    "GenerationBackend",
    "LossFn",
    "ModelOutputs",
    "Normalizer",
    "PromptSample",
    "SamplingParams",
    "StepResult",
    "TrainingBackend",
]
