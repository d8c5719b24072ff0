"""Run untrusted Python in a sandboxed process and collect its output (docs/sandbox.md).

The parent side: make a fresh working directory, start the launcher (which isolates and drops
privileges, see ``_launcher.py``), feed stdin, read stdout/stderr up to a cap, enforce a wall
timeout, and afterwards kill everything the program left behind: its process group and, when it ran
under its own uid, every process of that uid (which also catches grandchildren that left the group).
"""

from __future__ import annotations

import json
import os
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

KILL = shutil.which("kill", path="/usr/bin:/bin") or "/bin/kill"
LAUNCHER = str(Path(__file__).with_name("_launcher.py"))
SETUP_FAILED = 125
# Sandboxed programs run under a uid of their own, drawn from this range (when the host runs as root).
UID_BASE, UID_SPAN = 1_500_000_000, 500_000_000
MIN_PROCESS_MEMORY_MB = 32  # an interpreter with the prelude maps ~15 MB


class SandboxError(RuntimeError):
    """The sandbox itself could not be set up (not a failure of the program inside it)."""


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits of one sandboxed run."""

    cpu_time_s: int = 5
    """CPU seconds (RLIMIT_CPU); the kernel kills the process past it."""
    wall_time_s: float = 10.0
    """Wall-clock seconds before the whole process tree is killed."""
    memory_mb: int = 1024
    """Address space (RLIMIT_AS) of one process, at most (see ``total_memory_mb``)."""
    total_memory_mb: int = 4096
    """Memory of the program's whole process tree. Enforced as a share per process: each of the at most
    ``max_processes`` processes gets ``min(memory_mb, total_memory_mb // max_processes)`` of address
    space, so together they cannot exceed it (docs/sandbox.md, "Memory")."""
    file_size_mb: int = 16
    """Largest file the program may write (RLIMIT_FSIZE)."""
    max_processes: int = 8
    """Processes and threads of the sandbox uid (RLIMIT_NPROC; exact when running as root)."""
    max_open_files: int = 64
    max_output_bytes: int = 65536
    """stdout and stderr are each cut to this many bytes; a program that writes more is stopped."""
    tmpfs_mb: int = 64
    """Size of the private /tmp, /var/tmp and /dev/shm (root only)."""

    def __post_init__(self):
        if self.process_memory_mb < MIN_PROCESS_MEMORY_MB:
            raise ValueError(
                f"SandboxLimits: total_memory_mb // max_processes = {self.total_memory_mb} // {self.max_processes} "
                f"leaves {self.process_memory_mb} MB per process, below the {MIN_PROCESS_MEMORY_MB} MB a Python "
                "process needs: raise total_memory_mb or lower max_processes")

    @property
    def process_memory_mb(self) -> int:
        """The address space each process gets: its share of the tree's total."""
        return min(self.memory_mb, self.total_memory_mb // self.max_processes)


@dataclass
class SandboxResult:
    returncode: int | None
    """Exit status; negative: killed by that signal; None: never finished (killed at the wall timeout)."""
    stdout: str
    stderr: str
    timed_out: bool = False
    output_truncated: bool = False
    wall_s: float = 0.0
    isolation: dict[str, str] = field(default_factory=dict)
    """What isolation was in force: ``network``, ``filesystem``, ``user``, ``unix_sockets``, ``memory``."""

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out


def run_python(code: str, *, stdin: str = "", files: dict[str, str] | None = None,
               limits: SandboxLimits | None = None) -> SandboxResult:
    """Run ``code`` as ``main.py`` in a fresh sandbox; ``files`` are extra files put next to it."""
    limits = limits or SandboxLimits()
    base = Path(tempfile.mkdtemp(prefix="rl-sandbox-"))
    try:
        workdir, stage = base / "work", base / "stage"
        workdir.mkdir()
        stage.mkdir(mode=0o700)
        os.chmod(base, 0o711)  # the sandbox user may pass through to work/, not list or read the rest
        (workdir / "main.py").write_text(code)
        for name, content in (files or {}).items():
            target = (workdir / name).resolve()
            if workdir.resolve() not in target.parents:
                raise ValueError(f"sandbox file name {name!r} points outside the working directory")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(content)
        uid = _allocate_uid() if os.geteuid() == 0 else None
        if uid is not None:
            for path in [workdir, *workdir.rglob("*")]:
                os.chown(path, uid, uid)
        os.chmod(workdir, 0o700)
        config = {
            "workdir": str(workdir), "stage_dir": str(stage), "program": str(workdir / "main.py"),
            "status_path": str(base / "status.json"), "python": sys.executable, "uid": uid,
            "expose_paths": _interpreter_paths(), "tmpfs_mb": limits.tmpfs_mb,
            "limits": {k: getattr(limits, k) for k in ("cpu_time_s", "process_memory_mb", "file_size_mb",
                                                        "max_processes", "max_open_files")},
        }
        result = _run(config, stdin, limits, uid)
        if result.returncode == SETUP_FAILED and result.stderr.startswith("sandbox setup failed"):
            raise SandboxError(result.stderr.strip())
        try:
            result.isolation = json.loads((base / "status.json").read_text())
        except (OSError, ValueError):
            result.isolation = {}
        return result
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _run(config: dict, stdin: str, limits: SandboxLimits, uid: int | None) -> SandboxResult:
    start = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-I", "-S", LAUNCHER, json.dumps(config)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}, cwd="/", start_new_session=True, close_fds=True,
    )
    threading.Thread(target=_feed, args=(proc.stdin, stdin.encode()), daemon=True).start()
    out, err, truncated, timed_out = _collect(proc, start + limits.wall_time_s, limits.max_output_bytes, uid)
    returncode = None if timed_out else proc.returncode
    return SandboxResult(returncode=returncode, stdout=out.decode(errors="replace"),
                         stderr=err.decode(errors="replace"), timed_out=timed_out,
                         output_truncated=truncated, wall_s=time.monotonic() - start)


def _feed(pipe, data: bytes) -> None:
    try:
        pipe.write(data)
    except (BrokenPipeError, OSError):
        pass
    finally:
        try:
            pipe.close()
        except OSError:
            pass


def _collect(proc: subprocess.Popen, deadline: float, cap: int, uid: int | None):
    """Read both pipes until they close; kill the tree at the deadline or once the main process ends."""
    out_fd, err_fd = proc.stdout.fileno(), proc.stderr.fileno()
    buffers = {out_fd: bytearray(), err_fd: bytearray()}
    truncated = timed_out = killed = False
    selector = selectors.DefaultSelector()
    for pipe in (proc.stdout, proc.stderr):
        os.set_blocking(pipe.fileno(), False)
        selector.register(pipe.fileno(), selectors.EVENT_READ)
    while selector.get_map():
        if not killed and (proc.poll() is not None or time.monotonic() >= deadline):
            timed_out = proc.poll() is None
            _kill_tree(proc, uid)  # also grandchildren still holding our pipes open
            killed = True
        timeout = 0.05 if killed else min(0.05, max(deadline - time.monotonic(), 0))
        for key, _ in selector.select(timeout):
            try:
                chunk = os.read(key.fd, 65536)
            except BlockingIOError:
                continue
            if not chunk:
                selector.unregister(key.fd)
                continue
            buf = buffers[key.fd]
            room = cap - len(buf)
            if len(chunk) > room:
                truncated = True
            buf.extend(chunk[: max(room, 0)])
            if truncated and not killed:  # the output is unusable past the cap: stop the program now
                _kill_tree(proc, uid)
                killed = True
        if killed and time.monotonic() > deadline + 5:  # a pipe held by something we could not kill
            break
    selector.close()
    if not killed:
        _kill_tree(proc, uid)
    proc.wait()
    proc.stdout.close()
    proc.stderr.close()
    return bytes(buffers[out_fd]), bytes(buffers[err_fd]), truncated, timed_out


def _kill_tree(proc: subprocess.Popen, uid: int | None) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if uid is not None:
        _kill_uid(uid)
    proc.wait()


def _kill_uid(uid: int) -> None:
    """Kill every process of ``uid``: ``kill(-1, SIGKILL)`` issued by a process running as that uid
    reaches all of them at once (a fork bomb cannot outrun it), including those that left the group."""
    for _ in range(2):
        subprocess.run([KILL, "-KILL", "-1"],
                       user=uid, group=uid, extra_groups=[], env={}, cwd="/", check=False,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _allocate_uid() -> int:
    return UID_BASE + secrets.randbelow(UID_SPAN)


def _interpreter_paths() -> list[str]:
    """Directories the sandboxed interpreter needs to see (resolved, deduplicated, outermost only)."""
    candidates = {os.path.realpath(p) for p in (sys.base_prefix, sys.prefix, os.path.dirname(sys.executable))}
    candidates |= {os.path.realpath(p) for p in sysconfig.get_paths().values() if os.path.isdir(p)}
    paths = sorted(candidates, key=len)
    out: list[str] = []
    for p in paths:
        if p != "/" and not any(p == q or p.startswith(q.rstrip("/") + "/") for q in out):
            out.append(p)
    return out
