"""What every sandbox backend provides: the :class:`Sandbox` protocol, the :class:`Limits` a run gets, the
:class:`Mount` s it sees, the :class:`ExecResult` it ends with, and the :func:`workspace` a rollout's runs share.

A sandbox runs one untrusted command (a harness, a task's set-up, a verifier) with:

- **No way out but the model.** A network namespace of its own with loopback only. With ``model_socket``, the
  sandbox's init (:mod:`grader.sandboxes.init`) forwards ``127.0.0.1:MODEL_PORT`` inside to that Unix socket outside,
  the rollout's own socket of the model endpoint (:mod:`grader.model_endpoint`), bound in read-only and connectable
  by the init alone (mode 0600); nothing else is reachable: not the grader, the ledger, the test store, nor the
  internet.
- **No privileges.** Where the grader is root, every command but a task's verifier runs as the unprivileged
  :data:`AGENT_UID` (the sandbox's init, root, switches to it before the command starts), and what it may write (the
  writable mounts) is made that uid's first, so a setuid file it leaves is the agent user's, and its writes to the
  kernel's interfaces (``/proc/sys``) are refused. A verifier runs as root of the sandbox without capabilities but
  setuid and setgid (to run the agent's code through :data:`AS_AGENT_TARGET`), over mounts made root's, so agent code
  cannot write its reward. ``no_new_privs`` is set, and a seccomp filter refuses what Docker's default profile refuses
  a container without capabilities (:mod:`grader.sandboxes.seccomp`: no mounts, no new namespaces, no kernel keyring,
  modules, BPF or ``perf_event_open``); ``/proc/sys`` and the kernel's other writable ``/proc`` files are read-only.
- **Only what is mounted.** The sandbox image's userland read-only (``/usr``; for bubblewrap the host's, for Docker
  the image's), a read-only root, a fresh ``/tmp`` of ``disk_mb`` MiB, the mounts given (e.g. the workspace at
  ``/app``), nothing else of the host.
- **Limits** (:class:`Limits`): wall time (the whole sandbox is killed), CPU seconds, memory, processes, disk (the
  workspace is a size-limited tmpfs where the machine allows one) and the size of any file written.
- **Nothing left behind.** Every process the command started is killed when the command ends or a limit is reached
  (a harness that forks a sleeper and exits leaves nothing running).

Backends (:mod:`grader.sandboxes.bwrap`, :mod:`grader.sandboxes.docker`) are chosen by the grader setting
``sandbox_backend``; :func:`grader.sandboxes.get_sandbox` returns the configured one.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

import structlog

from services.common.processes import process_tag, tag_alive

log = structlog.get_logger("sandbox")

INIT_SCRIPT = Path(__file__).with_name("init.py")
"""The sandbox's init (host path); every backend mounts it at :data:`INIT_TARGET`."""
INIT_TARGET = "/run/crucible/init.py"
AS_AGENT_SCRIPT = Path(__file__).with_name("as_agent.sh")
AS_AGENT_TARGET = "/run/crucible/as-agent"
"""In a run with ``agent_user``: ``/run/crucible/as-agent COMMAND…`` runs COMMAND as the unprivileged agent user."""
AGENT_UID = 65534
"""The unprivileged uid (and gid) harnesses, set-ups, programs and agent code run as, where the grader is root."""
SOCKET_TARGET = "/run/crucible/model.sock"
MODEL_PORT = 8000
"""The port the model endpoint answers on inside a sandbox: ``OPENAI_BASE_URL=http://127.0.0.1:8000/v1``."""
SANDBOX_PYTHON = "/usr/bin/python3"
SANDBOX_PATH = "/usr/local/bin:/usr/bin:/bin"
TAIL_BYTES = 16 * 1024
INIT_GRACE_S = 10.0
"""Seconds past the wall limit at which the sandbox's init ends the sandbox itself (the backend kills it at the limit;
the init's own limit bounds a sandbox whose grader died)."""

WORKSPACE_PREFIX = "crucible-ws-{owner}-"
"""The name of a directory a rollout's runs use on the host (a workspace, a Docker run's staged files), with its owner's
:func:`process_tag`: :func:`reap_workspaces` removes those of dead owners."""

LimitHit = Literal["wall", "cpu", "memory", "processes", "disk"]


