"""The sandbox's private file system (standard library only, loaded by ``_launcher.py`` as root).

In a fresh mount namespace every mount the host has is made read-only (for this namespace only:
bind-remounts change the mount, never the file system, so the host keeps writing as before); then
the only writable places are new, size-limited tmpfs mounts of its own: ``/tmp``, ``/var/tmp``,
``/dev/shm`` and the working directory. No world-writable host directory (``/run/lock``, a
``chmod 1777`` scratch directory) can be written, whichever there are. Directories the sandbox user
could not traverse but the interpreter needs (``/root`` when Python lives in ``/root/.pyenv``) are
covered by an empty read-only tmpfs with the interpreter bind-mounted back read-only.
"""

import ctypes
import os
import shutil
import stat

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_NOATIME, MS_NODIRATIME, MS_BIND, MS_REC, MS_PRIVATE, MS_RELATIME = 1024, 2048, 4096, 16384, 1 << 18, 1 << 21
MS_STRICTATIME = 1 << 24
# Per-mount options as /proc/self/mountinfo writes them; a bind-remount must restate them to keep them
# (in a container's user namespace they are locked, and changing one fails).
MOUNT_OPTION_FLAGS = {"nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC, "noatime": MS_NOATIME,
                      "nodiratime": MS_NODIRATIME, "relatime": MS_RELATIME, "strictatime": MS_STRICTATIME}
PRIVATE_WRITABLE = ("/tmp", "/var/tmp", "/dev/shm")

libc = ctypes.CDLL(None, use_errno=True)


def mount(source, target, fstype, flags, data=None):
    enc = lambda s: None if s is None else s.encode()  # noqa: E731
    if libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"mount {source} -> {target}: {os.strerror(errno)}")


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


def host_mounts():
    """(mount point, per-mount flags) of every mount of this namespace, parents before children."""
    unescape = lambda s: s.encode().decode("unicode_escape").encode("latin-1").decode()  # noqa: E731 - "\040"
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            options = fields[5].split(",")
            yield unescape(fields[4]), sum(MOUNT_OPTION_FLAGS.get(o, 0) for o in options)


def make_read_only(path, flags=0):
    mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | flags)


def read_only_host():
    """Every mount read-only in this namespace, keeping its nosuid/nodev/noexec/atime options."""
    for path, flags in host_mounts():
        try:
            make_read_only(path, flags)
        except FileNotFoundError:
            pass  # a mount point that no path reaches any more (its directory was deleted)


def private_filesystem(cfg):
    mount(None, "/", None, MS_REC | MS_PRIVATE)  # never propagate anything below to the host
    # Open handles keep the originals reachable after the tmpfs mounts hide their paths.
    exposed = [(path, os.open(path, os.O_PATH | os.O_DIRECTORY)) for path in cfg["expose_paths"]]
    source_fd = os.open(cfg["workdir"], os.O_RDONLY | os.O_DIRECTORY)
    blocked = {blocked_ancestor(p) for p, _ in exposed} - {None}
    read_only_host()
    private = {d for d in PRIVATE_WRITABLE if os.path.isdir(d)}
    for directory in sorted(blocked | private):
        # A blocked dir below a private one (a 0700 checkout under /tmp) is gone once /tmp is covered.
        os.makedirs(directory, mode=0o755, exist_ok=True)
        mode = "1777" if directory in private else "0755"
        mount("tmpfs", directory, "tmpfs", MS_NOSUID | MS_NODEV, f"mode={mode},size={cfg['tmpfs_mb']}m")
    for path, fd in exposed:
        os.makedirs(path, mode=0o755, exist_ok=True)
        mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC)
        make_read_only(path)
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
    for directory in sorted(blocked - private):  # its mount points are made: nothing more to write there
        make_read_only(directory, MS_NOSUID | MS_NODEV)
