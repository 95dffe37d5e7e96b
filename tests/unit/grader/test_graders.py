"""OpenAI-style graders run by the grader (:mod:`grader.graders`): string checks, text similarity by the libraries
themselves, templates over the sample and its row, ``python`` graders on the real sandbox backend (bubblewrap here, one
program per batch), ``multi`` formulas, and the parsing of a grading model's answer (a stand-in inference answers: a
real model grades in the end-to-end suite). Then the route, ``POST /internal/graders/run``, for the gateway and the
trainer, on the ``served`` app of ``test_routes``."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import httpx
import jinja2
import pytest
from fastapi.testclient import TestClient
from inference_service.client import InferenceClient
from pydantic import TypeAdapter, ValidationError
from rapidfuzz import fuzz

import grader.graders as graders
from grader.client import GraderClient
from grader.graders import parse_label, parse_score, python_limits, run_grader
from grader.sandboxes import SandboxUnavailable
from services.common.auth import RunContext, run_headers
from services.common.errors import UpstreamProblem, UpstreamUnavailable
from services.common.graders import TEMPLATES, FormulaError, Grader, GraderResult, GraderRunRequest, GraderSample, evaluate_formula
from services.common.openai_protocol import ChatCompletion, ChatCompletionRequest
from tests.unit.grader import test_routes
from tests.unit.grader.test_routes import GATEWAY_TOKEN, Served, problem, stand_in
from tests.unit.inprocess import in_process

served = test_routes.served  # the route tests' app, one of its own for this module

CTX = RunContext(run_id="run_graders", task_id="bm_graders")
SPEC = TypeAdapter(Grader)
ANSWER = "{{ sample.output_text }}"


def grade(spec: dict[str, Any], samples: list[tuple[str, dict[str, Any]]], inference: Any = None) -> list[GraderResult]:  # noqa: ANN401
    """``spec`` (a grader as JSON) on ``(output_text, item)`` samples, with ``inference`` as the grader's inference."""
    req = GraderRunRequest(grader=SPEC.validate_python(spec), samples=[GraderSample(output_text=t, item=i) for t, i in samples])
    return run_grader(SimpleNamespace(inference=inference), CTX, req)  # type: ignore[arg-type]


def rewards(spec: dict[str, Any], samples: list[tuple[str, dict[str, Any]]]) -> list[float]:
    results = grade(spec, samples)
    assert [r.error for r in results] == [None] * len(samples), results
    return [r.reward for r in results]


# --------------------------------------------------------------------------- string_check


@pytest.mark.parametrize(("operation", "expected"), [("eq", [1, 0, 0, 0]), ("ne", [0, 1, 1, 1]), ("like", [1, 1, 0, 0]), ("ilike", [1, 1, 1, 0])])
def test_string_check_compares_the_rendered_input_and_reference(operation: str, expected: list[float]) -> None:
    spec = {"type": "string_check", "name": "check", "input": ANSWER, "reference": "{{ item.answer }}", "operation": operation}
    samples = [("Paris", {"answer": "Paris"}), ("It is Paris.", {"answer": "Paris"}), ("PARIS!", {"answer": "paris"}), ("Lyon", {"answer": "Paris"})]
    assert rewards(spec, samples) == expected


# --------------------------------------------------------------------------- text_similarity

TEXT = "The quick brown fox jumps over the lazy dog near the river bank"
UNRELATED = "4096 + 17 = 4113; 3 x 8 = 24, 99 / 9 = 11"


@pytest.mark.parametrize("metric", ["fuzzy_match", "bleu", "gleu", "rouge_1", "rouge_2", "rouge_3", "rouge_4", "rouge_5", "rouge_l"])
def test_each_similarity_metric_is_one_on_identical_text_and_low_on_unrelated_text(metric: str) -> None:
    spec = {"type": "text_similarity", "name": "close", "input": ANSWER, "reference": "{{ item.reference }}", "evaluation_metric": metric}
    same, other = rewards(spec, [(TEXT, {"reference": TEXT}), (UNRELATED, {"reference": TEXT})])
    assert same == pytest.approx(1.0) and same <= 1.0
    assert 0.0 <= other < 0.3


