"""The inference service's routes in this process (the app of ``conftest.py``). Calls are made as the gateway would,
through :class:`InferenceClient`, or raw where the request itself is wrong."""

from __future__ import annotations

import httpx
import pytest
from fastapi.testclient import TestClient
from inference_service.client import InferenceClient
from inference_service.models import CompletionLog
from sqlalchemy import select

from services.common.auth import RunContext, run_headers
from services.common.errors import UpstreamProblem
from services.common.openai_protocol import ChatCompletionRequest, ChatMessage
from services.ledger.client import LedgerClient
from services.ledger.schemas import EntryType, HoldCreate, HoldStatus, UsageItem, UsageKind
from tests.unit.inference.conftest import GATEWAY_TOKEN, INFERENCE_TOKEN, MODEL, REAL_MODEL, run

ROUTES = [("GET", "/internal/models"), ("GET", f"/internal/models/{MODEL}"), ("POST", "/internal/chat/completions"), ("POST", "/internal/completions"),
          ("POST", "/internal/chat/prompt-tokens")]


def ask(max_tokens: int = 3, model: str = MODEL) -> ChatCompletionRequest:
    return ChatCompletionRequest(model=model, messages=[ChatMessage(role="user", content="What is 2 + 3?")], max_tokens=max_tokens, temperature=0)


def problem(resp: httpx.Response, status: int) -> dict:
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"].startswith("application/problem+json")
    return resp.json()


@pytest.mark.parametrize(("method", "path"), ROUTES)
def test_every_route_refuses_a_caller_without_a_service_token(served: TestClient, method: str, path: str) -> None:
    for authorization in ("", "Bearer crk_a-run-key", f"Bearer {INFERENCE_TOKEN}"):  # none, a run key, a token inference does not trust
        body = problem(served.request(method, path, headers={"Authorization": authorization}, json=ask().model_dump()), 401)
        assert body["code"] == "unauthorized"


def test_a_forged_run_context_is_refused(served: TestClient) -> None:
    forged = run_headers(RunContext(run_id="run_other", task_id="bench_t"), "not-the-gateway-token")
    assert problem(served.get("/internal/models", headers=forged), 401)["code"] == "unauthorized"


def test_models_lists_the_loaded_base_models(served: TestClient, inference: InferenceClient) -> None:
    names = sorted([MODEL, REAL_MODEL])  # loaded in the registry's order, by name
    assert served.get("/internal/models").json() == {"object": "list", "data": [{"id": n, "object": "model", "owned_by": "crucible"} for n in names]}
    assert [m.id for m in inference.list_models().data] == names


def test_a_base_model_resolves_to_itself_without_adapter(served: TestClient, inference: InferenceClient) -> None:
    assert served.get(f"/internal/models/{MODEL}").json() == {"id": MODEL, "object": "model", "owned_by": "crucible", "base_model": MODEL, "adapter": None}
    detail = inference.get_model(RunContext(run_id="run_x", task_id="bench_t"), MODEL)
    assert (detail.base_model, detail.adapter) == (MODEL, None)


@pytest.mark.parametrize("model", ["gpt-4o", "ckpt_01jd3k5n8q2x7v4w9z6y3t1r0s"])
def test_an_unknown_model_is_a_404_problem(served: TestClient, inference: InferenceClient, model: str) -> None:
    body = problem(served.get(f"/internal/models/{model}"), 404)
    assert body["code"] == "not_found" and model in body["detail"]
    with pytest.raises(UpstreamProblem) as exc:
        inference.get_model(None, model)
    assert exc.value.status == 404


def test_a_completion_for_an_unknown_model_is_a_422_naming_model(inference: InferenceClient, ledger: LedgerClient) -> None:
    with pytest.raises(UpstreamProblem) as exc:
        inference.chat_completions(run(ledger, "run_unknown_model"), ask(model="gpt-4o"))
    assert (exc.value.status, exc.value.problem["field"]) == (422, "model")


def test_a_metered_completion_needs_a_run_context(inference: InferenceClient) -> None:
    with pytest.raises(UpstreamProblem) as exc:
        inference.chat_completions(None, ask())
    assert (exc.value.status, exc.value.problem["field"]) == (422, "model")
    assert "run context" in exc.value.problem["detail"]


@pytest.mark.parametrize(("body", "headers", "field"), [
    ({"messages": [{"role": "user", "content": "hi"}]}, {}, "model"),
    ({"model": MODEL, "messages": []}, {}, "messages"),
    ({"model": MODEL, "messages": [{"role": "robot", "content": "hi"}]}, {}, "messages.0.role"),
    ({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}, {}, "max_tokens"),
    ({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}, {"X-Crucible-Context-Tokens": "0"}, "x-crucible-context-tokens"),
])
def test_a_bad_completion_request_is_a_422_naming_the_field(served: TestClient, body: dict, headers: dict, field: str) -> None:
    problem_body = problem(served.post("/internal/chat/completions", json=body, headers=headers), 422)
    assert (problem_body["code"], problem_body["field"]) == ("invalid_input", field)


def test_a_prompt_over_the_context_is_refused_before_any_charge(inference: InferenceClient, ledger: LedgerClient) -> None:
    ctx = run(ledger, "run_context")
    with pytest.raises(UpstreamProblem) as exc:
        inference.chat_completions(ctx, ask(max_tokens=8), context_tokens=16)
    assert (exc.value.code, exc.value.problem["field"], exc.value.problem["context_tokens"]) == ("context_exceeded", "messages", 16)
    assert [e.type for e in ledger.list_entries(ctx.run_id)] == [EntryType.grant]


