"""Test helper shared by the rollout tests (native engine and vLLM)."""

from __future__ import annotations

from rl_core.types import SamplingParams


class RecordingBackend:
    """A real generation backend, with every generate call and its result kept for checking."""

    def __init__(self, inner):
        self.inner = inner
        self.calls: list[tuple[list[list[int]], SamplingParams, list]] = []

    def generate(self, prompts, sampling):
        result = self.inner.generate(prompts, sampling)
        self.calls.append(([list(p) for p in prompts], sampling, result))
        return result

    def __getattr__(self, name):
        return getattr(self.inner, name)
