"""A process sandbox for model-written Python (see docs/sandbox.md for what it does and does not isolate)."""

from rl_environments.sandbox.runner import SandboxError, SandboxLimits, SandboxResult, run_python

__all__ = ["SandboxError", "SandboxLimits", "SandboxResult", "run_python"]
