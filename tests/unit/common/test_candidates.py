"""Candidate systems of the evaluator track (services/common/candidates.py): opaque names, and a chat request as the
candidate's system makes it."""

from __future__ import annotations

from services.common.candidates import assign, candidate_request, renamed
from services.common.contracts import Harness, SystemSpec
from services.common.openai_protocol import ChatCompletion, ChatCompletionRequest

SYSTEMS = [SystemSpec(model="smollm2-135m-instruct", harness=Harness(system_prompt=f"You are system {i}.")) for i in range(8)]


def test_names_are_a_keyed_permutation_that_the_file_order_does_not_give_away() -> None:
    a, b = assign(SYSTEMS, "key-a"), assign(SYSTEMS, "key-b")
    assert list(a) == [f"candidate-{i:02d}" for i in range(1, 9)]
    assert sorted(a.values(), key=SYSTEMS.index) == SYSTEMS  # every system once
    assert a == assign(SYSTEMS, "key-a")  # the same key, the same names
    assert list(a.values()) != SYSTEMS and list(a.values()) != list(b.values())


def test_a_request_to_a_candidate_is_answered_by_its_system() -> None:
    system = SystemSpec(model="smollm2-135m-instruct", harness=Harness(system_prompt="Be terse.", user_template="Q: {{ question }}\nA:",
                                                                      max_tokens=8, temperature=0.7, top_p=0.9, stop=["\n"]))
    body = ChatCompletionRequest.model_validate({"model": "candidate-03", "max_tokens": 64, "temperature": 0, "stop": "###", "messages": [
        {"role": "system", "content": "Grade this."}, {"role": "user", "content": "2 + 2?"}, {"role": "assistant", "content": "4"},
        {"role": "user", "content": "3 + 3?"}]})
    out = candidate_request(body, system)
    assert out.model == "smollm2-135m-instruct"
    assert [(m.role, m.content) for m in out.messages] == [("system", "Be terse."), ("system", "Grade this."), ("user", "Q: 2 + 2?\nA:"),
                                                           ("assistant", "4"), ("user", "Q: 3 + 3?\nA:")]
    assert (out.max_tokens, out.max_completion_tokens, out.temperature, out.top_p, out.stop) == (8, None, 0.7, 0.9, ["###", "\n"])
    smaller = candidate_request(body.model_copy(update={"max_tokens": None, "max_completion_tokens": 3}), system)
    assert smaller.max_tokens == 3
    assert candidate_request(body, system, max_tokens_cap=5).max_tokens == 5


def test_a_candidate_without_a_harness_is_its_model_with_the_default_harness() -> None:
    body = ChatCompletionRequest.model_validate({"model": "candidate-01", "messages": [{"role": "user", "content": "hi"}]})
    out = candidate_request(body, SystemSpec(model="smollm2-135m-instruct"))
    assert [(m.role, m.content) for m in out.messages] == [("user", "hi")]
    assert (out.max_tokens, out.temperature) == (Harness().max_tokens, 0.0)


def test_the_answer_names_the_candidate() -> None:
    answer = ChatCompletion.model_validate({"id": "chatcmpl-1", "created": 0, "model": "smollm2-135m-instruct", "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "4"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}})
    assert renamed(answer, "candidate-02").model == "candidate-02"
