"""End to end: every service and worker as real processes, the real model, real HTTP through the gateway."""

from __future__ import annotations

import json
import re
import time

import httpx
import pytest

from crucible.agent import AgentConfig, BaselineAgent
from crucible.sdk import CrucibleAPIError, CrucibleClient
from tests.conftest import plumbing_benchmark
from tests.mcp_client import read_everything
from tests.models import TINY_MODEL

pytestmark = pytest.mark.e2e


def _ledger(stack):  # noqa: ANN001, ANN202
    from crucible.stack import service_token

    token = service_token(stack.data_dir, "gateway")  # the ledger trusts the gateway; operators read it so
    return httpx.Client(base_url=f"http://127.0.0.1:{stack.port_base + 1}", headers={"Authorization": f"Bearer {token}"}, timeout=30)


def _test_questions(stack, benchmark_id: str) -> list[str]:  # noqa: ANN001
    """Read the hidden split straight from the test store (the test plays the auditor here)."""
    from crucible.stack import ensure_secrets
    from grader.teststore import TestStore

    store = TestStore(stack.test_store_url or ensure_secrets(stack.data_dir)[2]["CRUCIBLE_GRADER_TEST_STORE_URL"])
    return [it.question for it in store.items(benchmark_id)]


@pytest.mark.planes("sqlite", "postgres")  # ledger holds and charges, job states and leases: both data planes
def test_research_loop_improves_and_reaches_the_leaderboard(stack, admin, new_run, request):  # noqa: ANN001
    """The reference agent's loop end to end: the real model on the embedded plane; on PostgreSQL, where the subject is
    the data plane (the ledger's holds and charges, job states and leases, column types), the test-only model, whose
    steps and gradings take milliseconds of the stack's CPU where the real model's took a minute."""
    if request.node.callspec.params["stack"] == "postgres":
        doc = plumbing_benchmark(f"chain-sum-loop-{stack.port_base}")
        admin.load_benchmark(doc)
        run = admin.create_run(doc["name"], "e2e-baseline")
        client = CrucibleClient(stack.gateway_url, run["api_key"])
    else:
        run, client = new_run("e2e-baseline")
    agent = BaselineAgent(client, AgentConfig(train_examples=200, recipe={"max_steps": 4, "batch_size": 8, "checkpoint_every": 2},
                                              evaluate_last_checkpoints=1, poll_s=0.5))
    result = agent.run()
    sub = result.submission
    assert sub["status"] == "graded"
    assert 0.0 <= sub["score"]["value"] <= 1.0 and sub["score"]["n"] == 24

    # the training job left events with metrics and two checkpoints
    job = client.training_jobs()[0]
    assert job["status"] == "succeeded" and job["steps_done"] == 4 and job["trained_tokens"] > 0
    steps = [e for e in client.training_events(job["id"]) if e["type"] == "step"]
    assert [e["data"]["step"] for e in steps] == [1, 2, 3, 4]
    assert all(e["data"]["loss"] > 0 and e["data"]["tokens_per_s"] > 0 for e in steps)
    assert [c["step"] for c in client.checkpoints(job["id"])] == [2, 4]

    # the leaderboard shows the run with initial, final and gap closed
    rows = [r for r in httpx.get(f"{stack.gateway_url}/v1/leaderboard").json()["data"] if r["run_id"] == run["id"]]
    assert len(rows) == 1
    row = rows[0]
    assert row["final_score"] == sub["score"]["value"]
    assert row["initial_score"] is not None and row["reference_score"] == 1.0
    assert row["gap_closed"] == pytest.approx((row["final_score"] - row["initial_score"]) / (1.0 - row["initial_score"]))
    assert row["validation_evaluations"] == 2 and row["spent_usd"] > 0
    assert row["contaminated"] is False and "contaminated_items" not in row  # trained on the public pool only; counts are the operator's
    assert row["final_ci"][0] <= row["final_score"] <= row["final_ci"][1]
    html = httpx.get(f"{stack.gateway_url}/leaderboard").text
    assert "e2e-baseline" in html

    # the ledger: spent equals the sum of charges, never above budget, no hold left open
    with _ledger(stack) as ledger:
        bal = ledger.get(f"/internal/accounts/{run['id']}").json()
        entries = ledger.get(f"/internal/accounts/{run['id']}/entries").json()
        entries = entries["data"] if isinstance(entries, dict) else entries
        open_holds = ledger.get(f"/internal/accounts/{run['id']}/holds", params={"status": "open"}).json()
        open_holds = open_holds["data"] if isinstance(open_holds, dict) else open_holds
    charges = sum(e["amount_usd_micros"] for e in entries if e["type"] == "charge")
    assert bal["spent_usd_micros"] == charges > 0
    assert bal["spent_usd_micros"] <= bal["budget_usd_micros"]
    assert bal["held_usd_micros"] == 0 and open_holds == []
    assert bal["spent_by_kind"]["training_tokens"] > 0 and bal["spent_by_kind"]["prefill_tokens"] > 0
    budget = client.budget()
    assert budget["spent_usd_micros"] == bal["spent_usd_micros"]

    # a second final submission is refused
    with pytest.raises(CrucibleAPIError) as exc:
        client.submit(result.best_model)
    assert exc.value.status == 403 and exc.value.code == "submission_limit"


