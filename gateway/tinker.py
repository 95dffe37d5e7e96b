"""Tinker's service API (``/api/v1/…``), as the unmodified ``tinker`` SDK calls it (0.38.x), over the trainer's
sessions of primitives (``trainer_service.sessions``).

The SDK authenticates with ``X-API-Key``, a key it insists starts with ``tml-``: the run's key is accepted as it is
and as ``tml-<run key>``, and counted against the key's rate limits as every agent call is. A session needs the
trainer editable on the run's track (403 otherwise); a live model's recipe (``method: primitives``, the client's LoRA
rank and seed) is checked against the benchmark's allow/lock like any job's (403 naming the field, in Tinker's terms).

Wire conventions this follows (read from the SDK's source): every computing call answers a future (``request_id``)
that the SDK polls at ``retrieve_future``, which waits up to :data:`POLL_WAIT_S` for the request to end and answers
``try_again`` otherwise; ``forward_backward`` arrives as protobuf and its results and samples' leave as protobuf
(``application/x-protobuf``), everything else is JSON; a failed request is ``{"error", "category"}``, which the SDK
raises as ``RequestFailedError``. A call past the budget is a 402 problem, which the SDK raises as ``BillingError``
(``client/config`` sets its billing pause to 0, so it does not wait an hour first).
"""

from __future__ import annotations

import base64
import json
from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Header, Path, Request, Response
from pydantic import BaseModel, ConfigDict, Field
from trainer_service.schemas import LiveModelCreate, LoraSpec, SamplerCreate, SamplerSnapshot, SessionCreate

from gateway import evaluator
from gateway.api import GatewayDep
from gateway.service import Caller, admit, apply_recipe_policy, check_deadline, check_editable
from services.common.app import StrictBodyRoute
from services.common.contracts import Recipe
from services.common.errors import BadRequest, NotFound, OutsideEditableSpace, Unauthorized, problem_responses

POLL_WAIT_S = 20.0
"""How long ``retrieve_future`` waits for a request to end before it answers ``try_again`` (the SDK waits 45 s)."""

PROTOBUF = "application/x-protobuf"

CLIENT_CONFIG = {"billing_exception_max_pause_duration_sec": 0, "pjwt_auth_enabled": False, "sample_use_retrieve_futures": False,
                 "custom_loss_server_side": False, "sample_join_sampling_session": False}
"""What ``client/config`` tells the SDK: a 402 fails at once; futures, custom losses and samplers the plain way."""




async def tinker_caller(request: Request, gw: GatewayDep, x_api_key: str | None = Header(None, description="`tml-<run API key>` or the key itself")) -> Caller:
    """The run whose key is ``X-API-Key`` (401 otherwise), marked for the episode log."""
    if not x_api_key:
        raise Unauthorized("send the run's API key as X-API-Key (tml-<key>: Tinker's SDK wants the prefix)")
    key = x_api_key.strip().removeprefix("tml-")
    caller = await admit(gw, f"Bearer {key}")
    request.state.run_id = caller.run.id
    return caller


async def trainer_caller(caller: Annotated[Caller, Depends(tinker_caller)]) -> Caller:
    """A caller that may use the primitives: the run's track makes the trainer editable (403) and the run has not ended (403)."""
    check_deadline(caller)
    check_editable(caller, "trainer", "training through Tinker's primitives")
    return caller


class _Body(BaseModel):
    """A Tinker request body: the fields this route reads, checked (a 422 names a bad one); the SDK's others (``type``,
    ``sdk_version``, …) are let through unread."""

    model_config = ConfigDict(extra="ignore")


Id = Annotated[str, Field(min_length=1, max_length=120)]
Seq = Annotated[int, Field(ge=0, le=2**31 - 1)]


class SessionRef(_Body):
    session_id: Id


class ModelRef(_Body):
    model_id: Id


class CreateModel(_Body):
    session_id: Id
    model_seq_id: Seq
    base_model: Annotated[str, Field(min_length=1, max_length=200)]
    lora_config: LoraSpec = Field(default_factory=LoraSpec)
    optimizer_config: dict[str, Any] | None = None


class LoadWeights(_Body):
    path: Annotated[str, Field(min_length=1, max_length=400)]
    optimizer: bool = False
    model_id: Id | None = None
    seq_id: Seq | None = None
    session_id: Id | None = None
    model_seq_id: Seq | None = None


class SaveForSampler(_Body):
    model_id: Id
    seq_id: Seq
    path: Annotated[str, Field(max_length=200)] | None = None
    sampling_session_seq_id: Annotated[int, Field(ge=0, le=10**12)] = 0


