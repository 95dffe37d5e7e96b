"""Final submissions: recording one under the task's limit, its wire form (whose fault a failed grading was, whether
it counts), and the leaderboard's choice of the submission that counts per run and task.

A submission is graded twice on the hidden test split, neither charged to the run: as submitted, and with its model
replaced by the null model (the null-model ablation, :mod:`grader.model_endpoint`), whose score is the submission's
``model_free_score``: what its harness scores without a model. The leaderboard counts only what depends on the model
(``gateway.leaderboard``). The evaluator track's own task has no ablation (its submission is an evaluator of systems,
not a system)."""

from __future__ import annotations

from sqlalchemy.orm import Session

from grader import repository
from grader.evaluations import evaluated_model
from grader.grading_tasks import harness_for
from grader.harness_archives import code_harness_for
from grader.model_endpoint import NULL_MODEL
from grader.models import AGENT, PLATFORM, Evaluation, Submission
from grader.schemas import ContaminationReport, LeaderboardEntry, SubmissionGrading
from grader.service import Grader
from grader.suites import get_suite
from services.common.auth import RunContext
from services.common.contracts import EvaluatorGrade, Harness, Score, SubmissionOut
from services.common.db import serialize
from services.common.errors import SubmissionLimitReached
from services.common.harness import check_harness

FREE_PLATFORM_FAILURES = 3  # per run and task: platform-failed gradings given back; later ones count (no free oracle)


def submission_out(s: Session, sub: Submission) -> SubmissionOut:
    """The wire form of ``sub``. A failure says whose fault it was. Its text is never a function of the test split:
    an agent failure shows what inference refused (:func:`public_refusal`), a platform failure only that the
    submission was given back; both stay whole in the grader's records."""
    ev = repository.evaluation(s, sub.evaluation_id)
    status = {"queued": "queued", "running": "running", "succeeded": "graded"}.get(ev.status, "failed")
    cause = ev.failure_cause if status == "failed" else None
    counted = cause != PLATFORM or repository.count_platform_failed_submissions(s, sub.run_id, sub.task_id, up_to=sub.id) > FREE_PLATFORM_FAILURES
    if cause == AGENT:
        error = public_refusal(ev.error or "")
    elif cause == PLATFORM:
        error = "grading failed on the platform's side; " + ("this submission does not count against the task's final submissions" if not counted else
                                                             f"it counts: the task had more than {FREE_PLATFORM_FAILURES} such failures")
    else:
        error = None
    return SubmissionOut(id=sub.id, status=status, task=repository.spec(s, sub.task_id).task, model=sub.model,  # type: ignore[arg-type]
                         harness=None if sub.harness_archive else Harness(**sub.harness),
                         harness_archive=sub.harness_archive,
                         score=Score(**ev.score) if ev.score else None, model_free_score=model_free_score(s, sub),
                         error=error, failure_cause=cause, counted=counted,  # type: ignore[arg-type]
                         created_at=sub.created_at, graded_at=ev.finished_at if status == "graded" else None)


def ablation_of(s: Session, sub: Submission) -> Evaluation | None:
    """The null-model ablation grading ``sub`` (``None`` for a submission without one)."""
    return repository.evaluation(s, sub.ablation_evaluation_id) if sub.ablation_evaluation_id else None


def model_free_score(s: Session, sub: Submission) -> Score | None:
    """The score of ``sub``'s null-model ablation once it is graded; ``None`` before, and where it has none."""
    ablation = ablation_of(s, sub)
    return Score(**ablation.score) if ablation is not None and ablation.status == "succeeded" and ablation.score else None


def public_refusal(error: str) -> str:
    """What a submission shows of inference's refusal: the whole of it when it concerns the submitted ``model`` (the
    same for every item), else only which field was refused, not inference's detail (which may count or quote a
    test prompt)."""
    head, _, _detail = error.partition(": ")
    return error if head.endswith("(field model)") else head


def counted_submissions(s: Session, run_id: str, task_id: str) -> int:
    """How many of the run's final submissions for the task are used up: every submission except those whose grading
    failed by the platform's fault (queued, running, graded, failed by the agent's), and those too past the first
    :data:`FREE_PLATFORM_FAILURES` (were a platform failure ever triggered by what a system answers, each free retry
    would tell the agent something about the hidden split)."""
    made = repository.count_submissions(s, run_id, task_id)
    return made - min(repository.count_platform_failed_submissions(s, run_id, task_id), FREE_PLATFORM_FAILURES)


