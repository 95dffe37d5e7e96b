"""Benchmark files and the run's editable space, checked without processes."""

from __future__ import annotations

import asyncio
import copy
import datetime as dt
from types import SimpleNamespace

import pytest
import yaml

from gateway.benchmarks import check_models, parse_benchmark
from gateway.schemas import BenchmarkFile
from gateway.service import Caller, apply_recipe_policy, check_editable
from services.common.auth import RunContext
from services.common.contracts import Page
from services.common.errors import OutsideEditableSpace, Unprocessable
from services.common.llms import BUILTIN_CARDS, ModelCard
from tests.conftest import ROOT, TEST_BENCHMARK


def _caller(doc: dict) -> Caller:
    from gateway.models import Run

    spec = BenchmarkFile.model_validate(doc)
    run = Run(id="run_x", benchmark_id="bm_x", agent_name="a", track=spec.track, key_hash="h", key_prefix="crk_", budget_usd_micros=1,
              deadline_at=dt.datetime.now(dt.UTC))
    tasks = {t.name: f"bm_{t.name}" for t in spec.task_list()}
    return Caller(run=run, benchmark=spec, ctx=RunContext(run_id="run_x", task_id=next(iter(tasks.values())), track=spec.track,
                                                          editable=list(spec.editable or [])), tasks=tasks)


def test_every_shipped_benchmark_file_is_valid() -> None:
    files = sorted((ROOT / "benchmarks").glob("*.yaml"))
    assert files
    for path in files:
        parse_benchmark(yaml.safe_load(path.read_text()))


@pytest.mark.parametrize(("mutate", "field"), [
    (lambda d: d["suite"]["splits"]["test"].update(seed=5), "suite.splits.test.seed"),
    (lambda d: d.pop("budget"), "budget"),
    (lambda d: d["budget"].update(usd=-1), "budget.usd"),
    (lambda d: d.update(track="everything"), "track"),
    (lambda d: d["recipe"].update(lock={"lernrate": 1}), "recipe"),
    (lambda d: d.update(reference={}), "reference"),
    (lambda d: d.update(surprise=1), "surprise"),
    (lambda d: d["evaluation"].update(context_tokens=64), "evaluation.context_tokens"),
])
def test_bad_benchmark_file_names_the_key(mutate, field: str) -> None:  # noqa: ANN001
    doc = copy.deepcopy(TEST_BENCHMARK)
    mutate(doc)
    with pytest.raises(Unprocessable) as exc:
        parse_benchmark(doc)
    assert exc.value.extra["field"].startswith(field.split(".")[0])
    if "." in field:
        assert exc.value.extra["field"] == field or "test seed" in exc.value.detail


class _Inference:
    """Inference as ``check_models`` calls it: serving the built-in cards of ``names``."""

    def __init__(self, *names: str) -> None:
        self.names = names

    async def list_base_models(self) -> Page[ModelCard]:
        return Page[ModelCard](data=[BUILTIN_CARDS[n] for n in self.names])


@pytest.mark.parametrize(("mutate", "field"), [
    (lambda d: d["evaluation"].update(thinking=True), "evaluation.thinking"),  # SmolLM2 has no thinking mode
    (lambda d: d["initial_system"].update(model="gpt-5"), "initial_system.model"),  # no base model of this deployment
    (lambda d: d["initial_system"].update(model="gemma3-270m"), "initial_system.model"),  # built in, but not served here
    (lambda d: d.update(reference={"system": {"model": "ckpt_01jd3k4m5n6p7q8r9s0t1v2w3x"}}), "reference.system.model"),
])
def test_a_benchmark_starts_from_a_served_base_model_with_the_modes_it_asks(mutate, field: str) -> None:  # noqa: ANN001
    gw = SimpleNamespace(inference=_Inference("smollm2-135m-instruct"))
    asyncio.run(check_models(gw, parse_benchmark(TEST_BENCHMARK)))  # type: ignore[arg-type]
    doc = copy.deepcopy(TEST_BENCHMARK)
    mutate(doc)
    with pytest.raises(Unprocessable) as exc:
        asyncio.run(check_models(gw, parse_benchmark(doc)))  # type: ignore[arg-type]
    assert exc.value.extra["field"] == field


