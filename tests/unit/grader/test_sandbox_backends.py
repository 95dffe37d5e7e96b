"""The sandbox contract (:mod:`grader.sandboxes.base`), held by every backend: the same stories run, for real, on
bubblewrap and on Docker. The Docker cases need a daemon and the sandbox image (``deploy/images/ensure-dockerd.sh``
then ``deploy/images/debootstrap.sh sandbox``); without them they fail, saying so, rather than skip. Marker ``docker``."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import http.server
import json
import os
import shutil
import socket
import socketserver
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from grader.sandboxes import BACKENDS
from grader.sandboxes.base import AGENT_UID, SANDBOX_PYTHON, ExecResult, Limits, Mount, Sandbox, inodes, owner, reap_workspaces, workspace
from grader.sandboxes.docker import DockerSandbox
from services.common.processes import owner_alive
from tests.conftest import ROOT
from tests.netns import SANDBOX_NETWORK_PROBE, outside_hosts


@pytest.fixture(params=["bwrap", pytest.param("docker", marks=pytest.mark.docker)])
def sandbox(request: pytest.FixtureRequest) -> Sandbox:
    """Each backend in turn. One that cannot start a sandbox here raises ``SandboxUnavailable`` from ``run``, which
    fails the test with what to do (install bubblewrap; start the daemon and build the image)."""
    return BACKENDS[request.param]()


def python(sandbox: Sandbox, code: str, *args: str, mounts: list[Mount] | None = None, cwd: str = "/", limits: Limits | None = None,
           **kwargs) -> ExecResult:
    """Run ``code`` with the sandbox's ``python3``."""
    return sandbox.run(["python3", "-c", textwrap.dedent(code), *args], mounts=mounts or [], cwd=cwd, env=kwargs.pop("env", {}),
                       limits=limits or Limits(wall_s=60), **kwargs)


def processes_with(token: str) -> list[str]:
    """The command lines of host processes whose argv mentions ``token``."""
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and proc.name != str(os.getpid()):
            with contextlib.suppress(OSError):
                cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                if token in cmdline:
                    found.append(f"{proc.name}: {cmdline}")
    return found


@contextlib.contextmanager
def tcp_server() -> Iterator[tuple[int, list[tuple[str, int]]]]:
    """A TCP server on loopback: its port, and the peers that connected."""
    server = socket.create_server(("127.0.0.1", 0))
    peers: list[tuple[str, int]] = []

    def accept() -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, peer = server.accept()
                peers.append(peer)
                conn.close()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1], peers
    finally:
        server.close()


