"""`rl <command> --max-restarts N`: run the command in a child process and, when it fails, run it again
from its last checkpoint (``checkpointing.resume=true``), at most N times.

A failure is any non-zero exit except 2 (a bad config or command line: it would fail the same way
again) and 130 (interrupted by the user). A child killed by a signal (the OOM killer, a lost node
that takes the driver with it) counts as a failure. SIGTERM to this process (``scancel``, a pod being
deleted) is passed on to the child and ends the loop.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Sequence

EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
RESUME_OVERRIDE = "checkpointing.resume=true"


def strip_max_restarts(argv: Sequence[str]) -> list[str]:
    """``argv`` without ``--max-restarts N`` / ``--max-restarts=N`` (the child must not loop itself)."""
    out, skip = [], False
    for arg in argv:
        option, has_value, _ = arg.partition("=")
        # argparse also takes an unambiguous prefix (--max-r 2)
        is_flag = len(option) >= 3 and "--max-restarts".startswith(option)
        if skip:
            skip = False
        elif is_flag:
            skip = not has_value
        else:
            out.append(arg)
    return out


def supervise(command: str, cfg, argv: Sequence[str], max_restarts: int) -> int:
    """Check that ``cfg`` can be restarted from a checkpoint (else exit code 2 with one line), then
    :func:`run_with_restarts`."""
    checkpointing = getattr(cfg, "checkpointing", None)
    problem = None
    if max_restarts < 0:
        problem = f"--max-restarts must be >= 0, got {max_restarts}"
    elif checkpointing is None or not hasattr(checkpointing, "resume"):
        problem = f"--max-restarts: `rl {command}` writes no checkpoints to restart from"
    elif not checkpointing.enabled:
        problem = "--max-restarts needs checkpointing.enabled=true: a restart continues from the last checkpoint"
    if problem:
        print(f"rl {command}: {problem}", file=sys.stderr)
        return EXIT_USAGE
    return run_with_restarts(command, argv, max_restarts)


def run_with_restarts(command: str, argv: Sequence[str], max_restarts: int) -> int:
    """Run ``rl <command> <argv>`` in a child process; after a failure, run it again with
    ``checkpointing.resume=true`` until it succeeds or ``max_restarts`` restarts are used up.
    Returns the last child's exit code."""
    child_argv = [sys.executable, "-m", "rl_apps.cli", command, *strip_max_restarts(argv)]
    restarts = 0
    while True:
        code, terminated = _run_child(child_argv + ([RESUME_OVERRIDE] if restarts else []))
        exit_code = code if code >= 0 else 128 - code  # killed by signal S: 128 + S, as a shell reports it
        if code == 0 or terminated or exit_code in (EXIT_USAGE, EXIT_INTERRUPTED):
            return exit_code
        if restarts >= max_restarts:
            print(f"rl {command}: the run failed (exit code {exit_code}) and all {max_restarts} restart(s) are used "
                  "up", file=sys.stderr)
            return exit_code
        restarts += 1
        print(f"rl {command}: the run failed (exit code {exit_code}); restart {restarts} of {max_restarts} from "
              "its last checkpoint", file=sys.stderr, flush=True)


def _run_child(argv: list[str]) -> tuple[int, bool]:
    """``(exit code, whether this process got SIGTERM)``; the exit code is negative when the child was
    killed by that signal. A SIGTERM here is passed on to the child."""
    child = subprocess.Popen(argv)
    terminated = False

    def forward(signum, frame):
        nonlocal terminated
        terminated = True
        child.send_signal(signal.SIGTERM)

    previous = signal.signal(signal.SIGTERM, forward)
    try:
        while True:
            try:
                return child.wait(), terminated
            except KeyboardInterrupt:  # the child got the terminal's SIGINT too: let it finish cleanly
                continue
    finally:
        signal.signal(signal.SIGTERM, previous)