def test_a_benchmark_may_start_from_any_served_model() -> None:
    doc = yaml.safe_load((ROOT / "benchmarks" / "chain-sum-gemma.yaml").read_text())
    asyncio.run(check_models(SimpleNamespace(inference=_Inference("smollm2-135m-instruct", "gemma3-270m")), parse_benchmark(doc)))  # type: ignore[arg-type]
    with pytest.raises(Unprocessable, match="gemma3-270m"):
        asyncio.run(check_models(SimpleNamespace(inference=_Inference("smollm2-135m-instruct")), parse_benchmark(doc)))  # type: ignore[arg-type]


def test_tracks_preset_the_editable_space() -> None:
    for track, editable in {"data": ["data"], "harness": ["harness"], "joint": ["data", "trainer", "harness"]}.items():
        assert BenchmarkFile.model_validate({**TEST_BENCHMARK, "track": track}).editable == editable


def test_locked_recipe_field_is_refused_not_overwritten() -> None:
    caller = _caller(TEST_BENCHMARK)
    assert apply_recipe_policy(caller, {"max_steps": 10}) == {"max_steps": 10, "method": "sft", "adapter": "lora"}
    assert apply_recipe_policy(caller, {"method": "sft"})["method"] == "sft"
    with pytest.raises(OutsideEditableSpace) as exc:
        apply_recipe_policy(caller, {"method": "dpo"})
    assert exc.value.extra["field"] == "recipe.method" and exc.value.status == 403


def test_data_track_cannot_change_the_trainer_or_harness() -> None:
    caller = _caller({**TEST_BENCHMARK, "track": "data"})
    with pytest.raises(OutsideEditableSpace) as exc:
        apply_recipe_policy(caller, {"learning_rate": 0.5})
    assert exc.value.extra["field"] == "recipe.learning_rate"
    assert apply_recipe_policy(caller, {"max_steps": 100}) == {"max_steps": 100, "method": "sft", "adapter": "lora"}  # the default value
    with pytest.raises(OutsideEditableSpace):
        check_editable(caller, "harness", "evaluating with a custom harness")
    check_editable(caller, "data", "uploading a dataset")


def test_allow_list_limits_the_fields() -> None:
    caller = _caller({**TEST_BENCHMARK, "recipe": {"allow": ["max_steps"], "lock": {}}})
    apply_recipe_policy(caller, {"max_steps": 3})
    with pytest.raises(OutsideEditableSpace) as exc:
        apply_recipe_policy(caller, {"lora_r": 4})
    assert exc.value.extra["field"] == "recipe.lora_r"


def _two_tasks() -> dict:
    one = {k: TEST_BENCHMARK[k] for k in ("suite", "initial_system", "reference")}
    doc = {k: v for k, v in TEST_BENCHMARK.items() if k not in one}
    return {**doc, "tasks": [{"name": "sums", **one}, {"name": "more-sums", **one}]}


def test_a_benchmark_has_one_task_or_a_tasks_list_never_both() -> None:
    assert [t.name for t in BenchmarkFile.model_validate(TEST_BENCHMARK).task_list()] == ["main"]
    assert [t.name for t in BenchmarkFile.model_validate(_two_tasks()).task_list()] == ["sums", "more-sums"]
    with pytest.raises(Unprocessable, match="belong inside each task"):
        parse_benchmark({**_two_tasks(), "suite": TEST_BENCHMARK["suite"]})
    with pytest.raises(Unprocessable, match="give suite, initial_system, reference"):
        parse_benchmark({k: v for k, v in TEST_BENCHMARK.items() if k not in ("suite", "initial_system", "reference")})
    doc = _two_tasks()
    doc["tasks"][1]["name"] = "sums"
    with pytest.raises(Unprocessable, match="unique"):
        parse_benchmark(doc)
    doc = _two_tasks()
    doc["tasks"][0]["suite"] = {**doc["tasks"][0]["suite"], "splits": {**doc["tasks"][0]["suite"]["splits"], "test": {"size": 5, "seed": 1}}}
    with pytest.raises(Unprocessable) as exc:
        parse_benchmark(doc)
    assert exc.value.extra["field"] == "tasks.0.suite"


