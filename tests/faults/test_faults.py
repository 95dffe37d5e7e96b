"""Fault tests: real processes on production's data plane (PostgreSQL, Redis) are killed mid-work.

One stack for the module, with its own Redis server (so restarting it disturbs nothing else) and short
lease and reconcile intervals, supervised as ``crucible up`` supervises it (a process that exits on its own is
restarted; one killed by a test stays down until the test restarts it). Each test prints what it measured
(run with ``-s`` to see it): how long a killed job took to resume, how many calls failed cleanly.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import create_engine, text

from crucible.sdk import AdminClient, CrucibleAPIError, CrucibleClient
from crucible.stack import Stack, admin_key, service_token
from tests.conftest import PORT_BASE, STACK_ENV, RedisServer, plumbing_benchmark, prepared_models, throwaway_postgres
from tests.models import TINY_MODEL

pytestmark = [pytest.mark.e2e, pytest.mark.slow]  # in `make test-slow`: kills processes and waits for leases, reconcilers and restarts

REDIS_PORT = PORT_BASE + 39
EXITS: list[tuple[str, int]] = []  # (process, return code) of every exit the supervisor saw
BASE = "smollm2-135m-instruct"
FAST_RECONCILE = {
    "CRUCIBLE_JOB_HEARTBEAT_S": "1",
    "CRUCIBLE_JOB_LEASE_S": "10",
    "CRUCIBLE_RECONCILE_INTERVAL_S": "1",
    "CRUCIBLE_JOB_RESEND_AFTER_S": "3",
    "CRUCIBLE_INFERENCE_CONCURRENCY": "2",
    "CRUCIBLE_LEDGER_HOLD_SWEEP_S": "1",
    "CRUCIBLE_UPSTREAM_RETRY_BACKOFF_S": "0.5",  # the grader gives up on an unavailable service after 0.5 × (1 + … + 5) = 7.5 s
}
GRADER_RETRIES_S = 0.5 * (1 + 2 + 3 + 4 + 5)


def wait_for(pred: Callable[[], Any], timeout_s: float, what: str, poll_s: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if value := pred():
            return value
        time.sleep(poll_s)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")


@pytest.fixture(scope="module")
def faulty(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Stack, RedisServer, dict[str, str]]]:
    data_dir = tmp_path_factory.mktemp("crucible-faults")
    (data_dir / "models").symlink_to(prepared_models(BASE, TINY_MODEL), target_is_directory=True)
    redis = RedisServer(REDIS_PORT)
    redis.start()
    with contextlib.ExitStack() as cleanup:
        cleanup.callback(redis.kill)
        urls = cleanup.enter_context(throwaway_postgres())
        stack = Stack(data_dir, PORT_BASE + 20, database_urls=urls, broker_url=redis.url,
                      test_store_url=urls["teststore"], extra_env=STACK_ENV | FAST_RECONCILE)
        stack.start(timeout_s=300)
        stack.supervise(on_exit=lambda name, code, _: EXITS.append((name, code)))
        if keep := os.environ.get("CRUCIBLE_KEEP_LOGS"):
            cleanup.callback(lambda: shutil.copytree(data_dir / "logs", Path(keep) / "faults", dirs_exist_ok=True))
        cleanup.callback(stack.stop)
        yield stack, redis, urls


@pytest.fixture(scope="module")
def bench(faulty) -> dict:  # noqa: ANN001
    stack, _, _ = faulty
    doc = plumbing_benchmark("chain-sum-faults")  # its baseline grading, at load, is not what these tests break; the work they break is on BASE
    doc["suite"]["splits"] = {"train": {"seed": 11, "size": 300}, "validation": {"seed": 23, "size": 24}, "test": {"size": 8}}
    doc["recipe"] = {"lock": {"adapter": "lora"}}  # every method
    admin = AdminClient(stack.gateway_url, admin_key(stack.data_dir))
    out = admin.load_benchmark(doc)
    admin.wait_baselines(doc["name"])
    return out


@pytest.fixture()
def client(faulty, bench) -> Iterator[CrucibleClient]:  # noqa: ANN001
    stack, _, _ = faulty
    admin = AdminClient(stack.gateway_url, admin_key(stack.data_dir))
    run = admin.create_run(bench["name"], f"fault-{uuid.uuid4().hex[:6]}")
    c = CrucibleClient(stack.gateway_url, run["api_key"])
    c.run_id = run["id"]  # type: ignore[attr-defined]
    yield c
    c.close()


def ledger(stack: Stack) -> httpx.Client:
    token = service_token(stack.data_dir, "gateway")  # the ledger trusts the gateway; operators read it so
    return httpx.Client(base_url=f"http://127.0.0.1:{stack.port_base + 1}", headers={"Authorization": f"Bearer {token}"}, timeout=30)


def ledger_state(stack: Stack, run_id: str) -> tuple[dict, list[dict], list[dict]]:
    """``(balance, entries, open holds)`` of the run's account, read from the ledger. The open holds are read
    first: once there are none, a balance read after them cannot predate the last settle."""
    with ledger(stack) as lc:
        holds = lc.get(f"/internal/accounts/{run_id}/holds", params={"status": "open"}).json()
        bal = lc.get(f"/internal/accounts/{run_id}").json()
        entries = lc.get(f"/internal/accounts/{run_id}/entries").json()
    unwrap = lambda x: x["data"] if isinstance(x, dict) else x  # noqa: E731
    return bal, unwrap(entries), unwrap(holds)


def assert_books_balance(stack: Stack, run_id: str) -> tuple[dict, list[dict]]:
    bal, entries, open_holds = wait_for(lambda: (s := ledger_state(stack, run_id)) and not s[2] and s, 30, "every hold to close")
    assert bal["spent_usd_micros"] == sum(e["amount_usd_micros"] for e in entries if e["type"] == "charge")
    assert bal["held_usd_micros"] == 0 and open_holds == []
    assert bal["spent_usd_micros"] <= bal["budget_usd_micros"]
    return bal, entries


def upload_training_set(client: CrucibleClient, rows: int = 64) -> str:
    items = client.train_sample(limit=rows)
    data = "".join(
        __import__("json").dumps({"messages": [{"role": "user", "content": it["question"]}, {"role": "assistant", "content": it["answer"]}]}) + "\n"
        for it in items
    ).encode()
    return client.upload_dataset(data, "faults.jsonl")["id"]


def events(client: CrucibleClient, job_id: str, type_: str) -> list[dict]:
    return [e for e in client.training_events(job_id) if e["type"] == type_]


@pytest.mark.parametrize("method", ["sft", "grpo"])
def test_killed_train_worker_job_resumes_from_checkpoint_and_is_charged_once(faulty, client, method: str) -> None:  # noqa: ANN001
    """SFT on a dataset, and GRPO on the training pool (its rollouts rewarded by the grader): the job resumes from its
    newest checkpoint; what the lost steps did is not charged, what was redone is charged once. On the test-only model
    (what is checked is the job's bookkeeping, not what it learns), with enough steps after the first checkpoint that
    the kill lands mid-job (a step costs tens of milliseconds, the poll a few)."""
    stack, _, _ = faulty
    steps, every = (60, 20) if method == "sft" else (12, 4)  # a GRPO step samples and is rewarded by the grader: ten times an SFT step
    recipe = {"max_steps": steps, "batch_size": 4, "checkpoint_every": every, "warmup_steps": 1, "method": method}
    if method == "grpo":
        recipe |= {"batch_size": 2, "grpo_group_size": 2, "grpo_max_new_tokens": 6}
    job = client.create_training_job(TINY_MODEL, [upload_training_set(client)] if method == "sft" else [], recipe)
    wait_for(lambda: client.training_job(job["id"])["steps_done"] > every, 400, "a step after the first checkpoint", poll_s=0.02)
    stack.kill("train-worker")
    killed_at = time.monotonic()
    at_kill = client.training_job(job["id"])
    assert (at_kill["status"], at_kill["steps_done"] < steps) == ("running", True)  # nobody knows yet; the job was mid-way
    newest = max(c["step"] for c in client.checkpoints(job["id"]))  # read once the worker is gone: it wrote no later one

    stack.restart("train-worker")
    resumed = wait_for(lambda: events(client, job["id"], "resumed"), 120, "the job to resume")[0]
    resume_s = time.monotonic() - killed_at
    done = wait_for(lambda: (j := client.training_job(job["id"]))["status"] in ("succeeded", "failed") and j, 500, "the job to finish")
    total_s = time.monotonic() - killed_at
    print(f"\n[fault] train worker killed at step {at_kill['steps_done']} (newest checkpoint {newest}); resumed {resume_s:.1f} s later "
          f"from step {resumed['data']['step']}; finished {total_s:.1f} s after the kill")

    assert done["status"] == "succeeded", done["error"]
    assert done["attempts"] == 2 and done["steps_done"] == steps
    assert resumed["data"]["step"] == newest
    assert events(client, job["id"], "worker_lost")
    assert [c["step"] for c in client.checkpoints(job["id"])] == list(range(every, steps + 1, every))
    # the steps lost with the worker are not charged, the ones redone are charged once: the job's count is that of
    # the last event of each step (SFT: exactly the estimate, which a clean run processes)
    last = {e["data"]["step"]: e["data"] for e in events(client, job["id"], "step")}
    assert sorted(last) == list(range(1, steps + 1))
    kinds = {"training_tokens": "trained_tokens", "prefill_tokens": "prefill_tokens", "decode_tokens": "decode_tokens"}
    step_key = {"training_tokens": "tokens", "prefill_tokens": "prefill_tokens", "decode_tokens": "decode_tokens"}
    for kind, field in kinds.items():
        assert done[field] == sum(d.get(step_key[kind], 0) for d in last.values()), kind
    if method == "sft":
        assert done["trained_tokens"] == done["estimated_tokens"] and done["decode_tokens"] == 0
    else:
        assert done["decode_tokens"] > 0 and done["trained_tokens"] == done["prefill_tokens"] + done["decode_tokens"] <= done["estimated_tokens"]
    _, entries = assert_books_balance(stack, client.run_id)
    for kind, field in kinds.items():
        assert sum(e["quantity"] for e in entries if e["type"] == "charge" and e["kind"] == kind) == done[field], kind
    assert sum(1 for e in entries if e["type"] == "hold") == 1


def test_killed_eval_worker_evaluation_resumes_item_by_item_and_charges_each_item_once(faulty, client) -> None:  # noqa: ANN001
    stack, _, _ = faulty
    ev = client.create_evaluation(BASE)
    n = ev["items_total"]
    wait_for(lambda: client.evaluation(ev["id"])["items_done"] >= 6, 300, "6 items scored")
    stack.kill("eval-worker")
    killed_at = time.monotonic()
    done_at_kill = client.evaluation(ev["id"])["items_done"]
    assert done_at_kill < n, "the evaluation finished before the kill; make it longer"

    stack.restart("eval-worker")
    done = wait_for(lambda: (e := client.evaluation(ev["id"]))["status"] in ("succeeded", "failed") and e, 400, "the evaluation to finish")
    print(f"\n[fault] eval worker killed after {done_at_kill}/{n} items; finished {time.monotonic() - killed_at:.1f} s after the kill")

    assert done["status"] == "succeeded", done["error"]
    assert done["attempts"] == 2 and done["score"]["n"] == n
    trajectories = client.trajectories(ev["id"])
    assert sorted(t["item_id"] for t in trajectories) == sorted({t["item_id"] for t in trajectories}) and len(trajectories) == n
    _, entries = assert_books_balance(stack, client.run_id)
    keys = Counter(e["idempotency_key"] for e in entries if e["type"] == "charge")
    assert len(keys) == n and set(keys.values()) == {2}  # one prefill and one decode line per item, whatever was re-run
    assert all(k.startswith(f"charge:{ev['id']}:") for k in keys)


def test_redis_restart_loses_no_queued_or_running_job(faulty, client) -> None:  # noqa: ANN001
    stack, redis, urls = faulty
    ds = upload_training_set(client, rows=32)
    recipe = {"max_steps": 4, "batch_size": 4, "checkpoint_every": 2, "warmup_steps": 1}
    evaluation = client.create_evaluation(BASE, limit=8)  # the real model: still grading at the kill
    wait_for(lambda: client.evaluation(evaluation["id"])["status"] == "running", 60, "the evaluation to start")
    running = client.create_training_job(TINY_MODEL, [ds], {**recipe, "max_steps": 120, "checkpoint_every": 60})  # still training at the kill
    queued = client.create_training_job(TINY_MODEL, [ds], {**recipe, "seed": 1})
    wait_for(lambda: client.training_job(running["id"])["status"] == "running", 120, "the first job to start", poll_s=0.05)
    exits_before = len(EXITS)
    at_kill = client.training_job(running["id"])
    assert (at_kill["status"], client.training_job(queued["id"])["status"], client.evaluation(evaluation["id"])["status"]) == ("running", "queued", "running")

    redis.kill()  # queued messages are gone with it (no persistence)
    time.sleep(2)
    redis.start()
    restarted_at = time.monotonic()

    jobs_done = [wait_for(lambda j=j: (x := client.training_job(j["id"]))["status"] in ("succeeded", "failed", "cancelled") and x, 300, f"job {j['id']}")
                 for j in (running, queued)]
    ev_done = wait_for(lambda: (e := client.evaluation(evaluation["id"]))["status"] in ("succeeded", "failed") and e, 240, "the evaluation")
    print(f"\n[fault] redis killed at step {at_kill['steps_done']}/120 of the first job; both jobs and the evaluation finished {time.monotonic() - restarted_at:.1f} s later; "
          f"process exits the supervisor restarted: {EXITS[exits_before:]}")
    assert [j["status"] for j in jobs_done] == ["succeeded", "succeeded"], [j["error"] for j in jobs_done]
    assert ev_done["status"] == "succeeded", ev_done["error"]
    with create_engine(urls["trainer"]).connect() as conn:
        resends = conn.execute(text("SELECT resends FROM training_jobs WHERE id = :id"), {"id": queued["id"]}).scalar()
    assert resends >= 1  # its message was lost with Redis and the reconciler sent it again

    # Both workers consume again: new work sent after the restart is done.
    after = [client.create_evaluation(BASE, limit=4), client.create_training_job(TINY_MODEL, [ds], {**recipe, "seed": 2})]
    ev_after = wait_for(lambda: (e := client.evaluation(after[0]["id"]))["status"] in ("succeeded", "failed") and e, 180, "an evaluation sent after the restart")
    job_after = wait_for(lambda: (j := client.training_job(after[1]["id"]))["status"] in ("succeeded", "failed") and j, 180, "a job sent after the restart")
    assert (ev_after["status"], job_after["status"]) == ("succeeded", "succeeded"), (ev_after["error"], job_after["error"])
    assert stack.failed() == []
    assert_books_balance(stack, client.run_id)


def test_ledger_restart_mid_request_gives_clean_errors_or_success_and_no_double_charge(faulty, client) -> None:  # noqa: ANN001
    stack, _, _ = faulty
    outcomes: list[int] = []
    problems: list[dict] = []
    stop = threading.Event()

    def caller() -> None:
        while not stop.is_set():
            try:
                client.chat(BASE, [{"role": "user", "content": "2 + 3 ="}], max_tokens=4)
                outcomes.append(200)
            except CrucibleAPIError as exc:
                outcomes.append(exc.status)
                problems.append(exc.problem)

    threads = [threading.Thread(target=caller) for _ in range(4)]
    for t in threads:
        t.start()
    wait_for(lambda: len(outcomes) >= 4, 60, "calls to flow")
    stack.kill("ledger")
    time.sleep(1.5)
    stack.restart("ledger")
    time.sleep(3)
    stop.set()
    for t in threads:
        t.join(60)
    print(f"\n[fault] ledger killed and restarted under 4 concurrent callers: {Counter(outcomes)}")
    assert set(outcomes) <= {200, 503}, problems
    assert all(p["code"] == "upstream_unavailable" and p.get("retry_after_s") for p in problems)
    _, entries = assert_books_balance(stack, client.run_id)
    settled_calls = {e["hold_id"] for e in entries if e["type"] == "charge" and e["kind"] == "decode_tokens"}
    assert len(settled_calls) == outcomes.count(200)  # every answered call charged once, no failed one charged

    # a job created while the ledger is down: a clean 503, then the retry with the same key creates it once
    ds = upload_training_set(client, rows=16)
    recipe = {"max_steps": 1, "batch_size": 2, "checkpoint_every": 1, "warmup_steps": 0}
    stack.kill("ledger")
    with pytest.raises(CrucibleAPIError) as exc:
        client.create_training_job(BASE, [ds], recipe, idempotency_key="job-during-outage")
    assert exc.value.status == 503 and exc.value.code == "upstream_unavailable"
    stack.restart("ledger")
    first = client.create_training_job(BASE, [ds], recipe, idempotency_key="job-during-outage")
    again = client.create_training_job(BASE, [ds], recipe, idempotency_key="job-during-outage")
    assert again["id"] == first["id"]
    with pytest.raises(CrucibleAPIError) as exc:
        client.create_training_job(BASE, [ds], {**recipe, "seed": 7}, idempotency_key="job-during-outage")
    assert exc.value.status == 409 and exc.value.code == "idempotency_key_reused"
    wait_for(lambda: client.training_job(first["id"])["status"] == "succeeded", 180, "the job to finish")
    assert [j["id"] for j in client.training_jobs()] == [first["id"]]
    _, entries = assert_books_balance(stack, client.run_id)
    assert sum(1 for e in entries if e["type"] == "hold" and "training job" in (e["purpose"] or "")) == 1


def test_a_job_that_ends_while_the_ledger_is_down_is_charged_once_it_is_back(faulty, client) -> None:  # noqa: ANN001
    stack, _, _ = faulty
    ds = upload_training_set(client, rows=16)
    job = client.create_training_job(BASE, [ds], {"max_steps": 3, "batch_size": 2, "checkpoint_every": 3, "warmup_steps": 0})
    wait_for(lambda: client.training_job(job["id"])["steps_done"] >= 1, 300, "the first step")
    stack.kill("ledger")
    done = wait_for(lambda: (j := client.training_job(job["id"]))["status"] in ("succeeded", "failed") and j, 300, "the job to end")
    stack.restart("ledger")
    restarted_at = time.monotonic()
    _, entries = assert_books_balance(stack, client.run_id)  # waits until the reconciler settled the hold
    print(f"\n[fault] ledger down when the job ended; its hold was settled {time.monotonic() - restarted_at:.1f} s after the ledger came back")
    assert done["status"] == "succeeded"
    assert sum(e["quantity"] for e in entries if e["type"] == "charge" and e["kind"] == "training_tokens") == done["trained_tokens"] > 0


def test_an_inference_outage_longer_than_the_retries_requeues_the_evaluation_instead_of_failing_it(faulty, client) -> None:  # noqa: ANN001
    stack, _, _ = faulty
    ev = client.create_evaluation(BASE, limit=8)
    wait_for(lambda: client.evaluation(ev["id"])["items_done"] >= 2, 300, "2 items scored", poll_s=0.05)
    stack.kill("inference")
    assert client.evaluation(ev["id"])["status"] == "running"
    gateway = f"http://127.0.0.1:{stack.port_base}"
    not_ready = httpx.get(f"{gateway}/readyz", timeout=10)  # alive, not ready: the operator's and the probes' view of the outage
    assert (not_ready.status_code, list(not_ready.json()["unready"]), httpx.get(f"{gateway}/healthz").status_code) == (503, ["inference"], 200)
    assert int(not_ready.headers["Retry-After"]) > 0
    time.sleep(GRADER_RETRIES_S + 5)  # longer than the grader's retries: every call in flight gives up
    stack.restart("inference")
    assert httpx.get(f"{gateway}/readyz", timeout=10).status_code == 200
    done = wait_for(lambda: (e := client.evaluation(ev["id"]))["status"] in ("succeeded", "failed") and e, 400, "the evaluation to finish")
    assert done["status"] == "succeeded", done["error"]
    assert done["attempts"] >= 2 and done["score"]["n"] == done["items_total"]
    assert_books_balance(stack, client.run_id)


def test_a_process_that_dies_on_its_own_is_restarted_by_the_supervisor(faulty, client) -> None:  # noqa: ANN001
    stack, _, _ = faulty
    before = len(EXITS)
    os.killpg(stack.procs["gateway"].pid, 9)  # not through stack.kill: as if it had crashed
    died_at = time.monotonic()
    wait_for(lambda: ("gateway", -9) in EXITS[before:], 10, "the supervisor to see the exit")
    wait_for(lambda: stack._healthy(stack.port_base), 60, "the gateway to answer again", poll_s=0.5)
    assert client.budget()["budget_usd_micros"] > 0
    print(f"\n[fault] gateway killed; answering again {time.monotonic() - died_at:.1f} s later")
    assert stack.failed() == []
