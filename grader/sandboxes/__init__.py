"""Sandbox backends (:mod:`grader.sandboxes.base` states what every one guarantees): ``bwrap`` (bubblewrap, the
embedded stack's) and ``docker`` (containers through the Docker SDK, for docker-compose and Kubernetes), chosen by the
grader setting ``sandbox_backend``."""

from __future__ import annotations

from collections.abc import Callable

from grader.sandboxes.base import ExecResult, Limits, Mount, Sandbox, SandboxUnavailable, reap_workspaces, remove_tree, workspace
from grader.sandboxes.bwrap import BubblewrapSandbox
from grader.sandboxes.docker import DockerSandbox

BACKENDS: dict[str, Callable[[], Sandbox]] = {"bwrap": BubblewrapSandbox, "docker": DockerSandbox}


def get_sandbox(name: str) -> Sandbox:
    """The backend called ``name``; raises ``KeyError`` for an unknown one."""
    return BACKENDS[name]()


__all__ = ["BACKENDS", "ExecResult", "Limits", "Mount", "Sandbox", "SandboxUnavailable", "get_sandbox", "reap_workspaces", "remove_tree", "workspace"]
