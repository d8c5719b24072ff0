"""A seccomp filter for the sandboxed program (standard library only, loaded by ``_launcher.py``).

A network namespace hides every network address, but not unix sockets bound to a path: those are
files, and a host socket in a directory the sandbox can see (``/run/lock``, a bind-mounted
directory) stays connectable, read-only mount or not (connect needs write permission on the socket
inode, which a read-only mount does not take away). The filter refuses to create such sockets:

- ``socket(AF_UNIX, ...)`` fails with EACCES (or every ``socket()`` when ``deny_all_sockets``:
  the network fallback when no network namespace could be made). ``socketpair`` stays allowed:
  its two ends reach nothing outside the program (``multiprocessing.Pipe`` uses it).
- io_uring is refused (ENOSYS) since its ``IORING_OP_SOCKET`` / ``IORING_OP_CONNECT`` would go
  around a filter on the ``socket`` system call.
- Only the native system call ABI is allowed: 32-bit (``int 0x80``, whose ``socketcall`` multiplexes
  socket calls) and x32 calls fail with EPERM.

The filter survives ``execve`` and is inherited by every child; ``PR_SET_NO_NEW_PRIVS`` (needed to
install it without privileges) also stops setuid programs from gaining any.
"""

import ctypes
import errno
import os
import platform
import struct

PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2
RET_ALLOW, RET_ERRNO = 0x7FFF0000, 0x00050000
BPF_LD_W_ABS, BPF_JEQ_K, BPF_JGE_K, BPF_RET_K = 0x20, 0x15, 0x35, 0x06
OFFSET_NR, OFFSET_ARCH, OFFSET_ARG0 = 0, 4, 16  # struct seccomp_data: nr, arch, ip, args[6]
AF_UNIX = 1
X32_SYSCALL_BIT = 0x40000000
IO_URING_SYSCALLS = (425, 426, 427)  # io_uring_setup, io_uring_enter, io_uring_register (all ABIs)
# machine -> (AUDIT_ARCH_*, number of the socket system call)
ARCHES = {"x86_64": (0xC000003E, 41), "aarch64": (0xC00000B7, 198)}


def supported() -> bool:
    return platform.machine() in ARCHES


def program(deny_all_sockets: bool) -> list[tuple[int, int, int, int]]:
    """The classic-BPF program as (code, jump_if_true, jump_if_false, k) rows; jumps are relative."""
    arch, socket_nr = ARCHES[platform.machine()]
    deny_abi, deny_uring, deny_socket = RET_ERRNO | errno.EPERM, RET_ERRNO | errno.ENOSYS, RET_ERRNO | errno.EACCES
    rows = [
        (BPF_LD_W_ABS, 0, 0, OFFSET_ARCH),
        (BPF_JEQ_K, 1, 0, arch),
        (BPF_RET_K, 0, 0, deny_abi),
        (BPF_LD_W_ABS, 0, 0, OFFSET_NR),
        (BPF_JGE_K, 0, 1, X32_SYSCALL_BIT),
        (BPF_RET_K, 0, 0, deny_abi),
    ]
    for number in IO_URING_SYSCALLS:
        rows += [(BPF_JEQ_K, 0, 1, number), (BPF_RET_K, 0, 0, deny_uring)]
    rows.append((BPF_JEQ_K, 0, 3 if not deny_all_sockets else 1, socket_nr))  # not socket(): allow
    if deny_all_sockets:
        rows.append((BPF_RET_K, 0, 0, deny_socket))
    else:
        rows += [(BPF_LD_W_ABS, 0, 0, OFFSET_ARG0),  # the family (an int: the low 32 bits of args[0])
                 (BPF_JEQ_K, 0, 1, AF_UNIX),
                 (BPF_RET_K, 0, 0, deny_socket)]
    rows.append((BPF_RET_K, 0, 0, RET_ALLOW))
    return rows


def install(deny_all_sockets: bool) -> None:
    """Install the filter on the calling (single-threaded) process; OSError when the kernel refuses."""
    libc = ctypes.CDLL(None, use_errno=True)
    rows = program(deny_all_sockets)
    code = b"".join(struct.pack("=HBBI", *row) for row in rows)
    buffer = ctypes.create_string_buffer(code, len(code))

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    fprog = SockFprog(len(rows), ctypes.addressof(buffer))
    for args, what in (((PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)"),
                       ((PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(fprog), 0, 0), "seccomp filter")):
        if libc.prctl(*(ctypes.c_ulong(a) for a in args)) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"{what}: {os.strerror(err)}")
