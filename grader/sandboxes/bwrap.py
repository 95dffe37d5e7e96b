"""The local sandbox backend: bubblewrap (Debian package ``bubblewrap``; ``make sandbox`` installs it), for the embedded
stack. Guarantees of :mod:`grader.sandboxes.base`, and how this backend keeps them:

- Network: ``--unshare-net`` (loopback only); the model endpoint's Unix socket is the one host object bound in.
- File system: the host's ``/usr`` (and the ``/bin``, ``/lib`` … links into it) and ``/etc/alternatives`` (Debian's
  command links: ``awk`` → ``gawk``) read-only, fresh ``/proc`` and a read-only ``/dev`` (its devices usable), tmpfs
  ``/tmp`` and ``/dev/shm`` of ``disk_mb`` MiB each,
  the init script and the mounts given; the root itself read-only; nothing else of the host (no rest of ``/etc``, no
  ``/root``, ``/home``, grader data). New PID, IPC, UTS and cgroup namespaces, ``--die-with-parent``.
- Privileges: none. bubblewrap started by root keeps every capability unless told, so every run gets
  ``--cap-drop ALL`` (a verifier ``--cap-add`` setuid and setgid only, for ``as-agent``); bubblewrap sets
  ``no_new_privs``.
- Nothing left behind: the command runs under the sandbox's init inside a new PID namespace; when it ends, the
  namespace's first process exits and the kernel kills every process left in it. On a limit the whole process group
  is killed from outside, and every process still in the run's cgroup.
- Limits: per process ``RLIMIT_CPU``/``RLIMIT_AS``/``RLIMIT_FSIZE`` (the init sets them); where the grader can create
  cgroups (root on a machine with the cgroup file system writable: v1 ``pids``/``memory``/``cpuacct``, or v2) the
  whole sandbox also gets ``pids.max`` = ``processes``, a memory limit of ``memory_mb`` and a CPU-time limit of
  ``cpu_s`` summed over its processes (polled). Without cgroups the number of processes is not limited (root ignores
  ``RLIMIT_NPROC``) and a warning is logged once.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path, PurePosixPath

import structlog

from grader.sandboxes.base import (
    AS_AGENT_SCRIPT,
    AS_AGENT_TARGET,
    INIT_SCRIPT,
    INIT_TARGET,
    SOCKET_TARGET,
    ExecResult,
    LimitHit,
    Limits,
    Mount,
    SandboxUnavailable,
    disk_full,
    give_mounts,
    init_argv,
    run_uid,
    sandbox_env,
    tail,
)
from grader.sandboxes.seccomp import filter_fd
from services.common.processes import process_tag, tag_alive

log = structlog.get_logger("sandbox")

_CGROUP_ROOT = Path("/sys/fs/cgroup")
_POLL_S = 0.05
_CPU_SIGNALS = frozenset({128 + signal.SIGKILL, 128 + signal.SIGXCPU, -signal.SIGKILL, -signal.SIGXCPU})
_FSIZE_SIGNALS = frozenset({128 + signal.SIGXFSZ, -signal.SIGXFSZ})  # a file written past RLIMIT_FSIZE


def _own_cgroup(controller: str) -> str:
    """This process's cgroup path in the v1 hierarchy of ``controller`` (``/`` when not listed)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controller in controllers.split(","):
            return path
    return "/"