class _ModelHandler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = json.dumps({"model": "answers", "path": self.path}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass

    def address_string(self) -> str:
        return "unix"


class _UnixHTTPServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


@contextlib.contextmanager
def model_endpoint() -> Iterator[Path]:
    """A tiny HTTP app on a Unix socket, as the rollout's model endpoint is."""
    folder = Path(tempfile.mkdtemp(prefix="crucible-test-model-"))
    path = folder / "model.sock"
    server = _UnixHTTPServer(str(path), _ModelHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield path
    finally:
        server.shutdown()
        server.server_close()
        shutil.rmtree(folder, ignore_errors=True)


def test_a_command_runs_with_its_stdin_env_and_cwd_and_its_status_and_output_come_back(sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CRUCIBLE_HOST_ONLY", "the grader's own environment")
    stdin = os.urandom(300_000) + b"end"
    with workspace(disk_mb=16) as ws:
        (ws / "given.txt").write_text("from the host")
        result = python(sandbox, """
            import hashlib, json, os, sys
            data = sys.stdin.buffer.read()
            print(json.dumps({"sha256": hashlib.sha256(data).hexdigest(), "cwd": os.getcwd(), "env": dict(os.environ),
                              "given": open("given.txt").read()}))
            print("to stderr", file=sys.stderr)
            sys.exit(3)
        """, mounts=[Mount(ws, "/app", writable=True)], cwd="/app", env={"TASK": "t-1", "HOME": "/app"}, stdin=stdin)
    assert (result.exit_code, result.limit, result.ok) == (3, None, False), result
    assert result.stderr == "to stderr\n"
    seen = json.loads(result.stdout)
    assert seen["sha256"] == hashlib.sha256(stdin).hexdigest()
    assert seen["cwd"] == "/app"
    assert seen["given"] == "from the host"
    env = seen["env"]
    assert env.pop("PWD", "/app") == "/app"  # the working directory, as a shell would export it; nothing else is added
    assert env == {"TASK": "t-1", "HOME": "/app", "PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
    assert result.backend == sandbox.name and 0 < result.elapsed_s < 30


def test_a_sandbox_sees_only_what_is_mounted_and_cannot_write_what_is_read_only(sandbox: Sandbox, tmp_path: Path) -> None:
    host_hostname = Path("/etc/hostname").read_text().strip() if Path("/etc/hostname").exists() else None
    home_marker = Path(tempfile.mkdtemp(prefix=".crucible-sandbox-test-", dir=Path.home()))
    stray = Path("/") / f"crucible-stray-{uuid.uuid4().hex}"  # written at the sandbox's root: never the host's
    given = tmp_path / "given"
    given.mkdir()
    (given / "data.txt").write_text("read me")
    try:
        with workspace(disk_mb=16) as ws:
            result = python(sandbox, """
                import json, os, sys
                def write(path):
                    try:
                        with open(path, "w") as f:
                            f.write("x")
                        return "written"
                    except OSError as exc:
                        return exc.__class__.__name__
                def read(path):
                    try:
                        return open(path).read().strip()
                    except OSError as exc:
                        return exc.__class__.__name__
                home_marker, repo, stray = sys.argv[1], sys.argv[2], sys.argv[3]
                print(json.dumps({
                    "hostname": read("/etc/hostname"),
                    "home_marker": os.path.exists(home_marker),
                    "root": sorted(os.listdir("/root")) if os.access("/root", os.R_OK | os.X_OK) else None,  # the image's is 0700
                    "repo": [os.path.exists(os.path.join(repo, p)) for p in ("pyproject.toml", "grader", "tests")],
                    "given": read("/data/data.txt"),
                    "write_given": write("/data/new.txt"),
                    "write_usr": write("/usr/new.txt"),
                    "write_root": write(stray),
                    "write_init": write("/run/crucible/init.py"),
                    "write_app": write("/app/out.txt"),
                    "write_tmp": write("/tmp/out.txt"),
                }))
            """, str(home_marker), str(ROOT), str(stray), mounts=[Mount(given, "/data"), Mount(ws, "/app", writable=True)])
            assert result.ok, result
            seen = json.loads(result.stdout)
            assert (ws / "out.txt").read_text() == "x"
    finally:
        shutil.rmtree(home_marker, ignore_errors=True)
    assert seen["hostname"] != host_hostname
    assert seen["home_marker"] is False
    assert home_marker.name not in (seen["root"] or [])
    assert seen["repo"] == [False, False, False]
    assert seen["given"] == "read me"
    assert not (given / "new.txt").exists()
    assert seen["write_given"] != "written" and seen["write_usr"] != "written", seen
    assert not stray.exists()  # the sandbox's root is its own (bubblewrap: a fresh tmpfs; Docker: the image, read-only)
    assert seen["write_init"] != "written", seen
    assert seen["write_app"] == "written" and seen["write_tmp"] == "written"


PRIVILEGE_PROBE = """
import ctypes, errno, json, os
libc = ctypes.CDLL(None, use_errno=True)
def opened(path):
    try:
        open(path, "w").close()
        return "opened"
    except OSError as exc:
        return errno.errorcode[exc.errno]
def call(name, *args):
    return "allowed" if getattr(libc, name)(*args) == 0 else errno.errorcode[ctypes.get_errno()]
status = dict(line.split(":\\t", 1) for line in open("/proc/self/status").read().splitlines() if ":\\t" in line)
open("/app/suid", "w").close()
os.chmod("/app/suid", 0o4755)
print(json.dumps({
    "uid": os.getuid(), "euid": os.geteuid(), "groups": os.getgroups(), "cap_eff": status["CapEff"].strip(),
    "no_new_privs": status["NoNewPrivs"].strip(), "seccomp": status["Seccomp"].strip(),
    "writes": {p: opened(p) for p in ("/proc/sys/kernel/core_pattern", "/proc/sys/vm/drop_caches", "/proc/sys/vm/swappiness")},
    "unshare_user": call("unshare", 0x10000000), "unshare_mount": call("unshare", 0x00020000),
    "mount": call("mount", b"none", b"/tmp", b"tmpfs", 0, None), "keyctl": call("syscall", {"x86_64": 250, "aarch64": 219}[os.uname().machine], 0, 0, 0, 0, 0),
    "io_uring": call("syscall", 425, 8, ctypes.create_string_buffer(120)),
    "setuid_root": call("setuid", 0),
}))
"""


def test_a_command_runs_unprivileged_and_cannot_write_the_kernels_settings(sandbox: Sandbox) -> None:
    """A harness runs as the unprivileged agent user with no capabilities, under a seccomp filter: it cannot open
    ``/proc/sys`` files for writing, create namespaces (``unshare -r``), mount, use the kernel keyring or become root;
    a setuid file it leaves in its workspace is the agent user's, not root's. A verifier (``agent_user``) is root of the
    sandbox under the same filter and read-only ``/proc/sys``."""
    with workspace(disk_mb=16) as ws:
        result = python(sandbox, PRIVILEGE_PROBE, mounts=[Mount(ws, "/app", writable=True)], cwd="/app")
        assert result.ok, result
        seen = json.loads(result.stdout)
        suid = (ws / "suid").stat()
        assert (suid.st_uid, suid.st_mode & 0o4000) == (AGENT_UID, 0o4000)  # setuid, but to the agent user alone
        assert (seen["uid"], seen["euid"]) == (AGENT_UID, AGENT_UID) and seen["groups"] in ([], [AGENT_UID]), seen
        assert (seen["cap_eff"], seen["no_new_privs"], seen["seccomp"]) == ("0000000000000000", "1", "2"), seen
        assert set(seen["writes"].values()) <= {"EROFS", "EACCES"}, seen
        assert {seen[k] for k in ("unshare_user", "unshare_mount", "mount", "keyctl", "setuid_root", "io_uring")} <= {"EPERM", "EACCES"}, seen
        verifier = sandbox.run([SANDBOX_PYTHON, "-I", "-c", PRIVILEGE_PROBE], mounts=[Mount(ws, "/app", writable=True)], cwd="/app", env={},
                               limits=Limits(wall_s=60), agent_user=True)
        assert verifier.ok, verifier
        root = json.loads(verifier.stdout)
        assert root["uid"] == 0 and (ws / "suid").stat().st_uid == 0  # the verifier's mounts are root's: agent code cannot write them
        assert set(root["writes"].values()) == {"EROFS"}, root
        assert {root[k] for k in ("unshare_user", "unshare_mount", "mount", "keyctl", "io_uring")} == {"EPERM"}, root
    with workspace(disk_mb=16) as ws:
        shell = sandbox.run(["bash", "-c", "unshare -r id; unshare -n true; echo done"], mounts=[Mount(ws, "/app", writable=True)], cwd="/app",
                            env={}, limits=Limits(wall_s=60))
        assert shell.stdout.strip() == "done" and shell.stderr.count("Operation not permitted") == 2, shell


def test_what_a_harness_left_writable_to_all_is_not_writable_by_agent_code_a_verifier_runs(sandbox: Sandbox) -> None:
    """Before a verifier runs, its mounts are root's with no group or other write permission: a harness that left
    ``/app`` and a source file writable to all (or set-user-ID) cannot have the agent code the verifier runs change
    them."""
    with workspace(disk_mb=16) as ws:
        harness = sandbox.run(["bash", "-c", "mkdir /app/src && echo ok > /app/src/code.py && chmod 777 /app /app/src && chmod 4777 /app/src/code.py"],
                              mounts=[Mount(ws, "/app", writable=True)], cwd="/app", env={}, limits=Limits(wall_s=30))
        assert harness.ok, harness
        verifier = sandbox.run(["bash", "-c", "/run/crucible/as-agent bash -c 'echo AGENT > /app/src/code.py; echo AGENT > /app/src/planted; echo AGENT > /app/top' "
                                              "2>/dev/null; echo done"], mounts=[Mount(ws, "/app", writable=True)], cwd="/app", env={},
                               limits=Limits(wall_s=30), agent_user=True)
        assert verifier.stdout.strip() == "done", verifier
        assert (ws / "src" / "code.py").read_text() == "ok\n" and not (ws / "src" / "planted").exists() and not (ws / "top").exists()
        assert not (ws / "src" / "code.py").stat().st_mode & 0o6022


def test_a_host_where_bubblewrap_cannot_make_namespaces_raises_unavailable_instead_of_failing_the_command() -> None:
    """A grader process that may not create namespaces (here: under the sandbox's own seccomp filter, as a container
    under a runtime's default profile is) gets ``SandboxUnavailable`` with bubblewrap's reason, so a python grader or
    a rollout is a 503 or a retry, never a score of 0 for a command that never ran."""
    code = textwrap.dedent("""
        import sys
        from grader.sandboxes import seccomp
        seccomp._build().load()
        from grader.sandboxes.base import Limits, SandboxUnavailable
        from grader.sandboxes.bwrap import BubblewrapSandbox
        try:
            print(BubblewrapSandbox().run(["true"], mounts=[], cwd="/", env={}, limits=Limits(wall_s=30)))
        except SandboxUnavailable as exc:
            print("unavailable:", exc)
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.stdout.startswith("unavailable: bubblewrap cannot make sandboxes here:") and "Operation not permitted" in done.stdout, done


def test_a_sandbox_has_no_network_and_reaches_no_host_the_test_owns(sandbox: Sandbox) -> None:
    """Only ``lo`` and no route inside; and no connection to hosts this test made (a listener on loopback, one in a
    network namespace of its own behind a veth pair, one on the host's end of that pair), which the host itself reaches."""
    with tcp_server() as (port, peers), outside_hosts() as outside:
        outside.check_reachable()
        targets = [("127.0.0.1", port), *outside.targets]
        result = python(sandbox, SANDBOX_NETWORK_PROBE + """
import json, socket, sys
outcome = {}
for target in json.loads(sys.argv[1]):
    try:
        socket.create_connection(tuple(target), timeout=3).close()
        outcome[f"{target[0]}:{target[1]}"] = "connected"
    except OSError as exc:
        outcome[f"{target[0]}:{target[1]}"] = exc.__class__.__name__ + ": " + str(exc)
print(json.dumps(outcome))
""", json.dumps(targets))
        time.sleep(0.2)
        assert outside.connections() == 2  # the host's own check, no more
    assert result.ok, result
    network, outcome = (json.loads(line.removeprefix("NETWORK ")) for line in result.stdout.splitlines())
    assert network == {"interfaces": ["lo"], "routes": [], "routes6": []}, network
    assert len(outcome) == len(targets)
    assert not [target for target, how in outcome.items() if how == "connected"], outcome
    assert peers == []


def test_the_model_endpoint_is_reachable_inside_at_127_0_0_1_8000(sandbox: Sandbox) -> None:
    with model_endpoint() as model_socket:
        result = python(sandbox, """
            import json, urllib.request
            with urllib.request.urlopen("http://127.0.0.1:8000/v1/models?x=1", timeout=10) as response:
                print(response.status, response.read().decode())
        """, model_socket=model_socket)
    assert result.ok, result
    status, body = result.stdout.split(" ", 1)
    assert status == "200"
    assert json.loads(body) == {"model": "answers", "path": "/v1/models?x=1"}


@pytest.mark.slow
def test_the_wall_limit_kills_a_sleeper(sandbox: Sandbox) -> None:
    result = sandbox.run(["sleep", "60"], mounts=[], cwd="/", env={}, limits=Limits(wall_s=2))
    assert (result.exit_code, result.limit) == (-9, "wall"), result
    assert 2 <= result.elapsed_s < 4


def test_a_forked_sleeper_does_not_outlive_the_run(sandbox: Sandbox) -> None:
    token = f"crucible-orphan-{uuid.uuid4().hex}"
    with workspace(disk_mb=16) as ws:
        result = sandbox.run(["/bin/sh", "-c", 'python3 -c "import time; time.sleep(1000)" "$1" & echo $! > /app/sleeper; sleep 0.5; kill -0 $! && echo alive',
                              "sh", token], mounts=[Mount(ws, "/app", writable=True)], cwd="/", env={}, limits=Limits(wall_s=30))
        assert (ws / "sleeper").read_text().strip().isdigit()
    assert result.ok and result.stdout == "alive\n", result
    assert processes_with(token) == []


@pytest.mark.slow
def test_a_fork_bomb_is_contained_and_the_host_still_forks(sandbox: Sandbox) -> None:
    token = f"crucible-bomb-{uuid.uuid4().hex}"
    limits = Limits(wall_s=5, processes=32)
    result = python(sandbox, """
        import os
        while True:
            try:
                os.fork()
            except OSError:
                pass
    """, token, limits=limits)
    assert result.limit in ("processes", "wall"), result
    assert result.elapsed_s < limits.wall_s + 5, result
    assert processes_with(token) == []
    for _ in range(20):
        assert subprocess.run(["true"]).returncode == 0


def test_allocating_past_the_memory_limit_fails_inside(sandbox: Sandbox) -> None:
    result = python(sandbox, "x = b'x' * (512 << 20)", limits=Limits(wall_s=60, memory_mb=256))
    assert result.exit_code != 0, result
    assert "MemoryError" in result.stderr or result.limit == "memory", result
    assert subprocess.run(["python3", "-c", "x = b'x' * (512 << 20)"]).returncode == 0  # the host's memory is its own


@pytest.mark.slow
def test_processes_together_past_the_memory_limit_are_stopped(sandbox: Sandbox) -> None:
    """Each process stays under its own address-space limit; together they pass the sandbox's memory."""
    result = python(sandbox, """
        import subprocess, sys
        child = "import time; x = b'x' * (150 << 20); time.sleep(4)"
        children = [subprocess.Popen([sys.executable, "-c", child]) for _ in range(3)]
        sys.exit(max(abs(c.wait()) for c in children))
    """, limits=Limits(wall_s=60, memory_mb=256))
    assert result.exit_code != 0 and result.limit == "memory", result


def test_filling_the_workspace_ends_with_no_space_left(sandbox: Sandbox) -> None:
    with workspace(disk_mb=16) as ws:
        assert shutil.disk_usage(ws).total <= 17 << 20, "the workspace is not size-limited: tmpfs mounts need root"
        result = python(sandbox, """
            import errno
            written = 0
            try:
                with open("/app/fill", "wb") as f:
                    while True:
                        f.write(b"x" * (1 << 20))
                        f.flush()
                        written += 1
            except OSError as exc:
                print(errno.errorcode[exc.errno], written)
                raise SystemExit(1)
        """, mounts=[Mount(ws, "/app", writable=True)], limits=Limits(wall_s=60, disk_mb=16, file_mb=64))
    assert result.stdout.split()[0] == errno.errorcode[errno.ENOSPC], result
    assert 10 <= int(result.stdout.split()[1]) <= 16
    assert (result.exit_code, result.limit) == (1, "disk"), result


@pytest.mark.slow
def test_a_busy_loop_is_stopped_at_its_cpu_limit(sandbox: Sandbox) -> None:
    result = python(sandbox, "while True: pass", limits=Limits(wall_s=30, cpu_s=2))
    assert result.limit == "cpu", result
    assert result.elapsed_s < 10, result


def test_a_sandbox_whose_grader_died_is_removed_when_a_worker_starts(sandbox: Sandbox, tmp_path: Path) -> None:
    """A grader process killed mid-run (SIGKILL: no clean-up of its own) leaves nothing running once a worker's
    ``reap()`` has run, and a live process's sandboxes are never touched."""
    token = f"orphan-{uuid.uuid4().hex[:12]}"
    script = tmp_path / "dying_worker.py"
    script.write_text(textwrap.dedent(f"""
        from grader.sandboxes import Limits, Mount, get_sandbox, workspace
        with workspace(16) as ws:
            get_sandbox({sandbox.name!r}).run(["bash", "-c", "sleep 1000; true", {token!r}], mounts=[Mount(ws, "/app", True)], cwd="/app", env={{}},
                                              limits=Limits(wall_s=900))
    """))
    dying = subprocess.Popen([sys.executable, str(script)], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    deadline = time.monotonic() + 60
    while not processes_with(token) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert processes_with(token), "the sandbox never started"
    live = threading.Thread(target=lambda: sandbox.run(["sleep", "3"], mounts=[], cwd="/", env={}, limits=Limits(wall_s=30)))
    live.start()  # a run of this (live) process while reap() runs
    time.sleep(1.5)
    dying.kill()
    dying.wait()
    assert sandbox.reap() >= (1 if sandbox.name == "docker" else 0)  # bubblewrap's sandbox died with its parent; its cgroup is left
    assert reap_workspaces() >= 1 and list(Path(tempfile.gettempdir()).glob(f"crucible-ws-{dying.pid}.*")) == []  # its workspace too
    deadline = time.monotonic() + 10
    while processes_with(token) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert processes_with(token) == []
    live.join()
    assert sandbox.reap() == 0  # nothing of a dead owner is left, and the live run was not counted


def test_an_owner_is_alive_only_while_that_very_process_runs() -> None:
    """A sandbox's owner is a process id and its start time: a worker restarted in its container is PID 1 again, and
    the PID 1 that left sandboxes behind must still read as dead."""
    me = owner()
    assert owner_alive(me)
    host, _, tag = me.rpartition(":")
    pid, _, start = tag.partition(".")
    assert start.isdigit() and not owner_alive(f"{host}:{pid}.{int(start) + 1}")  # the same id, another process
    gone = subprocess.Popen(["true"])
    gone.wait()
    assert not owner_alive(f"{host}:{gone.pid}")
    assert owner_alive(f"another-host:{gone.pid}.1")  # not ours to judge


def _mount_roots(stdout: str) -> dict[str, str]:
    """Mount point -> the path of the host's file system it shows (field 4 of /proc/self/mountinfo)."""
    return {fields[4]: fields[3] for fields in (line.split() for line in stdout.splitlines()) if len(fields) > 4}


@pytest.mark.docker
def test_docker_mounts_only_what_is_under_the_graders_temporary_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A grader in a container shares only its TMPDIR with the daemon (at the same path): a read-only source elsewhere
    (a task's tests, the init) is copied into the run's directory there and mounted from it; the copies go with the run."""
    shared = tmp_path / "shared"
    shared.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(shared))
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "a.txt").write_text("the task's file")
    result = DockerSandbox().run(["bash", "-c", "cat /x/a.txt; echo; cat /proc/self/mountinfo"], mounts=[Mount(outside, "/x")], cwd="/", env={},
                                 limits=Limits(wall_s=30))
    assert result.ok and result.stdout.startswith("the task's file\n"), result
    roots = _mount_roots(result.stdout)
    assert roots["/x"].startswith(f"{shared}/crucible-ws-") and roots["/run/crucible/init.py"].startswith(f"{shared}/crucible-ws-"), roots
    assert list(shared.iterdir()) == []


UNLINKED_FILL = """
import errno, os, time
held = []
written = 0
try:
    for i in range(8):  # files unlinked while held open: no du of the workspace would see them
        f = open(f"/app/hidden{i}", "wb")
        os.unlink(f"/app/hidden{i}")
        held.append(f)
        for _ in range(8):
            f.write(b"x" * (1 << 20))
            f.flush()
            written += 1
except OSError as exc:
    print(errno.errorcode[exc.errno], written, flush=True)
    time.sleep(2)  # still holding them: the backend sees its workspace full
    raise SystemExit(1)
print("wrote", written)
"""


def test_files_unlinked_while_held_open_count_against_the_disk_limit(sandbox: Sandbox) -> None:
    """The workspace is a file system whose size the kernel enforces: 64 MiB written to files the harness unlinked while
    holding them open end in "no space left" at 16 MiB."""
    with workspace(disk_mb=16) as ws:
        result = python(sandbox, UNLINKED_FILL, mounts=[Mount(ws, "/app", writable=True)], limits=Limits(wall_s=60, disk_mb=16, file_mb=64))
    assert result.stdout.split()[0] == errno.errorcode[errno.ENOSPC] and int(result.stdout.split()[1]) <= 16, result
    assert (result.exit_code, result.limit) == (1, "disk"), result


@pytest.mark.docker
def test_docker_a_workspace_on_a_large_disk_is_still_held_to_its_disk_limit(tmp_path: Path) -> None:
    """Where the grader's workspace is a plain directory on a large disk (a grader that may not mount a tmpfs, as in a
    container), the run's writable mounts are staged into a tmpfs of ``disk_mb`` inside the container: writing past it
    ends in "no space left", and what the run wrote comes back to the host, owned by the agent user (a set-user-ID file
    it made makes no one root)."""
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "given.txt").write_text("from the host")
    script = ("cat /app/given.txt > /app/seen.txt && ln -s /etc/passwd /app/link && touch /app/suid && chmod 4755 /app/suid && "
              "mkdir -p /app/deep/er && for i in $(seq 40); do head -c 4000000 /dev/zero > /app/deep/er/f$i || exit 3; done")
    result = DockerSandbox().run(["bash", "-c", script], mounts=[Mount(ws, "/app", writable=True)], cwd="/app", env={}, limits=Limits(wall_s=60, disk_mb=16))
    assert (result.exit_code, result.limit) == (3, "disk"), result
    assert "No space left" in result.stderr, result
    assert (ws / "seen.txt").read_text() == "from the host" and os.readlink(ws / "link") == "/etc/passwd"
    assert (ws / "suid").stat().st_uid == AGENT_UID  # set-user-ID to the agent user at most, never to root
    assert sum(p.stat().st_size for p in ws.rglob("*") if p.is_file() and not p.is_symlink()) <= 16 << 20
    unlinked = DockerSandbox().run([SANDBOX_PYTHON, "-I", "-c", UNLINKED_FILL], mounts=[Mount(ws, "/app", writable=True)], cwd="/app", env={},
                                   limits=Limits(wall_s=60, disk_mb=16, file_mb=64))
    assert unlinked.stdout.split()[0] == errno.errorcode[errno.ENOSPC] and unlinked.limit == "disk", unlinked


@pytest.mark.docker
def test_docker_a_staged_workspace_comes_back_whole_and_no_bigger_than_its_limits(tmp_path: Path) -> None:
    """The copy back is the platform's: a file larger than the run's per-file limit that was in the workspace before
    comes back whole; a run that makes more files than its tmpfs may hold (short symbolic links take no space in a
    tmpfs, so only its inode limit stops them) is stopped by it and brings back no more; and a run that ends at its
    process limit still has its workspace copied back."""
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "big.bin").write_bytes(os.urandom(6 << 20))
    links = DockerSandbox().run(["bash", "-c", "echo mine > /app/out.txt; for i in $(seq 20000); do ln -s /etc/passwd /app/l$i || exit 4; done"],
                                mounts=[Mount(ws, "/app", writable=True)], cwd="/app", env={}, limits=Limits(wall_s=120, disk_mb=16, file_mb=1))
    assert links.exit_code == 4 and "No space left" in links.stderr, links
    assert (ws / "big.bin").stat().st_size == 6 << 20 and (ws / "out.txt").read_text() == "mine\n"
    assert len(list(ws.iterdir())) <= inodes(16)
    forks = DockerSandbox().run(["bash", "-c", "echo still > /app/out.txt; while sleep 1000 & do :; done 2>/dev/null; exec sleep 1000"],
                                mounts=[Mount(ws, "/app", writable=True)], cwd="/app", env={}, limits=Limits(wall_s=5, processes=16))
    assert forks.limit in ("processes", "wall"), forks
    assert (ws / "out.txt").read_text() == "still\n" and (ws / "big.bin").stat().st_size == 6 << 20


@pytest.mark.docker
def test_docker_a_staged_run_past_its_wall_limit_still_brings_its_workspace_back(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    result = DockerSandbox().run(["bash", "-c", "echo before > /app/out.txt; sleep 60 & sleep 60"], mounts=[Mount(ws, "/app", writable=True)], cwd="/app",
                                 env={}, limits=Limits(wall_s=3))
    assert (result.exit_code, result.limit) == (-9, "wall") and result.elapsed_s < 20, result
    assert (ws / "out.txt").read_text() == "before\n"


@pytest.mark.docker
def test_docker_a_stopped_sandbox_of_a_worker_gone_for_good_is_removed(monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker in a container that compose replaced has a host name no process has any more: its sandboxes cannot be
    judged by their owner, so once stopped for a while they are removed by any worker; running ones are left alone."""
    import docker as docker_sdk

    from grader.sandboxes import docker as backend

    client = docker_sdk.from_env()
    labels = {backend.LABEL: "1", backend.OWNER_LABEL: "a-container-long-gone:1.1"}
    stopped = client.containers.run(backend.DEFAULT_IMAGE, ["true"], labels=labels, detach=True, network_mode="none")
    running = client.containers.run(backend.DEFAULT_IMAGE, ["sleep", "60"], labels=labels, detach=True, network_mode="none")
    try:
        stopped.wait(timeout=30)
        assert DockerSandbox().reap() == 0  # stopped a moment ago: not yet
        monkeypatch.setattr(backend, "STALE_AFTER_S", 0.0)
        time.sleep(1.1)
        assert DockerSandbox().reap() == 1
        ids = {c.id for c in client.containers.list(all=True, filters={"label": backend.LABEL})}
        assert stopped.id not in ids and running.id in ids
    finally:
        for container in (stopped, running):
            with contextlib.suppress(docker_sdk.errors.NotFound):
                container.remove(force=True)
        client.close()
