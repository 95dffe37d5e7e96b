"""One rollout of a code harness on one task, in a fresh sandbox (:mod:`grader.sandboxes`), and its trajectory.

In order, each step a sandbox of its own, all over one workspace shown at ``/app``:

1. **Set-up** (a task with an environment, :class:`grader.suites.TaskEnvironment`): the task's files are copied into
   ``/app`` and its ``setup.sh`` runs there (no model, no harness).
2. **Harness**: the archive is unpacked (a copy of its own) at ``/harness``; its ``install`` command runs in
   ``/harness``, then its ``entry`` in ``/app``, with the task's instruction on stdin and, in the environment,
   ``OPENAI_BASE_URL`` (``http://127.0.0.1:8000/v1``), ``OPENAI_API_KEY`` (a token bound to this rollout alone by the
   worker's :class:`grader.model_endpoint.ModelEndpoint`) and ``OPENAI_MODEL`` (the only model it serves). When the
   harness ends, or a limit ends it, every process it started is gone (the sandbox's guarantee) and the token is
   unbound.
3. **Verifier** (with an environment): only now are the task's tests mounted, read-only at ``/tests``, with an empty
   ``/logs/verifier``; ``bash /tests/test.sh`` runs in ``/app``. The harness never saw either path, so it cannot plant
   files where the tests go; what it left in ``/app`` is what the tests check. The reward is what the verifier wrote,
   as in Harbor: ``/logs/verifier/reward.txt`` (a number) or ``reward.json`` (``{"reward": x}``), in [0, 1].
   Without an environment (a single-turn suite), the harness's standard output is the answer the suite scores.

A rollout fails (reward 0, with the reason in :attr:`RolloutTrajectory.failure`) when the harness is ended by a limit
(the verifier does not run), or the verifier writes no reward. Either is the harness's doing, never an evaluation failure. A set-up that fails
is the platform's fault: :class:`TaskSetupFailed`.
"""

from __future__ import annotations

import json
import math
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grader.harness_archives import HarnessManifest, unpack
from grader.model_endpoint import Binding, Call, ModelEndpoint
from grader.sandboxes import ExecResult, Limits, Mount, Sandbox, workspace
from grader.settings import GraderSettings
from grader.suites import TaskEnvironment
from services.common.contracts import RolloutRun, RolloutStep, RolloutTrajectory

HARNESS_DIR, APP_DIR, TESTS_DIR, SETUP_DIR, VERIFIER_LOGS = "/harness", "/app", "/tests", "/setup", "/logs/verifier"
# install in /harness (stdin closed), then the entry in /app with the instruction on stdin; the commands come in the environment
_HARNESS_SCRIPT = ('if [ -n "$CRUCIBLE_HARNESS_INSTALL" ]; then (cd /harness && bash -c "$CRUCIBLE_HARNESS_INSTALL") </dev/null >&2 || exit $?; fi; '
                   'exec bash -c "$CRUCIBLE_HARNESS_ENTRY"')


class TaskSetupFailed(RuntimeError):
    """A task's set-up script failed: the task, not the harness, is broken."""


@dataclass(frozen=True)
class RolloutLimits:
    """The platform's caps on a rollout: the harness's declared limits are lowered to these (seconds, MiB, counts)."""

    wall_s: float = 600.0
    memory_mb: int = 2048
    processes: int = 128
    disk_mb: int = 512
    verifier_wall_s: float = 120.0

    @classmethod
    def from_settings(cls, settings: GraderSettings) -> RolloutLimits:
        """The caps the grader's settings give (``rollout_*``, ``verifier_wall_s``)."""
        return cls(wall_s=settings.rollout_wall_s, memory_mb=settings.rollout_memory_mb, processes=settings.rollout_processes,
                   disk_mb=settings.rollout_disk_mb, verifier_wall_s=settings.verifier_wall_s)

    def for_harness(self, manifest: HarnessManifest, task_timeout_s: float | None) -> Limits:
        """The harness run's :class:`Limits`: each declared limit capped here, the wall time also by the task's."""
        declared = manifest.limits
        wall = min(x for x in (declared.wall_s, task_timeout_s, self.wall_s) if x is not None)
        return Limits(wall_s=wall, cpu_s=wall, memory_mb=min(declared.memory_mb or self.memory_mb, self.memory_mb),
                      processes=min(declared.processes or self.processes, self.processes),
                      disk_mb=min(declared.disk_mb or self.disk_mb, self.disk_mb))

    def for_verifier(self, task_timeout_s: float) -> Limits:
        wall = min(task_timeout_s, self.verifier_wall_s)
        return Limits(wall_s=wall, cpu_s=wall, memory_mb=self.memory_mb, processes=self.processes, disk_mb=self.disk_mb)


