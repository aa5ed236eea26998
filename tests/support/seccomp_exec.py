"""Run a command under the system-call filter of the shipped systemd unit.

    python tests/support/seccomp_exec.py ALLOWED_FILE -- COMMAND [ARG...]

ALLOWED_FILE lists the allowed system calls, one a line (what
`test_systemd_unit.allowed_syscalls()` expands the unit's `SystemCallFilter=`
lines to with `systemd-analyze syscall-filter`). Every other call fails with
EPERM, as `SystemCallErrorNumber=EPERM` makes systemd's filter do; the filter
is loaded with libseccomp (the library systemd itself uses) through ctypes,
with no_new_privs set, and holds for the command and all it starts.
"""

from __future__ import annotations

import ctypes
import errno
import os
import sys

SCMP_ACT_ALLOW = 0x7FFF0000
SCMP_ACT_ERRNO = 0x00050000  # | errno


def load_filter(allowed: list[str]) -> None:
    lib = ctypes.CDLL("libseccomp.so.2", use_errno=True)
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_rule_add.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_uint]
    lib.seccomp_load.argtypes = [ctypes.c_void_p]
    ctx = lib.seccomp_init(SCMP_ACT_ERRNO | errno.EPERM)
    if not ctx:
        raise OSError("seccomp_init failed")
    for name in allowed:
        nr = lib.seccomp_syscall_resolve_name(name.encode())
        if nr < 0:  # a call this architecture does not have (systemd skips those too)
            continue
        rc = lib.seccomp_rule_add(ctx, SCMP_ACT_ALLOW, nr, 0)
        if rc < 0:
            raise OSError(-rc, f"seccomp_rule_add({name})")
    rc = lib.seccomp_load(ctx)
    if rc < 0:
        raise OSError(-rc, "seccomp_load")


def main(argv: list[str]) -> None:
    allowed_file, sep, *command = argv
    assert sep == "--" and command, __doc__
    with open(allowed_file) as f:
        load_filter([line.strip() for line in f if line.strip()])
    os.execvp(command[0], command)


if __name__ == "__main__":
    main(sys.argv[1:])
