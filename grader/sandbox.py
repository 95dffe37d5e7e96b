"""Run an untrusted Python program in a throw-away working directory with no network and CPU, memory and time limits.

Two isolations; :func:`run_python` uses the best one this machine has and says which in ``SandboxResult.isolation``:

- ``"bwrap"`` (bubblewrap, Debian package ``bubblewrap``; ``make sandbox`` installs it), used when ``bwrap`` is
  on ``PATH`` and a probe run succeeds (checked once per process). New network namespace (loopback only, no
  route out), new PID, IPC and UTS namespaces, no capabilities, killed with its parent. The file system is
  ``/usr`` and the Python installation read-only, a fresh ``/proc``, ``/dev`` and tmpfs ``/tmp``, and the
  work directory read-write at ``/sandbox`` (the current directory); nothing else of the host is visible.
- ``"rlimits"`` (fallback): a plain subprocess in the work directory. **It has network** and sees the host
  file system with the grader's permissions; only the limits below and an environment without proxies or
  credentials (``PATH``, ``HOME``, ``LANG`` only) apply.

Limits in both, set by a few lines of Python run in the sandboxed interpreter just before the program (not by
``preexec_fn``, which is unsafe in the grader's threads):

- **CPU time** ``cpu_s``: the program's own CPU seconds (user + system, all its threads together), as
  ``RLIMIT_CPU`` with soft = hard, so the kernel sends ``SIGKILL`` when it is reached. The boot code reads the CPU
  the interpreter has used so far (``getrusage(RUSAGE_SELF)``: bwrap's set-up in that process and Python's
  start-up) and sets the limit to that plus ``cpu_s``, rounded up to the whole second the kernel counts in: the
  program (from reading ``main.py`` on) gets at least ``cpu_s`` and less than ``cpu_s + 1`` CPU seconds of its own,
  however long start-up took.
  CPU time, unlike wall-clock time, does not grow when the machine is busy, so a verdict does not depend on how
  many programs run at once. A process the program starts inherits the limit and counts its own CPU from zero.
- **Wall-clock time** ``wall_s`` (default :func:`wall_limit_s`: ``max(30 s, 10 × cpu_s)``), a backstop for
  programs that hang without using CPU (sleeping, blocked, deadlocked): the whole process group is killed. It is
  long on purpose: a program within its CPU limit reaches it only if it got less than a tenth of a core on
  average (e.g. 3 CPU-seconds of work behind more than 10 busy processes per core; the grader runs up to
  ``scoring_concurrency`` programs per evaluation at once), or if start-up alone took 30 s. The price: an answer
  that sleeps holds one scoring thread for that long.
- ``RLIMIT_AS`` = ``memory_mb`` MiB, ``RLIMIT_FSIZE`` = 16 MiB per file written (stdout and stderr included), no
  core files.
- Processes: ``RLIMIT_NPROC`` counts all processes of the user, not the sandbox's, and root ignores it, so it is
  set (to 0: no new processes or threads) only in the fallback and only for a non-root grader. Under bwrap
  whatever the program starts lives in its PID namespace, which dies with the program's process (bwrap's init
  exits with it) and with the wall-clock kill. In both, the process group is killed when the program ends, so
  a child it left running does not outlive the run (in the fallback, one that left the group with ``setsid``
  does). Under bwrap the program has no capabilities; in the fallback under a grader with ``CAP_SYS_RESOURCE``
  (root outside a container) it can raise its own limits, and only the wall-clock limit holds.

The program runs as ``main.py`` in the work directory with ``python -I -B`` (isolated mode: no user site,
no ``PYTHON*`` variables, no bytecode written), stdin ``/dev/null``; the directory is deleted afterwards.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import IO, Literal

import structlog

_PYTHON = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
_FSIZE_BYTES = 16 * 1024 * 1024
_TAIL_BYTES = 4096
_PROBE_LIMIT_S = 30.0
_SANDBOX_DIR = "/sandbox"
_WALL_FLOOR_S = 30.0
_WALL_PER_CPU_S = 10.0
# how a process killed by the CPU limit ends: by the signal itself, or under bwrap with its exit status 128 + signal
_CPU_KILLS = frozenset(status for sig in (signal.SIGKILL, signal.SIGXCPU) for status in (-sig, 128 + sig))

# Run by the sandboxed interpreter before the program: argv = cpu_s, memory_bytes, fsize_bytes, nproc (-1: leave).
# The CPU limit is set last, from the CPU this process has used so far, so start-up is not the program's.
_BOOT = """\
import math, resource, runpy, sys
cpu_s, (mem, fsize, nproc) = float(sys.argv[1]), map(int, sys.argv[2:5])
for limit, value in ((resource.RLIMIT_AS, mem), (resource.RLIMIT_FSIZE, fsize), (resource.RLIMIT_CORE, 0)):
    resource.setrlimit(limit, (value, value))
if nproc >= 0:
    resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
