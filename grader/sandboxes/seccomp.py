"""The bubblewrap backend's seccomp filter: the system calls Docker's default profile refuses a container without
capabilities are refused here too, so a command can do the same in a sandbox of either backend (the Docker backend's
containers get the daemon's default profile itself).

Refused with ``EPERM``: :data:`REFUSED` (mounting, new namespaces and ``setns``, kernel modules and ``kexec``, the
kernel keyring, BPF, ``perf_event_open``, ``userfaultfd``, ``io_uring``, the clocks, swap, reboot, quotas,
``process_vm_*``, ``open_by_handle_at``, …) and ``clone`` with any namespace flag (:data:`NAMESPACE_FLAGS`).
``clone3`` answers ``ENOSYS``, as under Docker: its flags sit in memory a filter cannot read, and the C library then
falls back to ``clone``, whose flags it can. Everything else is allowed.

Built with libseccomp (``pyseccomp``) once per process, exported as BPF, and handed to bubblewrap (``--seccomp FD``),
which loads it as the last thing before the sandbox's init starts, so it binds the init and everything after.
"""

from __future__ import annotations

import errno
import os
import tempfile
from functools import lru_cache

import pyseccomp

REFUSED = (
    "acct", "add_key", "bpf", "clock_adjtime", "clock_settime", "create_module", "delete_module", "fanotify_init", "finit_module",
    "fsconfig", "fsmount", "fsopen", "fspick", "get_kernel_syms", "init_module", "io_uring_enter", "io_uring_register",
    "io_uring_setup", "ioperm", "iopl", "kcmp", "kexec_file_load", "kexec_load", "keyctl", "lookup_dcookie", "mount",
    "mount_setattr", "move_mount", "name_to_handle_at", "nfsservctl", "open_by_handle_at", "open_tree", "perf_event_open",
    "pivot_root", "process_vm_readv", "process_vm_writev", "query_module", "quotactl", "quotactl_fd", "reboot", "request_key",
    "setns", "settimeofday", "stime", "swapoff", "swapon", "sysfs", "_sysctl", "syslog", "umount", "umount2", "unshare",
    "uselib", "userfaultfd", "ustat", "vhangup", "vm86", "vm86old",
)
"""System calls refused outright (names this architecture lacks are skipped)."""

NAMESPACE_FLAGS = {
    "CLONE_NEWNS": 0x00020000, "CLONE_NEWCGROUP": 0x02000000, "CLONE_NEWUTS": 0x04000000, "CLONE_NEWIPC": 0x08000000,
    "CLONE_NEWUSER": 0x10000000, "CLONE_NEWPID": 0x20000000, "CLONE_NEWNET": 0x40000000, "CLONE_NEWTIME": 0x00000080,
}
"""``clone`` flags (its first argument on x86-64 and arm64) that create a namespace; a ``clone`` with any is refused."""


def _build() -> pyseccomp.SyscallFilter:
    refuse = pyseccomp.ERRNO(errno.EPERM)
    flt = pyseccomp.SyscallFilter(defaction=pyseccomp.ALLOW)
    for name in REFUSED:
        try:
            flt.add_rule(refuse, name)
        except (ValueError, RuntimeError, OSError):
            continue  # not a system call of this architecture
    for flag in NAMESPACE_FLAGS.values():
        flt.add_rule(refuse, "clone", pyseccomp.Arg(0, pyseccomp.MASKED_EQ, flag, flag))
    flt.add_rule(pyseccomp.ERRNO(errno.ENOSYS), "clone3")
    return flt


@lru_cache(maxsize=1)
def filter_bpf() -> bytes:
    """The filter as a BPF program (bytes), for bubblewrap's ``--seccomp``. Raises ``OSError`` when libseccomp is
    missing."""
    with tempfile.TemporaryFile() as out:
        _build().export_bpf(out)
        out.seek(0)
        return out.read()


def filter_fd() -> int:
    """A fresh file descriptor (inheritable, at offset 0) holding :func:`filter_bpf`; the caller closes it."""
    fd = os.memfd_create("crucible-seccomp", 0)
    os.write(fd, filter_bpf())
    os.lseek(fd, 0, os.SEEK_SET)
    os.set_inheritable(fd, True)
    return fd