@dataclass
class _Cgroups:
    """The run's cgroups (v1: one directory per controller; v2: one directory), created with the limits set."""

    dirs: dict[str, Path]
    v2: bool
    cpu_s: float

    @classmethod
    def create(cls, limits: Limits) -> _Cgroups | None:
        name = f"crucible-{process_tag()}-{uuid.uuid4().hex[:12]}"  # the owner: reap() removes a dead owner's
        dirs: dict[str, Path] = {}
        try:
            if (_CGROUP_ROOT / "cgroup.controllers").exists():  # cgroup v2
                d = _CGROUP_ROOT / _own_cgroup("").lstrip("/") / name
                d.mkdir()
                dirs[""] = d
                (d / "pids.max").write_text(str(limits.processes))
                (d / "memory.max").write_text(str(limits.memory_mb * 1024 * 1024))
                return cls(dirs, True, limits.cpu_s)
            for controller in ("pids", "memory", "cpuacct"):
                d = _CGROUP_ROOT / controller / _own_cgroup(controller).lstrip("/") / name
                d.mkdir()
                dirs[controller] = d
            (dirs["pids"] / "pids.max").write_text(str(limits.processes))
            (dirs["memory"] / "memory.limit_in_bytes").write_text(str(limits.memory_mb * 1024 * 1024))
            return cls(dirs, False, limits.cpu_s)
        except OSError:
            for d in dirs.values():
                _remove(d)
            return None

    def procs_files(self) -> list[str]:
        return [str(d / "cgroup.procs") for d in self.dirs.values()]

    def cpu_used_s(self) -> float:
        try:
            if self.v2:
                for line in (self.dirs[""] / "cpu.stat").read_text().splitlines():
                    if line.startswith("usage_usec"):
                        return int(line.split()[1]) / 1e6
                return 0.0
            return int((self.dirs["cpuacct"] / "cpuacct.usage").read_text()) / 1e9
        except (OSError, ValueError):
            return 0.0

    def hit(self) -> LimitHit | None:
        """The cgroup limit that was reached, if one was: ``memory`` (the out-of-memory killer acted), ``processes`` (a
        fork refused at ``pids.max``)."""
        try:
            if self.v2:
                events = dict(line.split() for line in (self.dirs[""] / "memory.events").read_text().splitlines())
                if int(events.get("oom_kill", 0)):
                    return "memory"
                pid_events = dict(line.split() for line in (self.dirs[""] / "pids.events").read_text().splitlines())
                return "processes" if int(pid_events.get("max", 0)) else None
            oom = dict(line.split() for line in (self.dirs["memory"] / "memory.oom_control").read_text().splitlines() if len(line.split()) == 2)
            if int(oom.get("oom_kill", 0)):
                return "memory"
            events = self.dirs["pids"] / "pids.events"
            if events.exists() and int(dict(line.split() for line in events.read_text().splitlines()).get("max", 0)):
                return "processes"
            current, limit = (self.dirs["pids"] / "pids.current").read_text().strip(), (self.dirs["pids"] / "pids.max").read_text().strip()
            return "processes" if limit.isdigit() and int(current) >= int(limit) else None
        except (OSError, ValueError):
            return None

    def kill_all(self) -> None:
        """Kill every process in the run's cgroups until none is left (a process forking while it is killed is caught
        on the next round)."""
        for _ in range(100):
            pids = {int(p) for f in self.procs_files() for p in _read(Path(f)).split() if p.isdigit()}
            if self.v2 and (self.dirs[""] / "cgroup.kill").exists():
                _write(self.dirs[""] / "cgroup.kill", "1")
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            if not pids:
                return
            time.sleep(0.01)

    def remove(self) -> None:
        self.kill_all()
        for d in self.dirs.values():
            _remove(d)


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _write(path: Path, text: str) -> None:
    try:
        path.write_text(text)
    except OSError:
        pass


def _remove(d: Path) -> None:
    for _ in range(50):
        try:
            d.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.02)


def _system_binds() -> list[str]:
    """``/usr`` read-only and the top-level links (or directories) into it, as the host has them."""
    argv = ["--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64"):
        if os.path.islink(top):
            argv += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            argv += ["--ro-bind", top, top]
    if os.path.isdir("/etc/alternatives"):  # Debian's command links (awk -> gawk, …) go through it
        argv += ["--perms", "0755", "--dir", "/etc", "--ro-bind", "/etc/alternatives", "/etc/alternatives"]  # /etc searchable: git looks for /etc/gitconfig
    return argv


