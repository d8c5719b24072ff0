"""Generation backends: the native torch engine, vLLM, SGLang and an HF reference."""

__version__ = "0.1.0"
