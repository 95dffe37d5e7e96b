"""GRPO's environment on the grader's routes in this process (the ``served`` app of ``test_routes``: a chain-sum task of
reasoning-gym, the real ledger app): the training pool's prompts as a harness renders them, and the suite's rewards of
completions of training-pool items, for the trainer alone. Validation and test items are never rendered or scored; rewards
are not charged."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from grader.client import GraderClient
from grader.suites import get_suite
from services.common.auth import RunContext, run_headers, trusted_callers
from services.common.contracts import GradingSpec, Harness, PoolCompletion, PoolPromptsRequest, RewardRequest
from services.common.errors import UpstreamProblem
from tests.unit.grader import test_routes
from tests.unit.grader.test_routes import GATEWAY_TOKEN, Served, problem
from tests.unit.inprocess import in_process

served = test_routes.served  # the route tests' app, one of its own for this module

TRAINER_TOKEN = "trainer-token-for-grader-tests"


@pytest.fixture(scope="module")
def trainer(served: Served) -> GraderClient:
    """The trainer's client of this module's grader, which trusts the trainer's token as a deployment configures it."""
    served.service.settings.trusted_tokens["trainer"] = TRAINER_TOKEN
    return GraderClient(in_process(TestClient(served.http.app, base_url="http://grader"), TRAINER_TOKEN, "grader"))  # the app, entered once


def as_trainer(ctx: RunContext) -> dict[str, str]:
    return run_headers(ctx, TRAINER_TOKEN) | {"Authorization": f"Bearer {TRAINER_TOKEN}"}


TAGGED = Harness(system_prompt="Think, then end with 'Answer: <number>'.", user_template="Q: {{ question }}", answer_extraction="regex",
                 answer_regex=r"Answer:\s*(-?\d+)")


def rewards(trainer: GraderClient, ctx: RunContext, completions: list[tuple[str, str]], harness: Harness | None = None) -> list[Any]:
    """The rewards route's answer for ``(item_id, completion)`` pairs, through the trainer's client."""
    body = RewardRequest(harness=harness, completions=[PoolCompletion(item_id=i, completion=c) for i, c in completions])
    return trainer.pool_rewards(ctx, body).data


def test_a_completion_of_a_training_pool_item_is_rewarded_by_the_suites_scorer_in_order(served: Served, trainer: GraderClient) -> None:
    ctx = served.ctx("run_grpo_rewards")
    first, second = served.grader.train_sample(ctx, limit=2).data
    got = rewards(trainer, ctx, [(first.id, f"{first.answer}\nbecause"), (second.id, "99999"), (first.id, "no number here"), (second.id, second.answer)])
    assert [(r.item_id, r.reward, r.answer, r.reason) for r in got] == [
        (first.id, 1.0, first.answer, None), (second.id, 0.0, "99999", None), (first.id, 0.0, "no number here", None), (second.id, 1.0, second.answer, None)]

    tagged = rewards(trainer, ctx, [(first.id, f"{first.answer} is tempting.\nAnswer: {first.answer}"), (second.id, "I cannot tell.")], TAGGED)
    assert [(r.reward, r.answer) for r in tagged] == [(1.0, first.answer), (0.0, None)]


def test_rewards_are_not_charged_to_the_run(served: Served, trainer: GraderClient) -> None:
    ctx = served.ctx("run_grpo_free")
    [item] = served.grader.train_sample(ctx, limit=1).data
    rewards(trainer, ctx, [(item.id, item.answer)] * 8)
    balance = served.ledger.get_balance(ctx.run_id)
    assert (balance.spent_usd_micros, balance.held_usd_micros, served.ledger.list_holds(ctx.run_id)) == (0, 0, [])


def test_an_id_outside_the_training_pool_gets_the_same_422_whether_unknown_validation_or_test(served: Served, trainer: GraderClient) -> None:
    ctx = RunContext(run_id="run_grpo_ids", task_id=served.task_id)
    [pool_item] = served.grader.train_sample(ctx, limit=1).data
    validation_id = served.grader.validation(ctx).data[0].id
    test_id = served.service.store.items(served.task_id)[0].id
    answers = []
    for outside in ("train-99999", validation_id, test_id):
        body = {"completions": [{"item_id": outside, "completion": "0"}, {"item_id": pool_item.id, "completion": pool_item.answer}]}
        answers.append(problem(served.http.post("/internal/training-pool/rewards", json=body, headers=as_trainer(ctx)), 422))
    assert answers[0]["field"] == "completions[0].item_id" and answers[0]["code"] == "invalid_input"
    assert answers[1] == answers[0] and answers[2] == answers[0]
    with pytest.raises(UpstreamProblem) as refused:
        rewards(trainer, ctx, [(pool_item.id, "1"), (validation_id, "1")])
    assert (refused.value.status, refused.value.problem["field"]) == (422, "completions[1].item_id")