@pytest.mark.slow
def test_the_agent_trains_by_dpo_on_full_weights_the_checkpoints_are_merged_evaluated_and_graded(stack, admin):  # noqa: ANN001
    """The reference agent's other options, through every service: preference pairs from the training pool, a DPO
    job on full weights (its device, its DPO metrics, full-weight checkpoints), the checkpoint served by inference
    for validation and graded on the hidden split."""
    _run, client = _open_recipe_run(admin, stack, "dpo-full")
    config = AgentConfig.for_steps(2, method="dpo", adapter="full")
    config.train_examples, config.evaluate_last_checkpoints, config.poll_s = 40, 1, 0.5
    config.recipe |= {"batch_size": 4}
    result = BaselineAgent(client, config).run()
    assert result.submission["status"] == "graded"

    [job] = client.training_jobs()
    assert (job["status"], job["recipe"]["method"], job["recipe"]["adapter"], job["steps_done"]) == ("succeeded", "dpo", "full", 2)
    events = client.training_events(job["id"])
    [device] = [e for e in events if e["type"] == "device"]
    assert device["data"]["method"] == "dpo" and device["data"]["adapter"] == "full" and device["data"]["device"].startswith("cpu")
    steps = [e["data"] for e in events if e["type"] == "step"]
    assert len(steps) == 2 and all({"reward_accuracy", "reward_margin", "chosen_logprob"} <= set(d) for d in steps)
    assert abs(steps[0]["loss"] - 0.6931) < 1e-3  # policy = reference at the first step: ln 2
    [ckpt] = client.checkpoints(job["id"])[-1:]
    assert ckpt["kind"] == "full"
    evaluated = [e for e in client.evaluations() if e["model"] == ckpt["id"]]
    assert evaluated and evaluated[0]["status"] == "succeeded" and evaluated[0]["score"] is not None
    assert client.budget()["spent_by_kind"]["training_tokens"] > 0

    # a merge job: the job's two full-weight checkpoints averaged into a new one, charged for what it read, served
    first, last = (c["id"] for c in client.checkpoints(job["id"]))
    merge = client.merge_checkpoints(TINY_MODEL, [first, last], combination="linear")
    assert (merge["recipe"]["method"], merge["merge"]["weights"], merge["datasets"]) == ("merge", None, [])
    deadline = time.monotonic() + 300
    while (merge := client.training_job(merge["id"]))["status"] not in ("succeeded", "failed", "cancelled") and time.monotonic() < deadline:
        time.sleep(0.5)
    assert merge["status"] == "succeeded", merge
    [merged] = client.checkpoints(merge["id"])
    assert merged["kind"] == "full"
    evaluation = client.wait_evaluation(client.create_evaluation(merged["id"], limit=2)["id"], poll_s=0.5)
    assert evaluation["status"] == "succeeded" and evaluation["score"] is not None
    assert client.budget()["spent_by_kind"]["merged_parameters"] > 0


def _open_recipe_run(admin, stack, name: str):  # noqa: ANN001, ANN202
    """A run of the test benchmark with every recipe field open (the default test benchmark locks some), on the test-only
    model (:func:`~tests.conftest.plumbing_benchmark`): what these runs check is each method's path through the services,
    its metrics and its charges, which the model's weights do not change (DPO on the real model's full weights took
    197 s of `make test-slow`)."""
    doc = plumbing_benchmark("chain-sum-open-recipe") | {"recipe": {}}
    admin.load_benchmark(doc)
    run = admin.create_run("chain-sum-open-recipe", name)
    return run, CrucibleClient(stack.gateway_url, run["api_key"])


