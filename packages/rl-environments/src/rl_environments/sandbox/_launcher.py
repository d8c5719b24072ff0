"""Sandbox launcher: runs as a fresh process (``python -I -S _launcher.py CONFIG_JSON``), sets up the
isolation, drops privileges and execs the sandboxed Python. Standard library only, no threads.

Steps (each explained in docs/sandbox.md):
1. new network namespace (no interfaces up: nothing is reachable, not even 127.0.0.1) and, when
   running as root, a private mount namespace in which every host mount is read-only and the only
   writable places are fresh size-limited tmpfs over /tmp, /var/tmp, /dev/shm and the working
   directory (holding a copy of the prepared files); see ``_mounts.py``;
2. resource limits (CPU, address space, file size, processes, open files, no core dumps);
3. as root: switch to a uid/gid of its own (no supplementary groups, no capabilities);
4. a seccomp filter: no unix sockets (host sockets on paths stay out of reach), no io_uring;
   see ``_seccomp.py``;
5. exec the interpreter in isolated mode with a clean environment in the working directory.
"""

import ctypes
import json
import os
import resource
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # -I leaves the script's directory out
import _mounts  # noqa: E402
import _seccomp  # noqa: E402

CLONE_NEWUSER = 0x10000000
CLONE_NEWNS = 0x00020000
CLONE_NEWNET = 0x40000000

SETUP_FAILED = 125

PRELUDE = r"""
import sys
if {block_sockets}:
    def _no_network(event, args):
        if event in ("socket.__new__", "socket.connect", "socket.bind", "socket.getaddrinfo"):
            raise PermissionError("network access is disabled in this sandbox")
    sys.addaudithook(_no_network)
sys.argv = [{program!r}]
sys.path[0:0] = [{workdir!r}]
del sys
import runpy
runpy.run_path({program!r}, run_name="__main__")
"""

def fail(message):
    sys.stderr.write(f"sandbox setup failed: {message}\n")
    sys.stderr.flush()
    os._exit(SETUP_FAILED)


def unshare(flags):
    if _mounts.libc.unshare(flags) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"unshare({flags:#x}): {os.strerror(err)}")


def set_limits(limits):
    mib = 1024 * 1024
    for name, value in (
        ("RLIMIT_CPU", limits["cpu_time_s"]),
        ("RLIMIT_AS", limits["process_memory_mb"] * mib),
        ("RLIMIT_FSIZE", limits["file_size_mb"] * mib),
        ("RLIMIT_NPROC", limits["max_processes"]),
        ("RLIMIT_NOFILE", limits["max_open_files"]),
        ("RLIMIT_CORE", 0),
    ):
        resource.setrlimit(getattr(resource, name), (value, value))


def isolate(cfg, status):
    """Namespaces (and the private file system as root); returns whether to switch to the run's uid."""
    if os.geteuid() != 0:
        try:  # unprivileged user namespace, where the kernel allows one
            unshare(CLONE_NEWUSER | CLONE_NEWNET)
            status["network"] = "namespace"
        except OSError:
            pass
        return False
    try:
        unshare(CLONE_NEWNET)
        status["network"] = "namespace"
    except OSError:
        pass  # e.g. a container without CAP_SYS_ADMIN: fall back to the seccomp filter
    try:
        unshare(CLONE_NEWNS)
    except OSError:
        # No mount namespace: another uid can only run the interpreter if it can reach it.
        return not any(_mounts.blocked_ancestor(p) for p in cfg["expose_paths"])
    _mounts.private_filesystem(cfg)
    status["filesystem"] = "read-only"
    return True


def main():
    cfg = json.loads(sys.argv[1])
    status_file = open(cfg["status_path"], "w")  # noqa: SIM115 - opened before /tmp is hidden
    status = {"network": "audit-hook", "filesystem": "shared", "user": "same", "unix_sockets": "open"}
    limits = cfg["limits"]
    try:
        drop_user = isolate(cfg, status)
        set_limits(limits)
        if drop_user:
            status["user"] = f"uid {cfg['uid']}"
            os.setgroups([])
            os.setgid(cfg["uid"])
            os.setuid(cfg["uid"])  # drops every capability as well
        # RLIMIT_NPROC does not bind root: as root without a uid of its own the tree has no bound.
        bounded = drop_user or os.geteuid() != 0
        status["memory"] = (f"{limits['process_memory_mb']} MB x {limits['max_processes']} processes" if bounded
                            else f"{limits['process_memory_mb']} MB per process, processes unbounded")
        if _seccomp.supported():
            no_network = status["network"] != "namespace"
            _seccomp.install(deny_all_sockets=no_network)
            status["unix_sockets"] = "blocked"
            status["network"] = "seccomp" if no_network else status["network"]
        json.dump(status, status_file)
        status_file.close()
        os.chdir(cfg["workdir"])
        os.umask(0o077)
    except OSError as err:
        fail(str(err))
    prelude = PRELUDE.format(block_sockets=status["network"] == "audit-hook", program=cfg["program"],
                             workdir=cfg["workdir"])
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": cfg["workdir"], "TMPDIR": cfg["workdir"],
           "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}
    os.execve(cfg["python"], [cfg["python"], "-I", "-B", "-c", prelude], env)


if __name__ == "__main__":
    main()
