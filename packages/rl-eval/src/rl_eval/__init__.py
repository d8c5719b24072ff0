"""pass@k / cons@k evaluation of any checkpoint on any dataset."""

__version__ = "0.1.0"