class CreateSampler(_Body):
    session_id: Id
    sampling_session_seq_id: Annotated[int, Field(ge=0, le=10**12)]
    model_path: Annotated[str, Field(max_length=400)] | None = None
    base_model: Annotated[str, Field(max_length=200)] | None = None


class Sample(_Body):
    sampling_session_id: Id
    num_samples: Annotated[int, Field(ge=1, le=1024)] = 1
    seq_id: Annotated[int, Field(ge=0)] = 0


class RequestRef(_Body):
    request_id: Annotated[str, Field(min_length=1, max_length=40)]


TinkerCaller = Annotated[Caller, Depends(tinker_caller)]
TrainerCaller = Annotated[Caller, Depends(trainer_caller)]

router = APIRouter(prefix="/api/v1", tags=["tinker"], responses=problem_responses(Unauthorized), route_class=StrictBodyRoute)


def _future(out: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"request_id": out.request_id}
    if out.model_id:
        body["model_id"] = out.model_id
    return body


# --------------------------------------------------------------------------- configuration and sessions


@router.post("/client/config", summary="The SDK's client configuration")
async def client_config(caller: TinkerCaller) -> dict[str, Any]:
    return CLIENT_CONFIG


@router.post("/client/dynamic_config", summary="The SDK's refreshed configuration")
async def dynamic_config(caller: TinkerCaller) -> dict[str, Any]:
    return {}


@router.post("/telemetry", summary="The SDK's telemetry (accepted, not kept)")
async def telemetry(caller: TinkerCaller) -> dict[str, str]:
    return {"status": "accepted"}


@router.post("/create_session", summary="Open a session (ServiceClient)")
async def create_session(body: dict[str, Any], gw: GatewayDep, caller: TrainerCaller) -> dict[str, Any]:
    metadata = body.get("user_metadata") if isinstance(body.get("user_metadata"), dict) else {}
    out = await gw.trainer.create_session(caller.ctx, SessionCreate(user_metadata=metadata))
    return {"session_id": out.session_id, "type": "create_session"}


@router.post("/session_heartbeat", summary="A session's heartbeat (410 once it finished)")
async def session_heartbeat(body: SessionRef, gw: GatewayDep, caller: TinkerCaller) -> Response:
    out = await gw.trainer.session_heartbeat(caller.ctx, body.session_id)
    return Response('{"type": "session_heartbeat"}', status_code=200 if out.alive else 410, media_type="application/json")


@router.post("/sessions/{session_id}/finish", summary="End a session")
async def finish_session(session_id: Annotated[str, Path(max_length=40)], gw: GatewayDep, caller: TinkerCaller) -> dict[str, Any]:
    await gw.trainer.finish_session(caller.ctx, session_id)
    return {}


@router.get("/get_server_capabilities", summary="The base models a training client may use")
async def server_capabilities(gw: GatewayDep, caller: TinkerCaller) -> dict[str, Any]:
    """None on the evaluator track, which trains nothing (and whose base models would hint at its candidates)."""
    models = [] if evaluator.on_track(caller) else (await gw.inference.list_models(ctx=caller.ctx)).data
    return {"supported_models": [{"model_name": m.id, "trainable": True, "sampleable": True} for m in models if not m.id.startswith("ckpt_")]}


# --------------------------------------------------------------------------- training clients


def _recipe(caller: Caller, lora: LoraSpec) -> Recipe:
    """A live model's recipe under the benchmark's policy: ``method: primitives`` and the client's rank and seed (a 403
    names ``lora_config.rank`` / ``lora_config.seed`` where the benchmark locks them otherwise)."""
    sent: dict[str, Any] = {"method": "primitives", "lora_r": lora.rank} | ({"seed": lora.seed % 2**31} if lora.seed is not None else {})
    try:
        return Recipe(**apply_recipe_policy(caller, sent))
    except OutsideEditableSpace as exc:
        field = str(exc.extra.get("field", ""))
        tinker = {"recipe.method": "method", "recipe.lora_r": "lora_config.rank", "recipe.seed": "lora_config.seed"}.get(field, field)
        raise OutsideEditableSpace(exc.detail, field=tinker) from None


@router.post("/create_model", summary="Create a LoRA training client (create_lora_training_client)",
             responses=problem_responses(BadRequest, OutsideEditableSpace, NotFound))