@dataclass(frozen=True)
class RolloutOutcome:
    """What a rollout gave: its ``trajectory``, the ``answer`` (a single-turn suite's: the harness's standard output;
    ``None`` with an environment), the ``reward`` (the verifier's; ``None`` without an environment), and the sandbox
    seconds it used (whole seconds, rounded up, as charged)."""

    trajectory: RolloutTrajectory
    answer: str | None
    reward: float | None
    sandbox_s: int


def _run_out(result: ExecResult) -> RolloutRun:
    return RolloutRun(exit_code=result.exit_code, limit=result.limit, elapsed_s=round(result.elapsed_s, 3), stdout=result.stdout, stderr=result.stderr)


def read_reward(logs: Path) -> float | None:
    """The reward the verifier wrote in ``logs`` (``reward.txt``: a number; else ``reward.json``: ``{"reward": x}``),
    if it is a number in [0, 1]; ``None`` otherwise."""
    try:
        if (logs / "reward.txt").is_file():
            value: Any = float((logs / "reward.txt").read_text()[:100].strip())
        elif (logs / "reward.json").is_file():
            value = json.loads((logs / "reward.json").read_text()[:100_000]).get("reward")
        else:
            return None
    except (ValueError, OSError, AttributeError):
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 <= value <= 1.0:
        return None
    return float(value)


def steps_of(calls: list[Call]) -> list[RolloutStep]:
    """The rollout's steps from its model calls: each call's messages not yet seen (the harness's prompts and the
    observations it sent back: ``tool`` messages, and ``user`` messages after the first answer, are ``environment``
    steps), then the model's answer as an ``agent`` step with its tokens."""
    steps: list[RolloutStep] = []
    seen = 0
    for call in (c for c in calls if c is not None):
        answered = any(s.source == "agent" for s in steps)
        new = call.messages[seen:] if seen <= len(call.messages) else call.messages
        for m in new:
            role = m.get("role")
            if role == "assistant":
                continue
            source = "environment" if role == "tool" or (role == "user" and answered) else ("system" if role in ("system", "developer") else "user")
            steps.append(RolloutStep(step_id=len(steps) + 1, source=source, message=_text(m.get("content"))))
        steps.append(RolloutStep(step_id=len(steps) + 1, timestamp=call.at, source="agent", message=_text(call.message.get("content")),
                                 tool_calls=call.message.get("tool_calls"), prompt_tokens=call.prompt_tokens, completion_tokens=call.completion_tokens))
        seen = len(call.messages) + 1
    return steps


def _text(content: Any) -> str:
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return content or ""


