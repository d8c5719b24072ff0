"""Environments and reward functions: math, arithmetic, countdown, sandboxed code, tools, sliding puzzle, reward models."""

__version__ = "0.1.0"