@pytest.mark.slow
def test_the_agent_trains_by_grpo_with_the_suites_scorer_as_reward_and_the_rollouts_are_charged(stack, admin):  # noqa: ANN001
    """GRPO through every service: the agent's job on the training pool (no dataset), its rollouts sampled in the train
    worker and rewarded by the grader's scorer for the run, the policy equal to the reference at step 1 (KL 0), the
    checkpoint evaluated and graded; the job's hold settled with its training tokens and its rollouts' prefill and
    decode tokens, exactly those the job reports."""
    run, client = _open_recipe_run(admin, stack, "grpo")
    config = AgentConfig.for_steps(2, method="grpo")
    config.evaluate_last_checkpoints, config.poll_s = 1, 0.5
    config.recipe |= {"batch_size": 2, "grpo_group_size": 4, "grpo_max_new_tokens": 12}
    result = BaselineAgent(client, config).run()
    assert result.submission["status"] == "graded"

    [job] = client.training_jobs()
    assert (job["status"], job["recipe"]["method"], job["datasets"], job["steps_done"]) == ("succeeded", "grpo", [], 2)
    events = client.training_events(job["id"])
    [validated] = [e for e in events if e["type"] == "validated"]
    assert validated["data"]["estimated_decode_tokens"] == 2 * 2 * 4 * 12  # steps x prompts x group x max_new_tokens
    steps = [e["data"] for e in events if e["type"] == "step"]
    assert len(steps) == 2 and all(0 <= d["reward_mean"] <= 1 and 1 <= d["completion_tokens"] <= 12 for d in steps)
    assert abs(steps[0]["kl"]) < 1e-5
    assert job["decode_tokens"] == sum(d["decode_tokens"] for d in steps) > 0
    assert job["prefill_tokens"] == sum(d["prefill_tokens"] for d in steps) > 0

    with _ledger(stack) as ledger:
        entries = ledger.get(f"/internal/accounts/{run['id']}/entries").json()
    charged = {e["kind"]: e["quantity"] for e in entries if e["type"] == "charge" and (e["idempotency_key"] or "").startswith(f"settle:{job['id']}")}
    assert charged == {"training_tokens": job["trained_tokens"], "prefill_tokens": job["prefill_tokens"], "decode_tokens": job["decode_tokens"]}


def test_grpo_prompts_are_training_pool_items_and_method_fields_are_checked(stack, admin):  # noqa: ANN001
    """A GRPO job trains on training-pool items only: a ``prompt_only`` row naming a validation item or an unknown id is
    refused alike (422 on ``datasets`` with the line), before any hold; fields of one method are refused on another."""
    run, client = _open_recipe_run(admin, stack, "grpo-inputs")
    pool, validation = client.train_sample(limit=2), client.validation_items()

    def refused(**body) -> dict:  # noqa: ANN003
        with pytest.raises(CrucibleAPIError) as exc:
            client.create_training_job(**body)
        assert exc.value.status == 422, exc.value.problem
        return exc.value.problem

    for item_id in (validation[0]["id"], "no-such-item"):
        rows = [{"prompt": pool[0]["question"], "item_id": pool[0]["id"]}, {"prompt": "What is 1 + 1?", "item_id": item_id}]
        ds = client.upload_dataset("".join(json.dumps(r) + "\n" for r in rows).encode(), "prompts.jsonl")
        assert ds["format"] == "prompt_only"
        problem = refused(model="smollm2-135m-instruct", datasets=[ds["id"]], recipe={"method": "grpo"})
        assert (problem["field"], problem["line"]) == ("datasets", 2) and "not an item of the run's training pool" in problem["detail"]
    assert refused(model="smollm2-135m-instruct", datasets=[ds["id"]], recipe={"method": "sft"})["field"] == "datasets"  # sft cannot train prompts
    assert refused(model="smollm2-135m-instruct", datasets=[], recipe={"method": "sft", "grpo_group_size": 8})["field"] == "recipe.grpo_group_size"
    assert refused(model="smollm2-135m-instruct", datasets=[], recipe={"method": "grpo", "dpo_beta": 0.2})["field"] == "recipe.dpo_beta"
    assert refused(model="smollm2-135m-instruct", datasets=[], recipe={"method": "sft"}, harness={"system_prompt": "x"})["field"] == "harness"
    assert refused(model="smollm2-135m-instruct", datasets=[], recipe={"method": "grpo"},
                   harness={"user_template": "{{ question.__class__ }}"})["field"] == "harness.user_template"
    assert client.training_jobs() == [] and client.budget()["held_usd_micros"] == 0

    ok = [{"prompt": [{"role": "system", "content": "Answer with the number only."}, {"role": "user", "content": it["question"]}],
           "item_id": it["id"]} for it in pool]
    ds = client.upload_dataset("".join(json.dumps(r) + "\n" for r in ok).encode(), "prompts-ok.jsonl")
    job = client.create_training_job("smollm2-135m-instruct", [ds["id"]], {"method": "grpo", "max_steps": 1, "batch_size": 2,
                                                                           "grpo_group_size": 2, "grpo_max_new_tokens": 4})
    assert job["recipe"]["grpo_group_size"] == 2 and job["datasets"] == [ds["id"]]
    client.cancel_training_job(job["id"])


def test_a_run_that_trained_on_planted_test_items_is_flagged_on_the_leaderboard(stack, admin):  # noqa: ANN001
    doc = plumbing_benchmark(f"chain-sum-planted-{stack.port_base}")  # the flag reads the run's data, not the model's answers
    benchmark = admin.load_benchmark(doc)
    run = admin.create_run(doc["name"], "contaminated")
    client = CrucibleClient(stack.gateway_url, run["api_key"])
    planted = _test_questions(stack, benchmark["id"])[:5]
    rows = [{"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": "0"}]} for q in planted]
    client.upload_dataset("\n".join(json.dumps(r) for r in rows).encode())
    sub = client.wait_submission(client.submit(TINY_MODEL)["id"], poll_s=0.5)
    assert sub["status"] == "graded"
    row = next(r for r in httpx.get(f"{stack.gateway_url}/v1/leaderboard").json()["data"] if r["run_id"] == run["id"])
    assert row["contaminated"] is True and "contaminated_items" not in row  # a public count would be a membership oracle
    assert "flagged" in httpx.get(f"{stack.gateway_url}/leaderboard").text
    from crucible.stack import service_token

    entries = httpx.get(f"http://127.0.0.1:{stack.port_base + 4}/internal/leaderboard", timeout=30,
                        headers={"Authorization": f"Bearer {service_token(stack.data_dir, 'gateway')}"}).json()["data"]
    assert next(e for e in entries if e["run_id"] == run["id"])["contamination"]["flagged_items"] == 5  # the operator's record