@dataclass(frozen=True)
class Limits:
    """Per-run limits. ``wall_s``: seconds from launch to kill; ``cpu_s``: CPU seconds of each process (the kernel
    kills a process at its limit; the bubblewrap backend also kills the whole sandbox when all its processes together
    pass it, where cgroups allow); ``memory_mb``: MiB of address space per process, and of resident memory for the
    whole sandbox where cgroups allow; ``processes``: processes and threads alive at once; ``disk_mb``: MiB the
    workspace holds; ``file_mb``: MiB of any one file written."""

    wall_s: float = 300.0
    cpu_s: float = 300.0
    memory_mb: int = 1024
    processes: int = 64
    disk_mb: int = 256
    file_mb: int = 64


@dataclass(frozen=True)
class Mount:
    """A host path ``source`` shown at the absolute sandbox path ``target``, read-only unless ``writable``."""

    source: Path
    target: str
    writable: bool = False


@dataclass(frozen=True)
class ExecResult:
    """How a run ended. ``exit_code``: the command's status (``128 + n`` when signal ``n`` ended it; ``-9`` when the
    sandbox was killed from outside); ``limit``: the limit that ended it, when one did (best effort: a process killed
    by the kernel for CPU reads as ``"cpu"``); ``stdout``/``stderr``: the last 16 KiB of each stream (UTF-8,
    undecodable bytes replaced); ``elapsed_s``: wall-clock seconds from launch to the end; ``backend``: the backend's
    name."""

    exit_code: int
    limit: LimitHit | None
    stdout: str
    stderr: str
    elapsed_s: float
    backend: str

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and self.limit is None


class Sandbox(Protocol):
    """One sandbox backend."""

    name: str

    def run(self, argv: Sequence[str], *, mounts: Sequence[Mount], cwd: str, env: Mapping[str, str], limits: Limits,
            stdin: bytes = b"", model_socket: Path | None = None, agent_user: bool = False) -> ExecResult:
        """Run ``argv`` in a fresh sandbox that sees ``mounts``, with working directory ``cwd`` (a sandbox path), the
        environment ``env`` only (plus ``PATH``, ``HOME=/tmp`` and ``LANG`` where not given, and ``PWD``), ``stdin`` as
        its input, and ``model_socket`` (a Unix socket on the host) reachable as ``127.0.0.1:MODEL_PORT`` inside.

        The command runs as :data:`AGENT_UID` (:func:`run_uid`) with no capabilities; with ``agent_user`` (a task's
        verifier) as root of the sandbox keeping only setuid and setgid, for :data:`AS_AGENT_TARGET` to run what the
        agent wrote as uid :data:`AGENT_UID`, which cannot write what root owns (the verifier's reward). The writable
        mounts are made the run's user's first (:func:`give_mounts`). Never raises for anything the
        command does; raises ``SandboxUnavailable`` when the backend cannot start a sandbox at all."""


    def reap(self) -> int:
        """Remove what runs of a grader process that died left behind on this host (containers, cgroups), never a live
        process's; returns how many were removed. Called when an eval worker starts."""


def owner() -> str:
    """This process as the owner of its sandboxes: ``<host>:<pid>.<start>`` (:func:`process_tag`; a sandbox's name,
    label or workspace carries it)."""
    return f"{socket.gethostname()}:{process_tag()}"


class SandboxUnavailable(RuntimeError):
    """The backend cannot start a sandbox on this machine (bubblewrap missing, Docker daemon away)."""


def tail(data: bytes) -> str:
    """The last :data:`TAIL_BYTES` of ``data`` as text."""
    return data[-TAIL_BYTES:].decode("utf-8", errors="replace")


def run_uid(agent_user: bool) -> int | None:
    """The uid a run's command runs as: ``0`` for a verifier (``agent_user``), :data:`AGENT_UID` for any other, where
    the grader is root; ``None`` (the grader's own uid, already unprivileged) elsewhere."""
    if os.geteuid() != 0:
        return None
    return 0 if agent_user else AGENT_UID


def give_mounts(mounts: Sequence[Mount], uid: int | None) -> None:
    """Make the writable mounts' sources, and everything under them, ``uid``'s (owner and group; symbolic links
    themselves, never what they point to), so the run's user may write them and no other run's user may. A verifier's
    (``uid`` 0) are root's again with no group or other write permission and no set-user-ID or set-group-ID bit, so
    agent code it runs cannot write there, whatever modes or ACLs the harness left. Nothing to do for ``None``."""
    if uid is None:
        return
    for m in mounts:
        if m.writable:
            subprocess.run(["chown", "-R", "-P", "-h", f"{uid}:{uid}", "--", str(m.source)], capture_output=True)
            if uid == 0:  # what an earlier run made writable to all (or granted by an ACL, whose mask this lowers) is not
                subprocess.run(["chmod", "-R", "go-w,ug-s", "--", str(m.source)], capture_output=True)


