"""The container sandbox backend: one Docker container per run, through the Docker SDK for Python, for docker-compose
and Kubernetes deployments. Its image (default ``crucible-sandbox:bookworm``) is built from Debian packages, no registry
needed: ``deploy/images/debootstrap.sh sandbox`` (``deploy/images/ensure-dockerd.sh`` starts the daemon first).
Guarantees of :mod:`grader.sandboxes.base`, and how this backend keeps them:

- Network: ``network_mode="none"`` (loopback only); the model endpoint's Unix socket is bind-mounted at
  :data:`~grader.sandboxes.base.SOCKET_TARGET`, where the init forwards ``127.0.0.1:8000`` to it.
- Paths: the daemon resolves a bind mount's source on its own host, so this backend mounts only paths under the
  grader's temporary directory (``tempfile.gettempdir()``, i.e. ``TMPDIR``), where the workspaces, the model endpoint's
  socket and each run's own directory are. Any other read-only source (the init, the agent-user script, a task's
  tests and set-up: files of the grader's installation) is copied into the run's directory first. A grader running in a
  container beside the host's daemon is given a ``TMPDIR`` at the same path in both (docker-compose.yml's
  ``grader-worker``); on the daemon's own host nothing needs arranging.
- File system: the image's userland with the root file system read-only, a tmpfs ``/tmp`` of ``disk_mb`` MiB
  (executable, as bubblewrap's is), the init script read-only, the read-only mounts given as bind mounts, and each
  writable mount **staged**: its host directory is bound under :data:`STAGE_TARGET` (a directory only root enters) and
  the sandbox sees a tmpfs of ``disk_mb`` MiB at its target, owned by the run's user, which the init fills from the
  host directory before the command and copies back after it (:mod:`grader.sandboxes.init`), so the kernel holds the
  run to its disk limit whatever file system the workspace is on (files unlinked while held open included); nothing
  else of the host. No capabilities (``cap_drop=ALL``; the init keeps setuid and setgid to become
  the run's user, :func:`~grader.sandboxes.base.run_uid`), ``no-new-privileges``, the daemon's default seccomp profile,
  and its read-only and hidden ``/proc`` files. The command runs as :data:`~grader.sandboxes.base.AGENT_UID` (a
  verifier as root without capabilities), as under bubblewrap, over writable mounts made that user's first.
- Stdin: written to a file that is bind-mounted read-only at :data:`STDIN_TARGET`; ``/bin/sh`` opens it as the
  command's standard input and ``exec`` s the init, so the init is still the container's first process. (Attaching to
  the container's stdin would also work, but a socket's half-close through the daemon is fragile; a file is exact.)
- Environment: exactly :func:`~grader.sandboxes.base.sandbox_env`, plus ``PWD`` (the working directory, exported by
  the launching shell, as bubblewrap's ``--chdir`` does); the ``HOSTNAME`` the daemon adds to every container is
  removed unless given.
- Nothing left behind: the init is the container's PID 1; when it exits the kernel kills every process left in the
  container's PID namespace. The container is removed after its output is read, however the run ended.
- Limits: per process ``RLIMIT_CPU``/``RLIMIT_AS``/``RLIMIT_FSIZE`` (the init sets them); for the whole container
  ``mem_limit`` = ``memswap_limit`` = ``memory_mb`` (no swap), ``pids_limit`` = ``processes``, one CPU
  (``nano_cpus``), wall time (a staged run's init ends the command at ``wall_s`` and copies back; the backend kills
  the container :data:`STAGE_GRACE_S` later at the latest), and the CPU seconds of all its processes together, read
  from the daemon's stats stream (one sample a second, so a run may overshoot ``cpu_s`` by about a second). The disk:
  each writable mount's tmpfs of ``disk_mb`` (above). A grader that is not root cannot make the workspace the run's
  user's: its runs bind writable mounts as they are and run as its uid, with no disk limit but the per-file one (a
  warning is logged once). The logs the daemon keeps are capped (:data:`LOG_MAX`), so a flood of output cannot fill
  the host's disk.
- How a run ended: ``"wall"``/``"cpu"`` when the backend killed it (``exit_code`` -9), ``"memory"`` when the kernel's
  out-of-memory killer acted in the container (``State.OOMKilled``), ``"processes"`` when a stats sample found the
  container at ``pids_limit`` (best effort: a fork refused between two samples goes unseen), ``"disk"`` when the init saw a
  staged mount full, ``"cpu"`` when the command died of ``SIGKILL``/``SIGXCPU`` (what ``RLIMIT_CPU`` sends).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shlex
import shutil
import signal
import tempfile
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from functools import lru_cache
from pathlib import Path

import docker
import docker.errors
import docker.types
import requests.exceptions
import structlog
from docker.models.containers import Container

from grader.sandboxes.base import (
    AS_AGENT_SCRIPT,
    AS_AGENT_TARGET,
    INIT_SCRIPT,
    INIT_TARGET,
    SOCKET_TARGET,
    WORKSPACE_PREFIX,
    ExecResult,
    LimitHit,
    Limits,
    Mount,
    SandboxUnavailable,
    disk_full,
    give_mounts,
    init_argv,
    inodes,
    owner,
    run_uid,
    sandbox_env,
    tail,
)
from grader.sandboxes.seccomp import filter_bpf
from services.common.processes import owner_alive, process_tag

log = structlog.get_logger("sandbox")

DEFAULT_IMAGE = "crucible-sandbox:bookworm"
STDIN_TARGET = "/run/crucible/stdin"
LABEL = "crucible.sandbox"
OWNER_LABEL = "crucible.owner"  # <host>:<pid> of the grader process that runs it (reap() removes a dead owner's)
"""Every sandbox container carries this label (``docker ps -a --filter label=crucible.sandbox`` finds any left over)."""
LOG_MAX = {"max-size": "1m", "max-file": "2"}
"""The daemon's json-file log of a run: at most two files of 1 MiB, so at least the last MiB of output is kept."""
_ADDED_ENV = ("HOSTNAME",)
"""Variables the daemon adds to every container's environment; removed unless given."""
STALE_AFTER_S = 600.0
"""A sandbox container stopped this long ago is removed by any worker's :meth:`DockerSandbox.reap`."""
STAGE_TARGET = "/run/crucible/stage"
"""Where a run's writable mounts are staged inside the container (a directory only root enters)."""
SECCOMP_TARGET = "/run/crucible/seccomp.bpf"
STAGE_GRACE_S = 60.0
"""Seconds past the wall limit a staged run has to copy its workspace back before the container is killed."""
_CPU_STATUSES = frozenset({128 + signal.SIGKILL, 128 + signal.SIGXCPU})
_HOW_TO_BUILD = "run deploy/images/ensure-dockerd.sh (starts the daemon) and deploy/images/debootstrap.sh sandbox (builds the image)"


