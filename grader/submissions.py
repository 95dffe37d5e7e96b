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


def gradings(s: Session, sub: Submission) -> list[Evaluation]:
    """The evaluations that grade ``sub``: its grading, then its null-model ablation where it has one."""
    return [repository.evaluation(s, eval_id) for eval_id in (sub.evaluation_id, sub.ablation_evaluation_id) if eval_id]


def submission_out(s: Session, sub: Submission) -> SubmissionOut:
    """The wire form of ``sub``. It is graded once its grading and its null-model ablation have both succeeded, and
    failed once either failed (the first that failed says whose fault it was); its score and model-free score are shown
    only once it is graded (a score shown before an ablation that then failed by the platform's fault would come with a
    free retry). Its text is never a function of the test split: an agent failure shows what inference refused
    (:func:`public_refusal`), a platform failure only that the submission was given back; both stay whole in the
    grader's records."""
    evaluations = gradings(s, sub)
    failed = next((ev for ev in evaluations if ev.status in ("failed", "cancelled")), None)
    if failed is not None:
        status = "failed"
    elif all(ev.status == "succeeded" for ev in evaluations):
        status = "graded"
    else:
        status = "queued" if all(ev.status == "queued" for ev in evaluations) else "running"
    cause = failed.failure_cause if failed is not None else None
    counted = cause != PLATFORM or repository.count_platform_failed_submissions(s, sub.run_id, sub.task_id, up_to=sub.id) > FREE_PLATFORM_FAILURES
    if cause == AGENT:
        error = public_refusal(failed.error or "")  # type: ignore[union-attr]
    elif cause == PLATFORM:
        error = "grading failed on the platform's side; " + ("this submission does not count against the task's final submissions" if not counted else
                                                             f"it counts: the task had more than {FREE_PLATFORM_FAILURES} such failures")
    else:
        error = None
    graded = status == "graded"
    score, model_free, *_ = [Score(**ev.score) if graded and ev.score else None for ev in evaluations] + [None]
    return SubmissionOut(id=sub.id, status=status, task=repository.spec(s, sub.task_id).task, model=sub.model,  # type: ignore[arg-type]
                         harness=None if sub.harness_archive else Harness(**sub.harness),
                         harness_archive=sub.harness_archive, score=score, model_free_score=model_free,
                         error=error, failure_cause=cause, counted=counted,  # type: ignore[arg-type]
                         created_at=sub.created_at, graded_at=max(ev.finished_at for ev in evaluations) if graded else None)


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
    """Per run and task, the submission that counts on the leaderboard, with its aggregate test score and its null-model
    ablation's (``model_free_score``; ``None`` for a submission without one), no per-item data.

    The run's latest graded submission counts (EvalAI's default): a later one that is queued, running or failed
    leaves the row as it was. Until one is graded, the latest submission stands in (its status shows progress).
    ``contamination``: the audit's counts, never which items.
    """
    with grader.db.session() as s:
        counting: dict[tuple[str, str], tuple[Submission, Evaluation, SubmissionOut]] = {}
        for sub, ev in repository.submissions_with_gradings(s):
            key, o = (sub.run_id, sub.task_id), submission_out(s, sub)
            if key not in counting or o.status == "graded" or counting[key][2].status != "graded":
                counting[key] = (sub, ev, o)
        return [LeaderboardEntry(submission_id=sub.id, run_id=sub.run_id, task_id=sub.task_id, status=o.status, score=o.score,
                                 model_free_score=o.model_free_score, graded_at=o.graded_at,
                                 validation_evaluations=repository.count_validation_evaluations(s, sub.run_id),
                                 contamination=ContaminationReport(**sub.contamination) if sub.contamination else None,
                                 grade=EvaluatorGrade(**ev.grade) if ev.grade and o.status == "graded" else None)
                for sub, ev, o in counting.values()]