_PROC_READ_ONLY = ("sys", "sysrq-trigger", "irq", "bus", "fs")
_PROC_HIDDEN = ("kcore", "keys", "timer_list", "sched_debug", "latency_stats")


def _proc_covers() -> list[str]:
    """Over the sandbox's fresh ``/proc``: the kernel's settings and triggers read-only (``/proc/sys`` is the host's,
    bound read-only: bubblewrap binds sources from the host, so its network settings read as the host's), and what
    tells of the host's kernel memory, keys and timers hidden (``/dev/null``), as Docker's runtime does."""
    argv: list[str] = []
    for name in _PROC_READ_ONLY:
        argv += ["--ro-bind-try", f"/proc/{name}", f"/proc/{name}"]
    for name in _PROC_HIDDEN:
        if os.path.exists(f"/proc/{name}"):
            argv += ["--ro-bind", "/dev/null", f"/proc/{name}"]
    return argv


@lru_cache(maxsize=4)
def _refusal(bwrap: str) -> str | None:
    """Why bubblewrap cannot make a sandbox on this host at all (e.g. a container whose seccomp profile refuses it the
    namespaces), from one empty run with the namespaces every run gets; ``None`` when it can. Checked once per
    process, so that such a host raises ``SandboxUnavailable`` instead of every command reading as failed."""
    probe = subprocess.run([bwrap, *_system_binds(), "--proc", "/proc", "--dev", "/dev", "--unshare-net", "--unshare-pid", "--unshare-ipc",
                            "--unshare-uts", "--die-with-parent", "--", "/bin/true"], capture_output=True, env={"PATH": "/usr/bin:/bin"}, timeout=60)
    return None if probe.returncode == 0 else (probe.stderr.decode(errors="replace").strip()[-300:] or f"exit {probe.returncode}")


@lru_cache(maxsize=1)
def _warn_without_cgroups() -> None:
    log.warning("cgroups cannot be created here: sandboxes get per-process limits only (the number of processes is not limited)")


def _run_cgroups() -> list[Path]:
    """Every run cgroup (``crucible-<pid>.<start>-<id>``) under this process's own cgroups."""
    if (_CGROUP_ROOT / "cgroup.controllers").exists():
        parents = [_CGROUP_ROOT / _own_cgroup("").lstrip("/")]
    else:
        parents = [_CGROUP_ROOT / c / _own_cgroup(c).lstrip("/") for c in ("pids", "memory", "cpuacct")]
    return [d for parent in parents if parent.is_dir() for d in parent.glob("crucible-*-*") if d.is_dir()]