def test_the_same_system_evaluated_twice_gets_identical_scores_and_completions(stack, new_run):  # noqa: ANN001
    _, client = new_run("twice")
    first, second = (client.wait_evaluation(client.create_evaluation("smollm2-135m-instruct", limit=6)["id"], poll_s=0.5) for _ in range(2))
    assert first["score"] == second["score"] and first["score"]["n"] == 6
    assert first["score"]["ci_low"] <= first["score"]["value"] <= first["score"]["ci_high"]
    completions = [[(t["item_id"], t["completion"], t["score"]) for t in client.trajectories(ev["id"])] for ev in (first, second)]
    assert completions[0] == completions[1]


def test_an_item_that_does_not_fit_the_benchmarks_context_length_scores_zero(stack, admin):  # noqa: ANN001
    doc = plumbing_benchmark(f"chain-sum-short-context-{stack.port_base}")
    doc["suite"]["splits"]["test"]["size"] = 2
    doc["evaluation"]["context_tokens"] = 128
    admin.load_benchmark(doc)
    run = admin.create_run(doc["name"], "short-context")
    client = CrucibleClient(stack.gateway_url, run["api_key"])
    fits = client.wait_evaluation(client.create_evaluation(TINY_MODEL, limit=2)["id"], poll_s=0.5)
    assert fits["status"] == "succeeded" and all(t["completion"] for t in client.trajectories(fits["id"]))
    long_prompt = {"system_prompt": "Think about the sum carefully. " * 30, "user_template": "{{ question }}", "answer_extraction": "first_line"}
    too_long = client.wait_evaluation(client.create_evaluation(TINY_MODEL, harness=long_prompt, limit=2)["id"], poll_s=0.5)
    assert too_long["status"] == "succeeded" and too_long["score"]["value"] == 0.0
    assert [(t["completion"], t["answer"], t["score"]) for t in client.trajectories(too_long["id"])] == [("", None, 0.0)] * 2
    client.close()


def test_no_gateway_route_or_mcp_tool_returns_test_split_content(stack, new_run, benchmark):  # noqa: ANN001
    run, client = new_run("crawler")
    ev = client.wait_evaluation(client.create_evaluation("smollm2-135m-instruct", limit=4)["id"], 0.5)
    sub = client.submit("smollm2-135m-instruct")
    client.wait_submission(sub["id"], 1.0)
    questions = _test_questions(stack, benchmark["id"])
    assert len(questions) == 24
    ids = {"eval_id": ev["id"], "sub_id": sub["id"], "run_id": run["id"]}
    spec = httpx.get(f"{stack.gateway_url}/openapi.json").json()
    bodies = []
    for path, ops in spec["paths"].items():
        if "get" not in ops or path.startswith("/admin"):
            continue
        if re.search(r"\{(?!eval_id|sub_id|run_id)\w+\}", path):
            continue
        url = path.format(**ids)
        bodies.append(client.http.get(url).text)
    bodies.append(json.dumps(client.trajectories(ev["id"])))
    time.sleep(1.1)  # the crawl's burst out of the key's 30/second window: the MCP SDK does not retry a 429 (it read as a protocol error)
    mcp = read_everything(stack.gateway_url, run["api_key"], ids)  # a coding agent's MCP tools: what HTTP hides, they hide
    assert {name for name, _, _ in mcp} >= {"run_card", "run_report", "evaluation", "trajectories", "submission", "train_sample"}
    bodies += [json.dumps(content) for _, _, content in mcp]
    text = "\n".join(bodies)
    assert "train-sample" not in text  # sanity: we crawled data, not docs
    leaked = [q for q in questions if q in text]
    assert leaked == []
    assert '"test-0' not in text  # no test item id either


