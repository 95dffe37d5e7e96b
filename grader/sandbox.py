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

Limits in both: ``RLIMIT_CPU`` = ``ceil(timeout_s) + 1`` s (a backstop), ``RLIMIT_AS`` = ``memory_mb`` MiB,
``RLIMIT_FSIZE`` = 16 MiB per file written (stdout and stderr included), no core files, and a wall-clock
``timeout_s`` after which the whole process group is killed. The limits are set by a few lines of Python run
in the sandboxed interpreter before the program (not by ``preexec_fn``, which is unsafe in the grader's
threads). ``RLIMIT_NPROC`` counts all processes of the user, not the sandbox's, and root ignores it, so it is
set (to 0: no new processes or threads) only in the fallback and only for a non-root grader; under bwrap a
fork bomb is bounded by the PID namespace, which dies with the wall-clock kill.

The program runs as ``main.py`` in the work directory with ``python -I -B`` (isolated mode: no user site,
no ``PYTHON*`` variables, no bytecode written), stdin ``/dev/null``; the directory is deleted afterwards.
"""

from __future__ import annotations

import math
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
from typing import IO

import structlog

_PYTHON = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
_FSIZE_BYTES = 16 * 1024 * 1024
_TAIL_BYTES = 4096
_PROBE_TIMEOUT_S = 30.0
_SANDBOX_DIR = "/sandbox"

# Run by the sandboxed interpreter before the program: argv = cpu_s, memory_bytes, fsize_bytes, nproc (-1: leave).
_BOOT = """\
import resource, runpy, sys
cpu, mem, fsize, nproc = map(int, sys.argv[1:5])
for limit, value in ((resource.RLIMIT_CPU, cpu), (resource.RLIMIT_AS, mem), (resource.RLIMIT_FSIZE, fsize), (resource.RLIMIT_CORE, 0)):
    resource.setrlimit(limit, (value, value))
if nproc >= 0:
    resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
sys.argv = ["main.py"]
runpy.run_path("main.py", run_name="__main__")
"""


@dataclass(frozen=True)
class SandboxResult:
    """How a run ended. ``exit_code``: the process's status (negative: killed by that signal, e.g. ``-9``
    after a timeout); ``timed_out``: the wall-clock limit was reached; ``*_tail``: the last 4 KiB of each
    stream (UTF-8, undecodable bytes replaced); ``isolation``: ``"bwrap"`` or ``"rlimits"``; ``elapsed_s``:
    wall-clock seconds including interpreter start."""

    exit_code: int
    timed_out: bool
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
    return argv + ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--bind", str(work), _SANDBOX_DIR, "--chdir", _SANDBOX_DIR,
                   "--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--die-with-parent", "--"]


def _run(work: Path, isolation: str, timeout_s: float, memory_mb: int, stdout: int | IO[bytes], stderr: int | IO[bytes]) -> tuple[int, bool]:
    """Run ``work/main.py``; returns (exit status, whether the wall-clock limit killed it). Raises ``OSError``
    if the launcher cannot be started."""
    nproc = 0 if isolation == "rlimits" and os.geteuid() != 0 else -1
    python = [_PYTHON, "-I", "-B", "-c", _BOOT, str(math.ceil(timeout_s) + 1), str(memory_mb * 1024 * 1024), str(_FSIZE_BYTES), str(nproc)]
    home = _SANDBOX_DIR if isolation == "bwrap" else str(work)
    argv = _bwrap_argv(work) + python if isolation == "bwrap" else python
    proc = subprocess.Popen(argv, cwd=work, stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr, start_new_session=True,
                            env={"PATH": "/usr/bin:/bin", "HOME": home, "LANG": "C.UTF-8"})
    try:
        return proc.wait(timeout=timeout_s), False
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        return proc.wait(), True


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
            status, timed_out = _run(work, "bwrap", _PROBE_TIMEOUT_S, 256, subprocess.DEVNULL, subprocess.DEVNULL)
        except OSError:
            return "rlimits"
    return "bwrap" if status == 0 and not timed_out else "rlimits"


def _tail(path: Path) -> str:
    with path.open("rb") as f:
        f.seek(max(0, path.stat().st_size - _TAIL_BYTES))
        return f.read().decode("utf-8", errors="replace")


def run_python(source: str, *, timeout_s: float, memory_mb: int) -> SandboxResult:
    """Run ``source`` (a Python program) in a fresh sandbox; wall-clock limit ``timeout_s`` seconds (> 0),
    address-space limit ``memory_mb`` MiB. Never raises for anything the program does."""
    isolation = available_isolation()
    with tempfile.TemporaryDirectory(prefix="crucible-sandbox-") as root:
        work, out, err = Path(root, "work"), Path(root, "stdout"), Path(root, "stderr")
        work.mkdir()
        (work / "main.py").write_text(source, encoding="utf-8")
        started = time.monotonic()
        with out.open("wb") as stdout, err.open("wb") as stderr:
            status, timed_out = _run(work, isolation, timeout_s, memory_mb, stdout, stderr)
        return SandboxResult(exit_code=status, timed_out=timed_out, stdout_tail=_tail(out), stderr_tail=_tail(err),
                             isolation=isolation, elapsed_s=time.monotonic() - started)
