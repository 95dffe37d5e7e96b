"""Sessions of Tinker's training primitives: a client's own training loop on a live LoRA model.

The gateway speaks Tinker's service API (``gateway.tinker``) and calls these. A **session** holds the client's
**live models** (Tinker's training clients: a LoRA adapter over a served base model, ``<session>:train:<n>``) and
**samplers** (``<session>:sample:<n>``). Every call that computes is a **request** (a Tinker future): it is metered
and held against the run's budget before any work (402 when the budget cannot cover its worst case), stored, and
executed by the train worker that holds its live model (``trainer_service.live``), training requests in the client's
``seq`` order; :func:`retrieve` waits for its end. Nothing is charged for a request that did not run: its hold is
released.

A live model is a training job of the run (``recipe.method: primitives``): its events (loss, steps), its
checkpoints (every ``save_weights_for_sampler``: an ordinary checkpoint of the run, for chat, evaluations and the
submission) and its spend show where a recipe job's do. Between requests its worker keeps it in memory; after
``primitives_idle_s`` without one it writes the adapter and the optimizer's state and lets it go (``paused``), and the
next request brings it back.

What a request costs (the ledger's prices): ``forward_backward``, its tokens as ``training_tokens`` (``forward``:
``prefill_tokens``); ``sample``, the prompt's tokens per sample as ``prefill_tokens`` and up to ``max_tokens`` per
sample as ``decode_tokens`` held, the generated ones charged; the rest (``optim_step``, saving and loading weights)
nothing.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session
from trainer_service import repository
from trainer_service.models import LiveModel, PrimitiveRequest, PrimitiveSession, Sampler, SavedWeights, TrainingJob
from trainer_service.service import Trainer

from services.common.auth import RunContext
from services.common.contracts import Recipe
from services.common.db import utcnow
from services.common.errors import BadRequest, Conflict, NotFound, Unprocessable
from services.common.ids import new_id
from services.common.llms import UnknownBaseModel, base_model_dir, model_card
from services.ledger.schemas import HoldCreate, HoldRelease, UsageItem, UsageKind

TRAINING_KINDS = frozenset({"forward_backward", "optim_step", "save_weights", "save_weights_for_sampler", "load_weights"})
"""Requests a live model executes in the client's ``seq`` order (a sample runs as it comes)."""

RETRIEVE_POLL_S = 0.1
DEFAULT_CONTEXT = 2048
"""A sample without ``max_tokens`` holds up to this context's worth when the model's card names none."""


@dataclass(frozen=True)
class Answer:
    """A request's state for :func:`retrieve`: ``pending``, ``done`` (``result``: protobuf bytes when ``proto``, else a
    JSON object) or ``failed`` (``error``, ``category``: ``user`` for the client's mistake, ``server`` for ours)."""

    status: str
    result: Any = None
    proto: bool = False
    error: str | None = None
    category: str | None = None


# --------------------------------------------------------------------------- sessions


def create_session(trainer: Trainer, ctx: RunContext, user_metadata: dict[str, Any]) -> str:
    """A new session of run ``ctx``; its id (``tks_…``)."""
    with trainer.db.session() as s:
        session = PrimitiveSession(id=new_id("tks"), run_id=ctx.run_id, run_context=ctx.model_dump(mode="json"), user_metadata=user_metadata,
                                   created_at=utcnow(), heartbeat_at=utcnow())
        s.add(session)
        return session.id


def _session(s: Session, ctx: RunContext, session_id: str) -> PrimitiveSession:
    session = s.get(PrimitiveSession, session_id)
    if session is None or session.run_id != ctx.run_id:
        raise NotFound(f"session {session_id!r} not found", field="session_id")
    return session


def heartbeat(trainer: Trainer, ctx: RunContext, session_id: str) -> bool:
    """Note the session alive; ``False`` once it has finished (the client then stops its heartbeat)."""
    with trainer.db.session() as s:
        session = _session(s, ctx, session_id)
        session.heartbeat_at = utcnow()
        return session.finished_at is None


def finish_session(trainer: Trainer, ctx: RunContext, session_id: str) -> None:
    """End the session: its live models' jobs end (``succeeded``) once their workers have let them go, at once when
    none holds them; a request the client sends later is refused."""
    from trainer_service.jobs import finish

    with trainer.db.session() as s:
        session = _session(s, ctx, session_id)
        session.finished_at = session.finished_at or utcnow()
        for model in repository.session_live_models(s, session_id):
            job = s.get(TrainingJob, model.job_id)
            if job is not None and job.status in ("paused", "queued"):
                finish(s, job, "succeeded", None)


