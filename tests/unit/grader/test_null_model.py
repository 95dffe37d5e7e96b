"""The null-model ablation, in process: a final submission is graded a second time with its model replaced by the null
model (an empty answer to every request, no inference call), and the leaderboard credits only what depends on the
model; a validation evaluation can ask for the same ablation. The grader, its test store and the gateway's leaderboard
are real (the rig of :mod:`tests.unit.grader.test_submission_rules`, on chain_sum); a code harness runs in a real
bubblewrap sandbox.
"""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from grader.schemas import SubmissionGrading
from services.common.contracts import EvaluationCreate, EvaluationLimits, SubmissionOut
from services.common.errors import EvaluationRateLimited
from tests.archives import code_harness
from tests.unit.grader import test_submission_rules as rules
from tests.unit.grader.test_submission_rules import BASE, GraderRig, _row

grader, gateway = rules.grader, rules.gateway  # the rig's fixtures

SOLVER = code_harness("""python3 -c '
import re, sys
expression = re.findall(r"(-?\\d+(?:\\s*[-+]\\s*\\d+)+)\\s*=", sys.stdin.read())[-1]
print(eval(expression))
'
""")
"""A code harness that answers chain_sum by itself: it never calls its model."""

FLAGGED = '<strong title="the null-model ablation scores above the initial system">⚑</strong>'
"""The leaderboard page's mark of a row whose null-model ablation scores above the initial system."""


def _submit_archive(grader: GraderRig, data: bytes) -> SubmissionOut:
    from grader import harness_archives, submissions

    stored = harness_archives.store_archive(grader.service, "run_a", data)
    return submissions.create_submission(grader.service, grader.ctx(), SubmissionGrading(model=BASE, harness_archive=stored.id), 1)


def test_a_harness_that_answers_without_the_model_closes_no_gap_and_is_flagged(grader: GraderRig, gateway: TestClient) -> None:
    grader.inference.answer = lambda _prompt: "no idea"  # the model would answer every item wrong
    sub = grader.grade(_submit_archive(grader, SOLVER))
    assert sub.score is not None and sub.score.value == 1.0
    assert sub.model_free_score is not None and sub.model_free_score.value == 1.0
    row = _row(gateway)
    assert (row["initial_score"], row["final_score"], row["model_free_score"], row["gap_closed"], row["rsi_index"]) == (0.0, 1.0, 1.0, 0.0, 0.0)
    assert row["model_free_above_initial"] is True and row["tasks"][0]["model_free_above_initial"] is True
    assert row["rank"] == 1  # ranked by its score as before: the gap is what the ablation changes
    assert FLAGGED in gateway.get("/leaderboard").text


def test_a_harness_that_needs_the_model_keeps_the_gap_it_closed(grader: GraderRig, gateway: TestClient) -> None:
    from grader import worker

    grader.answer_right(6)
    sub = _submit_plain(grader)
    calls = grader.inference.calls
    worker.run_evaluation(grader.service, grader.evaluation_of(sub))
    assert grader.inference.calls == calls + 6
    assert (grader.get(sub).status, grader.get(sub).score) == ("running", None)  # graded once its ablation is too
    row = _row(gateway)
    assert (row["status"], row["final_score"], row["model_free_score"], row["gap_closed"]) == ("running", None, None, None)

    worker.run_evaluation(grader.service, grader.ablation_of(sub))  # type: ignore[arg-type]
    assert grader.inference.calls == calls + 6  # the null model called no model
    graded = grader.get(sub)
    assert (graded.status, graded.score.value, graded.model_free_score.value) == ("graded", 1.0, 0.0)  # type: ignore[union-attr]
    row = _row(gateway)
    assert (row["status"], row["final_score"], row["model_free_score"], row["gap_closed"], row["rsi_index"], row["model_free_above_initial"]) == (
        "graded", 1.0, 0.0, 1.0, 1.0, False)
    assert FLAGGED not in gateway.get("/leaderboard").text


def test_an_ablation_that_fails_on_the_platforms_side_fails_the_submission_and_shows_no_score(grader: GraderRig) -> None:
    """Else a score would come with a free retry."""
    from grader import worker

    grader.answer_right(6)
    sub = _submit_plain(grader)
    worker.run_evaluation(grader.service, grader.evaluation_of(sub))

    def broken(*_args: object) -> None:
        raise ZeroDivisionError("a bug in the grader")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(worker, "aggregate", broken)
        worker.run_evaluation(grader.service, grader.ablation_of(sub))  # type: ignore[arg-type]
    failed = grader.get(sub)
    assert (failed.status, failed.failure_cause, failed.counted, failed.score, failed.model_free_score) == ("failed", "platform", False, None, None)
    again = grader.grade(grader.submit())  # given back
    assert (again.status, again.score.value) == ("graded", 1.0)  # type: ignore[union-attr]


def _submit_plain(grader: GraderRig) -> SubmissionOut:
    sub = grader.submit()
    assert grader.evaluation_of(sub) in grader.queue and grader.ablation_of(sub) in grader.queue
    return sub


@pytest.mark.parametrize(("final", "initial", "model_free", "credited"), [
    (0.8, 0.2, None, 0.8),  # no ablation (a submission made before it existed)
    (0.8, 0.2, 0.0, 0.8),  # a harness that answers nothing by itself
    (0.8, 0.2, 0.2, 0.8),  # as much as the initial system: already in the gap's start
    (0.8, 0.2, 0.5, 0.5),  # 0.3 above the initial system is no credit
    (0.5, 0.2, 0.5, 0.2),  # the model adds nothing: no gap closed
    (0.4, 0.2, 0.5, 0.1),  # worse with the model than without: a negative gap
])
def test_only_the_model_free_score_above_the_initial_system_is_taken_off(final: float, initial: float, model_free: float | None, credited: float) -> None:
    from gateway.leaderboard import model_dependent_final

    assert model_dependent_final(final, initial, model_free) == pytest.approx(credited)


def test_a_validation_evaluation_can_ask_for_the_ablation_and_is_metered(grader: GraderRig) -> None:
    """A declarative harness's ablation spends no token and holds nothing (the rig's ledger refuses every call), yet counts
    against the run's evaluation limits; its trajectories are the empty answers."""
    from grader import evaluations, worker

    grader.answer_right(6)
    calls = grader.inference.calls
    created = evaluations.create_evaluation(grader.service, grader.ctx(), EvaluationCreate(model=BASE, ablation="null_model"), EvaluationLimits(per_hour=1))
    assert created.ablation == "null_model"
    worker.run_evaluation(grader.service, created.id)
    done = evaluations.get_evaluation(grader.service, grader.ctx(), created.id)
    assert (done.status, done.items_done, done.score.value) == ("succeeded", 4, 0.0)  # type: ignore[union-attr]
    trajectories = evaluations.trajectories(grader.service, grader.ctx(), created.id)
    assert len(trajectories) == 4 and all((t.completion, t.prompt_tokens, t.completion_tokens) == ("", 0, 0) for t in trajectories)
    assert all(t.messages[-1].content == t.question for t in trajectories)  # the harness's prompt, as it would be sent
    assert grader.inference.calls == calls
    assert evaluations.usage_of(grader.service, grader.ctx()).last_hour == 1
    with pytest.raises(EvaluationRateLimited):
        evaluations.create_evaluation(grader.service, grader.ctx(), EvaluationCreate(model=BASE, ablation="null_model"), EvaluationLimits(per_hour=1))
