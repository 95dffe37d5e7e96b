"""A train worker holding a live model (Tinker's training client, ``trainer_service.sessions``) while its requests come.

The worker claims the live model's job (``services.common.jobs``: a lease, heartbeats), builds the model
(:class:`trainer_service.primitives.LiveModel`: a fresh adapter, or the state it was last let go with, then replays
the training requests done after that state, so a worker that died loses nothing the client was told), and executes
the model's requests: training requests strictly in the client's ``seq`` order, samples as they come. Each request
ends ``done`` with its result or ``failed`` with an error (``user``: the client's mistake, such as a loss input
missing; ``server``: ours), and its budget hold is settled with what it used or released. After
``primitives_idle_s`` seconds without a request (:data:`BUSY_IDLE_S` while another job waits for a worker; at once when
the session finished) the worker writes the adapter and the
optimizer's state, marks the job ``paused`` (``succeeded`` for a finished session) and returns; the next request
sends it to a worker again. Gradients a ``forward_backward`` left for a later ``optim_step`` are not part of that
state: the state is recorded as of the last training request after which none were pending, so the worker that takes
the model next replays the ``forward_backward`` requests since then and the step applies them all.
"""

from __future__ import annotations

import json
import shutil
import time
from typing import Any

import structlog
from trainer_service import primitives, repository
from trainer_service.jobs import fail_queued, finish, workdir
from trainer_service.models import LiveModel as LiveModelRow
from trainer_service.models import PrimitiveRequest, PrimitiveSession, Sampler, SavedWeights, TrainingJob
from trainer_service.service import Trainer
from trainer_service.sessions import TRAINING_KINDS, forward_usage

from services.common import artifacts, jobs
from services.common.db import utcnow
from services.common.ids import new_id
from services.common.llms import base_model_dir
from services.ledger.schemas import HoldRelease, UsageItem, UsageKind

log = structlog.get_logger("trainer.live")

POLL_S = 0.05
"""How often an idle worker looks for its model's next request."""

BUSY_IDLE_S = 2.0
"""How long a live model without a request keeps its worker while another job waits for one (``primitives_idle_s``
when none does)."""

GAP_WAIT_S = 30.0
"""How long a training request waits for the one before it in ``seq`` order (a client that gave up on a request,
e.g. a custom loss that failed on its side, leaves a gap) before the worker goes on without it."""