# --------------------------------------------------------------------------- live models


def _base_model(trainer: Trainer, name: str) -> str:
    """``name`` if it is a base model this deployment serves, else 400 naming ``base_model`` (the names Crucible serves
    are listed by ``GET /api/v1/get_server_capabilities``)."""
    try:
        base_model_dir(name, trainer.settings.models_dir)
    except (UnknownBaseModel, FileNotFoundError):
        raise BadRequest(f"base_model {name!r} is not a model this deployment serves", field="base_model") from None
    return name


def create_model(trainer: Trainer, ctx: RunContext, session_id: str, model_seq_id: int, base_model: str, lora: dict[str, Any],
                 recipe: Recipe) -> str:
    """Tinker's ``create_model``: live model ``<session>:train:<model_seq_id>`` with a fresh LoRA adapter (``lora``:
    ``rank``, ``seed``, ``train_attn``, ``train_mlp``, ``train_unembed``) over ``base_model``, and its training job
    (``recipe``, already under the benchmark's policy). Returns its id. ``Conflict`` if the id is taken, ``BadRequest``
    for a base model not served, ``NotFound`` for a session not the run's, a finished session a ``Conflict``."""
    base_model = _base_model(trainer, base_model)
    model_id = f"{session_id}:train:{model_seq_id}"
    with trainer.db.session() as s:
        session = _session(s, ctx, session_id)
        if session.finished_at is not None:
            raise Conflict(f"session {session_id} has finished; open a new ServiceClient", field="session_id")
        if s.get(LiveModel, model_id) is not None:
            raise Conflict(f"model {model_id} exists", field="model_seq_id")
        job = repository.add_job(s, ctx, new_id("job"), method="primitives", recipe=recipe.model_dump(), dataset_ids=[], base_model=base_model,
                                 parent_checkpoint_id=None, hold_id=None, estimated_tokens=0, merge=None, harness=None, grader=None,
                                 run_context=ctx.model_dump(mode="json"), idempotency_key=None, request_sha256="")
        job.status = "paused"
        repository.add_event(s, job.id, "info", "created", f"live model {model_id}: LoRA rank {lora['rank']} over {base_model} (Tinker's primitives)",
                             {"model_id": model_id, **lora})
        s.add(LiveModel(id=model_id, session_id=session_id, run_id=ctx.run_id, job_id=job.id, base_model=base_model, lora=lora, created_at=utcnow()))
    return model_id


def live_model(s: Session, ctx: RunContext, model_id: str) -> LiveModel:
    """Run ``ctx``'s live model ``model_id``; ``NotFound`` otherwise."""
    model = s.get(LiveModel, model_id)
    if model is None or model.run_id != ctx.run_id:
        raise NotFound(f"model {model_id!r} not found", field="model_id")
    return model


def model_info(trainer: Trainer, ctx: RunContext, model_id: str) -> dict[str, Any]:
    """Tinker's ``get_info``: the base model (its name is the tokenizer's: ``get_tokenizer`` loads it from the local
    folder the client was pointed at, see the README), the LoRA rank and the training job that carries it."""
    with trainer.db.session() as s:
        model = live_model(s, ctx, model_id)
        return {"model_id": model.id, "base_model": model.base_model, "lora": model.lora, "job_id": model.job_id}


def _wake(s: Session, model: LiveModel) -> str | None:
    """Mark the live model's job ``queued`` if no worker holds it (``paused``): its id, to send to the workers once this
    session has committed (a worker that claimed it before would find it still ``paused``), else ``None``."""
    job = repository.training_job(s, model.job_id, lock=True)  # the worker letting it go holds this row's lock: read after it
    if job is not None and job.status == "paused":
        job.status, job.enqueued_at = "queued", utcnow()
        return job.id
    return None


def _hold(trainer: Trainer, ctx: RunContext, request_id: str, usage: list[UsageItem]) -> str | None:
    """Hold ``usage``'s price for request ``request_id`` (none for free work); passes the ledger's 402 through."""
    usage = [u for u in usage if u.quantity > 0]
    if not usage:
        return None
    hold = trainer.ledger.create_hold(HoldCreate(account_id=ctx.run_id, purpose=f"primitive request {request_id}", usage=usage,
                                                 idempotency_key=f"hold:{request_id}", ttl_s=int(trainer.settings.train_time_limit_s) + 3600))
    return hold.hold_id


