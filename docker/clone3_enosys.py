"""Answer clone3 with ENOSYS in this process and its children, then run the given command.

Why: Docker before 20.10.10 (the Dev Board's Mendel Linux gets 18.09 from `apt install docker.io`)
answers the clone3 system call with EPERM from its default seccomp profile (moby/moby#42680).
glibc 2.34 and later (this image's Debian bookworm has 2.36) start every thread with clone3 and
fall back to clone only on ENOSYS, so under that profile no thread starts ("can't start new
thread") and the service dies at once. A process may add its own seccomp filter; when several
filters give the same action, the kernel takes the data of the newest one, so this filter's
ENOSYS wins over the engine's EPERM, glibc falls back to clone, and threads start. On engines
that allow clone3 the only change is that glibc uses clone, as it did before 2.34.

The filter is installed with no_new_privs (the kernel requires it of an unprivileged process;
it also stops setuid programs from gaining privileges, which this image has no use for). Where
it cannot be installed (under qemu-user, which refuses seccomp for its guests and does not
offer clone3 to them anyway) the command runs as it would have, after one line on stderr.

Example usage (the image's ENTRYPOINT):
    python clone3_enosys.py python -m app
"""

import ctypes
import errno
import os
import platform
import struct
import sys

PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
SECCOMP_RET_ALLOW = 0x7FFF0000
SECCOMP_RET_ERRNO = 0x00050000
NR_CLONE3 = 435  # the same number on x86-64 and arm64 (the generic syscall table)
AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}  # seccomp_data.arch per machine

# classic BPF: (code, jump if true, jump if false, k)
BPF_LD_W_ABS = 0x20
BPF_JEQ_K = 0x15
BPF_RET_K = 0x06
SECCOMP_DATA_NR = 0    # offsetof(struct seccomp_data, nr)
SECCOMP_DATA_ARCH = 4  # offsetof(struct seccomp_data, arch)


def program(audit_arch: int) -> list[tuple[int, int, int, int]]:
    """Another architecture's calls (x32 and i386 numbers differ): allowed; clone3: ENOSYS."""
    return [
        (BPF_LD_W_ABS, 0, 0, SECCOMP_DATA_ARCH),
        (BPF_JEQ_K, 0, 3, audit_arch),          # not this architecture: to ALLOW
        (BPF_LD_W_ABS, 0, 0, SECCOMP_DATA_NR),
        (BPF_JEQ_K, 0, 1, NR_CLONE3),           # not clone3: to ALLOW
        (BPF_RET_K, 0, 0, SECCOMP_RET_ERRNO | errno.ENOSYS),
        (BPF_RET_K, 0, 0, SECCOMP_RET_ALLOW),
    ]


class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]


def install() -> str | None:
    """Install the filter; None when done, else why not."""
    audit_arch = AUDIT_ARCH.get(platform.machine())
    if audit_arch is None:
        return f"no filter for {platform.machine()}"
    instructions = program(audit_arch)
    code = b"".join(struct.pack("=HBBI", *instruction) for instruction in instructions)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        return f"prctl(PR_SET_NO_NEW_PRIVS): {os.strerror(ctypes.get_errno())}"
    fprog = SockFprog(len(instructions), code)
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(fprog), 0, 0) != 0:
        return f"prctl(PR_SET_SECCOMP): {os.strerror(ctypes.get_errno())}"
    return None


def main(argv: list[str]) -> None:
    if not argv:
        sys.exit("usage: clone3_enosys.py COMMAND [ARG...]")
    problem = install()
    if problem:
        print(f"clone3_enosys: filter not installed ({problem}); running {argv[0]} without it", file=sys.stderr)
    os.execvp(argv[0], argv)


if __name__ == "__main__":
    main(sys.argv[1:])