class BubblewrapSandbox:
    """The bubblewrap backend (see the module docstring)."""

    name = "bwrap"

    def reap(self) -> int:
        """Kill what is left in, and remove, the run cgroups of grader processes on this host that are gone."""
        reaped = 0
        for d in _run_cgroups():
            if tag_alive(d.name.split("-")[1]):
                continue
            for p in _read(d / "cgroup.procs").split():
                try:
                    os.kill(int(p), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
            _remove(d)
            reaped += 1
        return reaped

    def run(self, argv: Sequence[str], *, mounts: Sequence[Mount], cwd: str, env: Mapping[str, str], limits: Limits,
            stdin: bytes = b"", model_socket: Path | None = None, agent_user: bool = False) -> ExecResult:
        bwrap = shutil.which("bwrap")
        if bwrap is None:
            raise SandboxUnavailable("bubblewrap (bwrap) is not installed: `make sandbox` installs it")
        refusal = _refusal(bwrap)
        if refusal:
            raise SandboxUnavailable(f"bubblewrap cannot make sandboxes here: {refusal}")
        size = str(limits.disk_mb * 1024 * 1024)
        uid = run_uid(agent_user)
        give_mounts(mounts, uid)
        args = [bwrap, *_system_binds(), "--proc", "/proc", *_proc_covers(), "--dev", "/dev", "--perms", "1777", "--size", size, "--tmpfs", "/dev/shm",
                "--perms", "1777", "--size", size, "--tmpfs", "/tmp",
                "--dir", "/run/crucible", "--ro-bind", str(INIT_SCRIPT), INIT_TARGET]
        if model_socket is not None:
            args += ["--ro-bind", str(model_socket), SOCKET_TARGET]  # read-only: connectable, but no chmod or unlink of it
        for m in mounts:
            for parent in reversed(PurePosixPath(m.target).parents[:-1]):  # bubblewrap would make a missing one 0700: the agent user could not reach the mount
                args += ["--perms", "0755", "--dir", str(parent)]
            args += ["--bind" if m.writable else "--ro-bind", str(m.source), m.target]
        if agent_user:
            args += ["--ro-bind", str(AS_AGENT_SCRIPT), AS_AGENT_TARGET]
        # bubblewrap run by root keeps every capability unless told otherwise: drop them all but setuid/setgid, which the
        # init needs to become the run's user (and a verifier, root, to run agent code through as-agent)
        args += ["--cap-drop", "ALL", *(["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"] if uid is not None else [])]
        args += ["--remount-ro", "/", "--remount-ro", "/dev", "--chdir", cwd, "--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
                 "--die-with-parent", "--new-session", "--clearenv"]
        for key, value in sandbox_env(env).items():
            args += ["--setenv", key, value]
        seccomp_fd = filter_fd()
        args += ["--seccomp", str(seccomp_fd), "--", *init_argv(argv, limits, model_socket, uid)]
        cgroups = _Cgroups.create(limits)
        if cgroups is None:
            _warn_without_cgroups()
        else:  # the launcher joins the run's cgroups before it becomes bwrap, so nothing it starts escapes them
            files = cgroups.procs_files()
            args = ["/bin/sh", "-c", 'n=$1; shift; i=0; while [ $i -lt "$n" ]; do echo $$ > "$1" || exit 125; shift; i=$((i+1)); done; exec "$@"',
                    "sh", str(len(files)), *files, *args]
        try:
            return self._supervise(args, stdin, limits, cgroups, mounts, pass_fds=(seccomp_fd,))
        finally:
            os.close(seccomp_fd)
            if cgroups is not None:
                cgroups.remove()

    def _supervise(self, args: list[str], stdin: bytes, limits: Limits, cgroups: _Cgroups | None, mounts: Sequence[Mount],
                   pass_fds: Sequence[int]) -> ExecResult:
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, tempfile.TemporaryFile() as inp:
            inp.write(stdin)
            inp.seek(0)
            started = time.monotonic()
            try:
                proc = subprocess.Popen(args, stdin=inp, stdout=out, stderr=err, start_new_session=True, env={"PATH": "/usr/bin:/bin"},
                                        pass_fds=pass_fds)
            except OSError as exc:
                raise SandboxUnavailable(f"bubblewrap cannot start: {exc}") from exc
            killed: LimitHit | None = None
            writable = [m.source for m in mounts if m.writable]
            filled = False  # a workspace seen full while the run went on (files held open and unlinked are freed at its end)
            while proc.poll() is None:
                filled = filled or any(disk_full(p) for p in writable)
                if time.monotonic() - started > limits.wall_s:
                    killed = "wall"
                elif cgroups is not None and cgroups.cpu_used_s() > limits.cpu_s:
                    killed = "cpu"
                if killed:
                    break
                time.sleep(_POLL_S)
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            if cgroups is not None:
                cgroups.kill_all()
            status = proc.wait()
            elapsed = time.monotonic() - started
            hit = cgroups.hit() if cgroups is not None else None
            if hit is None and (filled or any(disk_full(p) for p in writable)):
                hit = "disk"
            limit = hit or killed or ("cpu" if status in _CPU_SIGNALS else "disk" if status in _FSIZE_SIGNALS else None)
            out.seek(0)
            err.seek(0)
            return ExecResult(exit_code=status, limit=limit, stdout=tail(out.read()), stderr=tail(err.read()), elapsed_s=elapsed, backend=self.name)
