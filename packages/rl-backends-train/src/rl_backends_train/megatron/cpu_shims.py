"""The shims megatron-core 0.16 needs to run a GPTModel forward/backward without CUDA.

Applied only when CUDA is absent (``apply_cpu_shims`` is a no-op on a GPU machine):

1. ``GlobalMemoryBuffer.get_tensor`` allocates on ``torch.cuda.current_device()``; the shim
   allocates on the CPU instead.
2. The CUDA RNG tracker's ``fork`` saves/restores CUDA RNG state around dropout in
   tensor-parallel regions; the shim makes it an empty context (attention and hidden dropout are 0
   in the configs this backend builds, so no random stream is drawn inside it, at any TP size).
3. ``RotaryEmbedding.get_emb`` moves ``inv_freq`` to ``torch.cuda.current_device()`` on first use
   (the two shims in ARCHITECTURE.md were measured without RoPE); the shim leaves it on the CPU.
4. Activation recompute (``tensor_parallel.checkpoint``) saves and restores the CPU RNG state, the
   CUDA RNG state and the tracker's states around the recomputed forward; reading the CUDA state
   raises without CUDA. The shim saves/restores the CPU state and the tracker's (CPU) states only.
5. The pipeline schedules (``pipeline_parallel/schedules.py``) count tokens in
   ``torch.zeros([], device="cuda")``, and the p2p communicator (``p2p_communication.py``) allocates
   received activations and shapes on ``torch.cuda.current_device()`` and calls
   ``torch.cuda.synchronize()``. The shim gives these two modules a ``torch`` of their own
   (``_TorchWithoutCuda``) whose ``zeros(device="cuda")`` and ``cuda.current_device()`` mean the CPU
   and whose ``cuda.synchronize()`` does nothing; everything else is torch itself. The schedules'
   logic (1F1B order, p2p sends and receives, ``batch_isend_irecv``, which gloo runs op by op) is
   unchanged.
"""

from __future__ import annotations

import contextlib
import operator
from functools import reduce

import torch


class _CudaOnCpu:
    """``torch.cuda`` for code that only asks it where to allocate and when to synchronise."""

    @staticmethod
    def current_device() -> str:
        return "cpu"

    @staticmethod
    def synchronize(*args, **kwargs) -> None:
        return None

    def __getattr__(self, name: str):
        return getattr(torch.cuda, name)


class _TorchWithoutCuda:
    """``torch`` as seen by one megatron-core module (shim 5)."""

    cuda = _CudaOnCpu()

    @staticmethod
    def zeros(*args, device=None, **kwargs) -> torch.Tensor:
        return torch.zeros(*args, device="cpu" if device == "cuda" else device, **kwargs)

    def __getattr__(self, name: str):
        return getattr(torch, name)

_applied = False


def apply_cpu_shims() -> bool:
    """Patch megatron-core for CPU use when CUDA is unavailable. Returns whether shims are active."""
    global _applied
    if torch.cuda.is_available():
        return False
    if _applied:
        return True
    from megatron.core import utils as mcore_utils
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
    from megatron.core.pipeline_parallel import p2p_communication, schedules
    from megatron.core.tensor_parallel import random as mcore_random

    def get_tensor_on_cpu(self, tensor_shape, dtype, name, mem_alloc_context=None):
        required = reduce(operator.mul, tensor_shape, 1)
        current = self.buffer.get((name, dtype))
        if current is None or current.numel() < required:
            self.buffer[(name, dtype)] = torch.empty(required, dtype=dtype, device="cpu", requires_grad=False)
        return self.buffer[(name, dtype)][0:required].view(*tensor_shape)

    @contextlib.contextmanager
    def fork_without_cuda(self, name="model-parallel-rng"):
        yield

    def rope_emb_on_cpu(self, max_seq_len: int, offset: int = 0):
        freqs = self.get_freqs_non_repeated(max_seq_len, offset)  # [seq, dim / 2]
        if self.rotary_interleaved:
            emb = torch.stack((freqs.view(-1, 1), freqs.view(-1, 1)), dim=-1).view(freqs.shape[0], -1)
        else:
            emb = torch.cat((freqs, freqs), dim=-1)
        return emb[:, None, None, :]  # [seq, 1, 1, dim]

    def get_rng_states_without_cuda():
        return torch.get_rng_state(), None, mcore_random.get_cuda_rng_tracker().get_states()

    def set_rng_states_without_cuda(cpu_rng_state, _cuda_rng_state, tracker_states):
        torch.set_rng_state(cpu_rng_state)
        mcore_random.get_cuda_rng_tracker().set_states(tracker_states)

    mcore_utils.GlobalMemoryBuffer.get_tensor = get_tensor_on_cpu
    RotaryEmbedding.get_emb = rope_emb_on_cpu
    mcore_random.CudaRNGStatesTracker.fork = fork_without_cuda
    # CheckpointFunction and _fork_rng look these module globals up at call time.
    mcore_random._get_all_rng_states = get_rng_states_without_cuda
    mcore_random._set_all_rng_states = set_rng_states_without_cuda
    schedules.torch = p2p_communication.torch = _TorchWithoutCuda()
    _applied = True
    return True