class _Serving:
    """One claimed live model as this worker serves it."""

    def __init__(self, trainer: Trainer, row: LiveModelRow, lease: jobs.Lease) -> None:
        self.trainer, self.lease = trainer, lease
        self.model_id, self.job_id, self.base_model = row.id, row.job_id, row.base_model
        self.base_dir = base_model_dir(row.base_model, trainer.settings.models_dir)
        self.workdir = workdir(trainer.settings, row.job_id)
        self.samplers: dict[str, primitives.LiveModel] = {}  # checkpoint id -> a model of those weights, for old samplers
        self.current_checkpoint: str | None = None  # the checkpoint holding exactly the current weights, if one was saved since the last step
        self.applied_seq = row.applied_seq
        self.clean_seq = row.state_seq  # the last training request after which no gradient was pending
        lora = row.lora
        if row.state_uri:
            self.model = primitives.LiveModel.from_state(self.base_dir, artifacts.local_path(row.state_uri),
                                                         optimizer=bool(lora.get("load_optimizer", True)))
        else:
            self.model = primitives.LiveModel(self.base_dir, rank=int(lora["rank"]), seed=lora.get("seed"), train_attn=lora.get("train_attn", True),
                                              train_mlp=lora.get("train_mlp", True), train_unembed=lora.get("train_unembed", True))
        self._replay(row.state_seq, row.applied_seq)

    # ------------------------------------------------------------------ the loop

    def serve(self) -> str:
        """Execute requests until idle or the session ends; returns the job's next status (``paused`` | ``succeeded``)."""
        idle_since = time.monotonic()
        gap_since: float | None = None
        while True:
            self.lease.check()
            with self.trainer.db.session() as s:
                if repository.training_job(s, self.job_id).cancel_requested:  # type: ignore[union-attr]
                    return "cancelled"
                finished = self._session_finished(s)
                req = self._next(s)
                waiting = req is None and self._has_later_training_request(s)
                idle_limit = self.trainer.settings.primitives_idle_s
                if req is None and not waiting and repository.other_job_waiting(s, self.job_id):
                    idle_limit = min(idle_limit, BUSY_IDLE_S)
            if req is not None:
                self._execute(req)
                idle_since, gap_since = time.monotonic(), None
                continue
            now = time.monotonic()
            if waiting:
                gap_since = gap_since or now
                if now - gap_since > GAP_WAIT_S:
                    self._skip_gap()
                    gap_since = None
                time.sleep(POLL_S)
                continue
            if finished:
                return "succeeded"
            if now - idle_since > idle_limit:
                return "paused"
            time.sleep(POLL_S)

    def _session_finished(self, s: Any) -> bool:
        row = s.get(LiveModelRow, self.model_id)
        session = s.get(PrimitiveSession, row.session_id)
        return session is not None and session.finished_at is not None

    def _next(self, s: Any) -> str | None:
        """The next request to run: the training request right after the last one applied, else the oldest sample."""
        req = repository.primitive_request_at(s, self.model_id, self.applied_seq + 1)
        if req is not None and req.status == "queued":
            return req.id
        return repository.oldest_queued_sample(s, self.model_id)

    def _has_later_training_request(self, s: Any) -> bool:
        first = repository.first_queued_training_seq(s, self.model_id, self.applied_seq)
        return first is not None and first > self.applied_seq + 1

    def _skip_gap(self) -> None:
        with self.trainer.db.session() as s:
            first = repository.first_queued_training_seq(s, self.model_id, self.applied_seq)
            if first is not None:
                log.warning("skipping a gap in the client's requests", model_id=self.model_id, after=self.applied_seq, next=first)
                self.applied_seq = first - 1
                s.get(LiveModelRow, self.model_id).applied_seq = self.applied_seq  # type: ignore[union-attr]

    # ------------------------------------------------------------------ one request

    def _execute(self, request_id: str) -> None:
        with self.trainer.db.session() as s:
            req = s.get(PrimitiveRequest, request_id)
            kind, payload, seq, hold_id, sampler_id = req.kind, req.payload, req.seq, req.hold_id, req.sampler_id  # type: ignore[union-attr]
        usage: list[UsageItem] = []
        try:
            result, proto, usage, event = getattr(self, f"_{kind}")(payload, sampler_id)
            status, error, category = "done", None, None
        except primitives.PrimitiveError as exc:
            result, proto, event = None, False, None
            status, error, category = "failed", str(exc), "user"
        except jobs.LeaseLost:
            raise
        except Exception as exc:  # noqa: BLE001 - the request fails; the model and the worker live on
            log.exception("primitive request failed", request_id=request_id, kind=kind)
            result, proto, event = None, False, None
            status, error, category = "failed", f"{exc.__class__.__name__}: {exc}", "server"
        with self.trainer.db.session() as s:
            job = self.lease.row(s)
            req = s.get(PrimitiveRequest, request_id)
            req.status, req.error, req.category, req.finished_at = status, error, category, utcnow()  # type: ignore[union-attr]
            req.result, req.result_proto = (result if proto else json.dumps(result).encode()) if result is not None else None, proto  # type: ignore[union-attr]
            if seq is not None:
                self.applied_seq = seq
                if not self.model.has_pending_gradients:
                    self.clean_seq = seq
                s.get(LiveModelRow, self.model_id).applied_seq = seq  # type: ignore[union-attr]
            for item in usage:
                if item.kind == UsageKind.training_tokens:
                    job.trained_tokens += item.quantity
                elif item.kind == UsageKind.prefill_tokens:
                    job.prefill_tokens += item.quantity
                elif item.kind == UsageKind.decode_tokens:
                    job.decode_tokens += item.quantity
            if event is not None:
                repository.add_event(s, self.job_id, *event)
        if hold_id is not None:
            if usage:
                self.trainer.ledger.settle_or_charge(hold_id, usage, f"settle:{request_id}")
            else:
                self.trainer.ledger.release_hold(hold_id, HoldRelease(idempotency_key=f"release:{hold_id}"))

    def _forward_backward(self, payload: bytes, _sampler: str | None, replay: bool = False) -> tuple[Any, bool, list[UsageItem], Any]:
        request = primitives.decode_forward_backward(payload)
        logprobs, metrics, tokens = self.model.forward_backward(request.data, request.loss_fn, request.loss_fn_config, request.forward_only)
        if not request.forward_only:
            self.current_checkpoint = None
        if replay:
            return None, True, [], None
        usage = forward_usage(self.base_model, tokens, request.forward_only)
        what = "forward" if request.forward_only else "forward_backward"
        event = ("info", "forward", f"{what} {request.loss_fn} on {len(request.data)} datums: loss:sum {metrics['loss:sum']:.4f}",
                 {"loss_fn": request.loss_fn, "datums": len(request.data), "tokens": tokens, "forward_only": request.forward_only, **metrics})
        return primitives.encode_forward_backward_output(logprobs, metrics), True, usage, event

    def _optim_step(self, payload: bytes, _sampler: str | None, replay: bool = False) -> tuple[Any, bool, list[UsageItem], Any]:
        adam = json.loads(payload).get("adam_params") or {}
        metrics = self.model.optim_step(**{k: float(v) for k, v in adam.items() if k in OPTIM_FIELDS})
        self.current_checkpoint = None
        if replay:
            return None, False, [], None
        with self.trainer.db.session() as s:
            job = self.lease.row(s)
            job.steps_done += 1
            step = job.steps_done
        event = ("info", "step", f"optim_step {step}: learning rate {adam.get('learning_rate', 1e-4):g}",
                 {"step": step, "learning_rate": adam.get("learning_rate", 1e-4), **metrics})
        return {"metrics": metrics}, False, [], event

    def _save_weights(self, payload: bytes, _sampler: str | None, replay: bool = False) -> tuple[Any, bool, list[UsageItem], Any]:
        body = json.loads(payload)
        if replay:
            return None, False, [], None
        path = f"tinker://{self.model_id}/weights/{body['path']}"
        folder = self.model.save_state(self.workdir / "state")
        uri = artifacts.put_dir(self.trainer.settings.artifacts_dir, f"primitives/{self.job_id}/weights/{new_id('st')}", folder)
        self._record_weights(path, "weights", None, uri, overwrite=bool(body.get("overwrite")))
        return {"path": path, "type": "save_weights"}, False, [], ("info", "save_weights", f"state saved at {path}", {"path": path})

    def _save_weights_for_sampler(self, payload: bytes, _sampler: str | None, replay: bool = False) -> tuple[Any, bool, list[UsageItem], Any]:
        body = json.loads(payload)
        if replay:
            return None, False, [], None
        checkpoint_id = self._checkpoint()
        if body.get("path"):
            path = f"tinker://{self.model_id}/sampler_weights/{body['path']}"
            self._record_weights(path, "sampler_weights", checkpoint_id, None, overwrite=True)
            return {"path": path, "type": "save_weights_for_sampler"}, False, [], None
        sampler_id = body["sampler_id"]  # made by the submit route with the request (sessions.create_sampler)
        with self.trainer.db.session() as s:
            s.get(Sampler, sampler_id).checkpoint_id = checkpoint_id  # type: ignore[union-attr]
        return {"sampling_session_id": sampler_id, "type": "save_weights_for_sampler"}, False, [], None

    def _load_weights(self, payload: bytes, _sampler: str | None, replay: bool = False) -> tuple[Any, bool, list[UsageItem], Any]:
        body = json.loads(payload)
        with self.trainer.db.session() as s:
            saved = s.get(SavedWeights, body["path"])
            if saved is None or saved.kind != "weights":
                raise primitives.PrimitiveError(f"no training state saved at {body['path']!r} by this run")
            uri = saved.uri
        self.model.load_state(artifacts.local_path(uri), optimizer=bool(body.get("optimizer")))  # type: ignore[arg-type]
        self.current_checkpoint = None
        if replay:
            return None, False, [], None
        return {"path": body["path"], "type": "load_weights"}, False, [], ("info", "load_weights", f"state loaded from {body['path']}", {})

    def _sample(self, payload: bytes, sampler_id: str | None, replay: bool = False) -> tuple[Any, bool, list[UsageItem], Any]:
        body = json.loads(payload)
        prompt = [t for chunk in body["prompt"]["chunks"] for t in chunk.get("tokens", [])]
        params = body.get("sampling_params") or {}
        model = self._sampling_model(sampler_id)
        logprobs = model.prompt_logprobs(prompt) if body.get("prompt_logprobs") else None
        sequences = model.sample(prompt, num_samples=int(body.get("num_samples", 1)), max_tokens=params.get("max_tokens"),
                                 temperature=float(params.get("temperature", 1.0)), top_k=int(params.get("top_k", -1)),
                                 top_p=float(params.get("top_p", 1.0)), stop=params.get("stop"), seed=params.get("seed"),
                                 deadline=time.monotonic() + self.trainer.settings.primitives_sample_s)
        decoded = sum(len(seq.tokens) for seq in sequences)
        usage = [UsageItem(kind=UsageKind.prefill_tokens, quantity=len(prompt) * len(sequences), model=self.base_model),
                 UsageItem(kind=UsageKind.decode_tokens, quantity=decoded, model=self.base_model)]
        return primitives.encode_sample_response(sequences, prompt_logprobs=logprobs), True, [u for u in usage if u.quantity], None

    # ------------------------------------------------------------------ weights

    def _checkpoint(self) -> str:
        """A checkpoint of the run holding the current weights (one per set of weights: saving twice without a step
        between gives the same checkpoint)."""
        if self.current_checkpoint is not None:
            return self.current_checkpoint
        folder = self.model.save_adapter(self.workdir / "adapter")
        checkpoint_id = new_id("ckpt")
        uri = artifacts.put_dir(self.trainer.settings.artifacts_dir, f"checkpoints/{self.job_id}/{checkpoint_id}", folder)
        with self.trainer.db.session() as s:
            job = self.lease.row(s)
            step = repository.next_checkpoint_step(s, job.id, job.steps_done)
            repository.add_checkpoint(s, job, checkpoint_id, step=step, kind="lora", uri=uri,
                                      metrics={"optim_steps": job.steps_done, "trained_tokens": job.trained_tokens, "model_id": self.model_id})
            repository.add_event(s, self.job_id, "info", "checkpoint", f"checkpoint {checkpoint_id} after {job.steps_done} optim steps",
                                 {"checkpoint": checkpoint_id, "step": step})
        self.current_checkpoint = checkpoint_id
        return checkpoint_id

    def _record_weights(self, path: str, kind: str, checkpoint_id: str | None, uri: str | None, *, overwrite: bool) -> None:
        with self.trainer.db.session() as s:
            row = s.get(LiveModelRow, self.model_id)
            saved = s.get(SavedWeights, path)
            if saved is not None and not overwrite and kind == "weights":
                raise primitives.PrimitiveError(f"{path} exists; save_state(..., overwrite=True) replaces it")
            if saved is None:
                s.add(SavedWeights(path=path, run_id=row.run_id, model_id=self.model_id, kind=kind, checkpoint_id=checkpoint_id, uri=uri,  # type: ignore[union-attr]
                                   created_at=utcnow()))
            else:
                saved.checkpoint_id, saved.uri, saved.created_at = checkpoint_id, uri, utcnow()

    def _sampling_model(self, sampler_id: str | None) -> primitives.LiveModel:
        """The model a sampler draws from: this live model when the sampler's weights are its current ones (or it
        samples the base alone: the adapter off is not offered here, so a base sampler reads the current weights only
        before the first step), else a model of the sampler's checkpoint, loaded once."""
        if sampler_id is None:
            return self.model
        with self.trainer.db.session() as s:
            sampler = s.get(Sampler, sampler_id)
            checkpoint_id = sampler.checkpoint_id if sampler is not None else None
            uri = repository.checkpoint(s, checkpoint_id).uri if checkpoint_id else None  # type: ignore[union-attr]
        if checkpoint_id is None or checkpoint_id == self.current_checkpoint:
            return self.model
        if checkpoint_id not in self.samplers:
            self.samplers = {checkpoint_id: primitives.LiveModel.from_state(self.base_dir, artifacts.local_path(uri), optimizer=False)}  # type: ignore[arg-type]
        return self.samplers[checkpoint_id]

    # ------------------------------------------------------------------ resume

    def _replay(self, after: int, through: int) -> None:
        """Apply again the training requests ``after < seq <= through`` that were done before this worker took the
        model (its state was written at ``after``): their results are not written again, nothing is charged again."""
        if through <= after:
            return
        with self.trainer.db.session() as s:
            work = [(r.seq, r.kind, r.payload) for r in repository.done_training_requests(s, self.model_id, after, through)]
        for seq, kind, payload in work:
            if kind in ("forward_backward", "optim_step", "load_weights"):
                getattr(self, f"_{kind}")(payload, None, replay=True)
            if not self.model.has_pending_gradients:
                self.clean_seq = seq
        log.info("replayed requests", model_id=self.model_id, count=len(work), after=after, through=through)

    def let_go(self, status: str) -> None:
        """Write the adapter and optimizer state, record it on the live model and set the job ``status``. The state is
        recorded as of :attr:`clean_seq`: a ``forward_backward`` changes neither weights nor optimizer, so the state
        written now is that of the last request after which no gradient was pending, and the requests after it are
        replayed to bring the pending gradients back."""
        folder = self.model.save_state(self.workdir / "state")
        uri = artifacts.put_dir(self.trainer.settings.artifacts_dir, f"primitives/{self.job_id}/state/{new_id('st')}", folder)
        with self.trainer.db.session() as s:
            job = self.lease.row(s)
            row = s.get(LiveModelRow, self.model_id)
            row.state_uri, row.state_seq = uri, self.clean_seq  # type: ignore[union-attr]
            row.lora = {**row.lora, "load_optimizer": True}  # type: ignore[union-attr]
            if status in ("succeeded", "cancelled"):
                finish(s, job, status, None)
            else:
                job.status, job.worker_id = "paused", None
                repository.add_event(s, self.job_id, "info", "paused", "idle: the model's state is written; the next request brings it back",
                                     {"applied_seq": self.applied_seq})

    def close(self) -> None:
        shutil.rmtree(self.workdir, ignore_errors=True)


