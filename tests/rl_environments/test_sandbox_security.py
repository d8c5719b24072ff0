"""Hostile programs in the code sandbox: each must be contained and leave the host unharmed.

The strongest isolation (own uid, private /tmp, network namespace) needs root; tests of what only it
provides are skipped otherwise."""

from __future__ import annotations

import dataclasses
import os
import resource
import subprocess
import sys
import time

import pytest

from rl_environments.sandbox import SandboxLimits, run_python

SECRET = "rl-sandbox-test-secret-7f3a9c"

def _full_isolation() -> bool:
    """Own uid and private file system: root, with namespaces allowed (not in every container)."""
    if os.geteuid() != 0:
        return False
    isolation = run_python("pass").isolation
    return isolation.get("user", "").startswith("uid ") and isolation.get("filesystem") == "read-only"


IS_ROOT = _full_isolation()
root_only = pytest.mark.skipif(not IS_ROOT, reason="own uid / mount namespace isolation needs root and namespaces")
# RLIMIT_NPROC does not bind root: without the uid switch a fork bomb running as root is not contained.
bomb_safe = pytest.mark.skipif(os.geteuid() == 0 and not IS_ROOT, reason="root without namespaces: NPROC not enforced")
FAST = SandboxLimits(cpu_time_s=2, wall_time_s=5.0, memory_mb=512, file_size_mb=4, max_processes=16,
                     max_output_bytes=4096, tmpfs_mb=16)
SHORT = dataclasses.replace(FAST, wall_time_s=2.0)  # for programs that only end at the wall timeout


@pytest.fixture(autouse=True)
def planted_secret(monkeypatch):
    monkeypatch.setenv("RL_TEST_SECRET", SECRET)


def sandbox_uid(result) -> int | None:
    user = result.isolation.get("user", "")
    return int(user.split()[1]) if user.startswith("uid ") else None


def live_processes_of(uid: int) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/status") as f:
                    status = dict(line.split(":", 1) for line in f if ":" in line)
            except OSError:
                continue
            if int(status["Uid"].split()[0]) == uid and not status["State"].strip().startswith("Z"):
                pids.append(int(entry))
    return pids


def assert_nothing_left(result) -> None:
    uid = sandbox_uid(result)
    if uid is not None:
        assert live_processes_of(uid) == []


@bomb_safe
def test_fork_bomb_is_contained():
    code = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    result = run_python(code, limits=SHORT)
    assert not result.ok
    assert_nothing_left(result)
    assert subprocess.run(["true"]).returncode == 0  # the host can still start processes


def test_infinite_loop_is_stopped():
    result = run_python("while True:\n    pass\n", limits=FAST)
    assert not result.ok
    assert result.timed_out or result.returncode in (-9, -24)  # wall timeout, SIGKILL or SIGXCPU
    assert result.wall_s < FAST.wall_time_s + 5


@pytest.mark.parametrize("code", [
    "huge = bytearray(64 * 1024 ** 3)\n",
    "chunks = []\nwhile True:\n    chunks.append(' ' * (100 * 1024 * 1024))\n",
])
def test_memory_bomb_fails_inside(code):
    result = run_python(code, limits=SandboxLimits(memory_mb=256, wall_time_s=20))
    assert result.returncode == 1 and "MemoryError" in result.stderr


def test_huge_output_is_capped():
    result = run_python("import sys\nwhile True:\n    sys.stdout.write('x' * 100000)\n", limits=FAST)
    assert result.output_truncated
    assert len(result.stdout) <= FAST.max_output_bytes
    assert not result.ok


def test_writing_outside_the_working_directory_fails(tmp_path):
    host_dir = tmp_path / "host"
    host_dir.mkdir()
    (host_dir / "keep.txt").write_text("original")
    targets = [str(host_dir / "keep.txt"), str(host_dir / "new.txt"), "/work_pwned.txt", "/etc/pwned",
               os.path.join(sys.prefix, "pwned.txt"), os.path.join(os.path.dirname(os.__file__), "pwned.py")]
    code = (f"targets = {targets!r}\n"
            "for path in targets:\n"
            "    try:\n"
            "        with open(path, 'w') as f:\n"
            "            f.write('pwned')\n"
            "        print('WROTE', path)\n"
            "    except OSError as err:\n"
            "        print('blocked', path, type(err).__name__)\n")
    result = run_python(code, limits=FAST)
    assert result.returncode == 0
    assert (host_dir / "keep.txt").read_text() == "original"
    assert not (host_dir / "new.txt").exists()
    for path in targets[2:]:
        assert not os.path.exists(path) or open(path).read() != "pwned"  # noqa: SIM115
    if IS_ROOT:
        assert "WROTE" not in result.stdout.replace(f"WROTE {targets[0]}", "").replace(f"WROTE {targets[1]}", "")