def test_bad_inputs_get_problem_json(stack, new_run):  # noqa: ANN001
    run, client = new_run("bad-input")
    other_run, other = new_run("other")
    # 401: missing, invalid, revoked
    r = httpx.get(f"{stack.gateway_url}/v1/run")
    assert r.status_code == 401 and r.headers["content-type"].startswith("application/problem+json")
    assert httpx.get(f"{stack.gateway_url}/v1/run", headers={"Authorization": "Bearer crk_nope"}).status_code == 401
    # malformed JSONL: 422 with line and field; nothing stored
    with pytest.raises(CrucibleAPIError) as exc:
        client.upload_dataset(b'{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}\n{"prompt": 3}\n')
    assert exc.value.status == 422 and exc.value.problem["line"] == 2 and exc.value.problem["field"] == "prompt"
    with pytest.raises(CrucibleAPIError) as exc:
        client.upload_dataset(b"not json\n")
    assert exc.value.status == 422 and exc.value.problem["line"] == 1
    assert client.datasets() == []
    # another run's dataset is 404, never its data
    ds = other.upload_dataset(b'{"prompt": "1 + 1 =", "completion": "2"}\n')
    with pytest.raises(CrucibleAPIError) as exc:
        client.dataset(ds["id"])
    assert exc.value.status == 404 and "1 + 1" not in json.dumps(exc.value.problem)
    with pytest.raises(CrucibleAPIError) as exc:
        client.create_training_job("smollm2-135m-instruct", [ds["id"]])
    assert exc.value.status == 404
    # unknown base model or checkpoint: 422 naming `model`
    mine = client.upload_dataset(b'{"prompt": "1 + 2 =", "completion": "3"}\n')
    for model in ("gpt-17", "ckpt_01m8mpcgayz5m33vy6a2nnpezb"):
        with pytest.raises(CrucibleAPIError) as exc:
            client.create_training_job(model, [mine["id"]])
        assert exc.value.status == 422 and exc.value.problem["field"] == "model"
        with pytest.raises(CrucibleAPIError) as exc:
            client.create_evaluation(model)
        assert exc.value.status == 422 and exc.value.problem["field"] == "model"
    # a locked recipe field sent with another value: 403 naming it
    with pytest.raises(CrucibleAPIError) as exc:
        client.create_training_job("smollm2-135m-instruct", [mine["id"]], {"method": "dpo"})
    assert exc.value.status == 403 and exc.value.problem["field"] == "recipe.method"
    assert client.training_jobs() == []
    # chat completions work and are charged
    before = client.budget()["spent_usd_micros"]
    out = client.chat("smollm2-135m-instruct", [{"role": "user", "content": "What is 2 + 2?"}], max_tokens=8, temperature=0)
    assert out["object"] == "chat.completion" and out["usage"]["completion_tokens"] >= 1
    assert client.budget()["spent_usd_micros"] > before
    # revocation takes effect on the next request
    from crucible.sdk import AdminClient
    from crucible.stack import admin_key

    AdminClient(stack.gateway_url, admin_key(stack.data_dir)).revoke(other_run["id"])
    with pytest.raises(CrucibleAPIError) as exc:
        other.run()
    assert exc.value.status == 401


@pytest.mark.planes("sqlite", "postgres")  # ledger holds and charges, job states and leases: both data planes
def test_over_budget_is_402_and_reads_keep_working(stack, new_run):  # noqa: ANN001
    run, client = new_run("poor", budget_usd=0.000002)
    with pytest.raises(CrucibleAPIError) as exc:
        client.create_evaluation("smollm2-135m-instruct")
    assert exc.value.status == 402 and exc.value.problem["remaining_usd_micros"] == 2
    with pytest.raises(CrucibleAPIError) as exc:
        client.chat("smollm2-135m-instruct", [{"role": "user", "content": "hi"}], max_tokens=64)
    assert exc.value.status == 402
    assert client.evaluations() == []
    assert client.budget()["spent_usd_micros"] == 0
    assert client.run()["run_id"] == run["id"]


@pytest.mark.planes("sqlite", "postgres")  # ledger holds and charges, job states and leases: both data planes
def test_an_operator_refunds_part_of_a_charge_and_the_run_sees_it(stack, new_run, admin):  # noqa: ANN001
    run, client = new_run("refunded")
    client.chat("smollm2-135m-instruct", [{"role": "user", "content": "hi"}], max_tokens=4)
    spent = client.budget()["spent_usd_micros"]
    charge = next(e for e in admin.entries(run["id"]) if e["type"] == "charge")
    refund = admin.refund(run["id"], charge["id"], "test refund", "refund-1", amount_usd_micros=1)
    assert admin.refund(run["id"], charge["id"], "test refund", "refund-1", amount_usd_micros=1) == refund
    assert refund["refund_of"] == charge["id"] and client.budget()["spent_usd_micros"] == spent - 1
    with pytest.raises(CrucibleAPIError) as exc:
        admin.refund(run["id"], charge["id"], "too much", "refund-2", amount_usd_micros=charge["amount_usd_micros"])
    assert exc.value.status == 409 and exc.value.problem["code"] == "refund_exceeds_charge"
    with pytest.raises(CrucibleAPIError) as exc:
        admin.refund("run_" + "0" * 26, charge["id"], "wrong run", "refund-3")
    assert exc.value.status == 404
    assert [e["type"] for e in admin.entries(run["id"])][-1] == "refund"