def _job_closed(job: TrainingJob | None, model_id: str) -> str | None:
    """Why nothing more of the live model will run (its job has ended, or its cancel was asked for), else ``None``."""
    if job is not None and (job.status in ("succeeded", "failed", "cancelled") or job.cancel_requested):
        state = "cancelled" if job.cancel_requested else job.status
        return f"model {model_id}'s job {job.id} is {state}; open a new training client"
    return None


def _failed_at_once(s: Any, ctx: RunContext, model_id: str, request_id: str, kind: str, error: str) -> None:
    """Store the request as failed (``user``): its future fails at once with ``error`` (an HTTP 409 instead, the SDK
    retries for five minutes before it raises)."""
    s.add(PrimitiveRequest(id=request_id, run_id=ctx.run_id, model_id=model_id, seq=None, kind=kind, payload=b"{}", status="failed",
                           error=error, category="user", created_at=utcnow(), finished_at=utcnow()))


def submit(trainer: Trainer, ctx: RunContext, model_id: str, kind: str, payload: bytes, *, seq: int | None,
           usage: list[UsageItem] | None = None, sampler_id: str | None = None) -> str:
    """Store a request for live model ``model_id`` after holding ``usage`` (402 when the budget cannot cover it) and
    wake its worker; returns the request id (``req_…``). A training request (``seq`` set) is idempotent: the same
    ``kind`` and ``payload`` at a ``seq`` the model has seen returns that request (the SDK repeats a submit whose
    answer it lost), another one is a ``Conflict``; a session that finished, too. A request to a model whose job has
    ended or is being cancelled is stored as failed (its future fails at once). The hold is released if the request
    cannot be stored or run."""
    request_id = new_id("req")
    with trainer.db.session() as s:
        model = live_model(s, ctx, model_id)
        session = s.get(PrimitiveSession, model.session_id)
        if session is not None and session.finished_at is not None:
            raise Conflict(f"session {model.session_id} has finished", field="session_id")
        if (closed := _job_closed(repository.training_job(s, model.job_id), model_id)) is not None:
            _failed_at_once(s, ctx, model_id, request_id, kind, closed)
            return request_id
        if seq is not None and (earlier := repository.primitive_request_at(s, model_id, seq)) is not None:
            if earlier.kind == kind and earlier.payload == payload:
                return earlier.id  # the client's retry of a request that arrived (its answer was lost): the same future
            raise Conflict(f"model {model_id} has another request with seq_id {seq}", field="seq_id")
        if seq is not None and seq <= model.applied_seq:
            raise Conflict(f"model {model_id} is past seq_id {seq}", field="seq_id")
    hold_id = _hold(trainer, ctx, request_id, usage or [])
    try:
        with trainer.db.session() as s:
            model = live_model(s, ctx, model_id)
            if (closed := _job_closed(repository.training_job(s, model.job_id, lock=True), model_id)) is not None:  # again, locked
                _failed_at_once(s, ctx, model_id, request_id, kind, closed)
                woken = None
            else:
                s.add(PrimitiveRequest(id=request_id, run_id=ctx.run_id, model_id=model_id, sampler_id=sampler_id, seq=seq, kind=kind,
                                       payload=payload, hold_id=hold_id, created_at=utcnow()))
                woken = _wake(s, model)
        if closed is not None and hold_id is not None:
            trainer.ledger.release_hold(hold_id, HoldRelease(idempotency_key=f"release:{hold_id}"))
        if woken is not None:
            trainer.enqueue(woken)
    except Exception:
        if hold_id is not None:
            trainer.ledger.release_hold(hold_id, HoldRelease(idempotency_key=f"release:{hold_id}"))
        raise
    return request_id


def completed(trainer: Trainer, ctx: RunContext, model_id: str, kind: str, result: dict[str, Any]) -> str:
    """A request that is done as it is made (``create_model``, a load that made a model): its id, for the client's future."""
    request_id = new_id("req")
    with trainer.db.session() as s:
        s.add(PrimitiveRequest(id=request_id, run_id=ctx.run_id, model_id=model_id, seq=None, kind=kind, payload=b"{}", status="done",
                               result=json.dumps(result).encode(), created_at=utcnow(), finished_at=utcnow()))
    return request_id