def test_similarity_metrics_match_their_libraries() -> None:
    import sacrebleu
    from nltk.translate.gleu_score import sentence_gleu
    from rouge_score import rouge_scorer

    answer, reference = "the cat sat on a mat today", "the cat sat on the mat"
    expected = {"fuzzy_match": fuzz.ratio(answer, reference) / 100, "bleu": sacrebleu.sentence_bleu(answer, [reference]).score / 100,
                "gleu": sentence_gleu([reference.split()], answer.split()),
                "rouge_2": rouge_scorer.RougeScorer(["rouge2"]).score(reference, answer)["rouge2"].fmeasure,
                "rouge_l": rouge_scorer.RougeScorer(["rougeL"]).score(reference, answer)["rougeL"].fmeasure}
    for metric, value in expected.items():
        spec = {"type": "text_similarity", "name": "m", "input": ANSWER, "reference": reference, "evaluation_metric": metric}
        assert rewards(spec, [(answer, {})]) == [pytest.approx(value)], metric
        assert 0.0 < value < 1.0, metric


def test_metrics_crucible_does_not_ship_are_refused_naming_them() -> None:
    for metric in ("cosine", "meteor"):
        with pytest.raises(ValidationError, match=metric):
            SPEC.validate_python({"type": "text_similarity", "name": "m", "input": ANSWER, "reference": "x", "evaluation_metric": metric})


# --------------------------------------------------------------------------- templates


def test_templates_read_the_items_fields_and_the_answer_as_json() -> None:
    spec = {"type": "string_check", "name": "json", "input": "{{ sample.output_json.city }}/{{ item.meta.country }}",
            "reference": "{{ item.city }}/{{ item.values }}", "operation": "eq"}
    item = {"city": "Paris", "meta": {"country": "FR"}, "values": "FR"}  # a row's field named as a dict method is the field
    assert rewards(spec, [(json.dumps({"city": "Paris"}), item), (json.dumps({"city": "Lyon"}), item)]) == [1.0, 0.0]


def test_a_template_that_does_not_render_scores_zero_naming_the_variable_and_the_batch_goes_on() -> None:
    spec = {"type": "string_check", "name": "exact", "input": ANSWER, "reference": "{{ item.answer }}", "operation": "eq"}
    first, second = grade(spec, [("4", {"question": "2+2"}), ("4", {"answer": "4"})])
    assert (first.reward, first.error) == (0.0, "template") and "reference" in first.error_details and "answer" in first.error_details
    assert (second.reward, second.error) == (1.0, None)
    not_json = {**spec, "input": "{{ sample.output_json.answer }}"}
    [result] = grade(not_json, [("plain text", {"answer": "4"})])
    assert result.error == "template" and result.error_details.startswith("input:") and "answer" in result.error_details
    unsafe = {**spec, "input": "{{ item.__class__.__mro__ }}"}
    assert grade(unsafe, [("4", {"answer": "4"})])[0].error == "template"


def test_a_template_that_does_not_parse_is_refused_with_the_spec() -> None:
    with pytest.raises(ValidationError, match="not a valid template"):
        SPEC.validate_python({"type": "string_check", "name": "bad", "input": "{{ sample.output_text ", "reference": "x", "operation": "eq"})


# --------------------------------------------------------------------------- python, in the sandbox

PYTHON = '''
import os, sys

def grade(sample, item):
    text = sample["output_text"]
    print("junk that looks like a result: {\\"i\\": 0, \\"reward\\": 99}", flush=True)
    sys.stdout.write("1e9\\n")
    if text == "raise":
        return 1 / 0
    if text == "string":
        return "1.0"
    if text == "bool":
        return True
    if text == "inf":
        return float("inf")
    if text == "loop":
        while True:
            pass
    if text == "peek":  # look for another sample's answer anywhere the program can read
        seen = sys.stdin.read()
        for name in os.listdir("."):
            with open(name, encoding="utf-8", errors="replace") as handle:
                seen += handle.read()
        return 1.0 if "-".join(["the", "secret", "answer"]) in seen else 0.0  # not spelled whole: this source is readable
    if text == "mutate":
        item["answer"] = "changed"
        return 0.5
    return 1.0 if text == item["answer"] else 0.25 * len(sample["output_json"] or [])
'''