def create_submission(grader: Grader, ctx: RunContext, req: SubmissionGrading, max_submissions: int) -> SubmissionOut:
    """Record the run's final system, with the digests of the run's datasets (``req.datasets``, which its contamination
    audit reads), and queue its grading on the hidden test split and its null-model ablation there (neither charged;
    none for the evaluator track's own task).

    Raises ``Forbidden`` (code ``submission_limit``) when ``max_submissions`` of the task (``ctx.task_id``)
    are used up (see :func:`counted_submissions`) and ``Unprocessable`` for an unknown model or a bad harness.
    """
    if req.harness is not None:
        check_harness(req.harness)
    with grader.db.session() as s:
        spec = repository.spec(s, ctx.task_id)
    model, _ = evaluated_model(grader, ctx, spec, req.model, req.harness_archive)
    suite = get_suite(spec.suite.name)
    archive = code_harness_for(grader, ctx, suite, req.harness, req.harness_archive)
    with grader.db.session() as s:
        serialize(s, f"submissions:{ctx.run_id}")  # two submissions at once cannot both see one left
        spec = repository.spec(s, ctx.task_id)
        if counted_submissions(s, ctx.run_id, ctx.task_id) >= max_submissions:
            raise SubmissionLimitReached(f"this run has used its {max_submissions} final submission(s) for task {spec.task!r} "
                                         "(a grading that failed by the platform's fault is given back)", limit=max_submissions)
        harness = harness_for(spec, req.harness)
        graded = {"run_id": ctx.run_id, "split": "test", "model": model, "harness": harness, "items_total": spec.suite.splits.test.size,
                  "harness_archive": archive}
        eval_id = repository.add_evaluation(s, spec, purpose="submission", **graded).id  # type: ignore[arg-type]
        ablation_id = (repository.add_evaluation(s, spec, purpose="ablation", ablation=NULL_MODEL, **graded).id  # type: ignore[arg-type]
                       if spec.evaluator is None else None)
        out = submission_out(s, repository.add_submission(s, ctx, req.model_copy(update={"model": model}), harness=harness, harness_archive=archive,
                                                          evaluation_id=eval_id, ablation_evaluation_id=ablation_id))
    for queued in (eval_id, ablation_id):
        if queued:
            grader.enqueue(queued)
    return out


def get_submission(grader: Grader, ctx: RunContext, sub_id: str) -> SubmissionOut:
    """One of the run's submissions; raises ``NotFound`` for any other id."""
    with grader.db.session() as s:
        return submission_out(s, repository.owned_submission(s, ctx, sub_id))


def list_submissions(grader: Grader, ctx: RunContext) -> list[SubmissionOut]:
    """The run's submissions, oldest first."""
    with grader.db.session() as s:
        return [submission_out(s, sub) for sub in repository.run_submissions(s, ctx.run_id)]


def leaderboard_entries(grader: Grader) -> list[LeaderboardEntry]:
    """Per run and task, the submission that counts on the leaderboard, with its aggregate test score (no per-item data).

    The run's latest graded submission counts (EvalAI's default): a later one that is queued, running or failed
    leaves the row as it was. Until one is graded, the latest submission stands in (its status shows progress).
    ``contamination``: the audit's counts, never which items. ``model_free_score``: the null-model ablation's score,
    with the state of that grading (``model_free_status``; ``None`` where the submission has no ablation).
    """
    with grader.db.session() as s:
        counting: dict[tuple[str, str], tuple[Submission, Evaluation]] = {}
        for sub, ev in repository.submissions_with_gradings(s):
            key = (sub.run_id, sub.task_id)
            if key not in counting or ev.status == "succeeded" or counting[key][1].status != "succeeded":
                counting[key] = (sub, ev)
        out = []
        for sub, ev in counting.values():
            o = submission_out(s, sub)
            ablation = ablation_of(s, sub)
            out.append(LeaderboardEntry(submission_id=sub.id, run_id=sub.run_id, task_id=sub.task_id, status=o.status, score=o.score,
                                        model_free_score=o.model_free_score, model_free_status=ablation.status if ablation else None,  # type: ignore[arg-type]
                                        graded_at=o.graded_at, validation_evaluations=repository.count_validation_evaluations(s, sub.run_id),
                                        contamination=ContaminationReport(**sub.contamination) if sub.contamination else None,
                                        grade=EvaluatorGrade(**ev.grade) if ev.grade and o.status == "graded" else None))
        return out