def test_deleting_host_files_fails(tmp_path):
    host_dir = tmp_path / "host"
    host_dir.mkdir()
    planted = host_dir / "precious.txt"
    planted.write_text("keep me")
    repo_file = os.path.abspath(__file__)
    code = (
        "import os, shutil\n"
        f"for path in [{str(planted)!r}, {repo_file!r}]:\n"
        "    try:\n"
        "        os.remove(path)\n"
        "    except OSError as err:\n"
        "        print('blocked', type(err).__name__)\n"
        f"shutil.rmtree({str(host_dir)!r}, ignore_errors=True)\n"
        f"shutil.rmtree({os.path.dirname(repo_file)!r}, ignore_errors=True)\n"
    )
    result = run_python(code, limits=FAST)
    assert result.returncode == 0
    assert planted.read_text() == "keep me"
    assert os.path.exists(repo_file)


def test_host_environment_variables_do_not_leak():
    code = "import os\nprint(dict(os.environ))\nprint(open('/proc/self/environ', 'rb').read())\n"
    result = run_python(code, limits=FAST)
    assert result.returncode == 0
    assert SECRET not in result.stdout and "RL_TEST_SECRET" not in result.stdout


@root_only
def test_proc_of_other_processes_does_not_reveal_the_secret():
    code = (
        "import os\n"
        "for pid in [1, os.getppid(), " + str(os.getpid()) + "] + [int(p) for p in os.listdir('/proc') if p.isdigit()]:\n"
        "    for name in ('environ', 'cmdline', 'mem'):\n"
        "        try:\n"
        "            with open(f'/proc/{pid}/{name}', 'rb') as f:\n"
        "                print(f.read(100000))\n"
        "        except OSError:\n"
        "            pass\n"
    )
    result = run_python(code, limits=SandboxLimits(cpu_time_s=5, wall_time_s=10, max_output_bytes=10**7))
    assert result.returncode == 0
    assert SECRET not in result.stdout


def _pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            return not any(line.startswith("State:") and "Z" in line.split(":", 1)[1] for line in f)
    except FileNotFoundError:
        return False


def test_subprocess_that_outlives_the_timeout_is_killed():
    code = (
        "import os, subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], start_new_session=True)\n"
        "print(child.pid, flush=True)\n"
        "if os.fork() == 0:\n"  # a double-forked daemon in a session of its own
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        "        print(os.getpid(), flush=True)\n"
        "        time.sleep(60)\n"
        "    os._exit(0)\n"
        "time.sleep(60)\n"
    )
    result = run_python(code, limits=SHORT)
    assert result.timed_out
    pids = [int(line) for line in result.stdout.split()]
    assert len(pids) == 2
    time.sleep(0.2)
    assert not any(_pid_alive(pid) for pid in pids)
    assert_nothing_left(result)


@root_only
def test_killing_the_parent_fails():
    code = (
        "import os, signal\n"
        f"for pid in [os.getppid(), {os.getpid()}, 1]:\n"
        "    try:\n"
        "        os.kill(pid, signal.SIGKILL)\n"
        "        print('KILLED', pid)\n"
        "    except OSError as err:\n"
        "        print('blocked', type(err).__name__)\n"
        "try:\n"
        "    os.killpg(os.getpgid(os.getppid()), signal.SIGKILL)\n"
        "except OSError as err:\n"
        "    print('blocked', type(err).__name__)\n"
    )
    result = run_python(code, limits=FAST)
    assert "KILLED" not in result.stdout
    assert result.stdout.count("blocked PermissionError") == 4