def test_a_completion_beyond_the_budget_is_the_ledgers_402(inference: InferenceClient, ledger: LedgerClient) -> None:
    ctx = run(ledger, "run_broke", budget_usd_micros=0)
    with pytest.raises(UpstreamProblem) as exc:
        inference.chat_completions(ctx, ask())
    assert exc.value.status == 402 and "remaining_usd_micros" in exc.value.problem


def test_a_completion_is_generated_and_its_tokens_charged_to_the_run(served: TestClient, inference: InferenceClient, ledger: LedgerClient) -> None:
    ctx = run(ledger, "run_chat")
    out = inference.chat_completions(ctx, ask(max_tokens=3))
    assert out.model == MODEL and out.choices[0].message.role == "assistant" and out.choices[0].message.content
    assert 1 <= out.usage.completion_tokens <= 3 and out.usage.total_tokens == out.usage.prompt_tokens + out.usage.completion_tokens
    balance = ledger.get_balance(ctx.run_id)
    assert balance.held_usd_micros == 0 and balance.spent_usd_micros > 0
    assert (balance.usage_by_kind["prefill_tokens"] + balance.usage_by_kind["cached_prefill_tokens"], balance.usage_by_kind["decode_tokens"]) == (
        out.usage.prompt_tokens, out.usage.completion_tokens)
    assert [h.status for h in ledger.list_holds(ctx.run_id)] == [HoldStatus.settled]
    with served.app.state.inference.db.session() as s:
        logged = s.scalars(select(CompletionLog).where(CompletionLog.id == out.id)).one()
    assert (logged.run_id, logged.metered, logged.completion_tokens) == (ctx.run_id, True, out.usage.completion_tokens)


def test_a_billed_prompt_is_what_the_call_reports_and_is_charged_for(inference: InferenceClient, ledger: LedgerClient) -> None:
    ctx = run(ledger, "run_billed")
    hidden = ask(max_tokens=1).model_copy(update={"messages": [ChatMessage(role="system", content="A hidden harness prompt. " * 8), *ask().messages]})
    own, full = inference.chat_prompt_tokens(ctx, [ask(), hidden], context_tokens=512).prompt_tokens
    assert own < full and inference.chat_prompt_tokens(ctx, [ask()], context_tokens=512).context_tokens == [512]
    out = inference.chat_completions(ctx, hidden, billed_prompt_tokens=own, billed_model=MODEL)
    assert (out.usage.prompt_tokens, out.usage.prompt_tokens_details.cached_tokens) == (own, 0)
    usage = ledger.get_balance(ctx.run_id).usage_by_kind
    assert (usage["prefill_tokens"], usage.get("cached_prefill_tokens", 0), usage["decode_tokens"]) == (own, 0, out.usage.completion_tokens)


def test_a_repeated_call_against_an_evaluation_hold_is_charged_once(inference: InferenceClient, ledger: LedgerClient) -> None:
    ctx = run(ledger, "run_eval")
    hold = ledger.create_hold(HoldCreate(account_id=ctx.run_id, usage=[UsageItem(kind=UsageKind.decode_tokens, quantity=10_000)],
                                         purpose="evaluation", idempotency_key="eval-hold"))
    first = inference.chat_completions(ctx, ask(), hold_id=hold.hold_id, idempotency_key="ev:item:0")
    again = inference.chat_completions(ctx, ask(), hold_id=hold.hold_id, idempotency_key="ev:item:0")
    assert again.choices[0].message.content == first.choices[0].message.content
    charged = ledger.get_hold(hold.hold_id)
    assert charged.status == HoldStatus.open and charged.charged_usd_micros > 0
    assert ledger.get_balance(ctx.run_id).usage_by_kind["decode_tokens"] == first.usage.completion_tokens


def test_test_grading_is_not_charged(inference: InferenceClient, ledger: LedgerClient) -> None:
    ctx = run(ledger, "run_graded")
    inference.chat_completions(ctx, ask(), unmetered=True)
    assert [e.type for e in ledger.list_entries(ctx.run_id)] == [EntryType.grant]


def test_messages_as_openai_sends_them_are_served_and_other_parts_refused(served: TestClient, ledger: LedgerClient) -> None:
    """Text parts are joined, the developer role is the system role; an image part is a 422 naming the message's content."""
    import openai

    ctx = run(ledger, "run_message_forms")
    client = openai.OpenAI(base_url="http://inference/internal", api_key=GATEWAY_TOKEN, http_client=served,
                           default_headers=run_headers(ctx, GATEWAY_TOKEN), max_retries=0)
    parts = client.chat.completions.create(model=MODEL, max_tokens=4, temperature=0, messages=[
        {"role": "developer", "content": "Answer with a number."},
        {"role": "user", "content": [{"type": "text", "text": "What is 2 + "}, {"type": "text", "text": "3?"}]}])
    plain = client.chat.completions.create(model=MODEL, max_tokens=4, temperature=0, messages=[
        {"role": "system", "content": "Answer with a number."}, {"role": "user", "content": "What is 2 + 3?"}])
    assert parts.choices[0].message.content == plain.choices[0].message.content
    assert parts.usage.prompt_tokens == plain.usage.prompt_tokens
    with pytest.raises(openai.UnprocessableEntityError) as exc:
        client.chat.completions.create(model=MODEL, max_tokens=2, messages=[
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}])
    assert exc.value.param == "messages.0.content" and "image_url" in exc.value.message