async def create_model(body: CreateModel, gw: GatewayDep, caller: TrainerCaller) -> dict[str, Any]:
    """A live model over a served base model (``get_server_capabilities`` lists them) with Tinker's LoRA settings; only
    the ``adamw`` optimizer."""
    optimizer = (body.optimizer_config or {}).get("type", "adamw")
    if optimizer != "adamw":
        raise BadRequest(f"optimizer {optimizer!r}: only adamw is served", field="optimizer_config.type")
    out = await gw.trainer.create_live_model(caller.ctx, LiveModelCreate(
        session_id=body.session_id, model_seq_id=body.model_seq_id, base_model=body.base_model, lora=body.lora_config,
        recipe=_recipe(caller, body.lora_config).model_dump()))
    return _future(out)


@router.post("/load_weights", summary="Load a saved state (load_state, create_training_client_from_state)", responses=problem_responses(NotFound))
async def load_weights(body: LoadWeights, gw: GatewayDep, caller: TrainerCaller) -> dict[str, Any]:
    """Into the client's model (``model_id``, in its ``seq`` order), or, with ``session_id``, into a new one."""
    if body.model_id is not None:
        return _future(await gw.trainer.training_request(caller.ctx, "load_weights", body.model_dump(exclude_none=True)))
    if body.session_id is None or body.model_seq_id is None:
        raise BadRequest("give model_id (load into that model) or session_id and model_seq_id (a new model)", field="session_id")
    out = await gw.trainer.create_live_model(caller.ctx, LiveModelCreate(
        session_id=body.session_id, model_seq_id=body.model_seq_id, path=body.path, optimizer=body.optimizer,
        recipe=_recipe(caller, LoraSpec()).model_dump()))
    return _future(out)


@router.post("/get_info", summary="A training client's model (get_info)", responses=problem_responses(NotFound))
async def get_info(body: ModelRef, gw: GatewayDep, caller: TinkerCaller) -> dict[str, Any]:
    """``model_data.tokenizer_id`` is the base model's folder on the trainer's host: ``get_tokenizer`` loads it from there
    (a client on another host loads the tokenizer of the base model itself)."""
    info = await gw.trainer.live_model_info(caller.ctx, body.model_id)
    return {"type": "get_info", "model_id": info.model_id, "model_name": info.base_model, "is_lora": True, "lora_rank": info.lora.get("rank"),
            "model_data": {"arch": "causal_lm", "model_name": info.base_model, "tokenizer_id": info.tokenizer_dir},
            "optimizer_config": {"type": "adamw"}, "crucible_job_id": info.job_id}


@router.post("/forward_backward", summary="forward_backward / forward (protobuf ForwardBackwardRequest)",
             responses=problem_responses(BadRequest, NotFound))
async def forward_backward(gw: GatewayDep, caller: TrainerCaller, body: bytes = Body(b"", media_type=PROTOBUF)) -> dict[str, Any]:
    """Its tokens are held on the run's budget first (402 when they cannot be)."""
    return _future(await gw.trainer.forward_backward(caller.ctx, body))


@router.post("/optim_step", summary="optim_step (AdamParams)")
async def optim_step(body: dict[str, Any], gw: GatewayDep, caller: TrainerCaller) -> dict[str, Any]:
    return _future(await gw.trainer.training_request(caller.ctx, "optim_step", body))


@router.post("/save_weights", summary="save_state: the adapter and the optimizer's state")
async def save_weights(body: dict[str, Any], gw: GatewayDep, caller: TrainerCaller) -> dict[str, Any]:
    return _future(await gw.trainer.training_request(caller.ctx, "save_weights", body))


@router.post("/save_weights_for_sampler", summary="save_weights_for_sampler: a checkpoint of the run (or a sampler of it)")
async def save_weights_for_sampler(body: SaveForSampler, gw: GatewayDep, caller: TrainerCaller) -> dict[str, Any]:
    """With ``path``: named weights, an ordinary checkpoint of the run; without (``save_weights_and_get_sampling_client``):
    a sampler of the weights as they are then."""
    if body.path:
        return _future(await gw.trainer.training_request(caller.ctx, "save_weights_for_sampler", body.model_dump(exclude_none=True)))
    out = await gw.trainer.sampler_snapshot(caller.ctx, SamplerSnapshot(model_id=body.model_id, seq_id=max(body.seq_id, 1),
                                                                         sampling_session_seq_id=body.sampling_session_seq_id))
    return _future(out)


# --------------------------------------------------------------------------- sampling