def test_past_deadline_is_403_run_expired(stack, new_run):  # noqa: ANN001
    run, client = new_run("late", wall_clock_hours=0.0005)  # 1.8 s
    time.sleep(2.0)
    with pytest.raises(CrucibleAPIError) as exc:
        client.upload_dataset(b'{"prompt": "1 + 1 =", "completion": "2"}\n')
    assert exc.value.status == 403 and exc.value.code == "run_expired"
    assert client.run()["seconds_left"] == 0  # reads still work


@pytest.mark.planes("sqlite", "postgres")  # ledger holds and charges, job states and leases: both data planes
def test_cancelling_a_queued_job_releases_its_hold_and_a_running_one_is_charged_for_its_steps(stack, new_run):  # noqa: ANN001
    run, client = new_run("canceller")
    items = client.train_sample(limit=32)
    data = "".join(json.dumps({"prompt": it["question"], "completion": it["answer"]}) + "\n" for it in items).encode()
    ds = client.upload_dataset(data, "cancel.jsonl")["id"]
    recipe = {"max_steps": 50, "batch_size": 2, "checkpoint_every": 50, "warmup_steps": 0}
    running = client.create_training_job("smollm2-135m-instruct", [ds], recipe)
    queued = client.create_training_job("smollm2-135m-instruct", [ds], {**recipe, "seed": 1})
    deadline = time.monotonic() + 120
    while client.training_job(running["id"])["steps_done"] < 1:
        assert time.monotonic() < deadline, "the first job never trained a step"
        time.sleep(0.3)

    assert client.cancel_training_job(queued["id"])["status"] == "cancelled"  # at once: no worker had it
    stopping = client.cancel_training_job(running["id"])
    assert stopping["status"] == "running"
    deadline = time.monotonic() + 60
    while (job := client.training_job(running["id"]))["status"] == "running":
        assert time.monotonic() < deadline, "the running job did not stop"
        time.sleep(0.3)
    assert job["status"] == "cancelled" and 0 < job["steps_done"] < 50
    with pytest.raises(CrucibleAPIError) as exc:
        client.cancel_training_job(running["id"])
    assert exc.value.status == 409

    with _ledger(stack) as ledger:
        entries = ledger.get(f"/internal/accounts/{run['id']}/entries").json()
        entries = entries["data"] if isinstance(entries, dict) else entries
        bal = ledger.get(f"/internal/accounts/{run['id']}").json()
    trained = sum(e["quantity"] for e in entries if e["type"] == "charge" and e["kind"] == "training_tokens")
    assert trained == job["trained_tokens"] > 0 and client.training_job(queued["id"])["trained_tokens"] == 0
    assert bal["held_usd_micros"] == 0


@pytest.mark.planes("sqlite", "postgres")  # ledger holds and charges, job states and leases: both data planes
def test_validation_evaluations_are_limited_as_the_benchmark_says(stack, admin):  # noqa: ANN001
    from crucible.sdk import CrucibleClient

    doc = plumbing_benchmark("chain-sum-limited")
    doc["suite"]["splits"]["test"] = {"size": 4}
    doc["limits"] = {"final_submissions": 1, "validation_evaluations_per_hour": 2, "concurrent_evaluations": 1}
    admin.load_benchmark(doc)
    run = admin.create_run("chain-sum-limited", "limited")
    client = CrucibleClient(stack.gateway_url, run["api_key"])

    counted_from = time.monotonic()  # the hour's window opens when the first evaluation is counted, after this
    first = client.create_evaluation("smollm2-135m-instruct")
    with pytest.raises(CrucibleAPIError) as exc:  # the first is still queued or running
        client.create_evaluation("smollm2-135m-instruct", limit=1)
    assert exc.value.status == 429 and exc.value.code == "evaluation_limit" and exc.value.problem["limit"] == "concurrent_evaluations"
    client.wait_evaluation(first["id"], poll_s=0.3)
    client.wait_evaluation(client.create_evaluation("smollm2-135m-instruct", limit=1)["id"], poll_s=0.3)

    resp = httpx.post(f"{stack.gateway_url}/v1/evaluations", json={"model": "smollm2-135m-instruct", "limit": 1},
                      headers={"Authorization": f"Bearer {run['api_key']}"})
    assert resp.status_code == 429 and resp.headers["content-type"].startswith("application/problem+json")
    assert resp.json()["limit"] == "validation_evaluations_per_hour"
    waited = time.monotonic() - counted_from  # however slow the machine: the window closes an hour after the first
    assert 3600 - waited - 2 <= int(resp.headers["Retry-After"]) <= 3600
    limits = client.run()["limits"]
    assert limits["validation_evaluations_per_hour"] == {"limit": 2, "used": 2, "left": 0}
    assert limits["concurrent_evaluations"] == {"limit": 1, "used": 0, "left": 1}
    assert limits["final_submissions"] == {"limit": 1, "used": 0, "left": 1}
    assert len(client.evaluations()) == 2  # refused ones leave nothing behind
    budget = client.budget()
    assert budget["held_usd_micros"] == 0