def run_rollout(sandbox: Sandbox, endpoint: ModelEndpoint, *, archive: bytes, archive_id: str, manifest: HarnessManifest,
                instruction: str, binding: Binding, environment: TaskEnvironment | None, caps: RolloutLimits,
                check: Callable[[], None] = lambda: None, unbind_wait_s: float = 1800.0) -> RolloutOutcome:
    """Run one rollout (see the module docstring). ``binding``: what the rollout's model token allows (its calls are
    recorded on it); ``check()``: called between the steps (the evaluation's lease check; it raises to stop);
    ``unbind_wait_s``: how long to wait for model calls still in flight when the harness has ended (their charges).
    Raises :class:`TaskSetupFailed` when the task's set-up fails, ``SandboxUnavailable`` when no sandbox starts."""
    limits = caps.for_harness(manifest, environment.agent_timeout_s if environment else None)
    extra = [Mount(source, target) for source, target in environment.mounts] if environment else []
    with workspace(limits.disk_mb) as root:  # /app and /harness in one size-limited file system
        app, harness_dir = root / "app", root / "harness"
        app.mkdir()
        harness_dir.mkdir()
        unpack(archive, harness_dir)
        spent = 0.0
        if environment is not None:
            if environment.app is not None:
                shutil.copytree(environment.app, app, dirs_exist_ok=True)
            if environment.setup is not None:
                setup = sandbox.run(["bash", f"{SETUP_DIR}/{environment.setup.name}"], mounts=[Mount(app, APP_DIR, True), Mount(environment.setup.parent, SETUP_DIR), *extra],
                                    cwd=APP_DIR, env={}, limits=caps.for_verifier(environment.verifier_timeout_s))
                spent += setup.elapsed_s
                if not setup.ok:
                    raise TaskSetupFailed(f"the task's set-up failed (exit {setup.exit_code}, limit {setup.limit}): {setup.stderr[-500:]}")
        check()
        bound = endpoint.bind(binding)
        try:
            env = {"OPENAI_BASE_URL": endpoint.base_url, "OPENAI_API_KEY": bound.token, "OPENAI_MODEL": binding.name,
                   "CRUCIBLE_MAX_TURNS": str(binding.max_calls), "CRUCIBLE_HARNESS_ENTRY": manifest.entry, "CRUCIBLE_HARNESS_INSTALL": manifest.install or ""}
            ran = sandbox.run(["bash", "-c", _HARNESS_SCRIPT], mounts=[Mount(app, APP_DIR, True), Mount(harness_dir, HARNESS_DIR, True), *extra],
                              cwd=APP_DIR, env=env, limits=limits, stdin=instruction.encode(), model_socket=bound.socket)
        finally:
            endpoint.unbind(bound.token, wait_s=unbind_wait_s)
        spent += ran.elapsed_s
        failure = f"the harness was stopped by its {ran.limit} limit" if ran.limit else None
        verifier, reward, answer = None, None, None
        if environment is None:
            answer = None if failure else ran.stdout
        elif failure:
            reward = 0.0
        else:
            check()
            with tempfile.TemporaryDirectory(prefix="crucible-verifier-") as logs:  # the grader's (mode 0700): only the verifier's root writes it
                verifier = sandbox.run(["bash", f"{TESTS_DIR}/test.sh"], mounts=[Mount(app, APP_DIR, True), Mount(environment.tests, TESTS_DIR),
                                                                              Mount(Path(logs), VERIFIER_LOGS, True), *extra],
                                       cwd=APP_DIR, env={}, limits=caps.for_verifier(environment.verifier_timeout_s), agent_user=True)
                reward = read_reward(Path(logs))
            spent += verifier.elapsed_s
            if verifier.limit:
                failure, reward = f"the verifier was stopped by its {verifier.limit} limit", 0.0
            elif reward is None:
                failure, reward = f"the verifier wrote no reward in [0, 1] (exit {verifier.exit_code})", 0.0
    calls = [c for c in binding.calls if c is not None]
    prompt_tokens, completion_tokens = binding.tokens
    trajectory = RolloutTrajectory(harness=archive_id, model=binding.name, sandbox=sandbox.name, steps=steps_of(calls), harness_run=_run_out(ran),
                                   verifier_run=_run_out(verifier) if verifier else None, reward=reward or 0.0, failure=failure,
                                   model_calls=len(calls), prompt_tokens=prompt_tokens, completion_tokens=completion_tokens)
    return RolloutOutcome(trajectory=trajectory, answer=answer, reward=reward, sandbox_s=math.ceil(spent))
