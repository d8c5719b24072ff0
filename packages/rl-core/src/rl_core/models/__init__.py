"""Model and tokenizer helpers: tiny offline models for tests, and resolution of model names."""

from rl_core.models.tiny import build_tiny_model, build_tiny_tokenizer, save_tiny_model, tiny_model_config

__all__ = ["build_tiny_model", "build_tiny_tokenizer", "save_tiny_model", "tiny_model_config"]