OPTIM_FIELDS = ("learning_rate", "beta1", "beta2", "eps", "weight_decay", "grad_clip_norm")


def serve(trainer: Trainer, job_id: str) -> None:
    """Serve the claimed job's live model (module docstring). A request queued while the worker was letting the model
    go sends it to a worker again."""
    with trainer.db.session() as s:
        row = repository.live_model_of_job(s, job_id)
        if row is None:
            return
        s.expunge(row)
    lease = jobs.Lease(trainer.db, TrainingJob, job_id, trainer.settings.job_heartbeat_s)
    serving: _Serving | None = None
    try:
        with lease:
            serving = _Serving(trainer, row, lease)
            status = serving.serve()
            serving.let_go(status)
    except jobs.LeaseLost:
        log.warning("lease lost; leaving the live model to its new owner", job_id=job_id)
        return
    except Exception as exc:  # the model cannot be built or written: its job fails, its queued requests with it
        log.exception("live model failed", job_id=job_id)
        _fail(trainer, job_id, f"{exc.__class__.__name__}: {exc}")
        return
    finally:
        if serving is not None:
            serving.close()
    with trainer.db.session() as s:
        job = s.get(TrainingJob, job_id)
        again = repository.queued_primitive_request(s, row.id) is not None and job is not None and job.status == "paused"
        if again:
            job.status, job.enqueued_at = "queued", utcnow()  # type: ignore[union-attr]
    if again:  # sent once the row says queued: a worker that claims it must find it so
        trainer.enqueue(job_id)
    elif job is not None and job.status in ("succeeded", "cancelled"):
        fail_queued(trainer, row.id, f"the live model's job is {job.status}", category="user")


def _fail(trainer: Trainer, job_id: str, error: str) -> None:
    """Fail the job and every request of its model still queued (their holds released)."""
    with trainer.db.session() as s:
        job = jobs.owned_row(s, TrainingJob, job_id)
        if job is None:
            return
        finish(s, job, "failed", error)
        row = repository.live_model_of_job(s, job_id)
    fail_queued(trainer, row.id, f"the live model failed: {error}", category="server")  # type: ignore[union-attr]



__all__ = ["TRAINING_KINDS", "serve"]
