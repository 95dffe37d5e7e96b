"""The embedded stack: every service and worker as a separate local process on 127.0.0.1.

Secrets are generated once into ``<data_dir>/secrets/``: ``tokens.env`` (one service token per service;
each process gets its own and the tokens of the callers it trusts), ``gateway.env`` (the admin key, for the
gateway only), ``grader.env`` (test seed, test-store URL) for the grader and its eval worker only.
Each process's output goes to ``<data_dir>/logs/<name>.log``. :meth:`Stack.supervise` restarts a process
that exits on its own (as compose's ``restart: unless-stopped`` and Kubernetes do), with a back-off, and gives
up on one that keeps dying. :meth:`Stack.stop` ends every process group it started (SIGTERM, then SIGKILL
after a grace period).

A process's life is tied to the stack's: each is started under ``setpriv --pdeathsig`` (util-linux), so the kernel ends
it when the process that started it dies, however it dies (SIGKILL included). What runs is recorded in
``<data_dir>/run/stack.json`` (the starting process and each child, with their start times), so :func:`stop_recorded`
(``crucible down``) stops a stack started elsewhere. A port already taken is refused before anything starts, naming
what holds it (:class:`PortTaken`).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil

from services.common.auth import MAY_CALL, new_secret, trusted_callers


def die_with_parent(spec: ProcessSpec) -> list[str]:
    """The prefix of a child's command line: the kernel signals it when its parent dies (``prctl`` ``PR_SET_PDEATHSIG``, kept
    across the ``exec`` of the real command). A service gets SIGTERM (it stops at once); a worker SIGKILL, as Celery takes
    SIGTERM for a warm shutdown that waits for its task, an evaluation of hours maybe: its job's lease brings it back."""
    return ["setpriv", "--pdeathsig", "TERM" if spec.port is not None else "KILL", "--"]


_SPAWNER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="stack-spawner")
"""Every child is started from this one thread, which lives as long as the process: the kernel's parent-death signal
follows the thread that started a child, so a child started from a thread that ends (a test starting two stacks at
once, the supervisor's) would be sent SIGTERM with it."""


class PortTaken(RuntimeError):
    """A port the stack needs is held by another process (named in the message)."""


def port_holder(port: int) -> str | None:
    """Who listens on TCP ``port`` of this machine (``"pid 123: uvicorn gateway.app:app …"``), ``"an unknown process"``
    where the port is taken but its owner cannot be read, ``None`` where it is free."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
            return None
        except OSError:
            pass
    for conn in psutil.net_connections(kind="tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port and conn.pid:
            try:
                return f"pid {conn.pid}: {' '.join(psutil.Process(conn.pid).cmdline())[:200]}"
            except psutil.Error:
                return f"pid {conn.pid}"
    return "an unknown process"


def record_path(data_dir: Path) -> Path:
    """Where a running stack records its processes."""
    return data_dir / "run" / "stack.json"


def stop_recorded(data_dir: Path, grace_s: float = 20.0) -> list[str]:
    """Stop the stack recorded under ``data_dir`` by whichever process started it (``crucible down``): SIGTERM to its
    starter (which stops its children in order), then, after ``grace_s`` seconds, SIGTERM and SIGKILL to each recorded
    child's process group still running. A recorded process whose start time differs is another process that reused
    the pid, and is left alone. Returns what was stopped (``["up pid 12", "gateway pid 34", …]``); empty: nothing ran."""
    path = record_path(data_dir)
    if not path.exists():
        return []
    record = json.loads(path.read_text())
    stopped = []

    def alive(entry: dict) -> psutil.Process | None:
        try:
            proc = psutil.Process(entry["pid"])
            return proc if abs(proc.create_time() - entry["started"]) < 1.0 and proc.status() != psutil.STATUS_ZOMBIE else None
        except psutil.Error:
            return None

    if (starter := alive(record["starter"])) is not None:
        starter.send_signal(signal.SIGTERM)
        stopped.append(f"starter pid {starter.pid}")
        with contextlib.suppress(psutil.Error):
            starter.wait(timeout=grace_s)
    for name, entry in record["processes"].items():
        if alive(entry) is None:
            continue
        stopped.append(f"{name} pid {entry['pid']}")
        for sig, wait_s in ((signal.SIGTERM, grace_s / 2), (signal.SIGKILL, 5.0)):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(entry["pid"], sig)
            with contextlib.suppress(psutil.Error):
                psutil.Process(entry["pid"]).wait(timeout=wait_s)
                break
    path.unlink(missing_ok=True)
    return stopped


@dataclass(frozen=True)
class ProcessSpec:
    name: str
    argv: list[str]
    port: int | None = None
    grader_secrets: bool = False
    gateway_secrets: bool = False


def _read_env(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)


def _write_private(path: Path, values: dict[str, str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write("".join(f"{k}={v}\n" for k, v in values.items()))


def ensure_secrets(data_dir: Path) -> tuple[dict[str, str], dict[str, str], dict[str, str]]:
    """``(service tokens by service, gateway-only, grader-only)`` values, created on first use and kept."""
    sdir = data_dir / "secrets"
    tokens_file, gateway_file, grader_file = sdir / "tokens.env", sdir / "gateway.env", sdir / "grader.env"
    if not tokens_file.exists():
        _write_private(tokens_file, {service: new_secret(f"svc{service[:2]}", 32) for service in MAY_CALL})
    if not gateway_file.exists():
        _write_private(gateway_file, {"CRUCIBLE_ADMIN_KEY": new_secret("cak", 32)})
    if not grader_file.exists():
        _write_private(grader_file, {
            "CRUCIBLE_GRADER_TEST_SEED": str(secrets.randbelow(2**31)),
            "CRUCIBLE_GRADER_TEST_STORE_URL": f"sqlite:///{(data_dir / 'grader-teststore.sqlite').resolve()}",
        })
    return _read_env(tokens_file), _read_env(gateway_file), _read_env(grader_file)


def service_token(data_dir: Path, service: str) -> str:
    """The token ``service`` of the stack in ``data_dir`` calls others with (e.g. ``gateway`` to read the ledger as operators do)."""
    return ensure_secrets(data_dir)[0][service]


def admin_key(data_dir: Path) -> str:
    """The operator's admin key of the stack in ``data_dir``."""
    return _read_env(data_dir / "secrets" / "gateway.env")["CRUCIBLE_ADMIN_KEY"]