@router.post("/create_sampling_session", summary="A sampling client of saved weights or a base model")
async def create_sampling_session(body: CreateSampler, gw: GatewayDep, caller: TrainerCaller) -> dict[str, Any]:
    out = await gw.trainer.create_sampler(caller.ctx, SamplerCreate(
        session_id=body.session_id, sampling_session_seq_id=body.sampling_session_seq_id, model_path=body.model_path, base_model=body.base_model))
    return {"sampling_session_id": out.sampler_id, "type": "create_sampling_session"}


@router.get("/samplers/{sampler_id}", summary="A sampling client", responses=problem_responses(NotFound))
async def get_sampler(sampler_id: Annotated[str, Path(max_length=120)], gw: GatewayDep, caller: TinkerCaller) -> dict[str, Any]:
    out = await gw.trainer.get_sampler(caller.ctx, sampler_id)
    return {"sampler_id": out.sampler_id, "base_model": out.base_model, "model_path": out.model_path}


@router.post("/asample", summary="sample / compute_logprobs", responses=problem_responses(BadRequest, NotFound))
async def asample(request: Request, body: Sample, gw: GatewayDep, caller: TrainerCaller) -> dict[str, Any]:
    """The worst case (the prompt and ``max_tokens`` per sample) is held first (402 when it cannot be)."""
    out = await gw.trainer.sample(caller.ctx, body.sampling_session_id, await request.json())
    return {"request_id": out.request_id,
            "sample_sequence_ids": [f"{body.sampling_session_id}:{body.seq_id}:{i}" for i in range(body.num_samples)]}


# --------------------------------------------------------------------------- futures and checkpoints


@router.post("/retrieve_future", summary="A request's result (the SDK's futures)", response_class=Response,
             responses={200: {"content": {PROTOBUF: {}, "application/json": {}}}} | problem_responses(NotFound))
async def retrieve_future(body: RequestRef, gw: GatewayDep, caller: TinkerCaller) -> Response:
    """Waits up to :data:`POLL_WAIT_S` for the request: its result (protobuf for forward(-backward) and samples), its
    error (``{"error", "category"}``), or ``{"type": "try_again"}``."""
    request_id = body.request_id
    answer = await gw.trainer.retrieve_request(caller.ctx, request_id, wait_s=POLL_WAIT_S)
    if answer.status == "pending":
        return _json({"type": "try_again", "request_id": request_id, "queue_state": "active"})
    if answer.status == "failed":
        return _json({"error": answer.error or "the request failed", "category": answer.category or "unknown"})
    if answer.proto_b64 is not None:
        return Response(base64.b64decode(answer.proto_b64), media_type=PROTOBUF)
    return _json(answer.result or {})


def _json(body: dict[str, Any]) -> Response:
    return Response(json.dumps(body), media_type="application/json")


@router.get("/training_runs/{model_id}/checkpoints", summary="A training client's saved weights (RestClient.list_checkpoints)",
            responses=problem_responses(NotFound))
async def list_checkpoints(model_id: Annotated[str, Path(max_length=120)], gw: GatewayDep, caller: TinkerCaller) -> dict[str, Any]:
    """Each with its Crucible checkpoint in ``user_metadata.crucible_checkpoint`` (sampler weights: a model name for chat,
    evaluations and submissions)."""
    saved = (await gw.trainer.live_model_weights(caller.ctx, model_id)).data
    return {"checkpoints": [{"checkpoint_id": w.path.split("/", 3)[-1] if w.path.count("/") >= 3 else w.path,
                             "checkpoint_type": "sampler" if w.kind == "sampler_weights" else "training", "time": w.created_at.isoformat(),
                             "tinker_path": w.path, "public": False,
                             "user_metadata": {"crucible_checkpoint": w.checkpoint_id} if w.checkpoint_id else {}} for w in saved]}


@router.get("/training_runs/{model_id}", summary="A training client (RestClient.get_training_run)", responses=problem_responses(NotFound))
async def get_training_run(model_id: Annotated[str, Path(max_length=120)], gw: GatewayDep, caller: TinkerCaller) -> dict[str, Any]:
    info = await gw.trainer.live_model_info(caller.ctx, model_id)
    job = await gw.trainer.get_job(caller.ctx, info.job_id)
    return {"training_run_id": info.model_id, "base_model": info.base_model, "model_owner": caller.run.id, "is_lora": True, "corrupted": False,
            "lora_rank": info.lora.get("rank"), "last_request_time": (job.finished_at or job.started_at or job.created_at).isoformat(),
            "user_metadata": {"crucible_job_id": info.job_id}}