def python_spec(source: str) -> dict[str, Any]:
    return {"type": "python", "name": "py", "source": source}


def test_a_python_grader_grades_the_batch_in_one_sandboxed_program_whatever_each_sample_does() -> None:
    samples = [("42", {"answer": "42"}), ("[1, 2]", {"answer": "42"}), ("raise", {}), ("string", {}), ("bool", {}), ("inf", {}), ("loop", {}),
               ("peek", {}), ("mutate", {"answer": "x"}), ("the-secret-answer", {"answer": "the-secret-answer"}), ("42", {"answer": "42"})]
    started = time.monotonic()
    results = grade(python_spec(PYTHON), samples)
    assert time.monotonic() - started < python_limits(len(samples)).wall_s
    assert [(r.reward, r.error) for r in results] == [
        (1.0, None), (0.5, None), (0.0, "python_runtime"), (0.0, "python_runtime"), (0.0, "python_runtime"), (0.0, "python_runtime"),
        (0.0, "python_timeout"), (0.0, None), (0.5, None), (1.0, None), (1.0, None)]
    assert results[2].error_details == "ZeroDivisionError: division by zero"
    assert "str" in results[3].error_details and "bool" in results[4].error_details and "inf" in results[5].error_details
    assert "CPU" in results[6].error_details


def test_a_python_grader_that_defeats_its_timer_ends_at_the_batchs_cpu_limit() -> None:
    source = '''
def grade(sample, item):
    if sample["output_text"] == "stubborn":
        while True:
            try:
                while True:
                    pass
            except BaseException:
                pass
    return 1.0
'''
    started = time.monotonic()
    results = grade(python_spec(source), [("fine", {}), ("stubborn", {}), ("never reached", {})])
    assert time.monotonic() - started < python_limits(3).wall_s
    assert [(r.reward, r.error) for r in results] == [(1.0, None), (0.0, "python_timeout"), (0.0, "python_timeout")]
    assert "of CPU" in results[2].error_details


@pytest.mark.parametrize(("source", "error", "details"), [
    ("import no_such_module\ndef grade(sample, item):\n    return 1.0\n", "python_runtime", "ModuleNotFoundError"),
    ("def score(sample, item):\n    return 1.0\n", "python_runtime", "no function grade"),
    ("while True:\n    pass\n", "python_timeout", "importing"),
    ("import os\ndef grade(sample, item):\n    os._exit(3)\n", "python_runtime", "exit code 3"),
])
def test_a_source_that_cannot_grade_fails_every_sample_saying_why(source: str, error: str, details: str) -> None:
    results = grade(python_spec(source), [("a", {}), ("b", {})])
    assert [(r.reward, r.error) for r in results] == [(0.0, error)] * 2 and all(details in r.error_details for r in results), results


def test_no_sandbox_here_is_a_503_not_a_zero_reward(monkeypatch: pytest.MonkeyPatch) -> None:
    class NoSandbox:
        name = "none"

        def run(self, *args: Any, **kwargs: Any) -> Any:  # noqa: ANN401
            raise SandboxUnavailable("bubblewrap is not installed")

    monkeypatch.setattr(graders, "configured_sandbox", NoSandbox)
    with pytest.raises(UpstreamUnavailable, match="bubblewrap"):
        grade(python_spec("def grade(sample, item):\n    return 1.0\n"), [("a", {})])


# --------------------------------------------------------------------------- multi


