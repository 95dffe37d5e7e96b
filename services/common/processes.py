"""Processes of this host named so that a later look can tell whether they still live: what a worker names the files
it leaves while it runs (sandbox workspaces, training work folders), so that whoever finds them after it died removes
them, and never a live process's."""

from __future__ import annotations

import os
import socket
from pathlib import Path


def process_tag(pid: int | None = None) -> str:
    """Process ``pid`` (default: this one) as ``<pid>.<start>``: its id and its start time in clock ticks since boot
    (``/proc/<pid>/stat``). Ids are reused, by containers above all (a worker restarted in its container is PID 1
    again); the pair is not. ``<pid>`` alone where the start time cannot be read."""
    pid = os.getpid() if pid is None else pid
    start = _start_ticks(pid)
    return f"{pid}.{start}" if start is not None else str(pid)


def _start_ticks(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2:].split()[19]  # field 22, counted after the command name, which may hold spaces


def owner_alive(owner_tag: str) -> bool:
    """Whether the process ``<host>:<pid>[.<start>]`` is alive: a process with that id runs on this host and, where the
    tag has a start time, it started then (not a later process given the same id). ``True`` for another host's (not
    ours to judge)."""
    host, _, tag = owner_tag.rpartition(":")
    pid, _, start = tag.partition(".")
    if host != socket.gethostname() or not pid.isdigit():
        return True
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return not start or _start_ticks(int(pid)) in (start, None)


def tag_alive(tag: str) -> bool:
    """Whether the process of a :func:`process_tag` on this host is alive."""
    return owner_alive(f"{socket.gethostname()}:{tag}")