def retrieve(trainer: Trainer, ctx: RunContext, request_id: str, wait_s: float) -> Answer:
    """The request's answer, waiting up to ``wait_s`` seconds for it to end (``pending`` after that)."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            with trainer.db.session() as s:
                req = s.get(PrimitiveRequest, request_id)
                if req is None or req.run_id != ctx.run_id:
                    raise NotFound(f"request {request_id!r} not found", field="request_id")
                if req.status == "done":
                    return Answer("done", result=req.result if req.result_proto else json.loads(req.result or b"{}"), proto=req.result_proto)
                if req.status == "failed":
                    return Answer("failed", error=req.error, category=req.category)
        except OperationalError:  # the embedded plane's SQLite busy with a worker's write: look again, the answer stays pending
            pass
        if time.monotonic() >= deadline:
            return Answer("pending")
        time.sleep(RETRIEVE_POLL_S)


# --------------------------------------------------------------------------- weights and samplers


def saved_weights(s: Session, ctx: RunContext, path: str) -> SavedWeights:
    """The run's saved weights at ``path`` (``tinker://…``); ``NotFound`` naming ``path`` otherwise."""
    saved = s.get(SavedWeights, path)
    if saved is None or saved.run_id != ctx.run_id:
        raise NotFound(f"no weights saved at {path!r} by this run", field="path")
    return saved


def load_into_new_model(trainer: Trainer, ctx: RunContext, session_id: str, model_seq_id: int, path: str, optimizer: bool, recipe: Recipe) -> str:
    """Tinker's create-via-load: a new live model ``<session>:train:<model_seq_id>`` from the state saved at ``path``
    (a ``weights`` path; with ``optimizer`` its optimizer state too). Returns the new model's id."""
    with trainer.db.session() as s:
        saved = saved_weights(s, ctx, path)
        if saved.kind != "weights":
            raise Unprocessable(f"{path} holds sampler weights; a training client loads a state saved by save_state", field="path")
        source = s.get(LiveModel, saved.model_id)
        base_model, lora, uri = source.base_model, dict(source.lora), saved.uri  # type: ignore[union-attr]
    model_id = create_model(trainer, ctx, session_id, model_seq_id, base_model, lora, recipe)
    with trainer.db.session() as s:
        model = s.get(LiveModel, model_id)
        model.state_uri, model.lora = uri, {**lora, "load_optimizer": optimizer}  # type: ignore[union-attr]
    return model_id


def create_sampler(trainer: Trainer, ctx: RunContext, session_id: str, sampling_session_seq_id: int, *, model_path: str | None,
                   base_model: str | None, host: str | None = None, checkpoint_id: str | None = None) -> str:
    """Tinker's ``create_sampling_session``: sampler ``<session>:sample:<n>`` of the weights saved at ``model_path``
    (``sampler_weights``) or of ``base_model`` alone. Its requests run in the worker of the live model that saved the
    weights, else of a live model of the session on the same base model. ``host``/``checkpoint_id``: a sampler made by
    ``save_weights_and_get_sampling_client`` (the model and the checkpoint it saved)."""
    sampler_id = f"{session_id}:sample:{sampling_session_seq_id}"
    with trainer.db.session() as s:
        session = _session(s, ctx, session_id)
        if s.get(Sampler, sampler_id) is not None:
            raise Conflict(f"sampler {sampler_id} exists", field="sampling_session_seq_id")
        if model_path is not None:
            saved = saved_weights(s, ctx, model_path)
            if saved.kind != "sampler_weights":
                raise Unprocessable(f"{model_path} holds a training state; sample from weights saved by save_weights_for_sampler", field="model_path")
            checkpoint_id, source = saved.checkpoint_id, s.get(LiveModel, saved.model_id)
            base_model = source.base_model  # type: ignore[union-attr]
            host = source.id if source is not None and source.session_id == session.id else None  # type: ignore[union-attr]
        elif host is not None:
            base_model = s.get(LiveModel, host).base_model  # type: ignore[union-attr]
        if base_model is None:
            raise BadRequest("give model_path or base_model", field="model_path")
        if host is None:
            host = repository.session_model_on(s, session.id, base_model)
        if host is None:
            raise Unprocessable(f"sampling runs beside a training client of the session on {base_model}: create one first "
                                "(create_lora_training_client), then sample", field="base_model")
        s.add(Sampler(id=sampler_id, session_id=session.id, run_id=ctx.run_id, model_id=host, base_model=base_model, checkpoint_id=checkpoint_id,
                      model_path=model_path, created_at=utcnow()))
    return sampler_id