# every mutating gateway operation that touches the editable space: (name, part(s) that allow it, call).
# Each call is valid except for one thing checked after permission (an unknown model or dataset, a bad
# file), so an allowed call answers 4xx other than 403 and starts no work, and a refused one answers 403.
PERMISSION_OPERATIONS = [
    ("upload a dataset", {"data"}, lambda c: c._call("POST", "/v1/datasets", files={"file": ("x.jsonl", b"not json\n", "application/jsonl")})),
    ("start a training job", {"data", "trainer"},
     lambda c: c.create_training_job("smollm2-135m-instruct", ["ds_00000000000000000000000000"])),
    ("set a recipe field", {"trainer"},
     lambda c: c.create_training_job("smollm2-135m-instruct", ["ds_00000000000000000000000000"], {"learning_rate": 0.01})),
    ("evaluate with a custom harness", {"harness"}, lambda c: c.create_evaluation("no-such-model", harness={"system_prompt": "x"})),
    ("submit a custom harness", {"harness"}, lambda c: c.submit("no-such-model", harness={"system_prompt": "x"})),
    ("evaluate with the default harness", {"data", "trainer", "harness"}, lambda c: c.create_evaluation("no-such-model")),
    ("chat", {"data", "trainer", "harness"}, lambda c: c.chat("no-such-model", [{"role": "user", "content": "hi"}])),
]


@pytest.mark.parametrize("track", ["data", "trainer", "harness", "joint"])
def test_permission_matrix_every_operation_on_every_track(stack, admin, track):  # noqa: ANN001
    from crucible.sdk import CrucibleClient
    from gateway.schemas import TRACKS

    doc = plumbing_benchmark(f"chain-sum-track-{track}")
    doc["track"] = track
    doc["suite"]["splits"]["test"] = {"size": 4}
    doc["recipe"] = {"lock": {"method": "sft"}}
    admin.load_benchmark(doc)
    run = admin.create_run(doc["name"], f"matrix-{track}")
    client = CrucibleClient(stack.gateway_url, run["api_key"])
    editable = set(TRACKS[track])
    assert set(client.run()["editable"]) == editable
    outcomes = {}
    for name, _parts, call in PERMISSION_OPERATIONS:
        with pytest.raises(CrucibleAPIError) as exc:
            call(client)
        outcomes[name] = (exc.value.status, exc.value.code)
    expected = {name: "allowed" if parts & editable else "refused" for name, parts, _ in PERMISSION_OPERATIONS}
    seen = {name: "refused" if status == 403 and code == "not_editable" else "allowed" for name, (status, code) in outcomes.items()}
    assert seen == expected, outcomes
    assert all(status != 403 or code == "not_editable" for status, code in outcomes.values()), outcomes
    assert all(status < 500 for status, _ in outcomes.values()), outcomes
    assert client.training_jobs() == [] and client.evaluations() == [] and client.datasets() == []


def test_a_key_past_its_rate_limit_gets_429_problem_json_with_retry_after(stack, new_run):  # noqa: ANN001
    from concurrent.futures import ThreadPoolExecutor

    run, _client = new_run("hammer")
    headers = {"Authorization": f"Bearer {run['api_key']}"}
    with httpx.Client(base_url=stack.gateway_url, headers=headers, timeout=30) as http, ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(lambda _i: http.get("/v1/datasets"), range(120)))
        codes = {r.status_code for r in answers}
        assert codes == {200, 429}, codes
        refused = next(r for r in answers if r.status_code == 429)
        assert refused.headers["content-type"].startswith("application/problem+json")
        assert refused.json()["code"] == "rate_limited" and 1 <= int(refused.headers["Retry-After"]) <= 60
        time.sleep(int(refused.headers["Retry-After"]))
        assert http.get("/v1/datasets").status_code == 200
    _other_run, other = new_run("bystander")
    assert other.datasets() == []  # another key is not slowed by this one


@pytest.mark.planes("sqlite", "postgres")  # the audit log is append-only by each database's own triggers: both data planes
def test_operator_actions_and_refused_keys_are_in_the_append_only_audit_log(stack, admin, benchmark):  # noqa: ANN001
    from sqlalchemy import create_engine, text

    before = admin._call("GET", "/admin/audit")["data"]
    start = before[-1]["seq"] if before else 0
    run = admin.create_run(benchmark["name"], "audited")
    assert httpx.get(f"{stack.gateway_url}/v1/budget", headers={"Authorization": f"Bearer {run['api_key']}"}).status_code == 200
    admin.revoke(run["id"])
    assert httpx.get(f"{stack.gateway_url}/v1/run", headers={"Authorization": f"Bearer {run['api_key']}"}).status_code == 401
    assert httpx.get(f"{stack.gateway_url}/admin/runs", headers={"Authorization": "Bearer not-the-admin-key"}).status_code == 401
    events = admin._call("GET", "/admin/audit", params={"after": start})["data"]
    seen = [(e["actor"], e["method"], e["path"], e["status"]) for e in events]
    assert ("admin", "POST", "/admin/runs", 201) in seen
    assert ("admin", "POST", f"/admin/runs/{run['id']}/revoke", 200) in seen
    assert ("anonymous", "GET", "/v1/run", 401) in seen and ("anonymous", "GET", "/admin/runs", 401) in seen
    refused = next(e for e in events if e["path"] == "/v1/run")
    assert refused["key_prefix"] == run["api_key"][:8] and run["api_key"] not in json.dumps(events)

    url = stack.database_urls.get("gateway") or f"sqlite:///{stack.data_dir / 'gateway.sqlite'}"
    engine = create_engine(url)
    try:
        for statement in ("UPDATE audit_log SET status = 200", "DELETE FROM episode_log"):
            with pytest.raises(Exception, match="append-only"), engine.begin() as conn:
                conn.execute(text(statement))
    finally:
        engine.dispose()


