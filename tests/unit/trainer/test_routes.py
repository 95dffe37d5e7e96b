"""The trainer's routes in this process: the app from ``create_app`` on a temporary SQLite database, its ledger
calls answered by the real ledger app (SQLite) in this process, its job queue a list. Calls are made as the
gateway (and inference) would, through :class:`TrainerClient`, or raw where the request itself is wrong.
No job is trained here: a job's hold, events and cancel are the service's side; training is the worker's."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from fastapi.testclient import TestClient
from trainer_service.app import create_app
from trainer_service.client import TrainerClient
from trainer_service.models import Checkpoint, TrainingJob
from trainer_service.schemas import LiveModelCreate, SessionCreate
from trainer_service.service import Trainer

from services.common.auth import RunContext, run_headers
from services.common.contracts import Recipe, TrainingJobCreate
from services.common.db import utcnow
from services.common.errors import UpstreamProblem
from services.common.ids import new_id
from services.common.settings import ServiceSettings
from services.ledger.app import create_app as create_ledger_app
from services.ledger.client import LedgerClient
from services.ledger.schemas import AccountCreate, HoldStatus
from services.ledger.settings import LedgerSettings
from tests.conftest import prepared_models
from tests.unit.inprocess import in_process

MODEL = "smollm2-135m-instruct"
GATEWAY_TOKEN, INFERENCE_TOKEN, TRAINER_TOKEN = "gateway-token", "inference-token", "trainer-token"
GOOD = b'{"messages": [{"role": "user", "content": "What is 2 + 2?"}, {"role": "assistant", "content": "4"}]}\n'
RUN_ROUTES = [
    ("POST", "/internal/datasets"), ("GET", "/internal/datasets"), ("GET", "/internal/datasets/ds_x"), ("GET", "/internal/datasets/ds_x/content"),
    ("POST", "/internal/jobs"), ("GET", "/internal/jobs"), ("GET", "/internal/jobs/job_x"), ("GET", "/internal/jobs/job_x/events"),
    ("GET", "/internal/jobs/job_x/checkpoints"), ("POST", "/internal/jobs/job_x/cancel"),
    # Tinker's primitives (trainer_service.sessions)
    ("POST", "/internal/primitives/sessions"), ("POST", "/internal/primitives/sessions/tks_x/heartbeat"),
    ("POST", "/internal/primitives/sessions/tks_x/finish"), ("POST", "/internal/primitives/models"), ("GET", "/internal/primitives/models/tks_x:train:0"),
    ("GET", "/internal/primitives/models/tks_x:train:0/weights"), ("POST", "/internal/primitives/forward_backward"),
    ("POST", "/internal/primitives/training/optim_step"), ("POST", "/internal/primitives/samplers"), ("POST", "/internal/primitives/samplers/snapshot"),
    ("GET", "/internal/primitives/samplers/tks_x:sample:0"), ("POST", "/internal/primitives/samplers/tks_x:sample:0/sample"),
    ("GET", "/internal/primitives/requests/req_x"),
]
ROUTES = [*RUN_ROUTES, ("GET", "/internal/checkpoints/ckpt_x")]
TEMPLATED = {"ds_x": "{dataset_id}", "job_x": "{job_id}", "ckpt_x": "{checkpoint_id}", "tks_x:train:0": "{model_id}", "tks_x:sample:0": "{sampler_id}",
             "tks_x": "{session_id}", "req_x": "{request_id}", "optim_step": "{kind}"}
"""Each example id of :data:`ROUTES` → the path parameter the API description names it by."""


def templated(path: str) -> str:
    for example, name in TEMPLATED.items():
        path = path.replace(example, name)
    return path


@dataclass
class Served:
    """The running trainer app: ``raw`` (no credentials of its own), ``trainer`` (its service object),
    ``ledger`` (the ledger it holds budget on, as the trainer calls it) and ``enqueued`` (jobs sent to workers)."""

    raw: TestClient
    trainer: Trainer
    ledger: LedgerClient
    enqueued: list[str]

    def client(self, token: str = GATEWAY_TOKEN) -> TrainerClient:
        """A typed client calling the app with ``token`` (the gateway's by default)."""
        return TrainerClient(in_process(TestClient(self.raw.app, base_url="http://trainer", headers={"Authorization": f"Bearer {token}"}), token, "trainer"))

    def new_run(self, budget_usd_micros: int = 1_000_000) -> RunContext:
        ctx = RunContext(run_id=new_id("run"), task_id=new_id("bm"))
        self.ledger.open_account(AccountCreate(account_id=ctx.run_id, budget_usd_micros=budget_usd_micros))
        return ctx


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp("trainer")
    (tmp / "models").symlink_to(prepared_models(), target_is_directory=True)
    ledger_app = create_ledger_app(LedgerSettings(database_url=f"sqlite:///{tmp}/ledger.sqlite", service_token="ledger-token",
                                                  trusted_tokens={"trainer": TRAINER_TOKEN}))
    settings = ServiceSettings(data_dir=tmp, service_token=TRAINER_TOKEN, reconcile_interval_s=3600,
                               trusted_tokens={"gateway": GATEWAY_TOKEN, "inference": INFERENCE_TOKEN})
    enqueued: list[str] = []
    with TestClient(ledger_app, base_url="http://ledger", headers={"Authorization": f"Bearer {TRAINER_TOKEN}"}) as ledger_http, \
            TestClient(create_app(settings), base_url="http://trainer") as raw:
        trainer: Trainer = raw.app.state.trainer
        trainer.ledger.close()
        trainer.ledger = LedgerClient(in_process(ledger_http, TRAINER_TOKEN, "ledger"))
        trainer.enqueue = enqueued.append
        yield Served(raw=raw, trainer=trainer, ledger=trainer.ledger, enqueued=enqueued)


@pytest.fixture(scope="module")
def client(served: Served) -> TrainerClient:
    return served.client()


def job_request(datasets: list[str], **recipe: Any) -> TrainingJobCreate:
    return TrainingJobCreate(model=MODEL, datasets=datasets, recipe=Recipe(**{"max_steps": 2, "batch_size": 2, **recipe}))


def problem(exc: pytest.ExceptionInfo[UpstreamProblem], status: int) -> dict[str, Any]:
    """The problem+json the trainer answered, checked to have ``status``."""
    assert exc.value.status == status, exc.value.problem
    return exc.value.problem


def assert_problem(resp: httpx.Response, status: int) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"].startswith("application/problem+json")
    return resp.json()


# --------------------------------------------------------------------------- who may call


@pytest.mark.parametrize(("method", "path"), ROUTES)
def test_every_route_refuses_a_caller_without_a_trusted_service_token(served: Served, method: str, path: str) -> None:
    ctx = RunContext(run_id=new_id("run"), task_id=new_id("bm"))
    assert assert_problem(served.raw.request(method, path, headers=run_headers(ctx, GATEWAY_TOKEN)), 401)["code"] == "unauthorized"
    wrong = {"Authorization": "Bearer not-a-service-token", **run_headers(ctx, "not-a-service-token")}
    assert_problem(served.raw.request(method, path, headers=wrong), 401)


@pytest.mark.parametrize(("method", "path"), RUN_ROUTES)
def test_run_scoped_routes_refuse_a_call_without_a_run_context(served: Served, method: str, path: str) -> None:
    body = assert_problem(served.raw.request(method, path, headers={"Authorization": f"Bearer {GATEWAY_TOKEN}"}), 401)
    assert "run context" in body["detail"]


def test_a_run_context_signed_with_another_token_is_refused(served: Served) -> None:
    ctx = RunContext(run_id=new_id("run"), task_id=new_id("bm"))
    forged = {"Authorization": f"Bearer {GATEWAY_TOKEN}", **run_headers(ctx, INFERENCE_TOKEN)}
    assert "signature" in assert_problem(served.raw.get("/internal/datasets", headers=forged), 401)["detail"]


def test_the_api_description_is_served_only_to_a_trusted_service(served: Served) -> None:
    assert_problem(served.raw.get("/openapi.json"), 401)
    paths = served.raw.get("/openapi.json", headers={"Authorization": f"Bearer {GATEWAY_TOKEN}"}).json()["paths"]
    assert {p for p in paths if p.startswith("/internal")} == {templated(path) for _, path in ROUTES}


# --------------------------------------------------------------------------- datasets


def test_an_uploaded_dataset_is_listed_read_and_returned_byte_for_byte(served: Served, client: TrainerClient) -> None:
    ctx = served.new_run()
    ds = client.upload_dataset(ctx, GOOD + GOOD, name="two.jsonl")
    assert (ds.name, ds.format, ds.rows, ds.bytes) == ("two.jsonl", "messages", 2, len(GOOD) * 2)
    assert client.upload_dataset(ctx, GOOD + GOOD).id == ds.id  # content-addressed: the same content is the same dataset
    assert [d.id for d in client.list_datasets(ctx).data] == [ds.id]
    assert client.get_dataset(ctx, ds.id) == ds
    assert client.dataset_content(ctx, ds.id) == GOOD + GOOD
    assert client.upload_dataset(ctx, GOOD).name == "dataset.jsonl"  # the route's default name


def test_a_dataset_the_trainer_cannot_train_is_a_422_naming_line_and_field(served: Served, client: TrainerClient) -> None:
    ctx = served.new_run()
    with pytest.raises(UpstreamProblem) as exc:
        client.upload_dataset(ctx, GOOD + b'{"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": ""}]}\n')
    assert (problem(exc, 422)["field"], exc.value.problem["line"]) == ("messages[1].content", 2)
    headers = {"Authorization": f"Bearer {GATEWAY_TOKEN}", **run_headers(ctx, GATEWAY_TOKEN)}
    assert assert_problem(served.raw.post("/internal/datasets", headers=headers), 422)["field"] == "file"  # an empty body is an empty file
    name = assert_problem(served.raw.post("/internal/datasets", params={"name": "n" * 201}, content=GOOD, headers=headers), 422)
    assert name["field"] == "name"
    assert client.list_datasets(ctx).data == []


def test_another_runs_dataset_is_a_404(served: Served, client: TrainerClient) -> None:
    ds = client.upload_dataset(served.new_run(), GOOD)
    other = served.new_run()
    for call in (client.get_dataset, client.dataset_content):
        with pytest.raises(UpstreamProblem) as exc:
            call(other, ds.id)
        assert problem(exc, 404)["code"] == "not_found"
    headers = {"Authorization": f"Bearer {GATEWAY_TOKEN}", **run_headers(other, GATEWAY_TOKEN)}
    assert_problem(served.raw.get(f"/internal/datasets/{ds.id}", headers=headers), 404)


# --------------------------------------------------------------------------- jobs


def test_a_job_is_held_for_on_the_ledger_queued_and_read_back(served: Served, client: TrainerClient) -> None:
    ctx = served.new_run()
    ds = client.upload_dataset(ctx, GOOD)
    job = client.create_job(ctx, job_request([ds.id]), idempotency_key="train-1")
    assert (job.status, job.model, job.datasets, job.estimated_tokens > 0) == ("queued", MODEL, [ds.id], True)
    assert served.enqueued[-1] == job.id
    [hold] = served.ledger.list_holds(ctx.run_id)
    assert hold.status == HoldStatus.open and served.ledger.get_balance(ctx.run_id).held_usd_micros == hold.amount_usd_micros > 0

    assert client.create_job(ctx, job_request([ds.id]), idempotency_key="train-1") == job  # a repeat: the same job, no second hold
    assert len(served.ledger.list_holds(ctx.run_id)) == 1 and served.enqueued.count(job.id) == 1
    with pytest.raises(UpstreamProblem) as exc:
        client.create_job(ctx, job_request([ds.id], max_steps=3), idempotency_key="train-1")
    assert problem(exc, 409)["code"] == "idempotency_key_reused"

    assert [j.id for j in client.list_jobs(ctx).data] == [job.id]
    assert client.get_job(ctx, job.id) == job
    [validated] = client.job_events(ctx, job.id).data
    assert (validated.type, validated.data["estimated_tokens"]) == ("validated", job.estimated_tokens)
    assert client.job_events(ctx, job.id, after=validated.seq).data == []
    assert client.job_checkpoints(ctx, job.id).data == []


def test_a_job_the_budget_cannot_cover_is_the_ledgers_402_and_nothing_is_queued(served: Served, client: TrainerClient) -> None:
    ctx = served.new_run(budget_usd_micros=0)
    ds = client.upload_dataset(ctx, GOOD)
    queued = list(served.enqueued)
    with pytest.raises(UpstreamProblem) as exc:
        client.create_job(ctx, job_request([ds.id]))
    assert problem(exc, 402)["remaining_usd_micros"] == 0
    assert client.list_jobs(ctx).data == [] and served.enqueued == queued


@pytest.mark.parametrize(("body", "field"), [
    ({"model": MODEL, "datasets": ["ds_x"], "recipe": {"epochs": 3}}, "recipe.epochs"),
    ({"model": MODEL, "datasets": []}, "datasets"),
    ({"model": "gpt-5", "datasets": ["ds_x"]}, "model"),
    ({"model": "gemma3-270m", "datasets": ["ds_x"]}, "model"),  # a built-in card, but not prepared in this trainer's models folder
    ({"model": "ckpt_01jd3k4m5n6p7q8r9s0t1v2w3x", "datasets": ["ds_x"]}, "model"),
    ({"model": MODEL, "datasets": ["ds_x"], "recipe": {"method": "sft"}, "harness": {"system_prompt": "x"}}, "harness"),  # grpo's only
    ({"model": MODEL, "datasets": ["ds_x"], "recipe": {"method": "sft", "grpo_kl_coef": 0.1}}, "recipe.grpo_kl_coef"),
    ({"model": MODEL, "datasets": ["ds_x"], "recipe": {"dpo_beta": 0}}, "recipe.dpo_beta"),
])
def test_a_job_request_the_trainer_cannot_run_is_a_422_naming_the_field(served: Served, body: dict[str, Any], field: str) -> None:
    ctx = served.new_run()
    headers = {"Authorization": f"Bearer {GATEWAY_TOKEN}", **run_headers(ctx, GATEWAY_TOKEN)}
    assert assert_problem(served.raw.post("/internal/jobs", json=body, headers=headers), 422)["field"] == field


PREFERENCE = b'{"prompt": "What is 2 + 2?", "chosen": "4", "rejected": "5"}\n'


@pytest.mark.parametrize(("method", "data", "other"), [("sft", GOOD, PREFERENCE), ("dpo", PREFERENCE, GOOD)])
def test_each_method_takes_its_own_dataset_format_and_a_422_names_datasets_for_another(served: Served, client: TrainerClient,
                                                                                       method: str, data: bytes, other: bytes) -> None:
    ctx = served.new_run()
    job = client.create_job(ctx, job_request([client.upload_dataset(ctx, data).id], method=method))
    assert job.recipe.method == method and job.estimated_tokens > 0
    with pytest.raises(UpstreamProblem) as exc:
        client.create_job(ctx, job_request([client.upload_dataset(ctx, other).id], method=method))
    assert problem(exc, 422)["field"] == "datasets"


def test_a_job_a_train_worker_cannot_hold_is_a_422_before_any_hold(served: Served, client: TrainerClient) -> None:
    """The memory estimate (weights, gradients, AdamW moments, a DPO reference copy, activations, logits) against
    ``train_memory_mb``: full fine-tuning names ``recipe.adapter``, an oversized LoRA job ``recipe.batch_size``."""
    from trainer_service.estimate import estimate_memory

    from services.common.llms import base_model_dir

    ctx = served.new_run()
    ds = client.upload_dataset(ctx, GOOD)
    models = served.trainer.settings.models_dir
    full, lora = (estimate_memory(base_model_dir(MODEL, models), Recipe(adapter=a, batch_size=2, max_steps=2)) for a in ("full", "lora"))
    assert full.optimizer == 2 * full.weights and lora.optimizer < full.optimizer / 50 and full.reference == 0
    dpo_full = estimate_memory(base_model_dir(MODEL, models), Recipe(method="dpo", adapter="full", batch_size=2, max_steps=2))
    assert dpo_full.reference == full.weights and dpo_full.activations == 2 * full.activations
    settings = served.trainer.settings
    original = settings.train_memory_mb
    settings.train_memory_mb = lora.total // 2**20 + 1  # holds the LoRA job (rows of max_seq_len tokens, more than it has), not the full one
    try:
        with pytest.raises(UpstreamProblem) as exc:
            client.create_job(ctx, job_request([ds.id], adapter="full"))
        body = problem(exc, 422)
        assert body["field"] == "recipe.adapter" and body["estimated_mb"] > body["available_mb"] == settings.train_memory_mb
        assert served.ledger.list_holds(ctx.run_id) == []
        assert client.create_job(ctx, job_request([ds.id])).status == "queued"
        with pytest.raises(UpstreamProblem) as exc:
            client.create_job(ctx, job_request([ds.id], batch_size=256, max_seq_len=4096))
        assert problem(exc, 422)["field"] == "recipe.batch_size"
    finally:
        settings.train_memory_mb = original


def test_a_lora_job_on_a_full_weights_parent_is_a_422_naming_the_adapter(served: Served, client: TrainerClient) -> None:
    ctx = served.new_run()
    ds = client.upload_dataset(ctx, GOOD)
    job = client.create_job(ctx, job_request([ds.id], adapter="full"))
    ckpt_id = new_id("ckpt")
    with served.trainer.db.session() as s:
        s.add(Checkpoint(id=ckpt_id, job_id=job.id, run_id=ctx.run_id, step=1, base_model=MODEL, kind="full", uri="file:///nowhere",
                         metrics={}, created_at=utcnow()))
    with pytest.raises(UpstreamProblem) as exc:
        client.create_job(ctx, TrainingJobCreate(model=ckpt_id, datasets=[ds.id], recipe=Recipe(max_steps=2)))
    assert problem(exc, 422)["field"] == "recipe.adapter"
    continued = client.create_job(ctx, TrainingJobCreate(model=ckpt_id, datasets=[ds.id], recipe=Recipe(adapter="full", max_steps=2)))
    assert (continued.model, continued.base_model) == (ckpt_id, MODEL)


def _checkpoint(served: Served, ctx: RunContext, folder: Path, kind: str, rank: int = 8) -> str:
    """A checkpoint row of the run (of a queued job of its own) over a folder holding a safetensors file of 1,000
    parameters (and a LoRA config)."""
    from safetensors.torch import save_file

    client = served.client()
    job = client.create_job(ctx, job_request([client.upload_dataset(ctx, GOOD).id]))

    folder.mkdir(parents=True)
    save_file({"w": torch.zeros(10, 100)}, str(folder / ("adapter_model.safetensors" if kind == "lora" else "model.safetensors")))
    if kind == "lora":
        (folder / "adapter_config.json").write_text(json.dumps({"r": rank}))
    ckpt_id = new_id("ckpt")
    with served.trainer.db.session() as s:
        s.add(Checkpoint(id=ckpt_id, job_id=job.id, run_id=ctx.run_id, step=1, base_model=MODEL, kind=kind, uri=folder.as_uri(),
                         metrics={}, created_at=utcnow()))
    return ckpt_id


def test_a_merge_job_is_validated_held_on_the_parameters_it_reads_and_queued(served: Served, client: TrainerClient, tmp_path: Path) -> None:
    ctx, other = served.new_run(), served.new_run()
    lora_a, lora_b = _checkpoint(served, ctx, tmp_path / "a", "lora"), _checkpoint(served, ctx, tmp_path / "b", "lora")
    lora_r4, full = _checkpoint(served, ctx, tmp_path / "c", "lora", rank=4), _checkpoint(served, ctx, tmp_path / "d", "full")
    foreign = _checkpoint(served, other, tmp_path / "e", "lora")
    ds = client.upload_dataset(ctx, GOOD)
    merge = {"recipe": {"method": "merge"}}

    def refused(body: dict[str, Any]) -> str:
        headers = {"Authorization": f"Bearer {GATEWAY_TOKEN}", **run_headers(ctx, GATEWAY_TOKEN)}
        return assert_problem(served.raw.post("/internal/jobs", json={"model": MODEL, **body}, headers=headers), 422)["field"]

    assert refused(merge) == "merge"
    assert refused({**merge, "merge": {"checkpoints": [lora_a]}, "datasets": [ds.id]}) == "datasets"
    assert refused({"datasets": [ds.id], "merge": {"checkpoints": [lora_a]}}) == "merge"
    assert refused({"recipe": {"method": "sft"}}) == "datasets"
    assert refused({**merge, "merge": {"checkpoints": [lora_a, foreign]}}) == "merge.checkpoints[1]"
    assert refused({**merge, "merge": {"checkpoints": [lora_a, full]}}) == "merge.checkpoints"
    assert refused({**merge, "merge": {"checkpoints": [lora_a, lora_r4]}}) == "merge.checkpoints[1]"
    assert refused({**merge, "merge": {"checkpoints": [lora_a, lora_b], "weights": [1.0]}}) == "merge.weights"
    assert refused({**merge, "merge": {"checkpoints": [lora_a, lora_a]}}) == "merge.checkpoints"
    assert refused({**merge, "merge": {"checkpoints": [lora_a, lora_b], "weights": ["0.5", "0.5"]}}) == "merge.weights.0"  # no coercion
    assert refused({"recipe": {"method": "merge", "lora_r": 4}, "merge": {"checkpoints": [lora_a, lora_b]}}) == "recipe.lora_r"
    assert refused({"recipe": {"method": "merge", "adapter": "full"}, "merge": {"checkpoints": [lora_a, lora_b]}}) == "recipe.adapter"
    assert refused({"recipe": {"method": "sft", "dpo_beta": 5.0}, "datasets": [ds.id]}) == "recipe.dpo_beta"  # not read by sft: refused
    assert refused({"recipe": {"method": "dpo", "dpo_beta": "0.1"}, "datasets": [ds.id]}) == "recipe.dpo_beta"  # no coercion
    assert refused({**merge, "model": lora_a, "merge": {"checkpoints": [lora_b]}}) == "model"
    holds = len(served.ledger.list_holds(ctx.run_id))  # the checkpoints' own jobs'

    job = client.create_job(ctx, TrainingJobCreate(model=MODEL, recipe=Recipe(method="merge"),
                                                   merge={"checkpoints": [lora_a, lora_b], "combination": "ties", "density": 0.3}))
    assert (job.status, job.recipe.method, job.datasets, job.merge.resolved_weights()) == ("queued", "merge", [], [0.5, 0.5])
    full_merge = client.create_job(ctx, TrainingJobCreate(model=MODEL, recipe=Recipe(method="merge"), merge={"checkpoints": [full]}))
    assert full_merge.recipe.adapter == "full"  # the job records its checkpoints' kind
    hold = served.ledger.list_holds(ctx.run_id)[holds:holds + 1]
    assert len(hold) == 1 and hold[0].amount_usd_micros == 1  # 2,000 parameters at 1 µUSD per million, rounded up
    [validated] = client.job_events(ctx, job.id).data
    assert validated.data["merged_parameters"] == 2_000
    assert job.id in served.enqueued and full_merge.id in served.enqueued


def test_a_job_on_a_dataset_not_the_runs_is_a_404(served: Served, client: TrainerClient) -> None:
    ds = client.upload_dataset(served.new_run(), GOOD)
    with pytest.raises(UpstreamProblem) as exc:
        client.create_job(served.new_run(), job_request([ds.id]))
    assert problem(exc, 404)["field"] == "datasets"


@pytest.mark.parametrize("call", ["get_job", "job_events", "job_checkpoints", "cancel_job"])
def test_another_runs_job_is_a_404(served: Served, client: TrainerClient, call: str) -> None:
    ctx = served.new_run()
    job = client.create_job(ctx, job_request([client.upload_dataset(ctx, GOOD).id]))
    for run, job_id in ((served.new_run(), job.id), (ctx, "job_01jd3k4m5n6p7q8r9s0t1v2w3x")):
        with pytest.raises(UpstreamProblem) as exc:
            getattr(client, call)(run, job_id)
        assert problem(exc, 404)["code"] == "not_found"


def test_cancelling_a_queued_job_ends_it_and_gives_its_hold_back(served: Served, client: TrainerClient) -> None:
    ctx = served.new_run()
    job = client.create_job(ctx, job_request([client.upload_dataset(ctx, GOOD).id]))
    cancelled = client.cancel_job(ctx, job.id)
    assert (cancelled.status, cancelled.finished_at is not None) == ("cancelled", True)
    assert [e.type for e in client.job_events(ctx, job.id).data] == ["validated", "cancel_requested", "cancelled"]
    [hold] = served.ledger.list_holds(ctx.run_id)
    balance = served.ledger.get_balance(ctx.run_id)
    assert (hold.status, hold.charged_usd_micros, balance.held_usd_micros, balance.spent_usd_micros) == (HoldStatus.settled, 0, 0, 0)
    with pytest.raises(UpstreamProblem) as exc:
        client.cancel_job(ctx, job.id)
    assert problem(exc, 409)["code"] == "conflict"


# --------------------------------------------------------------------------- checkpoints


def test_a_checkpoint_is_located_for_its_run_or_for_inference_and_is_a_404_for_another_run(served: Served, client: TrainerClient) -> None:
    ctx = served.new_run()
    job = client.create_job(ctx, job_request([client.upload_dataset(ctx, GOOD).id]))
    ckpt_id = new_id("ckpt")
    with served.trainer.db.session() as s:  # as the worker writes it at a step
        s.add(Checkpoint(id=ckpt_id, job_id=job.id, run_id=ctx.run_id, step=1, base_model=MODEL, kind="lora",
                         uri="file:///adapters/step-1", metrics={"trained_tokens": 10}, created_at=utcnow()))
    [listed] = client.job_checkpoints(ctx, job.id).data
    assert (listed.id, listed.step, listed.metrics) == (ckpt_id, 1, {"trained_tokens": 10})
    assert client.get_job(ctx, job.id).latest_checkpoint == ckpt_id
    record = client.get_checkpoint(ctx, ckpt_id)
    assert (record.run_id, record.base_model, record.uri, record.kind, record.step) == (ctx.run_id, MODEL, "file:///adapters/step-1", "lora", 1)
    assert served.client(INFERENCE_TOKEN).get_checkpoint(None, ckpt_id) == record  # without a run context, any run's checkpoint is found
    for run, checkpoint_id in ((served.new_run(), ckpt_id), (ctx, new_id("ckpt"))):
        with pytest.raises(UpstreamProblem) as exc:
            client.get_checkpoint(run, checkpoint_id)
        assert problem(exc, 404)["code"] == "not_found"


# --------------------------------------------------------------------------- Tinker's primitives (sessions)


def test_a_live_model_is_sent_to_a_worker_only_once_its_queued_state_is_committed(served: Served, client: TrainerClient) -> None:
    """A worker that claims the live model's job as soon as it is sent must find it ``queued``: the message goes after
    the commit (it went before once, and a worker found the job still ``paused``, leaving the client's future hanging)."""
    ctx = served.new_run()
    session = client.create_session(ctx, SessionCreate()).session_id
    model_id = client.create_live_model(ctx, LiveModelCreate(session_id=session, model_seq_id=0, base_model=MODEL,
                                                            recipe={"method": "primitives", "lora_r": 4})).model_id
    seen: list[str | None] = []

    def claim_at_once(job_id: str) -> None:
        with served.trainer.db.session() as s:  # another session: what a worker's claim reads
            seen.append(s.get(TrainingJob, job_id).status)  # type: ignore[union-attr]

    served.trainer.enqueue = claim_at_once
    try:
        first = client.training_request(ctx, "optim_step", {"model_id": model_id, "seq_id": 1, "adam_params": {"learning_rate": 1e-3}})
        again = client.training_request(ctx, "optim_step", {"model_id": model_id, "seq_id": 1, "adam_params": {"learning_rate": 1e-3}})
        with pytest.raises(UpstreamProblem) as exc:  # the same seq_id with another body
            client.training_request(ctx, "optim_step", {"model_id": model_id, "seq_id": 1, "adam_params": {"learning_rate": 5e-3}})
    finally:
        served.trainer.enqueue = served.enqueued.append
    assert seen == ["queued"]  # sent once, after the commit; the repeat found it queued already
    assert again.request_id == first.request_id  # the SDK's repeat of a submit whose answer it lost: the same future
    assert problem(exc, 409)["field"] == "seq_id"
    assert client.retrieve_request(ctx, first.request_id).status == "pending"  # no worker in this process
    with pytest.raises(UpstreamProblem) as exc:
        client.retrieve_request(served.new_run(), first.request_id)  # another run's request does not exist
    assert problem(exc, 404)["field"] == "request_id"


def _forward_backward(model_id: str, seq: int, data: list[Any]) -> bytes:
    """A ``ForwardBackwardRequest`` as the unmodified ``tinker`` SDK writes it."""
    from tinker import types
    from tinker.proto import request_conv

    request = types.ForwardBackwardRequest(forward_backward_input=types.ForwardBackwardInput(data=data, loss_fn="cross_entropy"),
                                           model_id=model_id, seq_id=seq)
    return request_conv.forward_backward_request_to_proto(request).SerializeToString()


def test_gradients_pending_when_an_idle_model_is_let_go_are_applied_by_the_step_after_it_comes_back(
        served: Served, client: TrainerClient, monkeypatch: pytest.MonkeyPatch) -> None:
    """``forward_backward``, then the client idles past ``primitives_idle_s`` (the worker writes the state and lets the
    model go), then ``optim_step`` on the next worker: the step applies the gradient of the request before the pause
    (its state once held no gradient, the step was a no-op with norm 0, and the client was charged for nothing), and
    that request is charged once."""
    from tinker import types
    from trainer_service.worker import run_job

    monkeypatch.setattr(served.trainer.settings, "primitives_idle_s", 0.2)
    ctx = served.new_run()
    session = client.create_session(ctx, SessionCreate()).session_id
    model_id = client.create_live_model(ctx, LiveModelCreate(session_id=session, model_seq_id=0, base_model=MODEL,
                                                            recipe={"method": "primitives", "lora_r": 4})).model_id
    datum = types.Datum(model_input=types.ModelInput.from_ints([504, 3365, 314, 253, 1303, 30]),
                        loss_fn_inputs={"target_tokens": [3365, 314, 253, 1303, 30, 2], "weights": [1.0] * 6})
    client.forward_backward(ctx, _forward_backward(model_id, 1, [datum]))
    job_id = served.enqueued[-1]
    run_job(served.trainer, job_id)  # the forward_backward, then idle: the state is written and the model let go
    with served.trainer.db.session() as s:
        assert s.get(TrainingJob, job_id).status == "paused"  # type: ignore[union-attr]
    step = client.training_request(ctx, "optim_step", {"model_id": model_id, "seq_id": 2, "adam_params": {"learning_rate": 1e-3}})
    assert served.enqueued[-1] == job_id
    run_job(served.trainer, job_id)  # another worker's turn: the state, the pending gradient replayed, the step
    answer = client.retrieve_request(ctx, step.request_id)
    assert answer.status == "done", answer.error
    assert answer.result["metrics"]["grad_norm:mean"] > 0  # type: ignore[index]
    with served.trainer.db.session() as s:
        job = s.get(TrainingJob, job_id)
        assert (job.status, job.steps_done, job.trained_tokens) == ("paused", 1, 6)  # type: ignore[union-attr]


def test_a_live_model_cancelled_while_its_worker_is_dead_fails_its_waiting_requests_and_releases_their_holds(
        served: Served, client: TrainerClient) -> None:
    """The worker died in the middle of a request; the client cancels the job; the reconciler finds the worker gone and
    the cancel asked for, and ends the job: the requests that were waiting end ``failed`` and their holds are released
    (they stayed held, the budget shrunk by them, when the reconciler ended such a job)."""
    from tinker import types
    from trainer_service.worker import reconcile

    ctx = served.new_run()
    session = client.create_session(ctx, SessionCreate()).session_id
    model_id = client.create_live_model(ctx, LiveModelCreate(session_id=session, model_seq_id=0, base_model=MODEL,
                                                            recipe={"method": "primitives", "lora_r": 4})).model_id
    datum = types.Datum(model_input=types.ModelInput.from_ints([1, 2, 3]), loss_fn_inputs={"target_tokens": [2, 3, 4], "weights": [1.0] * 3})
    request = client.forward_backward(ctx, _forward_backward(model_id, 1, [datum]))
    job_id = served.enqueued[-1]
    assert [h.status for h in served.ledger.list_holds(ctx.run_id)] == [HoldStatus.open]
    with served.trainer.db.session() as s:  # a worker took it and died: running, its heartbeat long gone
        job = s.get(TrainingJob, job_id)
        job.status, job.worker_id, job.heartbeat_at, job.attempts = "running", "dead-worker", utcnow() - dt.timedelta(hours=1), 1  # type: ignore[union-attr]
    assert client.cancel_job(ctx, job_id).status == "running"  # asked; no worker to notice
    reconcile(served.trainer)
    assert client.get_job(ctx, job_id).status == "cancelled"
    answer = client.retrieve_request(ctx, request.request_id)
    assert (answer.status, answer.category) == ("failed", "user"), answer
    assert [h.status for h in served.ledger.list_holds(ctx.run_id)] == [HoldStatus.released]


def test_a_request_to_a_live_model_whose_cancel_was_asked_fails_at_once_and_holds_nothing(served: Served, client: TrainerClient) -> None:
    """The worker has not yet noticed the cancel (the job still ``running``): a request stored now would never run (one
    was stored as the worker ended the job, and its client waited for it forever). It fails at once, nothing held; a
    request that was stored anyway is failed by the reconciler's next round, its hold released."""
    from tinker import types
    from trainer_service.models import PrimitiveRequest
    from trainer_service.worker import reconcile

    ctx = served.new_run()
    session = client.create_session(ctx, SessionCreate()).session_id
    model_id = client.create_live_model(ctx, LiveModelCreate(session_id=session, model_seq_id=0, base_model=MODEL,
                                                            recipe={"method": "primitives", "lora_r": 4})).model_id
    datum = types.Datum(model_input=types.ModelInput.from_ints([1, 2, 3]), loss_fn_inputs={"target_tokens": [2, 3, 4], "weights": [1.0] * 3})
    first = client.forward_backward(ctx, _forward_backward(model_id, 1, [datum]))
    job_id = served.enqueued[-1]
    with served.trainer.db.session() as s:  # a worker serves it
        job = s.get(TrainingJob, job_id)
        job.status, job.worker_id, job.heartbeat_at = "running", "a-live-worker", utcnow()  # type: ignore[union-attr]
    client.cancel_job(ctx, job_id)
    late = client.forward_backward(ctx, _forward_backward(model_id, 2, [datum]))
    answer = client.retrieve_request(ctx, late.request_id)  # failed at once (a 409 made the SDK retry for five minutes)
    assert (answer.status, answer.category) == ("failed", "user") and "cancelled" in answer.error, answer  # type: ignore[operator]
    assert [h.status for h in served.ledger.list_holds(ctx.run_id)] == [HoldStatus.open]  # the first request's alone
    with served.trainer.db.session() as s:  # the worker ends the job; the first request had been stored and left waiting
        job = s.get(TrainingJob, job_id)
        job.status, job.worker_id, job.finished_at = "cancelled", None, utcnow()  # type: ignore[union-attr]
    reconcile(served.trainer)
    with served.trainer.db.session() as s:
        assert s.get(PrimitiveRequest, first.request_id).status == "failed"  # type: ignore[union-attr]
    assert [h.status for h in served.ledger.list_holds(ctx.run_id)] == [HoldStatus.released]


def test_a_forward_backward_no_worker_could_compute_is_refused_before_anything_is_held(served: Served, client: TrainerClient) -> None:
    """No data, a datum with no tokens, loss inputs not shaped as the tokens, more tokens than the model reads or than a
    request may compute: a 400 naming the datum, nothing held (each of these once reached a worker, which failed after a
    minute or ran out of memory)."""
    from tinker import types

    ctx = served.new_run()
    session = client.create_session(ctx, SessionCreate()).session_id
    model_id = client.create_live_model(ctx, LiveModelCreate(session_id=session, model_seq_id=0, base_model=MODEL,
                                                            recipe={"method": "primitives", "lora_r": 4})).model_id

    def datum(tokens: int, targets: int) -> types.Datum:
        return types.Datum(model_input=types.ModelInput.from_ints(list(range(1, tokens + 1))),
                           loss_fn_inputs={"target_tokens": list(range(targets)), "weights": [1.0] * targets})

    cases = [([], "data"), ([datum(3, 2)], "data[0].loss_fn_inputs.target_tokens"), ([datum(8193, 8193)], "data[0].model_input"),
             ([datum(8000, 8000)] * 9, "data")]
    for data, field in cases:
        with pytest.raises(UpstreamProblem) as exc:
            client.forward_backward(ctx, _forward_backward(model_id, 1, data))
        assert problem(exc, 400)["field"] == field, data[:1]
    assert served.ledger.list_holds(ctx.run_id) == []


def test_a_dead_workers_work_folders_are_reaped_and_a_live_ones_kept(served: Served) -> None:
    """A train worker killed mid-job leaves its work folder (a checkpoint being written, a live model's state); the next
    worker to start removes it, never a folder of a worker still running."""
    import subprocess

    from trainer_service.jobs import WORKDIR_PREFIX, reap_workdirs, workdir

    settings = served.trainer.settings
    dead = subprocess.Popen(["true"])
    dead.wait()
    left = Path(settings.data_dir) / (WORKDIR_PREFIX.format(owner=f"{dead.pid}.1", job_id="job_x") + "abc")  # its pid, gone
    left.mkdir()
    (left / "adapter.safetensors").write_bytes(b"x" * 1024)
    mine = workdir(settings, "job_y")
    assert reap_workdirs(settings) == 1
    assert not left.exists() and mine.is_dir()
    mine.rmdir()
