"""The gateway's service object, and who is calling: run keys, the run's deadline, editable space and recipe policy.

:class:`Gateway` holds what every route needs: settings, database, rate limiter and a typed client of each
service the gateway forwards to. ``gateway.app`` builds one when the app starts; routes receive it by
``Depends`` (``gateway.api``). Every agent call is authorized here (run key → :class:`Caller`), checked
against the run's deadline and editable space, then sent to the owning service with the signed run context;
the services' problem+json answers pass through unchanged. Benchmarks (``gateway.benchmarks``), runs
(``gateway.runs``) and the leaderboard (``gateway.leaderboard``) have their own modules; the episode and audit
logs are at the end of this one.
"""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass
from typing import Any

from inference_service.client import InferenceClient
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool
from trainer_service.client import TrainerClient

from gateway import repository
from gateway.models import Run
from gateway.ratelimit import KeyRateLimiter
from gateway.schemas import TRACKS, BenchmarkFile
from gateway.settings import GatewaySettings
from grader.client import GraderClient
from services.common.auth import RunContext, hash_secret
from services.common.contracts import TRAINING_FIELDS, Recipe, TrainingJobCreate
from services.common.db import Database, utcnow
from services.common.errors import CrucibleError, OutsideEditableSpace, RunExpired, Unauthorized, Unprocessable, UpstreamProblem
from services.common.http import AsyncServiceClient
from services.ledger.client import LedgerClient

TRAINER_TIMEOUT_S = 120.0  # an upload of up to max_upload_bytes, or a job's cost estimate
GRADER_TIMEOUT_S = 300.0  # registering a benchmark builds its splits


@dataclass
class Gateway:
    """The gateway's settings, database, per-key rate limits and clients of the ledger, trainer, inference and grader.

    The clients are async (:class:`AsyncServiceClient`): a request waiting for a busy service holds no worker
    thread. The ledger's client retries while the ledger restarts (``settings.ledger_timeout_s`` in all).
    """

    settings: GatewaySettings
    db: Database
    limiter: KeyRateLimiter
    ledger: LedgerClient
    trainer: TrainerClient
    inference: InferenceClient
    grader: GraderClient

    @classmethod
    def from_settings(cls, settings: GatewaySettings) -> Gateway:
        """The gateway of ``settings``: its database (migrated by the app first) and a client of each service."""
        return cls(
            settings=settings, db=Database(settings.database_url_for("gateway")),
            limiter=KeyRateLimiter(settings.rate_limits, settings.rate_limit_storage),
            ledger=LedgerClient.connect(settings, AsyncServiceClient),
            trainer=TrainerClient.connect(settings, AsyncServiceClient, timeout_s=TRAINER_TIMEOUT_S),
            inference=InferenceClient.connect(settings, AsyncServiceClient),
            grader=GraderClient.connect(settings, AsyncServiceClient, timeout_s=GRADER_TIMEOUT_S),
        )

    async def unready(self) -> dict[str, str]:
        """What of the gateway and the services behind it cannot serve now (part → why; empty: ready): its database,
        and each service's own ``GET /readyz`` (2 s each, asked at once), for the gateway's ``GET /readyz``."""
        services = {"ledger": self.ledger, "trainer": self.trainer, "inference": self.inference, "grader": self.grader}

        async def ask(client: Any) -> str | None:
            try:
                await client.readyz()
            except UpstreamProblem as exc:
                return str(exc.problem.get("detail") or exc.problem.get("code"))
            except CrucibleError as exc:
                return exc.detail
            return None

        answers = await asyncio.gather(asyncio.to_thread(self.db.unready), *(ask(c) for c in services.values()))
        return {name: why for name, why in zip(("database", *services), answers, strict=True) if why}

    async def close(self) -> None:
        """Close every client's connections and the database's."""
        for client in (self.ledger, self.trainer, self.inference, self.grader):
            await client.close()
        self.db.engine.dispose()


@dataclass(frozen=True)
class Caller:
    """An authenticated agent call: its run, its benchmark file, and the context sent to services.

    ``ctx.task_id`` is the grader's id of one task: the benchmark's only task, or the one named by the
    call (:func:`for_task`). ``tasks``: every task's name → grader id.
    """

    run: Run
    benchmark: BenchmarkFile
    ctx: RunContext
    tasks: dict[str, str]
    candidate_key: str | None = None  # the evaluator track: the key its candidates were named under (Benchmark.candidate_key)


