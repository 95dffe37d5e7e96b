"""Evaluators of the evaluator track (grader/evaluators.py): an evaluator archive run on a candidate in a real sandbox,
through the rollout model endpoint serving the candidate under its opaque name within the benchmark's budget; what it
printed read back; the grade of a frozen evaluator against sealed targets.

Inference is a stand-in that plays the candidates: a system whose system prompt says ``good`` answers 42, any other 7.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from inference_service.client import InferenceClient
from pydantic import ValidationError

from grader import repository, worker
from grader.app import create_app
from grader.evaluations import create_evaluation
from grader.evaluators import grade, parse_output, run_evaluator
from grader.grading_tasks import development_scores, register_task, target_scores, task_status, train_sample, validation_items
from grader.harness_archives import inspect_archive, store_archive
from grader.model_endpoint import ModelEndpoint
from grader.models import Evaluation
from grader.rewards import pool_prompts, score_completions
from grader.rollouts import RolloutLimits
from grader.sandboxes import get_sandbox
from grader.schemas import SubmissionGrading
from grader.service import Grader
from grader.settings import GraderSettings
from grader.submissions import create_submission
from services.common.auth import RunContext
from services.common.contracts import (
    CandidateEvaluation,
    EvaluationCreate,
    EvaluatorBudget,
    GradingSpec,
    Harness,
    PoolPromptsRequest,
    RewardRequest,
    SystemSpec,
)
from services.common.errors import NotFound, Unprocessable
from services.ledger.app import create_app as create_ledger_app
from services.ledger.client import LedgerClient
from services.ledger.schemas import AccountCreate, HoldStatus
from services.ledger.settings import LedgerSettings
from tests.archives import archive
from tests.unit.grader.test_routes import GATEWAY_TOKEN, GRADER_TOKEN, stand_in
from tests.unit.inprocess import in_process

SEEN: list[dict[str, Any]] = []  # every request inference was sent


def candidate_model(request: httpx.Request) -> httpx.Response:
    """A good system (its system prompt says so) answers sums right (42 to anything else), any other system 7; a prompt
    counts a token per word of its messages, and a completion reports it unless billed for another count."""
    body = json.loads(request.content)
    if request.url.path.endswith("/prompt-tokens"):
        counts = [sum(len(m["content"].split()) for m in r["messages"]) for r in body["requests"]]
        return httpx.Response(200, json={"prompt_tokens": counts, "context_tokens": [2048] * len(counts)})
    billed = request.headers.get("X-Crucible-Billed-Prompt-Tokens")
    prompt = int(billed) if billed is not None else sum(len(m["content"].split()) for m in body["messages"])
    SEEN.append(body)
    good = any(m["role"] == "system" and "good" in m["content"] for m in body["messages"])
    truncated = body.get("max_tokens", 64) < 4
    sum_ = re.search(r"problem: ([\d +-]+)=", body["messages"][-1]["content"])
    content = ("42" if sum_ is None else str(eval(sum_.group(1)))) if good else "7"  # noqa: S307 - digits, spaces, + and - only
    return httpx.Response(200, json={"id": "chatcmpl-test", "object": "chat.completion", "created": 0, "model": body["model"],
                                     "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                                                  "finish_reason": "length" if truncated else "stop"}],
                                     "usage": {"prompt_tokens": prompt, "completion_tokens": 5, "total_tokens": prompt + 5}})


# Asks "40 + 2" `items` times, prints an item line per answer and the final score; it tells what it was shown on stderr.
EVALUATOR = r"""
import json, os, sys, urllib.request
candidate = json.loads(sys.stdin.read())["candidate"]
base, key, model = os.environ["OPENAI_BASE_URL"], os.environ["OPENAI_API_KEY"], os.environ["OPENAI_MODEL"]
def call(path, body=None):
    req = urllib.request.Request(base + path, data=None if body is None else json.dumps(body).encode(),
                                 headers={"Authorization": "Bearer " + key, "Content-Type": "application/json"})
    return json.load(urllib.request.urlopen(req, timeout=30))
print(json.dumps({"candidate": candidate, "model": model, "models": call("/models")}), file=sys.stderr)
scores = []
for i in range(int(os.environ.get("ITEMS", "5"))):
    out = call("/chat/completions", {"model": candidate, "messages": [{"role": "user", "content": "40 + 2 ="}], "max_tokens": MAX})
    print(json.dumps({"answered_as": out["model"]}), file=sys.stderr)
    scores.append(float("42" in out["choices"][0]["message"]["content"]))
    print(json.dumps({"item": f"q{i}", "score": scores[-1], "domain": "sums"}))
