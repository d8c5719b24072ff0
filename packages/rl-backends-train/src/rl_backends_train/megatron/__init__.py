"""The Megatron-core backend (extra ``rl-backends-train[megatron]``)."""

from __future__ import annotations

MEGATRON_EXTRA_HINT = 'Please install "rl-backends-train[megatron]" to use the Megatron-core backend'


def require_megatron():
    """Import megatron.core or raise one ImportError naming the extra."""
    try:
        import megatron.core as megatron_core
    except ImportError as e:
        raise ImportError(f"{MEGATRON_EXTRA_HINT} (policy.backend=megatron): {e}") from e
    return megatron_core


def __getattr__(name: str):
    if name == "MegatronPolicy":
        require_megatron()
        from rl_backends_train.megatron.policy import MegatronPolicy

        return MegatronPolicy
    raise AttributeError(name)