def test_internal_services_accept_only_the_callers_they_trust(stack, new_run):  # noqa: ANN001
    from crucible.stack import service_token
    from services.common.auth import RunContext, run_headers

    run, _client = new_run("token-prober")
    port = {"ledger": 1, "trainer": 2, "inference": 3, "grader": 4}

    def get(service: str, path: str, token: str, **headers: str) -> int:
        url = f"http://127.0.0.1:{stack.port_base + port[service]}{path}"
        return httpx.get(url, headers={"Authorization": f"Bearer {token}", **headers}, timeout=30).status_code

    tokens = {s: service_token(stack.data_dir, s) for s in ("gateway", "ledger", "trainer", "inference", "grader")}
    assert {s: get("ledger", "/internal/prices", tokens[s]) for s in tokens} == {
        "gateway": 200, "trainer": 200, "inference": 200, "grader": 200, "ledger": 401}
    assert {s: get("grader", "/internal/leaderboard", tokens[s]) for s in tokens} == {
        "gateway": 200, "trainer": 401, "inference": 401, "grader": 401, "ledger": 401}
    assert get("inference", "/internal/models", tokens["grader"]) == 200 and get("inference", "/internal/models", tokens["trainer"]) == 401
    assert get("trainer", "/internal/datasets", run["api_key"]) == 401  # a run key is no service token

    ctx = RunContext(run_id=run["id"], task_id=run["benchmark_id"])
    assert get("trainer", "/internal/datasets", tokens["gateway"], **run_headers(ctx, tokens["gateway"])) == 200
    pool = f"http://127.0.0.1:{stack.port_base + 4}/internal/training-pool/prompts"  # GRPO's environment: the trainer's alone
    assert {s: httpx.post(pool, json={}, headers={"Authorization": f"Bearer {tokens[s]}", **run_headers(ctx, tokens[s])}, timeout=60).status_code
            for s in ("gateway", "trainer")} == {"gateway": 401, "trainer": 200}
    forged = run_headers(ctx, tokens["inference"])  # signed by another service than the one calling
    assert get("trainer", "/internal/datasets", tokens["gateway"], **forged) == 401


def test_internal_api_docs_and_metrics_answer_only_service_tokens(stack, new_run):  # noqa: ANN001
    """An internal service's OpenAPI document, Swagger page and metrics are not served to whoever reaches its port;
    the gateway's metrics (request counts per route, of every run) only to its operators."""
    from crucible.stack import service_token

    run, _client = new_run("docs-prober")
    gateway_token = service_token(stack.data_dir, "gateway")
    for offset, service in ((1, "ledger"), (2, "trainer"), (3, "inference"), (4, "grader")):
        base = f"http://127.0.0.1:{stack.port_base + offset}"
        for path in ("/openapi.json", "/docs", "/redoc", "/metrics"):
            for headers in ({}, {"Authorization": f"Bearer {run['api_key']}"}):
                r = httpx.get(base + path, headers=headers, timeout=30)
                assert r.status_code in (401, 404) and r.headers["content-type"].startswith("application/problem+json"), (service, path, r.status_code)
        spec = httpx.get(base + "/openapi.json", headers={"Authorization": f"Bearer {gateway_token}"}, timeout=30)
        assert spec.status_code == 200 and any(p.startswith("/internal/") for p in spec.json()["paths"]), service
        assert httpx.get(base + "/docs", headers={"Authorization": f"Bearer {gateway_token}"}, timeout=30).text.count("swagger-ui") > 0
        assert "crucible_http_requests_total" in httpx.get(base + "/metrics", headers={"Authorization": f"Bearer {gateway_token}"}, timeout=30).text
    assert httpx.get(f"{stack.gateway_url}/openapi.json", timeout=30).status_code == 200  # the agent-facing API stays documented
    from crucible.stack import admin_key

    assert httpx.get(f"{stack.gateway_url}/metrics", headers={"Authorization": f"Bearer {run['api_key']}"}, timeout=30).status_code == 401
    assert httpx.get(f"{stack.gateway_url}/metrics", headers={"Authorization": f"Bearer {admin_key(stack.data_dir)}"}, timeout=30).status_code == 200