def _evaluator_track() -> dict:
    doc = {k: v for k, v in TEST_BENCHMARK.items() if k not in ("suite", "initial_system", "reference", "recipe")}
    return {**doc, "track": "evaluator", "evaluator": {"calls": 50, "tokens": 20_000},
            "candidates": [{"model": "smollm2-135m-instruct"}, {"model": "smollm2-135m-instruct", "harness": {"system_prompt": "Answer 0."}}],
            "tasks": [{"name": "dev", "target": "development", "suite": TEST_BENCHMARK["suite"]},
                      {"name": "hidden", "target": "sealed", "suite": TEST_BENCHMARK["suite"]}]}


def test_an_evaluator_track_benchmark_has_candidates_and_targets_one_sealed() -> None:
    spec = parse_benchmark(_evaluator_track())
    assert (spec.editable, [(t.name, t.target) for t in spec.task_list()], spec.evaluator.calls) == (  # type: ignore[union-attr]
        ["evaluator"], [("evaluator", None), ("dev", "development"), ("hidden", "sealed")], 50)
    own = spec.task_list()[0]
    assert (own.suite.name, own.suite.params, own.suite.splits.test.size) == ("evaluator", {"candidates": ["candidate-01", "candidate-02"]}, 2)
    for mutate, says in [
        (lambda d: d.pop("candidates"), "needs candidates"),
        (lambda d: d["tasks"][1].update(target="development"), "at least one sealed"),
        (lambda d: d["tasks"][0].pop("target"), "initial_system and reference"),
        (lambda d: d["tasks"][0].update(initial_system={"model": "smollm2-135m-instruct"}), "a target has no initial_system"),
        (lambda d: d["candidates"].append(dict(d["candidates"][0])), "different systems"),
        (lambda d: d["candidates"].__setitem__(0, {"model": "smollm2-135m-instruct", "harness_archive": "har_01jd3k4m5n6p7q8r9s0t1v2w3x"}), "declarative"),
        (lambda d: d.update(track="joint"), "belong to the evaluator track"),
        (lambda d: d["tasks"][0].update(name="evaluator"), "the track's own task"),
    ]:
        doc = _evaluator_track()
        mutate(doc)
        with pytest.raises(Unprocessable, match=says):
            parse_benchmark(doc)
    with pytest.raises(Unprocessable, match="belong to the evaluator track"):
        parse_benchmark({**TEST_BENCHMARK, "candidates": _evaluator_track()["candidates"]})


def test_an_evaluator_track_candidate_is_a_served_model() -> None:
    doc = _evaluator_track()
    doc["candidates"][1]["model"] = "gemma3-270m"
    with pytest.raises(Unprocessable) as exc:
        asyncio.run(check_models(SimpleNamespace(inference=_Inference("smollm2-135m-instruct")), parse_benchmark(doc)))  # type: ignore[arg-type]
    assert exc.value.extra["field"] == "candidates.1.model"


def test_calls_name_a_task_when_the_benchmark_has_several() -> None:
    from gateway.service import for_task

    single = _caller(TEST_BENCHMARK)
    assert for_task(single, None) is single and for_task(single, "main").ctx.task_id == "bm_main"
    several = _caller(_two_tasks())
    assert for_task(several, "more-sums").ctx.task_id == "bm_more-sums"
    for task in (None, "nope"):
        with pytest.raises(Unprocessable) as exc:
            for_task(several, task)
        assert exc.value.extra["field"] == "task"


