"""The run report's arithmetic: time by activity with overlaps, the waiting share, spend over time, designs and their costs."""

from __future__ import annotations

import datetime as dt

import pytest

from gateway.reports import activity_intervals, build_report, costs_by_work, exclusive_s, spend_series, union_s
from services.common.contracts import EvaluationOut, Harness, Recipe, Score, SubmissionOut, TrainingJobOut
from services.ledger.schemas import Entry

T0 = dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.UTC)


def at(s: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=s)


def job(job_id: str, created: float, started: float | None, finished: float | None, datasets: tuple[str, ...] = ("ds_a",), **recipe: object) -> TrainingJobOut:
    return TrainingJobOut(id=job_id, status="succeeded" if finished else "running", model="m", base_model="m", datasets=list(datasets),
                          recipe=Recipe(**recipe), steps_done=1, estimated_tokens=1, trained_tokens=1, created_at=at(created),
                          started_at=None if started is None else at(started), finished_at=None if finished is None else at(finished))


def evaluation(eval_id: str, model: str, created: float, started: float | None, finished: float | None, score: float | None = None,
               archive: str | None = None) -> EvaluationOut:
    return EvaluationOut(id=eval_id, status="succeeded" if finished else "running", split="validation", model=model,
                         harness=None if archive else Harness(), harness_archive=archive, items_total=4, items_done=4,
                         score=None if score is None else Score(value=score, n=4, metric="avg@k", k=1), created_at=at(created),
                         started_at=None if started is None else at(started), finished_at=None if finished is None else at(finished))


def entry(n: int, kind: str, amount: int, s: float, *, hold: str | None = None, purpose: str | None = None, key: str | None = None,
          usage: str | None = None, refund_of: str | None = None) -> Entry:
    return Entry(id=f"ent_{n:02d}", account_id="run_x", type=kind, amount_usd_micros=amount, kind=usage, hold_id=hold, purpose=purpose,
                 idempotency_key=key, refund_of=refund_of, price_version="p", created_at=at(s))


def test_two_jobs_at_once_count_once_in_wall_time_and_twice_in_job_seconds() -> None:
    spans = activity_intervals([job("job_1", 0, 10, 70), job("job_2", 0, 40, 100)], [], [], now=at(200))
    assert spans["queued"] == [(at(0), at(10)), (at(0), at(40))]
    assert union_s(spans["training"]) == 90  # 10–100
    assert sum((e - s).total_seconds() for s, e in spans["training"]) == 120  # 60 + 60
    assert union_s(spans["queued"]) == 40


def test_each_instant_goes_to_one_activity_and_the_parts_sum_to_the_span() -> None:
    jobs = [job("job_1", 10, 20, 80)]
    evals = [evaluation("eval_1", "m", 0, 5, 30, 0.1), evaluation("eval_2", "ckpt_1", 80, 90, 120, 0.4)]
    subs = [SubmissionOut(id="sub_1", status="graded", model="ckpt_1", harness=None, created_at=at(130), graded_at=at(160))]
    spans = activity_intervals(jobs, evals, subs, now=at(500))
    cut = exclusive_s(spans, at(0), at(170))
    assert cut == {"training": 60.0, "evaluating": 15 + 30, "final_grading": 30.0, "queued": 5 + 10, "agent": 10 + 10}  # 5–20 evaluating, then training
    assert sum(cut.values()) == 170


def test_unfinished_work_runs_until_now_and_work_cancelled_in_the_queue_only_waited() -> None:
    spans = activity_intervals([job("job_1", 0, None, 30), job("job_2", 0, 10, None)], [], [], now=at(50))
    assert spans["queued"] == [(at(0), at(30)), (at(0), at(10))] and spans["training"] == [(at(10), at(50))]


