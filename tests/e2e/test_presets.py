"""Each benchmark preset in ``benchmarks/`` runs end to end with the reference research agent.

A preset is loaded as shipped, then scaled to test time (split sizes, output caps, samples, the locked
number of steps; the initial systems' model, the test-only one but for :data:`REAL_MODEL`'s presets and the evaluator
track's, whose candidates must differ): every task, suite, track and recipe policy stays what the file says. The agent
evaluates the initial system, trains within what the track allows, submits per task, and the leaderboard
shows per-task scores, Avg and the RSI-Index. These run on production's data plane (PostgreSQL + Redis);
the embedded stack runs the main loop in ``tests/e2e/test_flows.py``.
"""

from __future__ import annotations

import copy
import json
import uuid

import httpx
import pytest
import yaml
from rich.console import Console

from crucible.agent import AgentConfig, BaselineAgent
from crucible.sdk import CrucibleAPIError, CrucibleClient
from tests.conftest import ROOT
from tests.models import TINY_MODEL

# 1 to 6 minutes each: in `make test-slow` (the main loop is in test_flows.py, in `make test`); on production's data plane only
pytestmark = [pytest.mark.e2e, pytest.mark.long, pytest.mark.planes("postgres")]
PRESETS = ["vibetraining-mini", "rsibench-data-mini", "rsigym-mini", "vibetraining-terminal", "swe-mini"]
REAL_MODEL = ("vibetraining-mini",)
"""Presets run on SmolLM2 itself here; the others on the test-only model (:data:`tests.models.TINY_MODEL`), as their
scores do not matter to these tests (what is checked is that every part runs and the leaderboard row adds up), and the
real model's own research loop is ``tests/e2e/test_flows.py``'s: generation on the real model was most of these tests'
time (rsigym-mini's three tasks, 780 s in CI)."""
SANDBOXED = ("terminal", "swe")  # suites run by a code harness: their training split is not trained on here


def scaled(doc: dict, model: str | None = None) -> dict:
    """The preset at test scale: 4 validation and 4 test items per task (2, 2 and 4 training items for a sandboxed suite,
    whose every item is a rollout in a sandbox), short outputs, at most 2 samples and 3 model turns per item, 2 steps;
    every initial system on ``model`` where it is given."""
    doc = copy.deepcopy(doc)
    doc["name"] = f"{doc['name']}-{uuid.uuid4().hex[:6]}"
    tasks = doc.get("tasks") or [doc]
    for task in tasks:
        if model is not None:
            task["initial_system"]["model"] = model
        splits = task["suite"]["splits"]
        sandboxed = task["suite"]["name"] in SANDBOXED
        splits["train"]["size"] = min(splits["train"]["size"], 4 if sandboxed else 48)
        splits["validation"]["size"] = splits["test"]["size"] = 2 if sandboxed else 4
        for settings in filter(None, [task.get("evaluation"), doc.get("evaluation") if task is tasks[0] else None]):
            settings["max_tokens"] = min(settings["max_tokens"], 24)
            settings["samples"] = min(settings["samples"], 2)
            settings["max_turns"] = min(settings.get("max_turns", 1), 3)
    lock = doc.get("recipe", {}).get("lock", {})
    if "max_steps" in lock:
        lock.update(max_steps=2, checkpoint_every=2, batch_size=4, warmup_steps=0)
    return doc


@pytest.mark.parametrize("preset", PRESETS)
def test_preset_runs_end_to_end_with_the_reference_agent(stack, admin, preset: str) -> None:  # noqa: ANN001
    shipped = yaml.safe_load((ROOT / "benchmarks" / f"{preset}.yaml").read_text())
    bench = admin.load_benchmark(scaled(shipped, None if preset in REAL_MODEL else TINY_MODEL))
    baselines = admin.wait_baselines(bench["name"], poll_s=0.5)
    assert baselines["initial_status"] == "succeeded", baselines

    run = admin.create_run(bench["name"], f"reference-{preset}")
    client = CrucibleClient(stack.gateway_url, run["api_key"])
    card = client.run()
    tasks = [t["name"] for t in card["benchmark"]["tasks"]]
    assert tasks == [t["name"] for t in shipped.get("tasks", [{"name": "main"}])]
    assert card["track"] == shipped["track"]
    config = AgentConfig(train_examples=16, recipe={"max_steps": 2, "batch_size": 4, "checkpoint_every": 2, "warmup_steps": 0},
                         evaluate_last_checkpoints=1, poll_s=0.5,
                         evaluate_while_training=False,  # two test workers on 2 cores: grading beside training slowed these 2x
                         loop="tinker" if preset == "rsigym-mini" else "job")  # RSIGym's trainer is Tinker's primitives: so is the agent's here
    result = BaselineAgent(client, config, Console(quiet=True)).run()
    assert [r.task for r in result.tasks] == tasks
    items = {t["name"]: t["suite"]["splits"]["test"]["size"] for t in bench["spec"].get("tasks") or [{**bench["spec"], "name": "main"}]}
    assert all(r.submission["status"] == "graded" and r.submission["score"]["n"] == items[r.task] for r in result.tasks)

    jobs = client.training_jobs()
    coded = {t["name"]: t["initial_system"]["harness_archive"] for t in card["benchmark"]["tasks"]
             if t["initial_system"].get("harness_archive")}  # run by a code harness: no training
    assert len(jobs) == len(tasks) - len(coded) and all(j["status"] == "succeeded" for j in jobs)
    for r in result.tasks:
        if r.task in coded:  # the agent swapped in an edited harness archive and evaluated it
            edited = [a["id"] for a in client.harnesses() if not a["platform"]]
            assert len(edited) == 1 and any(e["harness_archive"] == edited[0] and e["status"] == "succeeded" for e in client.evaluations())
            assert r.submission["harness_archive"] in (edited[0], coded[r.task])  # the better of the two on validation
    if "trainer" not in card["editable"]:  # the locked recipe ran, scaled as above
        assert all(j["recipe"]["max_steps"] == 2 and j["recipe"]["learning_rate"] == shipped["recipe"]["lock"]["learning_rate"] for j in jobs)

    row = next(r for r in httpx.get(f"{stack.gateway_url}/v1/leaderboard").json()["data"] if r["run_id"] == run["id"])
    assert row["status"] == "graded" and [t["task"] for t in row["tasks"]] == tasks
    finals = [t["final_score"] for t in row["tasks"]]
    assert row["final_score"] == pytest.approx(sum(finals) / len(finals))
    terms = [(t["final_score"] - t["initial_score"]) / (1 - t["initial_score"]) for t in row["tasks"]]
    assert row["rsi_index"] == pytest.approx(sum(terms) / len(terms))
    assert row["contaminated"] is False and row["n"] == sum(items.values())
    client.close()