def test_a_multi_grader_combines_its_parts_by_the_formula_per_sample() -> None:
    spec = {"type": "multi", "name": "blend", "calculate_output": "0.5 * exact + 0.5 * close / fuzzy",
            "graders": {"exact": {"type": "string_check", "name": "exact", "input": ANSWER, "reference": "{{ item.answer }}", "operation": "eq"},
                        "close": {"type": "text_similarity", "name": "close", "input": ANSWER, "reference": "{{ item.answer }}",
                                  "evaluation_metric": "fuzzy_match"},
                        "fuzzy": {"type": "string_check", "name": "fuzzy", "input": ANSWER, "reference": "{{ item.answer }}", "operation": "ilike"}}}
    same, case, other, missing = grade(spec, [("Paris", {"answer": "Paris"}), ("PARIS", {"answer": "paris"}), ("Lyon", {"answer": "Paris"}), ("x", {})])
    assert (same.reward, same.sub_rewards, same.error) == (1.0, {"exact": 1.0, "close": 1.0, "fuzzy": 1.0}, None)
    assert case.reward == pytest.approx(0.5 * 0.0 + 0.5 * case.sub_rewards["close"] / 1.0) and case.error is None
    assert (other.reward, other.error) == (0.0, "formula") and "division by zero" in other.error_details  # fuzzy is 0 for Lyon
    assert other.sub_rewards == {"exact": 0.0, "close": pytest.approx(fuzz.ratio("Lyon", "Paris") / 100), "fuzzy": 0.0}
    assert (missing.error, missing.reward) == ("formula", 0.0)  # every part failed its template: 0 / 0


def test_a_multi_graders_parts_errors_are_reported_and_count_zero() -> None:
    spec = {"type": "multi", "name": "sum", "calculate_output": "exact + 0.5",
            "graders": {"exact": {"type": "string_check", "name": "exact", "input": ANSWER, "reference": "{{ item.answer }}", "operation": "eq"}}}
    [result] = grade(spec, [("4", {})])
    assert (result.reward, result.error, result.sub_rewards) == (0.5, "template", {"exact": 0.0}) and result.error_details.startswith("exact: reference")


# --------------------------------------------------------------------------- model graders (a stand-in inference: parsing only)


@dataclass
class Inference:
    """Answers a chat call with ``answers[the last message's last line]`` (or raises it; calls run concurrently, so not
    in order) and keeps the requests."""

    answers: dict[str, Any]
    requests: list[ChatCompletionRequest] = field(default_factory=list)

    def chat_completions(self, ctx: RunContext, body: ChatCompletionRequest, **metering: Any) -> ChatCompletion:  # noqa: ANN401
        assert ctx == CTX and metering == {}  # the run's own metering: no hold of the grader's
        self.requests.append(body)
        answer = self.answers[body.messages[-1].content.splitlines()[-1]]
        if isinstance(answer, Exception):
            raise answer
        return ChatCompletion.model_validate({"id": "c", "created": 0, "model": body.model, "usage": {"prompt_tokens": 20, "completion_tokens": 3, "total_tokens": 23},
                                              "choices": [{"index": 0, "message": {"role": "assistant", "content": answer}, "finish_reason": "stop"}]})


SCORE_MODEL = {"type": "score_model", "name": "judge", "model": "smollm2-135m-instruct", "range": [0, 10],
               "input": [{"role": "developer", "content": "Score the answer from 0 to 10."},
                         {"role": "user", "content": [{"type": "input_text", "text": "Q: {{ item.question }}"}, {"type": "input_text", "text": "A: " + ANSWER}]}],
               "sampling_params": {"temperature": 0, "seed": 7, "max_completions_tokens": 32}}


def test_a_score_model_answer_is_read_clipped_and_its_tokens_counted() -> None:
    answers = ['{"result": 7.5, "reason": "close to 3 of 4"}', "I'd say 4/10, maybe 6", "Score: 42", "no idea", '```json\n{"score": -3}\n```']
    inference = Inference({f"A: {i}": answer for i, answer in enumerate(answers)})
    results = grade(SCORE_MODEL, [(str(i), {"question": "Capital of France?"}) for i in range(5)], inference)
    assert [(r.reward, r.error, r.model_tokens) for r in results] == [(7.5, None, 23), (6.0, None, 23), (10.0, None, 23), (0.0, "model_parse", 23),
                                                                        (0.0, None, 23)]
    sent = next(r for r in inference.requests if r.messages[-1].content.endswith("A: 0"))
    assert [(m.role, m.content) for m in sent.messages] == [("system", "Score the answer from 0 to 10."), ("user", "Q: Capital of France?\nA: 0")]
    assert (sent.temperature, sent.seed, sent.max_tokens) == (0.0, 7, 32)