def test_crucible_admin_check_benchmark_names_the_bad_key(tmp_path) -> None:  # noqa: ANN001
    from typer.testing import CliRunner

    from crucible.cli import app

    good = CliRunner().invoke(app, ["admin", "check-benchmark", str(ROOT / "benchmarks" / "rsigym-mini.yaml")])
    assert good.exit_code == 0 and "tasks sums (reasoning_gym), tools (bfcl), code (humaneval)" in good.output
    doc = copy.deepcopy(TEST_BENCHMARK)
    doc["evaluation"]["metric"] = "best@k"
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(doc))
    bad = CliRunner().invoke(app, ["admin", "check-benchmark", str(tmp_path / "bad.yaml")])
    assert bad.exit_code == 1 and "evaluation.metric" in bad.output
    assert bad.output.count("evaluation.metric") == 1  # the key path once, then the reason
    (tmp_path / "latin1.yaml").write_bytes("name: caf\xe9\n".encode("latin-1"))
    unreadable = CliRunner().invoke(app, ["admin", "check-benchmark", str(tmp_path / "latin1.yaml")])
    assert unreadable.exit_code == 1 and "not a readable YAML file" in unreadable.output and "Traceback" not in unreadable.output


def test_the_leaderboard_page_renders_tasks_rsi_index_intervals_and_contamination() -> None:
    from gateway.api import templates
    from gateway.schemas import LeaderboardRow, TaskScore

    def task(name: str, final: float | None, flagged: bool | None) -> TaskScore:
        return TaskScore(task=name, submission_id="sub_x" if final is not None else None, status="graded" if final is not None else "not submitted",
                         initial_score=0.1, final_score=final, reference_score=1.0, gap_closed=None, n=4 if final is not None else None,
                         final_ci=(0.05, 0.6) if final is not None else None, contaminated=flagged)

    rows = [LeaderboardRow(rank=1, run_id="run_a", benchmark="rsigym-mini", agent_name="agent-a", status="graded",
                           tasks=[task("sums", 0.5, True), task("tools", 0.3, False)], submission_id=None, initial_score=0.1, final_score=0.4,
                           reference_score=1.0, gap_closed=0.33, rsi_index=0.333, n=8, validation_evaluations=3, spent_usd=0.5, elapsed_hours=1.5,
                           contaminated=True),
            LeaderboardRow(rank=None, run_id="run_b", benchmark="chain-sum", agent_name="agent-b", status="queued", tasks=[task("main", None, None)],
                           submission_id="sub_b", initial_score=0.1, final_score=None, reference_score=1.0, gap_closed=None, n=None,
                           validation_evaluations=0, spent_usd=0.0, elapsed_hours=0.1)]
    html = templates.env.get_template("leaderboard.html").render(rows=rows)
    assert "RSI-Index" in html and "33.3%" in html and "5.0–60.0%" in html
    assert "<strong>flagged</strong>" in html and "items)" not in html and "&nbsp;&nbsp;tools" in html and "clean" in html
    assert "&nbsp;&nbsp;main" not in html  # a one-task benchmark has no task lines