print(json.dumps({"score": sum(scores) / len(scores), "domains": {"sums": sum(scores) / len(scores)}}))
"""

GOOD = SystemSpec(model="smollm2-135m-instruct", harness=Harness(system_prompt="You are good."))
BAD = SystemSpec(model="smollm2-135m-instruct", harness=Harness(system_prompt="You are careless."))


def evaluator(items: int = 5, max_tokens: int = 16) -> bytes:
    return archive({"eval.py": EVALUATOR.replace("MAX", str(max_tokens))},
                   f'name = "evaluator"\nentry = "ITEMS={items} python3 /harness/eval.py"\n')


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Grader]:
    tmp = tmp_path_factory.mktemp("evaluators")
    settings = GraderSettings(data_dir=tmp, grader_test_seed=99, service_token=GRADER_TOKEN, trusted_tokens={"gateway": GATEWAY_TOKEN})
    ledger_app = create_ledger_app(LedgerSettings(data_dir=tmp / "ledger", service_token="ledger-token", trusted_tokens={"grader": GRADER_TOKEN}))
    with TestClient(ledger_app, base_url="http://ledger") as ledger_http, TestClient(create_app(settings), base_url="http://grader") as http:
        grader: Grader = http.app.state.grader  # type: ignore[attr-defined]
        grader.close()
        grader.ledger = LedgerClient(in_process(ledger_http, GRADER_TOKEN, "ledger"))  # a pilot is metered: the real ledger in process
        grader.inference = InferenceClient(stand_in("inference", candidate_model))
        grader.enqueue = QUEUE.append
        grader.enqueue_build = None  # no queue: a task's splits are built in the registering call
        yield grader


QUEUE: list[str] = []


@pytest.fixture(scope="module")
def endpoint(service: Grader) -> ModelEndpoint:
    return worker.model_endpoint(service)


def run(endpoint: ModelEndpoint, data: bytes, system: SystemSpec, budget: EvaluatorBudget | None = None) -> tuple[CandidateEvaluation, Any]:
    return run_evaluator(get_sandbox("bwrap"), endpoint, archive=data, archive_id="har_test", manifest=inspect_archive(data), candidate="candidate-04",
                         system=system, budget=budget or EvaluatorBudget(calls=20, tokens=10_000, max_tokens=16, wall_s=30),
                         caps=RolloutLimits(wall_s=60), ctx=None, hold_id=None, key="eval_test:candidate-04:0")


def test_an_evaluator_scores_a_candidate_it_reaches_only_by_its_opaque_name(endpoint: ModelEndpoint) -> None:
    SEEN.clear()
    good, outcome = run(endpoint, evaluator(), GOOD)
    assert (good.score, good.domains, good.items, good.partial, good.exhausted, good.failure) == (1.0, {"sums": 1.0}, 5, False, [], None)
    assert (good.model_calls, good.prompt_tokens, good.completion_tokens) == (5, 20, 25)  # its own 4 words a call, not the hidden prompt's
    shown = outcome.trajectory.harness_run.stderr
    assert "smollm2" not in shown and "smollm2" not in json.dumps(outcome.trajectory.model_dump())  # never the model behind it
    assert '"model": "candidate-04"' in shown and '"answered_as": "candidate-04"' in shown
    assert all(body["model"] == "smollm2-135m-instruct" and body["messages"][0] == {"role": "system", "content": "You are good."} for body in SEEN)
    bad, _ = run(endpoint, evaluator(), BAD)
    assert bad.score == 0.0
    wordy = SystemSpec(model=GOOD.model, harness=Harness(system_prompt="You are good. " + "Think it through, step by step. " * 20))
    assert run(endpoint, evaluator(), wordy)[0].prompt_tokens == good.prompt_tokens  # a longer hidden prompt is not counted either


def test_an_evaluator_that_runs_out_of_calls_is_graded_on_what_it_finished_and_flagged(endpoint: ModelEndpoint) -> None:
    result, _ = run(endpoint, evaluator(items=8), GOOD, EvaluatorBudget(calls=3, tokens=10_000, max_tokens=16, wall_s=30))
    assert (result.score, result.items, result.partial, result.exhausted, result.failure) == (1.0, 3, True, ["calls"], None)
    result, _ = run(endpoint, evaluator(items=8), GOOD, EvaluatorBudget(calls=20, tokens=20, max_tokens=16, wall_s=30))
    assert (result.items, result.partial, result.exhausted) == (3, True, ["tokens"])  # 9 tokens a call: the 4th finds 27 spent


def test_answers_cut_at_the_token_limit_are_counted(endpoint: ModelEndpoint) -> None:
    result, _ = run(endpoint, evaluator(items=2, max_tokens=2), GOOD)
    assert result.truncated_calls == 2


def test_an_evaluator_that_prints_no_score_gives_the_candidate_none() -> None:
    assert parse_output("thinking...\n{\"note\": 1}\n").score is None
    out = parse_output('{"item": "a", "score": 1.5}\n{"item": "b", "score": 0.5, "weight": -1}\n{"score": "high"}\n')
    assert (out.score, out.items) == (None, []) and "not a number in [0, 1]" in out.error
    out = parse_output('{"item": "a", "score": 1, "weight": 3}\n{"item": "b", "score": 0}\nlog line\n{"score": 0.75, "domains": {"x": 0.5, "y": 2}}\n')
    assert (out.score, out.domains, out.items) == (0.75, {"x": 0.5}, [(1.0, 3.0, None), (0.0, 1.0, None)])


SEALED = {"candidate-01": 0.8, "candidate-02": 0.6, "candidate-03": 0.4, "candidate-04": 0.2, "candidate-05": 0.1, "candidate-06": 0.0}
TARGETS = {"dev": {c: v * 0.9 for c, v in SEALED.items()}, "sealed-a": SEALED, "sealed-b": {**SEALED, "candidate-05": 0.0, "candidate-06": 0.1}}


def results(scores: dict[str, float | None]) -> dict[str, CandidateEvaluation]:
    return {c: CandidateEvaluation(candidate=c, score=s, model_calls=4, prompt_tokens=100, completion_tokens=10) for c, s in scores.items()}


def test_an_evaluator_that_reproduces_a_sealed_target_scores_agreement_one_on_it() -> None:
    got = grade(results(dict(SEALED)), TARGETS, ["sealed-a", "sealed-b"])
    by_target = {t.target: t for t in got.targets}
    assert by_target["sealed-a"].pairwise_agreement == 1.0 and by_target["sealed-a"].concordance == pytest.approx(1.0)
    assert by_target["sealed-b"].pairwise_agreement == pytest.approx(14 / 15)  # the one pair the two targets order differently
    assert by_target["sealed-a"].ceiling == pytest.approx((1 + 14 / 15) / 2)  # dev agrees fully, sealed-b on 14 of 15 pairs
    assert got.pairwise_agreement == pytest.approx((1 + 14 / 15) / 2)
    assert (got.candidates, got.model_calls, got.prompt_tokens, got.failed) == (6, 24, 600, 0)


def test_an_evaluator_that_scores_at_random_scores_near_one_half_over_many_seeds() -> None:
    values = []
    for seed in range(300):
        rng = random.Random(seed)
        values.append(grade(results({c: rng.random() for c in SEALED}), TARGETS, ["sealed-a", "sealed-b"]).pairwise_agreement)
    assert 0.46 < sum(values) / len(values) < 0.54


def test_a_candidate_without_a_score_ranks_lowest_and_is_counted() -> None:
    got = grade(results({**SEALED, "candidate-01": None}), TARGETS, ["sealed-a"])
    assert got.failed == 1 and got.targets[0].pairwise_agreement == pytest.approx(10 / 15)  # candidate-01 now below all 5 others


# --------------------------------------------------------------------------- targets


TWO = {"candidate-01": BAD, "candidate-02": GOOD}


def target(task_id: str, visibility: str, candidates: dict[str, SystemSpec] = TWO) -> GradingSpec:
    return GradingSpec(task_id=task_id, task=task_id, target=visibility, candidates=candidates, initial_system=BAD,
                       suite={"name": "reasoning_gym", "params": {"task": "chain_sum", "min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 2},
                              "splits": {"train": {"seed": 1, "size": 10}, "validation": {"seed": 2, "size": 6}, "test": {"size": 5}}},
                       evaluation={"max_tokens": 8})


@pytest.mark.parametrize(("visibility", "split", "items"), [("development", "validation", 6), ("sealed", "test", 5)])
def test_a_target_grades_each_candidate_on_its_split_and_not_an_initial_system(service: Grader, visibility: str, split: str, items: int) -> None:
    QUEUE.clear()
    status = register_task(service, target(f"bm_{visibility}", visibility))
    assert (status.initial_status, status.reference_status) == ("queued", None)  # the candidates' gradings
    assert target_scores(service, f"bm_{visibility}") == {"candidate-01": None, "candidate-02": None}
    with service.db.session() as s:
        queued = [s.get(Evaluation, eval_id) for eval_id in QUEUE]
        assert sorted((ev.candidate, ev.split, ev.items_total, ev.run_id, ev.hold_id) for ev in queued) == [
            ("candidate-01", split, items, None, None), ("candidate-02", split, items, None, None)]
    for eval_id in list(QUEUE):
        worker.run_evaluation(service, eval_id)
    scores = target_scores(service, f"bm_{visibility}")
    assert (scores["candidate-01"].value, scores["candidate-02"].value, scores["candidate-02"].n) == (0.0, 1.0, items)
    assert task_status(service, f"bm_{visibility}").initial_status == "succeeded"


# --------------------------------------------------------------------------- an evaluator's final submission


def evaluator_task(task_id: str, targets: dict[str, tuple[str, bool]], candidates: dict[str, SystemSpec] = TWO) -> GradingSpec:
    n = len(candidates)
    return GradingSpec(task_id=task_id, task="evaluator", candidates=candidates, initial_system=BAD,
                       suite={"name": "evaluator", "params": {"candidates": sorted(candidates)},
                              "splits": {"train": {"size": n}, "validation": {"size": n}, "test": {"size": n}}},
                       evaluation={"max_tokens": 16}, evaluator={"targets": [{"name": n, "task_id": t, "sealed": sealed} for n, (t, sealed) in targets.items()],
                                                                 "budget": {"calls": 10, "tokens": 10_000, "max_tokens": 16, "wall_s": 30}})


def graded_targets(service: Grader, prefix: str, run: bool = True, candidates: dict[str, SystemSpec] = TWO) -> dict[str, tuple[str, bool]]:
    QUEUE.clear()
    register_task(service, target(f"{prefix}_dev", "development", candidates))
    register_task(service, target(f"{prefix}_sealed", "sealed", candidates))
    for eval_id in list(QUEUE) if run else []:
        worker.run_evaluation(service, eval_id)
    return {"dev": (f"{prefix}_dev", False), "hidden": (f"{prefix}_sealed", True)}


def submit(service: Grader, task_id: str, data: bytes, **req: Any) -> Any:
    ctx = RunContext(run_id="run_evaluator", task_id=task_id)
    archive_id = store_archive(service, ctx.run_id, data).id
    return create_submission(service, ctx, SubmissionGrading(harness_archive=archive_id, **req), max_submissions=5)


def test_a_frozen_evaluator_is_run_on_every_candidate_and_graded_against_the_sealed_targets(service: Grader) -> None:
    status = register_task(service, evaluator_task("bm_evaluator", graded_targets(service, "bm_final")))
    assert (status.validation_items, status.test_items, status.initial_status) == (2, 2, None)
    sub = submit(service, "bm_evaluator", evaluator())
    worker.run_evaluation(service, QUEUE[-1])
    with service.db.session() as s:
        ev = s.get(Evaluation, QUEUE[-1])
        assert (ev.status, ev.model, ev.score["value"], ev.score["metric"], ev.score["n"]) == ("succeeded", "evaluator", 1.0, "pairwise_agreement", 2)
        grade_ = ev.grade
    assert [t["target"] for t in grade_["targets"]] == ["hidden"] and grade_["targets"][0]["ceiling"] == 1.0  # the dev target agrees
    assert (grade_["candidates"], grade_["model_calls"], grade_["failed"], sub.model) == (2, 10, 0, "evaluator")
    answers = service.store.answers(QUEUE[-1])
    assert json.loads(answers[("candidate-02", 0)])["score"] == 1.0 and "smollm2" not in json.dumps(list(answers.values()))


def test_an_evaluator_takes_an_archive_and_no_model_and_a_target_takes_nothing(service: Grader) -> None:
    targets = graded_targets(service, "bm_fields")
    register_task(service, evaluator_task("bm_evaluator_fields", targets))
    ctx = RunContext(run_id="run_evaluator", task_id="bm_evaluator_fields")
    for req, field in (({"model": "smollm2-135m-instruct"}, "model"), ({}, "harness_archive")):
        with pytest.raises(Unprocessable) as exc:
            create_submission(service, ctx, SubmissionGrading(**req), max_submissions=5)
        assert exc.value.extra["field"] == field
    for task_id, _ in targets.values():  # a system graded on a sealed target would tell the run what it may not know
        with pytest.raises(Unprocessable) as exc:
            create_submission(service, RunContext(run_id="run_evaluator", task_id=task_id), SubmissionGrading(model="smollm2-135m-instruct"),
                              max_submissions=5)
        assert exc.value.extra["field"] == "task"


def test_an_evaluator_finished_before_its_targets_is_graded_once_they_are(service: Grader) -> None:
    targets = graded_targets(service, "bm_later", run=False)
    target_evals = list(QUEUE)
    register_task(service, evaluator_task("bm_evaluator_later", targets))
    submit(service, "bm_evaluator_later", evaluator(items=2))
    eval_id = QUEUE[-1]
    worker.run_evaluation(service, eval_id)
    with service.db.session() as s:
        assert s.get(Evaluation, eval_id).status == "queued"  # its candidates' runs are kept; only the grade waits
    for target_eval in target_evals:
        worker.run_evaluation(service, target_eval)
    worker.run_evaluation(service, eval_id)
    with service.db.session() as s:
        ev = s.get(Evaluation, eval_id)
        assert (ev.status, ev.score["value"], ev.grade["model_calls"]) == ("succeeded", 1.0, 4)  # each candidate's run once


def test_a_run_reads_a_development_targets_candidate_scores_and_never_a_sealed_ones(service: Grader) -> None:
    targets = graded_targets(service, "bm_visible")
    register_task(service, evaluator_task("bm_evaluator_visible", targets))
    dev = development_scores(service, RunContext(run_id="run_evaluator", task_id=targets["dev"][0]))
    assert [(c.candidate, c.score.value) for c in dev] == [("candidate-01", 0.0), ("candidate-02", 1.0)]  # type: ignore[union-attr]
    for task_id in (targets["hidden"][0], "bm_evaluator_visible"):
        with pytest.raises(NotFound, match="not a development target"):
            development_scores(service, RunContext(run_id="run_evaluator", task_id=task_id))
    # a sealed target's items are as hidden as its scores: a run that read them could rebuild it and rank the candidates
    dev, sealed = (RunContext(run_id="run_evaluator", task_id=targets[t][0]) for t in ("dev", "hidden"))
    assert len(validation_items(service, dev)) == 6 and len(train_sample(service, dev, 0, 100)) == 10
    for read in (lambda: validation_items(service, sealed), lambda: train_sample(service, sealed, 0, 100),
                 lambda: pool_prompts(service, sealed, PoolPromptsRequest()),
                 lambda: score_completions(service, sealed, RewardRequest(completions=[{"item_id": "train-00000", "completion": "7"}]))):
        with pytest.raises(NotFound, match="sealed target"):
            read()


# --------------------------------------------------------------------------- a pilot


THREE = TWO | {"candidate-03": SystemSpec(model="smollm2-135m-instruct", harness=Harness(system_prompt="You are good at sums."))}


def test_a_pilot_on_chosen_candidates_runs_on_them_alone_is_metered_and_graded_on_their_pairs(service: Grader) -> None:
    register_task(service, evaluator_task("bm_evaluator_pilot", graded_targets(service, "bm_pilot", candidates=THREE), THREE))
    ctx = RunContext(run_id="run_pilot", task_id="bm_evaluator_pilot")
    service.ledger.open_account(AccountCreate(account_id=ctx.run_id, budget_usd_micros=1_000_000))
    archive_id = store_archive(service, ctx.run_id, evaluator(items=2)).id
    ev = create_evaluation(service, ctx, EvaluationCreate(harness_archive=archive_id, candidates=["candidate-03", "candidate-01"]))
    assert ev.items_total == 2
    worker.run_evaluation(service, QUEUE[-1])
    with service.db.session() as s:
        row = s.get(Evaluation, ev.id)
        assert (row.status, row.score["value"], row.grade["candidates"], row.grade["model_calls"]) == ("succeeded", 1.0, 2, 4)
        assert [t["target"] for t in row.grade["targets"]] == ["dev"]  # a pilot sees the development target alone
        assert sorted(t.item_id for t in repository.trajectories(s, ev.id)) == ["candidate-01", "candidate-03"]
    spent = service.ledger.get_balance(ctx.run_id).spent_usd_micros
    assert spent > 0 and not service.ledger.list_holds(ctx.run_id, status=HoldStatus.open)

    for req, message in (({"candidates": ["candidate-01", "candidate-09"]}, "candidate-09 is not a candidate"),
                         ({"candidates": ["candidate-01", "candidate-02"], "limit": 2}, "not both")):
        with pytest.raises(Unprocessable, match=message) as exc:
            create_evaluation(service, ctx, EvaluationCreate(harness_archive=archive_id, **req))
        assert exc.value.extra["field"] == "candidates"
    for bad in (["candidate-01"], ["candidate-01", "candidate-01"], ["gpt-4o", "candidate-01"]):
        with pytest.raises(ValidationError):
            EvaluationCreate(harness_archive=archive_id, candidates=bad)
    assert service.ledger.get_balance(ctx.run_id).spent_usd_micros == spent  # nothing refused was charged