# Settings the stack decides itself; any other CRUCIBLE_* variable (lease, time limits, rate limits, log
# level…) is passed on to every process.
STACK_OWNED = frozenset({"CRUCIBLE_DATA_DIR", "CRUCIBLE_DATABASE_URL", "CRUCIBLE_BROKER_URL", "CRUCIBLE_SERVICE_TOKEN", "CRUCIBLE_TRUSTED_TOKENS",
                         "CRUCIBLE_ADMIN_KEY", "CRUCIBLE_GRADER_TEST_SEED", "CRUCIBLE_GRADER_TEST_STORE_URL"})


def process_specs(port_base: int) -> list[ProcessSpec]:
    """The five services (gateway on ``port_base``, then ledger, trainer, inference, grader) and two workers."""
    py = sys.executable

    def uvicorn(app: str, port: int) -> list[str]:
        return [py, "-m", "uvicorn", app, "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"]

    def worker(app: str, queue: str, pool: str, concurrency: int) -> list[str]:
        return [py, "-m", "celery", "-A", app, "worker", "-Q", queue, "-P", pool, "-c", str(concurrency), "-n", f"{queue}@%h",
                "--without-gossip", "--without-mingle", "--without-heartbeat", "--loglevel", "INFO"]

    return [
        ProcessSpec("ledger", uvicorn("services.ledger.app:app", port_base + 1), port_base + 1),
        ProcessSpec("trainer", uvicorn("trainer_service.app:app", port_base + 2), port_base + 2),
        ProcessSpec("inference", uvicorn("inference_service.app:app", port_base + 3), port_base + 3),
        ProcessSpec("grader", uvicorn("grader.app:app", port_base + 4), port_base + 4, grader_secrets=True),
        ProcessSpec("gateway", uvicorn("gateway.app:app", port_base), port_base, gateway_secrets=True),
        ProcessSpec("train-worker", worker("trainer_service.tasks", "train", "solo", 1)),
        ProcessSpec("eval-worker", worker("grader.tasks", "eval", "threads", 4), grader_secrets=True),
    ]


