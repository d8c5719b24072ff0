"""Model and tokenizer helpers: tiny offline models for tests, and resolution of model names."""

from rl_core.models.resolve import SHORT_NAMES, ModelResolutionError, model_cache_dir, resolve_model
from rl_core.models.tiny import build_tiny_model, build_tiny_tokenizer, save_tiny_model, tiny_model_config

__all__ = [
    "SHORT_NAMES",
    "ModelResolutionError",
    "build_tiny_model",
    "build_tiny_tokenizer",
    "model_cache_dir",
    "resolve_model",
    "save_tiny_model",
    "tiny_model_config",
]
