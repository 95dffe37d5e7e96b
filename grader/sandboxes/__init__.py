"""Sandbox backends (:mod:`grader.sandboxes.base` states what every one guarantees): ``bwrap`` (bubblewrap, the
embedded stack's) and ``docker`` (containers through the Docker SDK, for docker-compose and Kubernetes), chosen by the
grader setting ``sandbox_backend``."""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from grader.sandboxes.base import ExecResult, Limits, Mount, Sandbox, SandboxUnavailable, reap_workspaces, remove_tree, workspace
from grader.sandboxes.bwrap import BubblewrapSandbox
from grader.sandboxes.docker import DockerSandbox

BACKENDS: dict[str, Callable[[], Sandbox]] = {"bwrap": BubblewrapSandbox, "docker": DockerSandbox}


class SandboxSettings(BaseSettings):
    """Which backend runs this process's sandboxes (``CRUCIBLE_SANDBOX_BACKEND``); the grader's settings include it."""

    model_config = SettingsConfigDict(env_prefix="CRUCIBLE_", extra="ignore")

    sandbox_backend: Literal["bwrap", "docker"] = Field(
        "bwrap", description="Where code harnesses, task verifiers and the programs of code suites (HumanEval) run (grader/sandboxes): "
                             "`bwrap` (bubblewrap, local processes) or `docker` (a container per sandbox through the Docker SDK).")


def get_sandbox(name: str) -> Sandbox:
    """The backend called ``name``; raises ``KeyError`` for an unknown one."""
    return BACKENDS[name]()


@lru_cache(maxsize=1)
def configured_sandbox() -> Sandbox:
    """The backend this process's settings name (:class:`SandboxSettings`, read once): what a suite that runs programs
    uses when it is not given one."""
    return get_sandbox(SandboxSettings().sandbox_backend)


__all__ = ["BACKENDS", "ExecResult", "Limits", "Mount", "Sandbox", "SandboxSettings", "SandboxUnavailable", "configured_sandbox", "get_sandbox",
           "reap_workspaces", "remove_tree", "workspace"]
