"""A rank's training state moved off its device and back (``TrainWorker.offload`` / ``onload``, for a
generation engine sharing the GPU), and the memory figures reported per phase."""

from __future__ import annotations

import os

import torch

GIB = 2**30
StateHomes = dict[tuple[int, torch.nn.Parameter, str], torch.device]


def optimizer_state_to_cpu(optimizers: list[torch.optim.Optimizer]) -> StateHomes:
    """Move every optimizer-state tensor (Adam's moments, Muon's momentum; DTensors too) to CPU memory;
    returns where each was, for ``optimizer_state_back``."""
    homes: StateHomes = {}
    cpu = torch.device("cpu")
    for index, opt in enumerate(optimizers):
        for param, state in opt.state.items():
            for key, value in state.items():
                if torch.is_tensor(value) and value.device != cpu:
                    homes[(index, param, key)] = value.device
                    state[key] = value.to(cpu)
    return homes


def optimizer_state_back(optimizers: list[torch.optim.Optimizer], homes: StateHomes) -> None:
    """Undo ``optimizer_state_to_cpu``."""
    for (index, param, key), device in homes.items():
        state = optimizers[index].state[param]
        state[key] = state[key].to(device)


def memory_metrics(device: torch.device) -> dict[str, float]:
    """This process's memory in GiB: its resident set (``cpu_rss_gib``) and, on a CUDA device, the bytes
    allocated by tensors, reserved by the caching allocator, and the peak allocated since the previous
    call (the peak counter is reset, so successive calls report successive phases)."""
    out = {"cpu_rss_gib": _resident_bytes() / GIB}
    if device.type == "cuda":
        out |= {"gpu_allocated_gib": torch.cuda.memory_allocated(device) / GIB,
                "gpu_reserved_gib": torch.cuda.memory_reserved(device) / GIB,
                "gpu_peak_gib": torch.cuda.max_memory_allocated(device) / GIB}
        torch.cuda.reset_peak_memory_stats(device)
    return out


def _resident_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:  # Linux: size, resident, ... in pages
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:  # elsewhere: the peak, which is what getrusage keeps
        import resource
        import sys

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024