def test_the_prompts_are_every_training_pool_item_rendered_by_the_harness(served: Served, trainer: GraderClient) -> None:
    ctx = RunContext(run_id="run_grpo_prompts", task_id=served.task_id)
    pool = served.grader.train_sample(ctx, limit=10_000).data
    given = trainer.pool_prompts(ctx, PoolPromptsRequest(harness=TAGGED)).data
    assert [p.item_id for p in given] == [it.id for it in pool] and len(pool) == 600
    assert all(p.messages == [{"role": "system", "content": TAGGED.system_prompt}, {"role": "user", "content": f"Q: {it.question}"}]
               for p, it in zip(given, pool, strict=True))

    default = get_suite("reasoning_gym").default_harness  # the initial system declares none: the suite's own
    initial = trainer.pool_prompts(ctx, PoolPromptsRequest()).data
    assert [p.item_id for p in initial] == [it.id for it in pool]
    assert initial[0].messages == [{"role": "system", "content": default.system_prompt}, {"role": "user", "content": pool[0].question}]


def test_a_harness_that_cannot_be_used_is_a_422_naming_its_field(served: Served, trainer: GraderClient) -> None:
    ctx = RunContext(run_id="run_grpo_bad_harness", task_id=served.task_id)
    headers = as_trainer(ctx)
    looping = {"harness": {"user_template": "{% for x in range(9) %}{{ question }}{% endfor %}"}}
    assert problem(served.http.post("/internal/training-pool/prompts", json=looping, headers=headers), 422)["field"] == "harness.user_template"
    no_regex = {"harness": {"answer_extraction": "regex"}, "completions": [{"item_id": "train-00000", "completion": "1"}]}
    assert problem(served.http.post("/internal/training-pool/rewards", json=no_regex, headers=headers), 422)["field"] == "harness.answer_regex"
    assert problem(served.http.post("/internal/training-pool/rewards", json={"completions": []}, headers=headers), 422)["field"] == "completions"


def test_a_suite_of_multi_turn_tasks_is_refused(served: Served, trainer: GraderClient) -> None:
    spec = GradingSpec(task_id="bm_grpo_terminal", suite={"name": "terminal", "params": {"tasks": ["count-log-errors", "dedupe-lines", "extract-emails"]},
                                                          "splits": {"validation": {"seed": 1, "size": 1}, "train": {"seed": 0, "size": 1}, "test": {"size": 1}}},
                       initial_system={"model": "smollm2-135m-instruct"}, reference_score=1.0, evaluation={"max_tokens": 64, "max_turns": 4})
    served.grader.register_task(spec)
    ctx = RunContext(run_id="run_grpo_terminal", task_id=spec.task_id)
    for call in (lambda: trainer.pool_prompts(ctx, PoolPromptsRequest()), lambda: rewards(trainer, ctx, [("count-log-errors", "done")])):
        with pytest.raises(UpstreamProblem) as refused:
            call()
        assert (refused.value.status, refused.value.problem["field"]) == (422, "suite") and "multi-turn" in refused.value.problem["detail"]


def test_the_training_pool_routes_answer_the_trainer_alone_and_the_trainer_nothing_else(served: Served, trainer: GraderClient) -> None:
    """The trainer is trusted for GRPO's environment only: the gateway's token, a run key or a missing run context gets
    a 401 on the training-pool routes, and the trainer's token a 401 on every other grader route."""
    assert trusted_callers("grader") == ("gateway", "trainer")
    ctx = RunContext(run_id="run_grpo_trainer", task_id=served.task_id)
    prompts = served.http.post("/internal/training-pool/prompts", json={}, headers=as_trainer(ctx))
    assert prompts.status_code == 200 and len(prompts.json()["data"]) == 600
    body = {"completions": [{"item_id": prompts.json()["data"][0]["item_id"], "completion": "0"}]}
    assert served.http.post("/internal/training-pool/rewards", json=body, headers=as_trainer(ctx)).status_code == 200
    for path in ("/internal/training-pool/prompts", "/internal/training-pool/rewards"):
        assert "gateway" in problem(served.http.post(path, json=body, headers=run_headers(ctx, GATEWAY_TOKEN)), 401)["detail"]
        assert problem(served.http.post(path, json=body, headers=as_trainer(ctx) | {"Authorization": "Bearer crk_a-run-key"}), 401)["code"] == "unauthorized"
        assert "run context" in problem(served.http.post(path, json=body, headers={"Authorization": f"Bearer {TRAINER_TOKEN}"}), 401)["detail"]
    for path in ("/internal/leaderboard", "/internal/suite/validation", "/internal/evaluations", f"/internal/tasks/{served.task_id}"):
        assert "trainer" in problem(served.http.get(path, headers=as_trainer(ctx)), 401)["detail"]