sys.argv = ["main.py"]
usage = resource.getrusage(resource.RUSAGE_SELF)
cpu = math.ceil(usage.ru_utime + usage.ru_stime + cpu_s)
resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
runpy.run_path("main.py", run_name="__main__")
"""


def wall_limit_s(cpu_s: float) -> float:
    """The default wall-clock backstop for a CPU limit of ``cpu_s`` seconds: ``max(30, 10 * cpu_s)`` seconds
    (the module docstring says why)."""
    return max(_WALL_FLOOR_S, _WALL_PER_CPU_S * cpu_s)


@dataclass(frozen=True)
class SandboxResult:
    """How a run ended. ``exit_code``: the process's status (negative: killed by that signal, e.g. ``-9``; under
    bwrap a program killed by signal ``n`` exits ``128 + n``); ``limit``: ``"wall"`` if the wall-clock limit
    killed it, ``"cpu"`` if it was killed by ``SIGKILL`` or ``SIGXCPU`` before (the CPU limit's signals; a
    program that sends itself one of them, or one the kernel's out-of-memory killer ends, reads the same), else
    ``None``; ``*_tail``: the last 4 KiB of each stream (UTF-8, undecodable bytes replaced); ``isolation``:
    ``"bwrap"`` or ``"rlimits"``; ``elapsed_s``: wall-clock seconds from launch to exit, start-up included."""

    exit_code: int
    limit: Literal["cpu", "wall"] | None
    stdout_tail: str
    stderr_tail: str
    isolation: str
    elapsed_s: float


def _bwrap_argv(work: Path) -> list[str]:
    """bubblewrap arguments that show ``work`` at ``/sandbox`` and the Python installation read-only."""
    argv = ["bwrap", "--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64"):
        if os.path.islink(top):
            argv += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            argv += ["--ro-bind", top, top]
    prefix = os.path.realpath(sys.base_prefix)
    if not prefix.startswith("/usr/"):
        argv += ["--ro-bind", prefix, prefix]
    # bubblewrap run by root keeps every capability unless told otherwise: --cap-drop ALL
    return argv + ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--bind", str(work), _SANDBOX_DIR, "--chdir", _SANDBOX_DIR,
                   "--cap-drop", "ALL", "--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
                   "--die-with-parent", "--"]


def _run(work: Path, isolation: str, cpu_s: float, wall_s: float, memory_mb: int,
         stdout: int | IO[bytes], stderr: int | IO[bytes]) -> tuple[int, bool]:
    """Run ``work/main.py``; returns (exit status, whether the wall-clock limit killed it). Whatever is left of the
    process group when the program ends is killed. Raises ``OSError`` if the launcher cannot be started."""
    nproc = 0 if isolation == "rlimits" and os.geteuid() != 0 else -1
    python = [_PYTHON, "-I", "-B", "-c", _BOOT, repr(cpu_s), str(memory_mb * 1024 * 1024), str(_FSIZE_BYTES), str(nproc)]
    home = _SANDBOX_DIR if isolation == "bwrap" else str(work)
    argv = _bwrap_argv(work) + python if isolation == "bwrap" else python
    proc = subprocess.Popen(argv, cwd=work, stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr, start_new_session=True,
                            env={"PATH": "/usr/bin:/bin", "HOME": home, "LANG": "C.UTF-8"})
    deadline, delay, wall = time.monotonic() + wall_s, 0.0005, False
    # Wait without reaping (WNOWAIT): while the leader is not reaped, its pid is the group's, and killpg below
    # reaches the program's leftovers and nothing else.
    while os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
        left = deadline - time.monotonic()
        if left <= 0:
            wall = True
            break
        time.sleep(min(delay, left))
        delay = min(2 * delay, 0.05)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return proc.wait(), wall


@lru_cache(maxsize=1)
def available_isolation() -> str:
    """``"bwrap"`` if ``bwrap`` is on ``PATH`` and runs a trivial program here, else ``"rlimits"`` (cached; the
    fallback is logged once as a warning, since it leaves the network reachable)."""
    isolation = _probe()
    if isolation == "rlimits":
        structlog.get_logger("sandbox").warning("bubblewrap is missing or cannot run here: sandboxed programs get resource limits only, "
                                                "with the network reachable", bwrap=shutil.which("bwrap"))
    return isolation


def _probe() -> str:
    if shutil.which("bwrap") is None:
        return "rlimits"
    with tempfile.TemporaryDirectory(prefix="crucible-sandbox-") as root:
        work = Path(root)
        (work / "main.py").write_text("pass\n")
        try:
            status, wall = _run(work, "bwrap", _PROBE_LIMIT_S, _PROBE_LIMIT_S, 256, subprocess.DEVNULL, subprocess.DEVNULL)
        except OSError:
            return "rlimits"
    return "bwrap" if status == 0 and not wall else "rlimits"


def _tail(path: Path) -> str:
    with path.open("rb") as f:
        f.seek(max(0, path.stat().st_size - _TAIL_BYTES))
        return f.read().decode("utf-8", errors="replace")


def run_python(source: str, *, cpu_s: float, memory_mb: int, wall_s: float | None = None) -> SandboxResult:
    """Run ``source`` (a Python program) in a fresh sandbox: at most ``cpu_s`` CPU seconds of its own (> 0, start-up
    not counted; see the module docstring for the rounding), ``memory_mb`` MiB of address space, and ``wall_s``
    wall-clock seconds from launch (default :func:`wall_limit_s` of ``cpu_s``). Never raises for anything the
    program does."""
    isolation = available_isolation()
    wall_s = wall_limit_s(cpu_s) if wall_s is None else wall_s
    with tempfile.TemporaryDirectory(prefix="crucible-sandbox-") as root:
        work, out, err = Path(root, "work"), Path(root, "stdout"), Path(root, "stderr")
        work.mkdir()
        (work / "main.py").write_text(source, encoding="utf-8")
        started = time.monotonic()
        with out.open("wb") as stdout, err.open("wb") as stderr:
            status, wall = _run(work, isolation, cpu_s, wall_s, memory_mb, stdout, stderr)
        limit = "wall" if wall else "cpu" if status in _CPU_KILLS else None
        return SandboxResult(exit_code=status, limit=limit, stdout_tail=_tail(out), stderr_tail=_tail(err),
                             isolation=isolation, elapsed_s=time.monotonic() - started)