# --------------------------------------------------------------------------- agent authorization


def bearer_key(authorization: str | None) -> str | None:
    """The key of an ``Authorization: Bearer <key>`` header; ``None`` for another scheme or no key."""
    scheme, _, key = (authorization or "").partition(" ")
    return (key.strip() or None) if scheme.lower() == "bearer" else None


def authenticate(gw: Gateway, authorization: str | None) -> Caller:
    """The caller behind ``Authorization: Bearer <run key>``; ``Unauthorized`` if missing, unknown or revoked (blocking: a database read)."""
    key = bearer_key(authorization)
    if key is None:
        raise Unauthorized("send the run's API key as `Authorization: Bearer <key>`")
    with gw.db.session() as s:
        run = repository.run_by_key_hash(s, hash_secret(key))
        if run is None:
            raise Unauthorized("unknown API key")
        if run.revoked_at is not None:
            raise Unauthorized("this API key has been revoked")
        return _caller(s, run)


async def admit(gw: Gateway, authorization: str | None, *, counted: bool = False) -> Caller:
    """The caller behind ``authorization``, for a request of the agent API (``/v1`` or ``/mcp``): the key's hit is
    counted first, as the request arrives, before it waits for a thread or the database (``TooManyRequests`` past its
    rate limits; ``counted``: this request was counted already, an MCP tool's call), then :func:`authenticate`
    (``Unauthorized``)."""
    key = bearer_key(authorization)
    if key and not counted:
        await gw.limiter.check(hash_secret(key))
    return await run_in_threadpool(authenticate, gw, authorization)


def run_caller(gw: Gateway, run_id: str) -> Caller:
    """Run ``run_id`` as its agent's calls see it, for an operator's reading of it (``NotFound`` naming ``run_id``)."""
    with gw.db.session() as s:
        return _caller(s, repository.run(s, run_id, field="run_id"))


def _caller(s: Session, run: Run) -> Caller:
    bm = repository.benchmark(s, run.benchmark_id)
    spec, tasks = BenchmarkFile.model_validate(bm.spec), bm.task_ids()  # type: ignore[union-attr]
    editable = list(spec.editable or []) if run.track == spec.track else list(TRACKS[run.track])  # a run on another track than the file's
    ctx = RunContext(run_id=run.id, task_id=next(iter(tasks.values())), track=run.track, editable=editable)
    return Caller(run=run, benchmark=spec, ctx=ctx, tasks=tasks, candidate_key=bm.candidate_key)  # type: ignore[union-attr]


def for_task(caller: Caller, task: str | None) -> Caller:
    """The caller scoped to ``task`` (its grader id in ``ctx.task_id``); ``task`` may be omitted when the
    benchmark has one. ``Unprocessable`` (field ``task``) when it is unknown, or missing with several tasks."""
    if task is None:
        if len(caller.tasks) > 1:
            raise Unprocessable(f"this benchmark has several tasks ({', '.join(caller.tasks)}): name one with ?task=", field="task")
        return caller
    if task not in caller.tasks:
        raise Unprocessable(f"unknown task {task!r}; this benchmark's tasks: {', '.join(caller.tasks)}", field="task")
    return dataclasses.replace(caller, ctx=caller.ctx.model_copy(update={"task_id": caller.tasks[task]}))


def check_deadline(caller: Caller) -> None:
    """``RunExpired`` (403 ``run_expired``) if the run's wall-clock deadline has passed."""
    if utcnow() >= caller.run.deadline_at:
        raise RunExpired(f"run {caller.run.id} ended at {caller.run.deadline_at.isoformat()}; read-only calls still work")


def check_editable(caller: Caller, part: str, operation: str) -> None:
    """``OutsideEditableSpace`` unless ``part`` (data|trainer|harness) is in the run's editable space."""
    if part not in caller.ctx.editable:
        raise OutsideEditableSpace(f"{operation} needs the {part!r} part editable; track {caller.run.track!r} allows {caller.ctx.editable}", operation=operation)


