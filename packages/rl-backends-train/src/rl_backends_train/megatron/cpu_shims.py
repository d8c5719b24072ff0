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
6. Mixture-of-experts layers: the router moves its weight to ``torch.cuda.current_device()`` on
   every forward, the all-to-all token dispatcher copies token counts to the host on a side CUDA
   stream, and the all-to-all of ``tensor_parallel/mappings.py`` allocates its output on
   ``torch.cuda.current_device()``. Those three modules get ``_TorchWithoutCuda`` too, whose
   ``cuda.Stream()`` / ``current_stream()`` / ``stream()`` are a stream that does nothing (CPU work
   runs in order), and the dispatcher's host copy of the split sizes (a no-op for CPU tensors in
   megatron-core) makes them numpy arrays as it does for CUDA tensors.
7. Sequence parallel: the gathers and reduce-scatters of ``tensor_parallel/mappings.py`` (shim 6's
   ``torch``) and the backward of the tensor-parallel linears (``tensor_parallel/layers.py``, which
   all-gathers the sequence-sharded input into a buffer on ``torch.cuda.current_device()``) get
   ``_TorchWithoutCuda`` as well.
"""

from __future__ import annotations

import contextlib
import operator
from functools import reduce

import torch


class _NoStream:
    """A CUDA stream or event for code that only orders work on streams: on the CPU everything runs
    in order, so waiting and synchronising do nothing."""

    def wait_stream(self, *args, **kwargs) -> None:
        return None

    def record_event(self, *args, **kwargs) -> _NoStream:
        return self

    def synchronize(self) -> None:
        return None


_THE_STREAM = _NoStream()


class _CudaOnCpu:
    """``torch.cuda`` for code that only asks it where to allocate, when to synchronise and on which
    stream to run."""

    @staticmethod
    def current_device() -> str:
        return "cpu"

    @staticmethod
    def synchronize(*args, **kwargs) -> None:
        return None

    @staticmethod
    def Stream(*args, **kwargs) -> _NoStream:  # noqa: N802 (torch.cuda's name)
        return _THE_STREAM

    @staticmethod
    def current_stream(*args, **kwargs) -> _NoStream:
        return _THE_STREAM

    @staticmethod
    def stream(*args, **kwargs):
        return contextlib.nullcontext()

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
    from megatron.core.tensor_parallel import layers as tp_layers
    from megatron.core.tensor_parallel import mappings
    from megatron.core.tensor_parallel import random as mcore_random
    from megatron.core.transformer.moe import router, token_dispatcher

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

    def splits_to_host(tensor, as_numpy: bool = False, record_stream: bool = False):
        # On CUDA this copies token counts to the host (numpy for all_to_all_single's split sizes);
        # megatron-core's version leaves a CPU tensor as it is, which all_to_all_single refuses.
        if torch.is_tensor(tensor) and as_numpy:
            return tensor.numpy()
        return tensor

    mcore_utils.GlobalMemoryBuffer.get_tensor = get_tensor_on_cpu
    RotaryEmbedding.get_emb = rope_emb_on_cpu
    mcore_random.CudaRNGStatesTracker.fork = fork_without_cuda
    # CheckpointFunction and _fork_rng look these module globals up at call time.
    mcore_random._get_all_rng_states = get_rng_states_without_cuda
    mcore_random._set_all_rng_states = set_rng_states_without_cuda
    schedules.torch = p2p_communication.torch = _TorchWithoutCuda()
    router.torch = token_dispatcher.torch = mappings.torch = tp_layers.torch = _TorchWithoutCuda()
    token_dispatcher.maybe_move_tensor_to_cpu = splits_to_host
    _applied = True
    return True
