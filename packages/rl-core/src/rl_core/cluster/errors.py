"""The one error a worker group raises in the driver."""

from __future__ import annotations


class WorkerError(RuntimeError):
    """A worker of a group failed: it raised, died, or a call timed out.

    The message names the group, the rank and the method, and carries the worker's traceback.
    ``__cause__`` is the worker's own exception when it could be recovered.
    """

    def __init__(self, group: str, rank: int | None, method: str, reason: str, traceback: str = "",
                 group_shut_down: bool = False):
        self.group = group
        self.rank = rank
        self.method = method
        self.reason = reason
        self.worker_traceback = traceback
        self.group_shut_down = group_shut_down
        where = f"rank {rank}" if rank is not None else "all ranks"
        msg = f"worker group {group!r}, {where}, {method}(): {reason}"
        if group_shut_down:
            msg += "\nThe group was shut down (its other ranks could be stuck in a collective)."
        if traceback:
            msg += f"\n\n--- traceback of {group!r} rank {rank} ---\n{traceback.rstrip()}"
        super().__init__(msg)