def test_the_leaderboard_page_shows_an_evaluators_agreement_with_each_sealed_target_and_its_failure_modes() -> None:
    from gateway.api import templates
    from gateway.schemas import LeaderboardRow, TaskScore
    from services.common.contracts import EvaluatorGrade, TargetAgreement

    grade = EvaluatorGrade(pairwise_agreement=0.75, kendall_tau=0.5, concordance=0.4, ceiling=0.9, candidates=6, model_calls=120, prompt_tokens=9000,
                           completion_tokens=1000, sandbox_s=40, exhausted=2, partial=2, failed=0, truncated_share=0.25, top_items_share=0.8,
                           targets=[TargetAgreement(target="sums", pairwise_agreement=0.8, ci_low=0.6, ci_high=0.95, kendall_tau=0.6, concordance=0.5,
                                                    ceiling=0.93),
                                    TargetAgreement(target="tools", pairwise_agreement=0.7, kendall_tau=0.4, concordance=0.3, ceiling=0.87)])
    task = TaskScore(task="evaluator", submission_id="sub_e", status="graded", initial_score=None, final_score=0.75, reference_score=None,
                     gap_closed=None, n=6)
    rows = [LeaderboardRow(rank=1, run_id="run_e", benchmark="evalresearch-mini", agent_name="agent-e", status="graded", tasks=[task],
                           submission_id="sub_e", initial_score=None, final_score=0.75, reference_score=None, gap_closed=None, n=6,
                           validation_evaluations=2, spent_usd=0.1, elapsed_hours=0.5, evaluator=grade)]
    html = templates.env.get_template("leaderboard.html").render(rows=rows)
    assert "sealed target" in html and "80.0%" in html and "60.0–95.0%" in html and "93.0%" in html and "0.60" in html
    assert "budget out on 2" in html and "25.0% of answers cut" in html and "80.0% of a score on 3 items" in html


def test_a_chunked_body_over_the_limit_is_refused_before_the_app_reads_it() -> None:
    from fastapi import Body
    from fastapi.testclient import TestClient

    from services.common.app import create_service_app

    app = create_service_app("t", title="t", description="t", max_body_bytes=1000)
    seen: list[int] = []

    @app.post("/echo")
    def echo(body: bytes = Body(..., media_type="application/octet-stream")) -> dict:
        seen.append(len(body))
        return {"bytes": len(body)}

    def chunks(n: int):  # no Content-Length: sent chunked
        for _ in range(n):
            yield b"x" * 100

    with TestClient(app) as client:
        assert client.post("/echo", content=chunks(5)).json() == {"bytes": 500}
        big = client.post("/echo", content=chunks(50))
        assert big.status_code == 413 and big.headers["content-type"] == "application/problem+json"
        assert client.post("/echo", content=b"x" * 2000).status_code == 413  # with Content-Length
    assert seen == [500]


def _fine_tuning(caller: Caller, rows: int, **hyperparameters: object) -> dict:
    from gateway.finetuning import job_request
    from gateway.schemas import FineTuningJobCreate

    req = FineTuningJobCreate(model="smollm2-135m-instruct", training_file="ds_" + "0" * 26,
                              method={"type": "supervised", "supervised": {"hyperparameters": hyperparameters}})
    return job_request(caller, req, rows).recipe.model_dump()


def test_an_auto_fine_tuning_job_fits_its_batch_to_the_file_and_its_warmup_to_its_steps() -> None:
    """OpenAI's short jobs: one row for 3 epochs is 3 steps of one row (a batch of the default 8 read the row 8 times),
    and a job of 3 steps has no warm-up (inside the default 10 steps of warm-up its learning rate stayed near 0 and it
    trained nothing it was charged for); set values, long jobs and a track that fixes the recipe are left as they are."""
    caller = _caller(TEST_BENCHMARK)
    short = _fine_tuning(caller, 1, n_epochs=3)
    assert (short["batch_size"], short["max_steps"], short["warmup_steps"]) == (1, 3, 0)
    long = _fine_tuning(caller, 400, n_epochs=3)
    assert (long["batch_size"], long["max_steps"], long["warmup_steps"]) == (8, 150, 10)
    assert _fine_tuning(caller, 40, n_epochs=2)["warmup_steps"] == 1  # 10 steps: a tenth of them
    assert _fine_tuning(caller, 2, n_epochs=1, batch_size=4)["batch_size"] == 4  # set by the client: honoured
    fixed = _caller({**TEST_BENCHMARK, "track": "data"})
    assert (_fine_tuning(fixed, 1)["batch_size"], _fine_tuning(fixed, 1)["warmup_steps"]) == (8, 10)  # the benchmark's recipe
    locked = _caller({**TEST_BENCHMARK, "recipe": {"lock": {"method": "sft", "warmup_steps": 5}}})
    assert _fine_tuning(locked, 1, n_epochs=1)["warmup_steps"] == 5