def test_score_and_label_parsing() -> None:
    assert parse_score('{"score": 0.2} then {"result": 0.9}') == 0.9 and parse_score("1e999 and .5") == 0.5 and parse_score("none") is None
    labels = ["correct", "incorrect", "partially correct"]
    assert parse_label("  INCORRECT ", labels) == "incorrect" and parse_label("It is partially correct overall.", labels) == "partially correct"
    assert parse_label("The answer is incorrect, not correct.", labels) == "incorrect" and parse_label("incorrectly", labels) is None


def test_a_label_model_passes_its_passing_labels_only() -> None:
    spec = {"type": "label_model", "name": "judge", "model": "smollm2-135m-instruct", "labels": ["correct", "incorrect"], "passing_labels": ["correct"],
            "input": [{"role": "user", "content": "Is {{ sample.output_text }} the capital of {{ item.country }}?"}]}
    inference = Inference({"Is Paris the capital of France?": "Correct.", "Is Lyon the capital of France?": "incorrect",
                           "Is Nice the capital of France?": "maybe"})
    results = grade(spec, [(city, {"country": "France"}) for city in ("Paris", "Lyon", "Nice")], inference)
    assert [(r.reward, r.error, r.model_tokens) for r in results] == [(1.0, None, 23), (0.0, None, 23), (0.0, "model_parse", 23)]
    [missing] = grade(spec, [("Paris", {})], Inference({}))  # no call is made for a sample whose template fails
    assert (missing.error, missing.model_tokens) == ("template", 0)


def test_inferences_refusals_fail_the_batch_and_its_server_errors_the_sample() -> None:
    budget = UpstreamProblem({"status": 402, "code": "budget_exhausted", "detail": "budget exhausted", "remaining_usd_micros": 0})
    with pytest.raises(UpstreamProblem) as refused:
        grade(SCORE_MODEL, [("a", {"question": "q"}), ("b", {"question": "q"})], Inference({"A: a": "5", "A: b": budget}))
    assert refused.value.status == 402
    crashed = UpstreamProblem({"status": 500, "code": "internal_error", "detail": "engine crashed"})
    results = grade(SCORE_MODEL, [("a", {"question": "q"}), ("b", {"question": "q"})], Inference({"A: a": "5", "A: b": crashed}))
    assert [(r.reward, r.error) for r in results] == [(5.0, None), (0.0, "model_server")]


# --------------------------------------------------------------------------- the route

TRAINER_TOKEN = "trainer-token-for-grader-tests"
EXACT = {"type": "string_check", "name": "exact", "input": ANSWER, "reference": "{{ item.answer }}", "operation": "eq"}


@pytest.fixture(scope="module")
def trainer(served: Served) -> GraderClient:
    """The trainer's client of this module's grader, which trusts the trainer's token as a deployment configures it."""
    served.service.settings.trusted_tokens["trainer"] = TRAINER_TOKEN
    return GraderClient(in_process(TestClient(served.http.app, base_url="http://grader"), TRAINER_TOKEN, "grader"))


def test_the_gateway_and_the_trainer_run_graders_for_a_run(served: Served, trainer: GraderClient) -> None:
    ctx = served.ctx("run_graders_route")
    body = GraderRunRequest(grader=SPEC.validate_python(EXACT), samples=[GraderSample(output_text="4", item={"answer": "4"}),
                                                                         GraderSample(output_text="5", item={"answer": "4"})])
    for client in (served.grader, trainer):
        assert [(r.reward, r.error) for r in client.run_grader(ctx, body).data] == [(1.0, None), (0.0, None)]
    judge = GraderRunRequest(grader=SPEC.validate_python(SCORE_MODEL), samples=[GraderSample(output_text="Paris", item={"question": "q"})])
    [judged] = served.grader.run_grader(ctx, judge).data  # the stand-in inference answers "0" with 11 tokens
    assert (judged.reward, judged.error, judged.model_tokens) == (0.0, None, 11)