def init_argv(argv: Sequence[str], limits: Limits, model_socket: Path | None, uid: int | None,
              stages: Sequence[tuple[str, str]] = (), status: str | None = None, seccomp: str | None = None) -> list[str]:
    """The command a backend runs in the sandbox: the init (:mod:`grader.sandboxes.init`) wrapping ``argv``, switching
    to ``uid`` (:func:`run_uid`) for it. With ``stages`` (``(staged source, target)`` sandbox paths) the init copies
    each in and back out, writes how the run ended to ``status``, and ends the command itself at the wall limit (so
    the copy back still happens); otherwise its own wall limit is a little longer than the backend's. ``seccomp``: a
    sandbox path of :func:`grader.sandboxes.seccomp.filter_bpf`'s program, which the init loads first."""
    head = [SANDBOX_PYTHON, "-I", "-B", INIT_TARGET]
    if model_socket is not None:
        head += ["--socket", SOCKET_TARGET, "--port", str(MODEL_PORT)]
    if uid:
        head += ["--user", str(uid)]
    for source, target in stages:
        head += ["--stage", source, target]
    if status is not None:
        head += ["--status", status]
    if seccomp is not None:
        head += ["--seccomp", seccomp]
    wall_s = limits.wall_s if stages else limits.wall_s + INIT_GRACE_S
    return head + ["--cpu-s", repr(limits.cpu_s), "--memory-mb", str(limits.memory_mb), "--fsize-mb", str(limits.file_mb),
                   "--wall-s", repr(wall_s), "--", *argv]


def sandbox_env(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with ``PATH``, ``HOME`` and ``LANG`` defaulted; nothing of the grader's own environment."""
    return {"PATH": SANDBOX_PATH, "HOME": "/tmp", "LANG": "C.UTF-8", **env}


def disk_full(path: Path) -> bool:
    """Whether the file system at ``path`` has no room left (a workspace filled to its size)."""
    try:
        return shutil.disk_usage(path).free < 64 * 1024
    except OSError:
        return False


@contextlib.contextmanager
def workspace(disk_mb: int, root: Path | None = None) -> Iterator[Path]:
    """A fresh, empty directory for one rollout's runs (the rollout keeps its working directory and its copy of the
    harness under it, so both count against ``disk_mb``), removed afterwards. Where the grader may mount (root, or
    ``CAP_SYS_ADMIN``) it is a tmpfs of ``disk_mb`` MiB, so filling it ends in "no space left" for the sandbox and
    nothing for the host; elsewhere a plain directory (only the per-file limit applies)."""
    path = Path(tempfile.mkdtemp(prefix=WORKSPACE_PREFIX.format(owner=process_tag()), dir=root))  # reap_workspaces() removes a dead owner's
    mounted = False
    if os.geteuid() == 0:
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={disk_mb}m,nr_inodes={inodes(disk_mb)},mode=0755,nosuid,nodev", "tmpfs", str(path)],
                                 capture_output=True).returncode == 0
        if not mounted:
            log.warning("the workspace is not size-limited: tmpfs cannot be mounted here", path=str(path))
    try:
        yield path
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(path)], capture_output=True)
        remove_tree(path)


def inodes(disk_mb: int) -> int:
    """The files (inodes) a tmpfs of ``disk_mb`` MiB may hold: 256 per MiB, at least 4,096. A tmpfs does not count short
    symbolic links, directory entries or extended attributes against its size, so without this a run could make
    millions of them (kernel memory; and disk, once a Docker run's workspace is copied back)."""
    return max(disk_mb * 256, 4096)


def reap_workspaces(root: Path | None = None) -> int:
    """Unmount and remove the workspaces (:func:`workspace`) that grader processes on this host left when they died;
    a live process's are never touched. Returns how many were removed."""
    reaped = 0
    for path in Path(root or tempfile.gettempdir()).glob("crucible-ws-*-*"):
        if tag_alive(path.name.split("-")[2]):
            continue
        subprocess.run(["umount", "-l", str(path)], capture_output=True)
        remove_tree(path)
        reaped += 1
    return reaped


def remove_tree(path: Path) -> None:
    """Remove ``path`` and everything under it, however deep (a harness may leave a tree thousands of levels deep, past
    Python's recursion limit) or oddly permissioned; never raises (a leftover is logged)."""
    done = subprocess.run(["rm", "-rf", "--one-file-system", "--", str(path)], capture_output=True)
    if done.returncode != 0 or path.exists():
        log.warning("a sandbox directory could not be removed", path=str(path), error=done.stderr.decode(errors="replace")[-300:])