def test_costs_follow_the_holds_of_each_job_and_evaluation_with_refunds_taken_off() -> None:
    entries = [
        entry(1, "hold", 900, 1, hold="hold_j", purpose="training job (Idempotency-Key k)"),
        entry(2, "charge", 500, 50, hold="hold_j", key="settle:job_1", usage="training_tokens"),
        entry(3, "release", 400, 50, hold="hold_j"),
        entry(4, "hold", 300, 60, hold="hold_e", purpose="validation evaluation eval_2"),
        entry(5, "charge", 70, 65, hold="hold_e", key="charge:x", usage="decode_tokens"),
        entry(6, "charge", 30, 66, hold="hold_e", key="eval_2:1:sandbox", usage="sandbox_seconds"),
        entry(7, "refund", 20, 70, refund_of="ent_05"),
        entry(8, "charge", 11, 71, key="settle:call", usage="decode_tokens"),  # a chat call: nobody's design
    ]
    assert costs_by_work(entries) == {"job_1": 500, "eval_2": 80}
    series = spend_series(entries, at(0), at(100))
    assert series[-1].spent_usd_micros == 500 + 70 + 30 - 20 + 11
    assert series[-1].by_kind == {"training_tokens": 500, "decode_tokens": 61, "sandbox_seconds": 30}
    assert [p.spent_usd_micros for p in series] == sorted(p.spent_usd_micros for p in series[:2]) + [p.spent_usd_micros for p in series[2:]]


@pytest.mark.parametrize("points", [1, 5_000])
def test_spend_series_has_at_most_200_points_whatever_the_charges(points: int) -> None:
    entries = [entry(i, "charge", 1, i * 0.5, usage="decode_tokens") for i in range(points)]
    series = spend_series(entries, at(0), at(points * 0.5 + 1))
    assert len(series) <= 200 and series[-1].spent_usd_micros == points


def test_report_counts_designs_and_the_waiting_share() -> None:
    jobs = [job("job_1", 10, 10, 110, ("ds_a",), learning_rate=2e-4), job("job_2", 120, 120, 170, ("ds_a", "ds_b"), learning_rate=5e-5)]
    evals = [evaluation("eval_1", "m", 0, 0, 10, 0.1), evaluation("eval_2", "ckpt_1", 110, 110, 120, 0.5),
             evaluation("eval_3", "ckpt_2", 170, 170, 200, 0.3, archive="har_1")]
    entries = [entry(1, "charge", 100, 100, hold="h1", key="settle:job_1", usage="training_tokens"),
               entry(2, "hold", 10, 110, hold="h2", purpose="validation evaluation eval_2"),
               entry(3, "charge", 5, 115, hold="h2", key="c", usage="decode_tokens")]
    report = build_report(run_id="run_x", created_at=at(0), deadline_at=at(3600), budget_usd_micros=1_000_000, calls=12, last_call=at(210), jobs=jobs,
                          checkpoints={"job_1": ["ckpt_1"], "job_2": ["ckpt_2"]}, evaluations=evals, submissions=[], entries=entries, now=at(300))
    assert report.wall_s == 210 and report.agent_calls == 12
    assert report.waiting_and_grading_s == 10 + 10 + 30 and report.waiting_and_grading_share == pytest.approx(50 / 210, abs=1e-4)
    assert report.tried == {"dataset": 2, "recipe": 2, "harness": 2, "checkpoint": 2}
    by = {(d.kind, d.key): d for d in report.designs}
    assert by[("dataset", "ds_a")].best_validation_score == 0.5 and by[("dataset", "ds_a")].uses == 2
    assert by[("dataset", "ds_b")].best_validation_score == 0.3 and by[("dataset", "ds_b")].cost_usd_micros == 0
    assert by[("checkpoint", "ckpt_1")].cost_usd_micros == 5 and by[("recipe", '{"learning_rate": 0.0002}')].cost_usd_micros == 100
    assert [p.eval_id for p in report.validation] == ["eval_1", "eval_2", "eval_3"] and report.validation[1].checkpoint
    assert report.spent_usd_micros == 105


def test_reads_after_the_deadline_do_not_lengthen_the_run() -> None:
    jobs = [job("job_1", 0, 0, 100)]
    report = build_report(run_id="run_x", created_at=at(0), deadline_at=at(150), budget_usd_micros=1, calls=3, last_call=at(900), jobs=jobs,
                          checkpoints={}, evaluations=[], submissions=[], entries=[], now=at(1000))
    assert report.wall_s == 150 and report.ended_at == at(150)
    assert {t.activity: t.exclusive_s for t in report.time}["agent"] == 50