def test_the_grader_route_needs_a_trusted_service_and_a_run(served: Served) -> None:
    ctx = RunContext(run_id="run_graders_auth", task_id=served.task_id)
    body = {"grader": EXACT, "samples": [{"output_text": "4", "item": {"answer": "4"}}]}
    assert problem(served.http.post("/internal/graders/run", json=body, headers={"Authorization": f"Bearer {GATEWAY_TOKEN}"}), 401)["code"] == "unauthorized"
    runs_key = run_headers(ctx, GATEWAY_TOKEN) | {"Authorization": "Bearer crk_a-run-key"}
    assert problem(served.http.post("/internal/graders/run", json=body, headers=runs_key), 401)["code"] == "unauthorized"
    assert served.http.post("/internal/graders/run", json=body, headers=run_headers(ctx, GATEWAY_TOKEN)).status_code == 200


def test_a_bad_grader_is_a_422_and_an_exhausted_budget_a_402(served: Served) -> None:
    ctx = served.ctx("run_graders_refused")
    headers = run_headers(ctx, GATEWAY_TOKEN)
    cosine = {"grader": {"type": "text_similarity", "name": "close", "input": ANSWER, "reference": "4", "evaluation_metric": "cosine"},
              "samples": [{"output_text": "4"}]}
    assert problem(served.http.post("/internal/graders/run", json=cosine, headers=headers), 422)["code"] == "invalid_input"
    unknown = {"grader": {**EXACT, "weight": 2}, "samples": [{"output_text": "4"}]}
    assert "weight" in json.dumps(problem(served.http.post("/internal/graders/run", json=unknown, headers=headers), 422))

    def broke(request: httpx.Request) -> httpx.Response:
        return httpx.Response(402, json={"status": 402, "title": "Budget cannot cover this request", "code": "budget_exhausted",
                                         "detail": "the run's budget cannot cover this call", "remaining_usd_micros": 12})

    kept = served.service.inference
    served.service.inference = InferenceClient(stand_in("inference", broke))
    try:
        answer = problem(served.http.post("/internal/graders/run", json={"grader": SCORE_MODEL, "samples": [{"output_text": "4", "item": {"question": "q"}}]},
                                          headers=headers), 402)
    finally:
        served.service.inference = kept
    assert (answer["code"], answer["remaining_usd_micros"]) == ("budget_exhausted", 12)


def test_the_grader_route_documents_its_errors(served: Served) -> None:
    route = served.http.get("/openapi.json").json()["paths"]["/internal/graders/run"]["post"]
    assert {"401", "402", "404", "422", "503"} <= set(route["responses"])


@pytest.mark.parametrize("formula", ["9**9**9", "2 ^ 10**10", "10**400", "a * 10**400"])
def test_a_formula_too_large_to_compute_is_refused_at_once(formula: str) -> None:
    """A tester's ``9**9**9`` held the gateway's event loop when the grader was validated, and ``10**400`` was a 500:
    simpleeval's guarded operators refuse the first, the finiteness check the second, in microseconds."""
    with pytest.raises(FormulaError):
        evaluate_formula(formula, {"a": 1.0})


def test_a_template_that_builds_a_huge_string_is_a_template_error_not_a_minute_of_the_graders_time() -> None:
    with pytest.raises(jinja2.exceptions.SecurityError):
        TEMPLATES.from_string("{{ 'x' * 10**9 }}").render(sample={}, item={})
    assert TEMPLATES.from_string("{{ 'ab' * 3 }} {{ 2 ** 3 }}").render(sample={}, item={}) == "ababab 8"
