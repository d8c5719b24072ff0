"""The native torch engine (no dependencies beyond torch and transformers)."""

from rl_backends_gen.native.engine import EngineStats, NativeEngine

__all__ = ["EngineStats", "NativeEngine"]