def apply_recipe_policy(caller: Caller, sent: dict[str, Any]) -> dict[str, Any]:
    """The recipe to run: fields the agent sent, checked against the benchmark's allow/lock, plus locked values.

    A locked field sent with a different value, a field outside ``allow``, or any field at all when the
    trainer is not editable → ``OutsideEditableSpace`` naming ``recipe.<field>``. Never silently overwritten.
    """
    policy = caller.benchmark.recipe
    defaults = Recipe().model_dump()
    for name, value in sent.items():
        if name not in TRAINING_FIELDS:
            continue  # the trainer's schema rejects unknown fields with 422
        if name in policy.lock:
            if value != policy.lock[name]:
                raise OutsideEditableSpace(f"recipe.{name} is locked to {policy.lock[name]!r} by this benchmark", field=f"recipe.{name}")
            continue
        if "trainer" not in caller.ctx.editable and value != defaults[name]:
            raise OutsideEditableSpace(f"recipe.{name}: the trainer is not editable on track {caller.run.track!r}", field=f"recipe.{name}")
        if policy.allow != "all" and name not in policy.allow:
            raise OutsideEditableSpace(f"recipe.{name} is not among the benchmark's allowed fields {policy.allow}", field=f"recipe.{name}")
    return {**sent, **policy.lock}


def recipe_field_free(caller: Caller, name: str) -> bool:
    """Whether the run may set recipe field ``name`` to another value than its default (:func:`apply_recipe_policy`
    would take it): not locked, the trainer editable on the run's track, and the field allowed."""
    policy = caller.benchmark.recipe
    return name not in policy.lock and "trainer" in caller.ctx.editable and (policy.allow == "all" or name in policy.allow)


def training_job(caller: Caller, req: TrainingJobCreate) -> TrainingJobCreate:
    """The job the trainer is asked for: ``req`` with its recipe under the benchmark's policy (:func:`apply_recipe_policy`).

    ``OutsideEditableSpace`` when neither the data nor the trainer is editable on the run's track.
    """
    if "data" not in caller.ctx.editable and "trainer" not in caller.ctx.editable:
        check_editable(caller, "trainer", "starting a training job")
    recipe = Recipe(**apply_recipe_policy(caller, req.recipe.model_dump(exclude_unset=True)))
    return req.model_copy(update={"recipe": recipe})


# --------------------------------------------------------------------------- episode and audit logs


def log_call(gw: Gateway, run_id: str, method: str, path: str, status: int, latency_ms: int) -> None:
    """Append one agent call to the episode log."""
    with gw.db.session() as s:
        repository.add_episode_event(s, run_id, method, path, status, latency_ms)


NOTE_METHOD = "NOTE"  # the episode log's method of an agent's note


def log_note(gw: Gateway, run_id: str, path: str, text: str) -> dict[str, Any]:
    """Append the agent's note ``text`` to the episode log: a row with method ``NOTE``, the note route's ``path``, status 201
    and the text (the call itself gets its own row, as every call does). Returns ``{text, created_at}`` (not the row's
    ``seq``: the log's sequence counts every run's calls, which one run is not to learn)."""
    with gw.db.session() as s:
        e = repository.add_episode_event(s, run_id, NOTE_METHOD, path, 201, 0, note=text)
        return {"text": e.note, "created_at": e.created_at}


def log_audit(gw: Gateway, actor: str, key_prefix: str | None, method: str, path: str, status: int, client: str | None) -> None:
    """Append an operator action or a refused credential to the audit log."""
    with gw.db.session() as s:
        repository.add_audit_event(s, actor, key_prefix, method, path, status, client)


def audit_log(gw: Gateway, after: int = 0, limit: int = 1000) -> list[dict[str, Any]]:
    """At most ``limit`` audit events with ``seq > after``, oldest first."""
    with gw.db.session() as s:
        return [{"seq": e.seq, "actor": e.actor, "key_prefix": e.key_prefix, "method": e.method, "path": e.path, "status": e.status,
                 "client": e.client, "created_at": e.created_at} for e in repository.audit_events_after(s, after, limit)]


def episode_log(gw: Gateway, run_id: str, after: int = 0, limit: int = 1000) -> list[dict[str, Any]]:
    """At most ``limit`` of run ``run_id``'s calls and notes with ``seq > after``, oldest first (``note``: a ``NOTE`` row's text,
    else null)."""
    with gw.db.session() as s:
        return [{"seq": e.seq, "method": e.method, "path": e.path, "status": e.status, "latency_ms": e.latency_ms, "note": e.note,
                 "created_at": e.created_at} for e in repository.episode_events_after(s, run_id, after, limit)]