class _Watch:
    """The container's stats stream, read in a thread: kills the container when its processes together pass ``cpu_s``
    CPU seconds, and notes whether it was ever seen at its process limit."""

    def __init__(self, container: Container, limits: Limits) -> None:
        self.container = container
        self.limits = limits
        self.cpu_exceeded = False
        self.at_process_limit = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"sandbox-stats-{container.short_id}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        try:
            for sample in self.container.stats(stream=True, decode=True):
                if self._stop.is_set():
                    return
                pids = sample.get("pids_stats") or {}
                if pids.get("limit") and pids.get("current", 0) >= pids["limit"]:
                    self.at_process_limit = True
                used_ns = ((sample.get("cpu_stats") or {}).get("cpu_usage") or {}).get("total_usage", 0)
                if used_ns > self.limits.cpu_s * 1e9:
                    self.cpu_exceeded = True
                    _kill(self.container)
                    return
        except (docker.errors.DockerException, requests.exceptions.RequestException, ValueError):
            return  # the container is gone: the run is over


@lru_cache(maxsize=1)
def _warn_unstaged() -> None:
    log.warning("the grader is not root: Docker sandboxes run as its uid over its workspaces as they are (no disk limit but the per-file one)")


def _host_visible(path: Path) -> bool:
    """Whether the daemon sees ``path`` where the grader does: only what is under the grader's temporary directory."""
    return path.resolve().is_relative_to(Path(tempfile.gettempdir()).resolve())


