"""Training backends: PyTorch DTensor (FSDP2 + tensor parallel) and Megatron-core, as Ray worker groups."""

__version__ = "0.1.0"