def sampler(s: Session, ctx: RunContext, sampler_id: str) -> Sampler:
    """Run ``ctx``'s sampler ``sampler_id``; ``NotFound`` otherwise."""
    found = s.get(Sampler, sampler_id)
    if found is None or found.run_id != ctx.run_id:
        raise NotFound(f"sampler {sampler_id!r} not found", field="sampling_session_id")
    return found


def context_tokens(trainer: Trainer, base_model: str) -> int:
    """``base_model``'s context window in tokens: its card's cap, else its own (``max_position_embeddings``)."""
    card = model_card(base_model, trainer.settings.models_dir).context_tokens
    if card:
        return card
    config = json.loads((base_model_dir(base_model, trainer.settings.models_dir) / "config.json").read_text())
    return int(config.get("max_position_embeddings") or DEFAULT_CONTEXT)


def sample_usage(base_model: str, prompt_tokens: int, num_samples: int, max_tokens: int) -> list[UsageItem]:
    """What a sample holds: the prompt's tokens per sample (prefill) and ``max_tokens`` per sample (decode)."""
    return [UsageItem(kind=UsageKind.prefill_tokens, quantity=prompt_tokens * num_samples, model=base_model),
            UsageItem(kind=UsageKind.decode_tokens, quantity=max_tokens * num_samples, model=base_model)]


def forward_usage(base_model: str, tokens: int, forward_only: bool) -> list[UsageItem]:
    """What a forward(-backward) holds and is charged: its tokens, as ``prefill_tokens`` for a forward pass alone."""
    return [UsageItem(kind=UsageKind.prefill_tokens if forward_only else UsageKind.training_tokens, quantity=tokens, model=base_model)]


# --------------------------------------------------------------------------- requests as the client sends them


def submit_forward_backward(trainer: Trainer, ctx: RunContext, body: bytes) -> str:
    """A ``forward_backward`` (or ``forward``) request: the protobuf ``ForwardBackwardRequest`` names its model and
    ``seq_id``; its tokens are held (training tokens; a forward pass alone, prefill). ``BadRequest`` for a body that is
    not such a message."""
    from trainer_service.primitives import PrimitiveError, decode_forward_backward

    try:
        request = decode_forward_backward(body)
    except PrimitiveError as exc:
        raise BadRequest(str(exc), field="body") from None
    with trainer.db.session() as s:
        base_model = live_model(s, ctx, request.model_id).base_model
    context = context_tokens(trainer, base_model)
    for i, datum in enumerate(request.data):
        if not datum.tokens:
            raise BadRequest(f"datum {i} has no tokens", field=f"data[{i}].model_input")
        if len(datum.tokens) > context:
            raise BadRequest(f"datum {i} has {len(datum.tokens)} tokens; {base_model} reads {context} at most", field=f"data[{i}].model_input")
        for name, array in sorted(datum.inputs.items(), key=lambda item: item[0] != "target_tokens"):  # the targets named first
            if array.shape[:1] != (len(datum.tokens),):
                raise BadRequest(f"datum {i}: loss_fn_inputs[{name!r}] has shape {list(array.shape)}; its first dimension is the input's "
                                 f"{len(datum.tokens)} tokens", field=f"data[{i}].loss_fn_inputs.{name}")
    tokens = sum(len(d.tokens) for d in request.data)
    if not request.data or tokens > trainer.settings.primitives_max_tokens:
        raise BadRequest(f"{tokens} tokens in {len(request.data)} datums: a request computes 1 to {trainer.settings.primitives_max_tokens} "
                         "tokens (split the batch: gradients add up until optim_step)", field="data")
    return submit(trainer, ctx, request.model_id, "forward_backward", body, seq=request.seq_id,
                  usage=forward_usage(base_model, tokens, request.forward_only))