@dataclass
class Stack:
    """Start, watch and stop the embedded stack rooted at ``data_dir``."""

    data_dir: Path
    port_base: int = 8000
    database_urls: dict[str, str] = field(default_factory=dict)  # service name -> URL (default: SQLite in data_dir)
    broker_url: str | None = None  # default: the embedded SQLite broker
    test_store_url: str | None = None  # default: a SQLite file in data_dir
    extra_env: dict[str, str] = field(default_factory=dict)  # more CRUCIBLE_* settings for every process
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    restarts: dict[str, list[float]] = field(default_factory=dict)  # name -> monotonic times the supervisor restarted it
    _held: set[str] = field(default_factory=set)  # killed by hand (kill()): not restarted until restart()
    _given_up: set[str] = field(default_factory=set)
    _lock: threading.RLock = field(default_factory=threading.RLock)
    _supervisor: threading.Thread | None = None
    _stopping: threading.Event = field(default_factory=threading.Event)

    # A process that exits on its own is restarted after BACKOFF_S[min(n, last)] seconds, n = its restarts in
    # the last GIVE_UP_WINDOW_S seconds; at MAX_RESTARTS there it is left down (see ``failed``).
    BACKOFF_S = (1.0, 2.0, 5.0, 10.0, 30.0)
    MAX_RESTARTS = 5
    GIVE_UP_WINDOW_S = 300.0

    @property
    def gateway_url(self) -> str:
        return f"http://127.0.0.1:{self.port_base}"

    def environment(self, spec: ProcessSpec) -> dict[str, str]:
        tokens, gateway_only, grader_only = ensure_secrets(self.data_dir)
        owner = {"train-worker": "trainer", "eval-worker": "grader"}.get(spec.name, spec.name)
        env = {k: v for k, v in os.environ.items() if not (k in STACK_OWNED or (k.startswith("CRUCIBLE_") and k.endswith("_URL")))}
        env["CRUCIBLE_SERVICE_TOKEN"] = tokens[owner]
        env["CRUCIBLE_TRUSTED_TOKENS"] = json.dumps({caller: tokens[caller] for caller in trusted_callers(owner)})
        env.update({
            "CRUCIBLE_DATA_DIR": str(self.data_dir.resolve()),
            "CRUCIBLE_GATEWAY_URL": f"http://127.0.0.1:{self.port_base}",
            "CRUCIBLE_LEDGER_URL": f"http://127.0.0.1:{self.port_base + 1}",
            "CRUCIBLE_TRAINER_URL": f"http://127.0.0.1:{self.port_base + 2}",
            "CRUCIBLE_INFERENCE_URL": f"http://127.0.0.1:{self.port_base + 3}",
            "CRUCIBLE_GRADER_URL": f"http://127.0.0.1:{self.port_base + 4}",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
        })
        if spec.gateway_secrets:
            env.update(gateway_only)
        if spec.grader_secrets:
            env.update(grader_only)
            if self.test_store_url:
                env["CRUCIBLE_GRADER_TEST_STORE_URL"] = self.test_store_url
        if owner in self.database_urls:
            env["CRUCIBLE_DATABASE_URL"] = self.database_urls[owner]
        if self.broker_url:
            env["CRUCIBLE_BROKER_URL"] = self.broker_url
        env.update(self.extra_env)
        return env

    def start(self, on_ready=None, timeout_s: float = 300.0) -> None:  # noqa: ANN001
        """Start every process and wait until each service is ready (``/readyz``: the gateway's only once every service
        behind it is) and each worker is alive.

        ``on_ready(name)`` is called as each becomes ready. Raises ``RuntimeError`` (with the log's tail)
        if a process exits or a service is not healthy within ``timeout_s`` seconds; everything started is
        stopped first.
        """
        specs = process_specs(self.port_base)
        if taken := {spec.port: who for spec in specs if spec.port is not None and (who := port_holder(spec.port))}:
            raise PortTaken("; ".join(f"port {port} is taken by {who}" for port, who in sorted(taken.items()))
                            + f". Stop it (a Crucible stack: crucible down --data-dir <its data dir>) or choose another port base than {self.port_base}.")
        try:
            for spec in specs:
                self._spawn(spec)
            self._wait_ready(specs, on_ready, timeout_s)
        except BaseException:
            self.stop()
            raise

    def _spawn(self, spec: ProcessSpec) -> None:
        logs = self.data_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        with open(logs / f"{spec.name}.log", "ab") as log:  # the child keeps its own descriptor
            self.procs[spec.name] = _SPAWNER.submit(subprocess.Popen, [*die_with_parent(spec), *spec.argv], env=self.environment(spec), stdout=log,
                                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True).result()
        self._record()

    def _record(self) -> None:
        """Write which processes run (``record_path``): this one, which started them, and each child, with start times."""
        def entry(pid: int) -> dict:
            try:
                return {"pid": pid, "started": psutil.Process(pid).create_time()}
            except psutil.Error:
                return {"pid": pid, "started": 0.0}

        path = record_path(self.data_dir)
        path.parent.mkdir(parents=True, exist_ok=True)
        record = {"starter": entry(os.getpid()), "port_base": self.port_base,
                  "processes": {name: entry(proc.pid) for name, proc in self.procs.items() if proc.poll() is None}}
        tmp = path.with_suffix(f".{threading.get_ident()}.tmp")
        tmp.write_text(json.dumps(record))
        tmp.replace(path)

    def _wait_ready(self, specs: list[ProcessSpec], on_ready, timeout_s: float) -> None:  # noqa: ANN001
        pending = {s.name: s for s in specs}
        deadline = time.monotonic() + timeout_s
        while pending:
            for name, spec in list(pending.items()):
                proc = self.procs[name]
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} exited with {proc.returncode}:\n{self.log_tail(name)}")
                if spec.port is None or self._healthy(spec.port, "/readyz"):
                    del pending[name]
                    if on_ready:
                        on_ready(name)
            if time.monotonic() > deadline:
                raise RuntimeError(f"not ready after {timeout_s:.0f} s: {', '.join(pending)}")
            time.sleep(0.3)

    def supervise(self, on_exit=None, interval_s: float = 1.0) -> None:  # noqa: ANN001
        """Watch every process from a daemon thread and restart one that exits on its own.

        ``on_exit(name, returncode, restarting)`` is called for each such exit; ``restarting`` is False when
        the process died more than ``MAX_RESTARTS`` times within ``GIVE_UP_WINDOW_S`` seconds and is left
        down (then it is listed by :meth:`failed`). A process killed through :meth:`kill` stays down until
        :meth:`restart`. :meth:`stop` ends the watch.
        """
        if self._supervisor is not None:
            return
        self._stopping.clear()

        def loop() -> None:
            exited_at: dict[str, float] = {}
            while not self._stopping.wait(interval_s):
                for name in self.dead():
                    if name in self._held or name in self._given_up:
                        continue
                    now = time.monotonic()
                    recent = [t for t in self.restarts.get(name, []) if now - t < self.GIVE_UP_WINDOW_S]
                    if name not in exited_at:
                        exited_at[name] = now
                        gave_up = len(recent) >= self.MAX_RESTARTS
                        if gave_up:
                            self._given_up.add(name)
                        if on_exit:
                            on_exit(name, self.procs[name].returncode, not gave_up)
                    if name in self._given_up or now - exited_at[name] < self.BACKOFF_S[min(len(recent), len(self.BACKOFF_S) - 1)]:
                        continue
                    with self._lock:
                        if not self._stopping.is_set() and name not in self._held and self.procs[name].poll() is not None:
                            self.restarts[name] = [*recent, now]
                            self._spawn(self._spec(name))
                    exited_at.pop(name, None)

        self._supervisor = threading.Thread(target=loop, name="crucible-supervisor", daemon=True)
        self._supervisor.start()

    def failed(self) -> list[str]:
        """Processes the supervisor gave up on (they kept dying); empty while every process is up or being restarted."""
        return sorted(self._given_up)

    def _spec(self, name: str) -> ProcessSpec:
        return next(s for s in process_specs(self.port_base) if s.name == name)

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` (default SIGKILL: no clean-up at all) to process ``name``'s whole group and reap it.

        The supervisor leaves it down until :meth:`restart`.
        """
        with self._lock:
            self._held.add(name)
        proc = self.procs[name]
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        proc.wait(timeout=30)

    def restart(self, name: str, timeout_s: float = 120.0) -> None:
        """Start process ``name`` again (after :meth:`kill`) and wait until it is ready."""
        spec = self._spec(name)
        with self._lock:
            if self.procs[name].poll() is None:
                raise RuntimeError(f"{name} is still running")
            self._spawn(spec)
            self._held.discard(name)
            self._given_up.discard(name)
        self._wait_ready([spec], None, timeout_s)

    @staticmethod
    def _healthy(port: int, path: str = "/healthz") -> bool:
        """Whether the service on ``port`` answers ``path`` with 200: ``/healthz`` (alive) or ``/readyz`` (it and what it
        needs can serve)."""
        try:
            return httpx.get(f"http://127.0.0.1:{port}{path}", timeout=3).status_code == 200
        except httpx.HTTPError:
            return False

    def log_tail(self, name: str, lines: int = 30) -> str:
        path = self.data_dir / "logs" / f"{name}.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""

    def dead(self) -> list[str]:
        """Names of processes that have exited."""
        return [n for n, p in self.procs.items() if p.poll() is not None]

    def stop(self, grace_s: float = 10.0) -> None:
        """Stop the supervisor, then every process group started (SIGTERM, SIGKILL after ``grace_s`` seconds)."""
        self._stopping.set()
        if self._supervisor is not None:
            self._supervisor.join(timeout=5)
            self._supervisor = None
        for proc in self.procs.values():
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + grace_s
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait()
        self.procs.clear()
        record_path(self.data_dir).unlink(missing_ok=True)
