"""What the sandbox keeps away from the host (the rest of the hostile set is test_sandbox_security.py):
the network, host unix sockets on paths, every world-writable host directory (found by a scan, not a
list), and memory beyond the total of the whole process tree."""

from __future__ import annotations

import contextlib
import os
import platform
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest

from rl_environments.sandbox import SandboxLimits, run_python

ISOLATION = run_python("pass").isolation
read_only_fs = pytest.mark.skipif(ISOLATION.get("filesystem") != "read-only",
                                  reason="a read-only host file system needs root and a mount namespace")
PRIVATE = ("/tmp", "/var/tmp", "/dev/shm")  # the sandbox's own tmpfs mounts: writable, never the host's
LIMITS = SandboxLimits(cpu_time_s=5, wall_time_s=20.0, max_output_bytes=10**6)


def world_writable_host_dirs() -> list[str]:
    """Every world-writable directory of the host (all mounts but /proc and /sys)."""
    found = subprocess.run(["find", "/", "(", "-path", "/proc", "-o", "-path", "/sys", ")", "-prune", "-o",
                            "-perm", "-0002", "-type", "d", "-print"],
                           capture_output=True, text=True, timeout=120, check=False)
    return sorted(line for line in found.stdout.splitlines() if line)


@pytest.fixture
def shared_host_dir():
    """A world-writable directory of the test's own, visible to the sandbox: outside its private /tmp, in the
    repository (or, for a checkout under /tmp, the working directory or home)."""
    bases = [Path(__file__).parent.resolve(), Path.cwd().resolve(), Path.home().resolve()]
    base = next((b for b in bases if not is_private(str(b)) and os.access(b, os.W_OK) and open_to_others(b)), None)
    if base is None:
        pytest.skip("the checkout, working directory and home are each under /tmp, /var/tmp or /dev/shm (which "
                    "the sandbox replaces with its own) or closed to other users: none is visible to the sandbox")
    path = Path(tempfile.mkdtemp(prefix=".sandbox-host-", dir=base))
    path.chmod(0o1777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def listening(server: socket.socket):
    """Accept connections on a listening ``server`` in a thread while the block runs; yields what
    each connection sent (the list fills in as they arrive)."""
    server.settimeout(0.2)
    received: list[bytes] = []
    done = threading.Event()

    def accept() -> None:
        while not done.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            received.append(conn.recv(100))
            conn.close()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield received
        time.sleep(0.3)  # a connection made at the very end still gets accepted
    finally:
        done.set()
        thread.join()
        server.close()


def open_to_others(path: Path) -> bool:
    """Whether another user (the sandbox's) can reach ``path``: every directory on the way lets others through."""
    return all(os.stat(p).st_mode & 0o001 for p in (path, *path.parents))


def is_private(path: str) -> bool:
    return any(path == p or path.startswith(p + "/") for p in PRIVATE)


@read_only_fs
def test_no_world_writable_host_directory_is_writable(shared_host_dir):
    targets = [*world_writable_host_dirs(), str(shared_host_dir)]
    assert "/run/lock" in targets or not os.path.isdir("/run/lock")  # the scan sees what the issue found
    name = f"pwned-{os.getpid()}"
    code = (f"import os\nfor d in {targets!r}:\n"
            "    try:\n"
            f"        open(os.path.join(d, {name!r}), 'w').write('pwned')\n"
            "        print('WROTE', d)\n"
            "    except OSError as err:\n"
            "        print('blocked', d, err.errno)\n")
    result = run_python(code, limits=LIMITS)
    leaked = [d for d in targets if os.path.exists(os.path.join(d, name))]
    for directory in leaked:  # a failing run must not leave its files on the host
        os.remove(os.path.join(directory, name))
    assert leaked == []  # the host never sees a file the program wrote
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == len(targets)
    for directory, line in zip(targets, lines):
        if directory in PRIVATE:
            assert line == f"WROTE {directory}"  # the program's own /tmp works as programs expect
        elif is_private(directory):
            assert line == f"blocked {directory} 2"  # the host's /tmp/x is not in the private /tmp
        else:  # EROFS; EACCES where a parent directory is closed to others (e.g. container storage)
            assert line in (f"blocked {directory} 30", f"blocked {directory} 13"), line


@pytest.mark.skipif(platform.machine() not in ("x86_64", "aarch64"), reason="seccomp filter for x86_64 / aarch64")
def test_host_unix_socket_in_a_world_writable_dir_is_unreachable(shared_host_dir):
    path = str(shared_host_dir / "host.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    os.chmod(path, 0o777)
    server.listen(1)
    code = ("import os, socket\n"
            f"print('visible', os.path.exists({path!r}))\n"
            "try:\n"
            "    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
            f"    s.connect({path!r})\n"
            "    s.sendall(b'exfiltrated')\n"
            "    print('CONNECTED')\n"
            "except OSError as err:\n"
            "    print('blocked', type(err).__name__)\n"
            "a, b = socket.socketpair()\n"  # a pair reaches nothing outside: still allowed
            "a.sendall(b'ok')\n"
            "print('pair', b.recv(2))\n")
    with listening(server) as received:
        result = run_python(code, limits=LIMITS)
    assert received == []
    assert result.stdout.splitlines() == ["visible True", "blocked PermissionError", "pair b'ok'"], result.stderr
    assert result.isolation["unix_sockets"] == "blocked"


def test_socket_to_localhost_listener_receives_nothing():
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port = listener.getsockname()[1]
    code = ("import socket\n"
            "try:\n"
            f"    s = socket.create_connection(('127.0.0.1', {port}), timeout=1)\n"
            "    s.sendall(b'exfiltrated')\n"
            "    print('CONNECTED')\n"
            "except Exception as err:\n"
            "    print('blocked', type(err).__name__, err)\n")
    with listening(listener) as received:
        result = run_python(code, limits=LIMITS)
    assert received == []
    assert "CONNECTED" not in result.stdout and "blocked" in result.stdout


def test_external_network_is_unreachable():
    code = ("import socket\n"
            "try:\n"
            "    socket.create_connection(('8.8.8.8', 53), timeout=1)\n"
            "    print('CONNECTED')\n"
            "except Exception as err:\n"
            "    print('blocked', type(err).__name__)\n")
    result = run_python(code, limits=LIMITS)
    assert "blocked" in result.stdout


def test_io_uring_is_refused():
    code = ("import ctypes, os\n"
            "params = ctypes.create_string_buffer(120)\n"
            "libc = ctypes.CDLL(None, use_errno=True)\n"
            "print(libc.syscall(425, 4, params), ctypes.get_errno())\n")  # io_uring_setup(4, &params)
    result = run_python(code, limits=LIMITS)
    if ISOLATION.get("unix_sockets") != "blocked":
        pytest.skip("no seccomp filter on this platform")
    assert result.stdout.split() == ["-1", "38"]  # ENOSYS


@pytest.mark.skipif("unbounded" in ISOLATION.get("memory", "unbounded"),
                    reason="root without a uid of its own: RLIMIT_NPROC does not bind")
def test_process_tree_memory_stays_under_the_total():
    limits = SandboxLimits(cpu_time_s=10, wall_time_s=30.0, total_memory_mb=200, max_processes=4)
    # Each process (the parent and up to 5 children) tries to hold 120 MB at the same time and reports
    # its resident memory: uncapped the tree would hold ~720 MB.
    code = (
        "import os, time\n"
        "def hog():\n"
        "    held = []\n"
        "    try:\n"
        "        while len(held) < 30:\n"
        "            held.append(b'\\x01' * (4 * 1024 * 1024))\n"
        "    except MemoryError:\n"
        "        pass\n"
        "    rss = [line.split()[1] for line in open('/proc/self/status') if line.startswith('VmRSS')][0]\n"
        "    print('rss_kb', rss, flush=True)\n"
        "    return held\n"
        "children = 0\n"
        "for _ in range(5):\n"
        "    try:\n"
        "        pid = os.fork()\n"
        "    except OSError:\n"
        "        break\n"
        "    if pid == 0:\n"
        "        held = hog()\n"
        "        time.sleep(2)\n"  # hold it while the others allocate
        "        os._exit(0)\n"
        "    children += 1\n"
        "held = hog()\n"
        "for _ in range(children):\n"
        "    os.wait()\n"
        "print('children', children, flush=True)\n"
    )
    result = run_python(code, limits=limits)
    assert result.returncode == 0, result.stderr
    rss_kb = [int(line.split()[1]) for line in result.stdout.splitlines() if line.startswith("rss_kb")]
    children = int(result.stdout.split("children")[1])
    assert len(rss_kb) == children + 1 <= limits.max_processes
    assert min(rss_kb) > 8 * 1024  # every process got to allocate
    assert sum(rss_kb) <= limits.total_memory_mb * 1024
    assert result.isolation["memory"] == "50 MB x 4 processes"


def test_limits_leaving_too_little_per_process_are_refused():
    with pytest.raises(ValueError, match="total_memory_mb // max_processes = 100 // 8 leaves 12 MB per process"):
        SandboxLimits(total_memory_mb=100, max_processes=8)