def submit_training(trainer: Trainer, ctx: RunContext, kind: str, body: dict[str, Any]) -> str:
    """An ``optim_step``, ``save_weights``, ``save_weights_for_sampler`` (named) or ``load_weights`` request of the
    model ``body["model_id"]`` at ``body["seq_id"]``: free (nothing is held). ``BadRequest`` naming a missing field."""
    if not isinstance(body.get("model_id"), str):
        raise BadRequest("model_id (a string) is required", field="model_id")
    if not isinstance(body.get("seq_id"), int) or isinstance(body.get("seq_id"), bool) or not 1 <= body["seq_id"] <= 2**31 - 1:
        raise BadRequest("seq_id (an integer from 1) is required", field="seq_id")
    if kind in ("save_weights", "save_weights_for_sampler") and not _name_ok(body.get("path")):
        raise BadRequest("path: a name of 1-200 letters, digits, '-', '_' or '.'", field="path")
    return submit(trainer, ctx, str(body["model_id"]), kind, json.dumps(body).encode(), seq=int(body["seq_id"]))


def _name_ok(name: Any) -> bool:
    return isinstance(name, str) and 0 < len(name) <= 200 and all(c.isalnum() or c in "-_." for c in name) and name not in (".", "..")


def submit_sampler_snapshot(trainer: Trainer, ctx: RunContext, model_id: str, seq: int, sampling_session_seq_id: int) -> tuple[str, str]:
    """``save_weights_and_get_sampling_client``: a sampler of the model's weights as they are at request ``seq``:
    ``(request id, sampler id)``; the sampler's checkpoint is written when the request runs."""
    with trainer.db.session() as s:
        session_id = live_model(s, ctx, model_id).session_id
    sampler_id = create_sampler(trainer, ctx, session_id, sampling_session_seq_id, model_path=None, base_model=None, host=model_id)
    body = {"model_id": model_id, "seq_id": seq, "sampler_id": sampler_id}
    return submit(trainer, ctx, model_id, "save_weights_for_sampler", json.dumps(body).encode(), seq=seq), sampler_id


def submit_sample(trainer: Trainer, ctx: RunContext, sampler_id: str, body: dict[str, Any]) -> str:
    """A ``sample`` (or ``compute_logprobs``) request of sampler ``sampler_id``: its worst case held (the prompt's tokens
    and ``max_tokens`` per sample; without ``max_tokens``, what the context leaves). ``BadRequest`` naming a bad field."""
    try:
        prompt = [int(t) for chunk in body["prompt"]["chunks"] for t in chunk["tokens"]]
        num_samples = int(body.get("num_samples", 1))
    except (KeyError, TypeError, ValueError):
        raise BadRequest("prompt: encoded_text chunks of token ids are required (images are not served)", field="prompt") from None
    if not prompt or not 1 <= num_samples <= 1024:
        raise BadRequest("a non-empty prompt and 1-1024 samples", field="num_samples" if prompt else "prompt")
    params = body.get("sampling_params") or {}
    with trainer.db.session() as s:
        found = sampler(s, ctx, sampler_id)
        host, base_model = found.model_id, found.base_model
    context = context_tokens(trainer, base_model)
    asked = params.get("max_tokens") if isinstance(params, dict) else "?"
    if asked is not None and (not isinstance(asked, int) or isinstance(asked, bool) or asked < 1):
        raise BadRequest("sampling_params.max_tokens: a positive integer", field="sampling_params.max_tokens")
    if len(prompt) >= context:
        raise BadRequest(f"the prompt has {len(prompt)} tokens; {base_model} reads {context} at most", field="prompt")
    max_tokens = min(asked or context, context - len(prompt))
    if num_samples * (len(prompt) + max_tokens) > trainer.settings.primitives_max_tokens:
        raise BadRequest(f"{num_samples} samples of up to {len(prompt) + max_tokens} tokens: a request computes "
                         f"{trainer.settings.primitives_max_tokens} at most", field="num_samples")
    return submit(trainer, ctx, host, "sample", json.dumps(body).encode(), seq=None, sampler_id=sampler_id,
                  usage=sample_usage(base_model, len(prompt), num_samples, max_tokens))


def weights_of(trainer: Trainer, ctx: RunContext, model_id: str) -> list[SavedWeights]:
    """The weights the run saved from live model ``model_id`` (``NotFound`` if it is not the run's), oldest first."""
    with trainer.db.session() as s:
        live_model(s, ctx, model_id)
        found = repository.saved_weights_of(s, model_id)
        for w in found:
            s.expunge(w)
        return found