def _stage(source: Path, into: Path) -> Path:
    """A copy of ``source`` (a file or a directory, modes kept) in a fresh directory under ``into``."""
    target = Path(tempfile.mkdtemp(dir=into)) / source.name
    if source.is_dir():
        shutil.copytree(source, target, symlinks=True)
    else:
        shutil.copy2(source, target)
    target.parent.chmod(0o755)
    return target


def _ended_long_ago(container: Container) -> bool:
    """Whether the container stopped more than :data:`STALE_AFTER_S` ago (its owner removes it as soon as it stops)."""
    state = container.attrs.get("State") or {}
    if state.get("Status") not in ("exited", "dead"):
        return False
    try:
        finished = dt.datetime.fromisoformat(state.get("FinishedAt", "")[:19]).replace(tzinfo=dt.UTC)
    except ValueError:
        return False
    return finished.year > 1 and (dt.datetime.now(dt.UTC) - finished).total_seconds() > STALE_AFTER_S


def _kill(container: Container) -> None:
    try:
        container.kill()
    except (docker.errors.NotFound, docker.errors.APIError):
        pass  # it has already stopped


class DockerSandbox:
    """The Docker backend (see the module docstring). ``image``: the sandbox image; ``base_url``: the daemon (default:
    ``DOCKER_HOST`` or the local socket)."""

    name = "docker"

    def __init__(self, image: str = DEFAULT_IMAGE, base_url: str | None = None) -> None:
        self.image = image
        self.base_url = base_url

    def _client(self) -> docker.DockerClient:
        try:
            if self.base_url is not None:
                return docker.DockerClient(base_url=self.base_url, version="auto")
            return docker.from_env(version="auto")
        except docker.errors.DockerException as exc:
            raise SandboxUnavailable(f"the Docker daemon cannot be reached ({exc}): {_HOW_TO_BUILD}") from exc

    def reap(self) -> int:
        """Remove the sandbox containers whose grader process on this host is gone (stopped or still running), and any
        that ended more than :data:`STALE_AFTER_S` ago, whoever started them (an owner in a container that is gone for
        good, whose host name no process has any more, would keep its own forever)."""
        client = self._client()
        try:
            reaped = 0
            for container in client.containers.list(all=True, filters={"label": LABEL}):
                if owner_alive(container.labels.get(OWNER_LABEL, "")) and not _ended_long_ago(container):
                    continue
                try:
                    container.remove(force=True)
                    reaped += 1
                except docker.errors.NotFound:
                    pass
            return reaped
        except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
            raise SandboxUnavailable(f"the Docker daemon cannot be reached ({exc}): {_HOW_TO_BUILD}") from exc
        finally:
            client.close()

    def run(self, argv: Sequence[str], *, mounts: Sequence[Mount], cwd: str, env: Mapping[str, str], limits: Limits,
            stdin: bytes = b"", model_socket: Path | None = None, agent_user: bool = False) -> ExecResult:
        client = self._client()
        try:
            with tempfile.TemporaryDirectory(prefix=WORKSPACE_PREFIX.format(owner=process_tag())) as tmp:  # the run's own files
                run_dir = Path(tmp)
                run_dir.chmod(0o755)
                stdin_file = run_dir / "stdin"
                stdin_file.write_bytes(stdin)
                stdin_file.chmod(0o644)
                return self._run(client, argv, mounts=mounts, cwd=cwd, env=env, limits=limits, stdin_file=stdin_file, model_socket=model_socket,
                                 agent_user=agent_user, run_dir=run_dir)
        finally:
            client.close()

    def _run(self, client: docker.DockerClient, argv: Sequence[str], *, mounts: Sequence[Mount], cwd: str, env: Mapping[str, str],
             limits: Limits, stdin_file: Path, model_socket: Path | None, agent_user: bool, run_dir: Path) -> ExecResult:
        def visible(path: Path) -> Path:  # a read-only source, as the daemon can mount it (a missing one is left for it to refuse)
            return path if not path.exists() or _host_visible(path) else _stage(path, run_dir)

        binds = [docker.types.Mount(INIT_TARGET, str(visible(INIT_SCRIPT)), type="bind", read_only=True),
                 docker.types.Mount(STDIN_TARGET, str(stdin_file), type="bind", read_only=True)]
        if agent_user:
            binds.append(docker.types.Mount(AS_AGENT_TARGET, str(visible(AS_AGENT_SCRIPT)), type="bind", read_only=True))
        if model_socket is not None:
            binds.append(docker.types.Mount(SOCKET_TARGET, str(model_socket), type="bind", read_only=True))  # read-only: no chmod or unlink of it
        uid = run_uid(agent_user)
        give_mounts(mounts, uid)
        tmpfs = {"/tmp": f"rw,exec,nosuid,nodev,size={limits.disk_mb}m,nr_inodes={inodes(limits.disk_mb)},mode=1777"}
        stages: list[tuple[str, str]] = []
        status = None
        if uid is None:  # a grader that is not root cannot make the workspace the run's user's: bound in as it is
            _warn_unstaged()
            binds += [docker.types.Mount(m.target, str(m.source if m.writable else visible(m.source)), type="bind", read_only=not m.writable) for m in mounts]
        else:  # writable mounts: staged into tmpfs of disk_mb (the kernel's limit) under a directory only root enters
            stage_dir = run_dir / "stage"
            stage_dir.mkdir(mode=0o700)
            binds.append(docker.types.Mount(STAGE_TARGET, str(stage_dir), type="bind"))
            for i, m in enumerate(mounts):
                if m.writable:
                    stages.append((f"{STAGE_TARGET}/{i}", m.target))
                    binds.append(docker.types.Mount(f"{STAGE_TARGET}/{i}", str(m.source), type="bind"))
                    tmpfs[m.target] = f"rw,exec,nosuid,nodev,size={limits.disk_mb}m,nr_inodes={inodes(limits.disk_mb)},mode=0755,uid={uid},gid={uid}"
                else:
                    binds.append(docker.types.Mount(m.target, str(visible(m.source)), type="bind", read_only=True))
            status = f"{STAGE_TARGET}/status.json"
        seccomp_file = run_dir / "seccomp.bpf"  # this backend's filter on top of the daemon's profile (which lets io_uring through, say)
        seccomp_file.write_bytes(filter_bpf())
        seccomp_file.chmod(0o644)
        binds.append(docker.types.Mount(SECCOMP_TARGET, str(seccomp_file), type="bind", read_only=True))
        environment = sandbox_env(env)
        unset = " ".join(name for name in _ADDED_ENV if name not in environment)
        prelude = f"unset {unset}; " if unset else ""
        command = ["/bin/sh", "-c", f'{prelude}exec "$@" <{shlex.quote(STDIN_TARGET)}', "sh", *init_argv(argv, limits, model_socket, uid, stages, status, SECCOMP_TARGET)]
        try:
            container = client.containers.create(
                self.image, command, name=f"crucible-sandbox-{uuid.uuid4().hex[:12]}", labels={LABEL: "1", OWNER_LABEL: owner()},
                entrypoint=[], environment=environment, working_dir=cwd, hostname="sandbox",
                user=f"{os.getuid()}:{os.getgid()}" if uid is None else "0:0",  # the init, root, switches to the run's user
                network_mode="none", mounts=binds, read_only=True,
                tmpfs=tmpfs,
                cap_drop=["ALL"], cap_add=None if uid is None else ["SETUID", "SETGID", "KILL"], shm_size=f"{limits.disk_mb}m", security_opt=["no-new-privileges"],
                mem_limit=limits.memory_mb * 1024 * 1024, memswap_limit=limits.memory_mb * 1024 * 1024,
                pids_limit=limits.processes, nano_cpus=1_000_000_000,
                log_config=docker.types.LogConfig(type=docker.types.LogConfig.types.JSON, config=LOG_MAX),
                stdin_open=False, tty=False)
        except docker.errors.ImageNotFound as exc:
            raise SandboxUnavailable(f"the sandbox image {self.image} is missing: {_HOW_TO_BUILD}") from exc
        except docker.errors.APIError as exc:
            if not exc.is_client_error():
                raise SandboxUnavailable(f"the Docker daemon cannot create a container: {exc}") from exc
            return self._refused(exc, 0.0)  # e.g. a mount's source is missing
        except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
            raise SandboxUnavailable(f"the Docker daemon cannot create a container: {exc}") from exc
        try:
            return self._supervise(container, limits, mounts, run_dir / "stage" / "status.json" if stages else None)
        finally:
            try:
                container.remove(force=True)
            except docker.errors.NotFound:
                pass
            except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
                log.warning("a sandbox container could not be removed", container=container.name, error=str(exc))

    def _refused(self, exc: docker.errors.APIError, elapsed_s: float) -> ExecResult:
        """A run the daemon would not start for what it was given (as bubblewrap exits 1 on a missing mount source)."""
        return ExecResult(exit_code=125, limit=None, stdout="", stderr=f"crucible sandbox: the run cannot start: {exc.explanation or exc}",
                          elapsed_s=elapsed_s, backend=self.name)

    def _supervise(self, container: Container, limits: Limits, mounts: Sequence[Mount], status_file: Path | None) -> ExecResult:
        started = time.monotonic()
        try:
            container.start()
        except docker.errors.APIError as exc:  # the runtime refused what was asked (a mount it cannot make): the run fails
            return self._refused(exc, time.monotonic() - started)
        except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
            raise SandboxUnavailable(f"the Docker daemon cannot start a container: {exc}") from exc
        watch = _Watch(container, limits)
        watch.start()
        killed: LimitHit | None = None
        wall_s = limits.wall_s + (STAGE_GRACE_S if status_file else 0.0)  # a staged run's init ends it at wall_s and copies back
        try:
            try:
                status = container.wait(timeout=max(wall_s - (time.monotonic() - started), 0.001))["StatusCode"]
            except requests.exceptions.RequestException:
                if time.monotonic() - started < wall_s:  # not the wait timing out: the daemon went away
                    raise
                killed = "wall"
                _kill(container)
                status = container.wait(timeout=60)["StatusCode"]
        except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
            watch.stop()
            raise SandboxUnavailable(f"the Docker daemon stopped answering during a run: {exc}") from exc
        elapsed = time.monotonic() - started
        watch.stop()
        if killed is None and watch.cpu_exceeded:
            killed = "cpu"
        staged = _staged_limit(status_file) if status_file and killed is None else None
        if staged == "wall":
            killed = "wall"
        container.reload()
        hit: LimitHit | None = None
        if container.attrs["State"].get("OOMKilled"):
            hit = "memory"
        elif watch.at_process_limit:
            hit = "processes"
        elif staged == "disk" or (status_file is None and any(m.writable and disk_full(m.source) for m in mounts)):
            hit = "disk"
        limit = hit or killed or ("cpu" if status in _CPU_STATUSES else None)
        stdout = container.logs(stdout=True, stderr=False)
        stderr = container.logs(stdout=False, stderr=True)
        return ExecResult(exit_code=-signal.SIGKILL if killed else status, limit=limit, stdout=tail(stdout), stderr=tail(stderr),
                          elapsed_s=elapsed, backend=self.name)


def _staged_limit(path: Path) -> LimitHit | None:
    """The limit a staged run's init recorded (``wall`` or ``disk``), if any."""
    try:
        limit = json.loads(path.read_text()).get("limit")
    except (OSError, ValueError, AttributeError):
        return None
    return limit if limit in ("wall", "disk") else None
