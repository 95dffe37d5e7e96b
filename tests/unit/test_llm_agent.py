"""The LLM agent's own rules, without a stack: what it submits when it stops, how it keeps a model's answer, and what of a
long conversation it sends. The loop against the real tools is in ``tests/e2e/test_llm_agent.py``."""

from __future__ import annotations

import json

from crucible.llm_agent import ELIDED, System, assistant_message, best_systems, clip, trim_history


def evaluation(eval_id: str, model: str, score: float | None, status: str = "succeeded", task: str = "main") -> dict:
    return {"id": eval_id, "model": model, "status": status, "task": task, "score": None if score is None else {"value": score, "n": 16}}


def test_the_best_validated_system_is_submitted_with_the_harness_it_was_evaluated_with() -> None:
    harness = {"system_prompt": "Answer with the number only."}
    evaluations = [evaluation("eval_a", "base", 0.25), evaluation("eval_b", "ckpt_1", 0.5), evaluation("eval_c", "ckpt_2", 0.5),
                   evaluation("eval_d", "ckpt_3", None, status="running"), evaluation("eval_e", "ckpt_4", 0.9, status="failed")]
    launched = {"eval_a": {}, "eval_b": {"harness": harness}, "eval_c": {}, "eval_d": {}, "eval_e": {}}
    assert best_systems(evaluations, launched, {"main": "base"}) == {
        "main": System(model="ckpt_1", harness=harness, score=0.5, evaluation="eval_b")}  # the earliest of equals


def test_without_a_validation_score_the_initial_model_is_submitted() -> None:
    others = [evaluation("eval_x", "ckpt_9", 1.0)]  # not started by this agent: its harness is unknown
    assert best_systems(others, {}, {"main": "base"}) == {"main": System(model="base")}
    assert best_systems([], {}, {"math": "base", "code": "base-code"}) == {"math": System(model="base"), "code": System(model="base-code")}


def test_each_task_gets_its_own_best() -> None:
    evaluations = [evaluation("eval_a", "ckpt_1", 0.4, task="math"), evaluation("eval_b", "ckpt_2", 0.7, task="code"),
                   evaluation("eval_c", "ckpt_3", 0.6, task="math")]
    best = best_systems(evaluations, dict.fromkeys(("eval_a", "eval_b", "eval_c"), {}), {"math": "base", "code": "base"})
    assert (best["math"].model, best["code"].model) == ("ckpt_3", "ckpt_2")


def test_a_models_answer_is_kept_with_an_id_for_every_call_and_arguments_as_text() -> None:
    raw = {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "budget", "arguments": "{}"}},
        {"function": {"name": "evaluation", "arguments": {"eval_id": "eval_1"}}},  # no id, arguments not a string
        {"function": {}}]}
    message = assistant_message(raw, step=7)
    assert message["content"] is None
    assert [c["id"] for c in message["tool_calls"]] == ["c1", "call_7_1", "call_7_2"]
    assert message["tool_calls"][1]["function"] == {"name": "evaluation", "arguments": json.dumps({"eval_id": "eval_1"})}
    assert message["tool_calls"][2]["function"] == {"name": "", "arguments": "{}"}
    assert assistant_message({"content": None}, step=1) == {"role": "assistant", "content": ""}  # an empty answer is still a message


def test_a_long_conversation_drops_its_oldest_turns_whole() -> None:
    head = [{"role": "system", "content": "s"}, {"role": "user", "content": "card"}]
    turns = [[{"role": "assistant", "content": None, "tool_calls": [{"id": f"c{i}", "type": "function", "function": {"name": "budget", "arguments": "{}"}}]},
              {"role": "tool", "tool_call_id": f"c{i}", "content": "x" * 1000}] for i in range(5)]
    messages = head + [m for t in turns for m in t]
    assert trim_history(messages, 100_000) == messages
    kept = trim_history(messages, 2_600)
    assert kept[:2] == head and kept[2] == {"role": "user", "content": ELIDED}
    assert kept[3:] == [m for t in turns[-2:] for m in t]  # whole turns: no tool result without its call
    assert trim_history(messages, 10)[3:] == turns[-1]  # the last turn is always sent


def test_a_long_tool_result_is_cut_and_says_so() -> None:
    assert clip("abc", 5) == "abc"
    assert clip("x" * 20, 5).startswith("xxxxx… [cut: 15 more characters")
