"""Sandbox launcher: runs as a fresh process (``python -I -S _launcher.py CONFIG_JSON``), sets up the
isolation, drops privileges and execs the sandboxed Python. Standard library only, no threads.

Steps (each explained in docs/sandbox.md):
1. new network namespace (no interfaces up: nothing is reachable, not even 127.0.0.1) and, when
   running as root, a private mount namespace: fresh size-limited tmpfs over /tmp, /var/tmp, /dev/shm
   and over directories the sandbox user could not traverse but needs for the interpreter (e.g. /root
   when Python lives in /root/.pyenv); the interpreter is bind-mounted back read-only; the working
   directory becomes a tmpfs of its own holding a copy of the prepared files;
2. resource limits (CPU, address space, file size, processes, open files, no core dumps);
3. as root: switch to a uid/gid of its own (no supplementary groups, no capabilities);
4. exec the interpreter in isolated mode with a clean environment in the working directory.
"""

import ctypes
import json
import os
import resource
import shutil
import stat
import sys

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 2, 4, 32, 4096, 16384, 1 << 18

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

libc = ctypes.CDLL(None, use_errno=True)


def fail(message):
    sys.stderr.write(f"sandbox setup failed: {message}\n")
    sys.stderr.flush()
    os._exit(SETUP_FAILED)


def check(result, what):
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def mount(source, target, fstype, flags, data=None):
    enc = lambda s: None if s is None else s.encode()  # noqa: E731
    check(libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)),
          f"mount {source} -> {target}")


def blocked_ancestor(path):
    """Highest ancestor of ``path`` that others cannot traverse (no o+x), or None."""
    parts = path.strip("/").split("/")
    for i in range(1, len(parts) + 1):
        candidate = "/" + "/".join(parts[:i])
        try:
            if not os.stat(candidate).st_mode & stat.S_IXOTH:
                return candidate
        except FileNotFoundError:
            return None
    return None


def private_filesystem(cfg):
    """In a new mount namespace: hide /tmp-like dirs and untraversable parents, re-expose what is needed."""
    mount(None, "/", None, MS_REC | MS_PRIVATE)  # never propagate anything below to the host
    # Open handles keep the originals reachable after the tmpfs mounts hide their paths.
    exposed = [(path, os.open(path, os.O_PATH | os.O_DIRECTORY)) for path in cfg["expose_paths"]]
    source_fd = os.open(cfg["workdir"], os.O_RDONLY | os.O_DIRECTORY)
    hidden = {blocked_ancestor(p) for p, _ in exposed}
    hidden |= {d for d in ("/tmp", "/var/tmp", "/dev/shm") if os.path.isdir(d)}
    for directory in sorted(d for d in hidden if d):
        # A hidden dir below another one (a 0700 checkout under /tmp) is gone once /tmp is covered.
        os.makedirs(directory, mode=0o755, exist_ok=True)
        mount("tmpfs", directory, "tmpfs", MS_NOSUID | MS_NODEV, f"mode=1777,size={cfg['tmpfs_mb']}m")
    for path, fd in exposed:
        os.makedirs(path, mode=0o755, exist_ok=True)
        mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC)
        mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_REC)
        os.close(fd)
    # The working directory is a size-limited tmpfs of its own holding a copy of the prepared files:
    # whatever the program writes can neither fill the host's disk nor reach the host's copy.
    workdir = cfg["workdir"]
    os.makedirs(workdir, mode=0o755, exist_ok=True)
    mount("tmpfs", workdir, "tmpfs", MS_NOSUID | MS_NODEV, f"mode=0700,size={cfg['tmpfs_mb']}m")
    shutil.copytree(f"/proc/self/fd/{source_fd}", workdir, dirs_exist_ok=True)
    os.close(source_fd)
    for root, dirs, files in os.walk(workdir):
        for name in [root, *(os.path.join(root, n) for n in dirs + files)]:
            os.chown(name, cfg["uid"], cfg["uid"])


def set_limits(limits):
    mib = 1024 * 1024
    for name, value in (
        ("RLIMIT_CPU", limits["cpu_time_s"]),
        ("RLIMIT_AS", limits["memory_mb"] * mib),
        ("RLIMIT_FSIZE", limits["file_size_mb"] * mib),
        ("RLIMIT_NPROC", limits["max_processes"]),
        ("RLIMIT_NOFILE", limits["max_open_files"]),
        ("RLIMIT_CORE", 0),
    ):
        resource.setrlimit(getattr(resource, name), (value, value))


def main():
    cfg = json.loads(sys.argv[1])
    status_file = open(cfg["status_path"], "w")  # noqa: SIM115 - opened before /tmp is hidden
    status = {"network": "audit-hook", "filesystem": "shared", "user": "same"}
    as_root = os.geteuid() == 0
    drop_user = False
    try:
        if as_root:
            try:
                check(libc.unshare(CLONE_NEWNET), "unshare(CLONE_NEWNET)")
                status["network"] = "namespace"
            except OSError:
                pass  # e.g. a container without CAP_SYS_ADMIN: fall back to the audit hook
            try:
                check(libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
                drop_user = True
            except OSError:
                # No mount namespace: another uid can only run the interpreter if it can reach it.
                drop_user = not any(blocked_ancestor(p) for p in cfg["expose_paths"])
            else:
                private_filesystem(cfg)
                status["filesystem"] = "private-tmp"
        else:
            try:  # unprivileged user namespace, where the kernel allows one
                check(libc.unshare(CLONE_NEWUSER | CLONE_NEWNET), "unshare(CLONE_NEWUSER|CLONE_NEWNET)")
                status["network"] = "namespace"
            except OSError:
                pass
        set_limits(cfg["limits"])
        if drop_user:
            status["user"] = f"uid {cfg['uid']}"
        json.dump(status, status_file)
        status_file.close()
        if drop_user:
            os.setgroups([])
            os.setgid(cfg["uid"])
            os.setuid(cfg["uid"])  # drops every capability as well
        os.chdir(cfg["workdir"])
        os.umask(0o077)
    except OSError as err:
        fail(str(err))
    prelude = PRELUDE.format(block_sockets=status["network"] != "namespace", program=cfg["program"],
                             workdir=cfg["workdir"])
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": cfg["workdir"], "TMPDIR": cfg["workdir"],
           "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}
    os.execve(cfg["python"], [cfg["python"], "-I", "-B", "-c", prelude], env)


if __name__ == "__main__":
    main()