def test_raising_limits_fails():
    code = (
        "import resource\n"
        "for name in ('RLIMIT_CPU', 'RLIMIT_AS', 'RLIMIT_NPROC', 'RLIMIT_FSIZE', 'RLIMIT_NOFILE'):\n"
        "    limit = getattr(resource, name)\n"
        "    try:\n"
        "        resource.setrlimit(limit, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))\n"
        "        print('RAISED', name)\n"
        "    except (ValueError, OSError):\n"
        "        print('blocked', name)\n"
    )
    result = run_python(code, limits=FAST)
    assert result.returncode == 0
    assert "RAISED" not in result.stdout and result.stdout.count("blocked") == 5


def test_ctypes_segfault_is_a_contained_error():
    result = run_python("import ctypes\nctypes.string_at(0)\n", limits=FAST)
    assert result.returncode == -11  # SIGSEGV, reported, nothing else affected
    assert not result.ok


def test_sleeping_past_the_timeout_is_cut_off():
    start = time.monotonic()
    result = run_python("import time\ntime.sleep(100)\n", limits=SHORT)
    assert result.timed_out and result.returncode is None
    assert time.monotonic() - start < SHORT.wall_time_s + 5


def test_filling_the_disk_stops_at_the_limits():
    code = (
        "import os\n"
        "try:\n"
        "    with open('big.bin', 'wb') as f:\n"
        "        f.write(b'0' * (64 * 1024 * 1024))\n"
        "except OSError as err:\n"
        "    print('big file blocked', err.errno)\n"
        "written = 0\n"
        "try:\n"
        "    for i in range(100000):\n"
        "        with open(f'part{i}.bin', 'wb') as f:\n"
        "            f.write(b'0' * (1024 * 1024))\n"
        "        written += 1\n"
        "except OSError as err:\n"
        "    print('disk full after', written, 'MiB', err.errno)\n"
    )
    result = run_python(code, limits=FAST)
    # RLIMIT_FSIZE ends the big write (SIGXFSZ kills the process unless Python ignores it: EFBIG).
    assert result.returncode == -25 or "big file blocked" in result.stdout
    if IS_ROOT and result.returncode == 0:
        assert "disk full after" in result.stdout
        assert int(result.stdout.split("disk full after")[1].split()[0]) <= FAST.tmpfs_mb


@bomb_safe
def test_thread_bomb_hits_the_process_limit():
    code = (
        "import threading, time\n"
        "threads = 0\n"
        "try:\n"
        "    for _ in range(10000):\n"
        "        threading.Thread(target=time.sleep, args=(5,), daemon=True).start()\n"
        "        threads += 1\n"
        "except RuntimeError:\n"
        "    pass\n"
        "print(threads, flush=True)\n"
        "import os\n"
        "os._exit(0)\n"
    )
    result = run_python(code, limits=FAST)
    assert result.returncode == 0
    assert int(result.stdout.strip()) < FAST.max_processes
    assert_nothing_left(result)


@root_only
def test_root_only_files_are_unreadable_and_root_home_is_hidden():
    code = (
        "import os\n"
        "try:\n"
        "    open('/etc/shadow').read()\n"
        "    print('READ shadow')\n"
        "except OSError as err:\n"
        "    print('blocked', type(err).__name__)\n"
        "print(sorted(os.listdir('/root')))\n"
    )
    result = run_python(code, limits=FAST)
    assert "READ shadow" not in result.stdout
    hidden_home = result.stdout.strip().splitlines()[-1]
    visible = sorted(os.listdir("/root"))
    assert hidden_home != str(visible) or len(visible) <= 1


@root_only
def test_python_installation_is_read_only():
    site_dir = os.path.dirname(os.__file__)
    code = (f"try:\n    open({os.path.join(site_dir, 'sitecustomize.py')!r}, 'w').write('import os')\n"
            "    print('WROTE')\nexcept OSError as err:\n    print('blocked', type(err).__name__)\n")
    result = run_python(code, limits=FAST)
    assert "WROTE" not in result.stdout and "blocked" in result.stdout
    assert not os.path.exists(os.path.join(site_dir, "sitecustomize.py")) or "import os" != open(  # noqa: SIM115
        os.path.join(site_dir, "sitecustomize.py")).read()


def test_benign_program_runs_normally():
    result = run_python("import json, math, sys\nprint(json.dumps({'x': math.sqrt(sys.stdin.read().count('a'))}))",
                        stdin="aaaa", limits=FAST)
    assert result.ok and result.stdout.strip() == '{"x": 2.0}'
    assert resource.getrlimit(resource.RLIMIT_NPROC) == resource.getrlimit(resource.RLIMIT_NPROC)
