"""The embedded stack's processes live and die with the process that started them (crucible/stack.py): a starter killed
by SIGKILL leaves nothing running, ``crucible down`` stops a stack started elsewhere, and a port already taken is refused
before anything starts, naming what holds it. Stand-in children (``sleep``) take the services' place: what is tested is
how processes are started, recorded and stopped, the same for any command."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest
from typer.testing import CliRunner

from crucible.cli import app
from crucible.stack import PortTaken, Stack, record_path
from tests.conftest import ROOT

STARTER = """
import signal, sys, threading, time
from pathlib import Path
from crucible.stack import ProcessSpec, Stack
signal.signal(signal.SIGINT, signal.SIG_IGN)  # as a stack started in the background: Ctrl-C never reaches it
stack = Stack(Path(sys.argv[1]), 9)
threads = [threading.Thread(target=stack._spawn, args=(ProcessSpec(name, ["sleep", "300"]),)) for name in ("ledger", "trainer")]
for t in threads:
    t.start()
for t in threads:
    t.join()  # the threads that asked for the children end: the children must not end with them
print(" ".join(str(p.pid) for p in stack.procs.values()), flush=True)
time.sleep(300)
"""


def start_elsewhere(data_dir: Path) -> tuple[subprocess.Popen[str], list[int]]:
    """A process that starts two stand-in children and waits: it and their pids."""
    starter = subprocess.Popen([sys.executable, "-c", textwrap.dedent(STARTER), str(data_dir)], stdout=subprocess.PIPE, text=True, cwd=ROOT,
                               env={**os.environ, "PYTHONPATH": str(ROOT)}, start_new_session=True)
    assert starter.stdout is not None
    children = [int(p) for p in starter.stdout.readline().split()]
    assert len(children) == 2 and all(psutil.pid_exists(p) for p in children)
    return starter, children


def gone(pids: list[int], within_s: float = 10.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]:
            return True
        time.sleep(0.1)
    return False


def test_children_die_with_a_starter_killed_by_sigkill(tmp_path: Path) -> None:
    starter, children = start_elsewhere(tmp_path)
    time.sleep(0.5)
    assert all(psutil.pid_exists(p) for p in children)  # alive after the threads that started them ended
    os.kill(starter.pid, signal.SIGKILL)
    starter.wait()
    assert gone(children), [psutil.Process(p).cmdline() for p in children if psutil.pid_exists(p)]


def test_crucible_down_stops_a_stack_started_elsewhere(tmp_path: Path) -> None:
    starter, children = start_elsewhere(tmp_path)
    record = json.loads(record_path(tmp_path).read_text())
    assert record["starter"]["pid"] == starter.pid and sorted(e["pid"] for e in record["processes"].values()) == sorted(children)
    result = CliRunner().invoke(app, ["down", "--data-dir", str(tmp_path)])
    assert result.exit_code == 0 and f"starter pid {starter.pid}" in result.output, result.output
    starter.wait(timeout=10)
    assert gone(children)
    assert not record_path(tmp_path).exists()
    again = CliRunner().invoke(app, ["down", "--data-dir", str(tmp_path)])
    assert again.exit_code == 0 and "no stack is running" in again.output


def test_a_taken_port_is_refused_before_anything_starts_naming_its_holder(tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as held:
        port = held.getsockname()[1]
        with pytest.raises(PortTaken, match=rf"port {port} is taken by pid {os.getpid()}: "):
            Stack(tmp_path, port).start(timeout_s=5)
    assert not record_path(tmp_path).exists() and not (tmp_path / "logs").exists()