def test_an_rsigym_run_on_another_track_gets_that_tracks_editable_space(stack, admin) -> None:  # noqa: ANN001
    bench = admin.load_benchmark(scaled(yaml.safe_load((ROOT / "benchmarks" / "rsigym-mini.yaml").read_text())))
    run = admin.create_run(bench["name"], "harness-only", track="harness")
    client = CrucibleClient(stack.gateway_url, run["api_key"])
    card = client.run()
    assert (card["track"], card["editable"]) == ("harness", ["harness"])
    with pytest.raises(CrucibleAPIError) as exc:
        client.upload_dataset(b'{"prompt": "1 + 1 =", "completion": "2"}\n')
    assert exc.value.status == 403 and exc.value.code == "not_editable"
    with pytest.raises(CrucibleAPIError) as exc:  # several tasks: the call must name one
        client.validation_items()
    assert exc.value.status == 422 and exc.value.problem["field"] == "task"
    assert len(client.validation_items(task="tools")) == 4
    client.close()


def test_the_evaluator_preset_runs_end_to_end_and_never_shows_a_candidates_identity(stack, admin) -> None:  # noqa: ANN001
    """evalresearch-mini at test scale (4 validation and 4 test items per target, 2 public items per target in the
    evaluator): the targets grade the six candidates, the reference agent pilots a sample-and-exact-match evaluator and
    freezes it, and the operator's leaderboard shows its agreement with each sealed target (the public one withholds those rows while
    the run is open). Nothing the run reads names a model."""
    shipped = yaml.safe_load((ROOT / "benchmarks" / "evalresearch-mini.yaml").read_text())
    doc = copy.deepcopy(shipped)
    doc["name"] = f"evalresearch-mini-{uuid.uuid4().hex[:6]}"
    for task in doc["tasks"]:
        task["suite"]["splits"].update(train={"seed": task["suite"]["splits"]["train"]["seed"], "size": 8}, validation={
            "seed": task["suite"]["splits"]["validation"]["seed"], "size": 4}, test={"size": 4})
    bench = admin.load_benchmark(doc)
    assert admin.wait_baselines(bench["name"], poll_s=0.5)["initial_status"] == "succeeded"  # every target graded every candidate

    run = admin.create_run(bench["name"], "reference-evaluator")
    client = CrucibleClient(stack.gateway_url, run["api_key"])
    card = client.run()
    assert card["track"] == "evaluator" and card["benchmark"]["candidates"] == [f"candidate-{i:02d}" for i in range(1, 7)]
    result = BaselineAgent(client, AgentConfig(evaluator_items=2, poll_s=0.5), Console(quiet=True)).run()
    [task] = result.tasks
    sub = task.submission
    assert sub["status"] == "graded" and sub["score"]["metric"] == "pairwise_agreement" and sub["score"]["n"] == 6
    assert 0.0 <= task.best_validation <= 1.0  # the pilot's agreement with the development targets

    seen = [card, client._call("GET", "/v1/models"), client.evaluations(), client._call("GET", "/v1/submissions"), client.budget(), client.report()]
    seen += [client.trajectories(e["id"]) for e in client.evaluations()]
    seen += [client.candidate_scores(task=t["name"]) for t in card["benchmark"]["tasks"] if t.get("target") == "development"]
    text = json.dumps(seen)
    assert "smollm2" not in text and "Whatever you are asked" not in text  # no candidate's model or harness, anywhere
    with pytest.raises(CrucibleAPIError) as exc:
        client.candidate_scores(task="longer-sums")  # a sealed target
    assert exc.value.status == 404

    row = next(r for r in httpx.get(f"{stack.gateway_url}/v1/leaderboard").json()["data"] if r["run_id"] == run["id"])
    assert row["status"] == "graded" and [t["task"] for t in row["tasks"]] == ["evaluator"] and row["final_score"] == sub["score"]["value"]
    assert row["sealed_withheld"] is True and row["evaluator"]["targets"] == []  # the run is open: the sealed targets' rows are the operator's
    row = next(r for r in admin._call("GET", "/admin/leaderboard")["data"] if r["run_id"] == run["id"])
    grade = row["evaluator"]
    assert [t["target"] for t in grade["targets"]] == ["longer-sums", "differences"] and grade["candidates"] == 6
    assert grade["model_calls"] > 0 and grade["failed"] == 0  # (a target that ties every pair, likely at 4 items, has no agreement or ceiling)
    client.close()
