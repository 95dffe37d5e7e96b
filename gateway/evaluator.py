"""The evaluator track at the gateway: a run reaches its benchmark's candidate systems only under their opaque names.

On an evaluator-track run, inference serves exactly the candidates (``candidate-01`` …, :mod:`services.common.candidates`):

- ``GET /v1/models`` lists them, and nothing else;
- ``POST /v1/chat/completions`` with ``model: candidate-NN`` is answered by that candidate's system (its harness applied,
  :func:`services.common.candidates.candidate_request`), metered as any call of the run, its answer, stream events and
  errors naming the candidate, never the model behind it; any other ``model`` is a 422 naming ``model``;
- legacy ``POST /v1/completions`` is refused (422 naming ``model``): a candidate is a chat system.

**Nothing but the answer depends on a candidate's hidden harness** (DESIGN §1, sealed targets): what a run can read of
a call, beside the completion itself, is the same for every candidate (:func:`admitted`):

- ``usage.prompt_tokens`` counts the run's own messages, rendered by one model's chat template for every candidate (the
  model of the first candidate by name), none reported as cached: never the harness's system prompt or template;
- the charge is for those tokens and the completion's, priced as that one model's (the ledger's usage kinds, so
  ``GET /v1/budget`` says nothing more than ``usage``), and never a prompt-cache hit on the harness's prefix;
- the context check is one for all: a request is refused with 422 ``context_exceeded`` (field ``messages``) when it does
  not fit *some* candidate's context with that candidate's harness and answer cap, whichever it names, so the limit a
  run can find by trying is the same for every candidate;
- the answer, its stream and its errors name the candidate, never its model; inference sets no
  ``system_fingerprint``. How long a call takes is the model's own time and is not masked.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

from gateway.benchmarks import named_candidates
from gateway.service import Caller, Gateway
from services.common.candidates import candidate_request, renamed
from services.common.contracts import Page, SystemSpec
from services.common.errors import Unprocessable, UpstreamProblem, with_openai_error
from services.common.openai_protocol import ChatCompletion, ChatCompletionRequest, ModelOut

TRACK = "evaluator"


def on_track(caller: Caller) -> bool:
    """Whether ``caller``'s run is on the evaluator track."""
    return caller.run.track == TRACK


def candidates(caller: Caller) -> dict[str, SystemSpec]:
    """The run's candidates by opaque name: the names its benchmark's targets were registered with (under the key kept
    with the benchmark, :func:`gateway.benchmarks.named_candidates`)."""
    return named_candidates(caller.benchmark, caller.candidate_key or "")


def code_part(caller: Caller) -> str:
    """The editable part a code archive belongs to: the evaluator on the evaluator track (its archives are
    evaluators), else the harness."""
    return "evaluator" if on_track(caller) else "harness"


def models(caller: Caller) -> Page[ModelOut]:
    """The candidates as OpenAI models."""
    return Page[ModelOut](data=[ModelOut(id=name) for name in candidates(caller)])


def _system(caller: Caller, model: str) -> SystemSpec:
    served = candidates(caller)
    if model not in served:
        raise Unprocessable(f"model {model!r}: an evaluator-track run calls its candidates only ({', '.join(served)})", field="model")
    return served[model]


def refuse_completions(model: str) -> None:
    """Legacy completions on the evaluator track: always a 422 naming ``model``."""
    raise Unprocessable(f"model {model!r}: a candidate is a chat system; call it with POST /v1/chat/completions", field="model")


_CANDIDATE_PROBLEM = {"context_exceeded": "the messages do not fit the candidates' context with their answer caps; send fewer or shorter messages"}


class CandidateContextExceeded(Unprocessable):
    """The run's messages do not fit some candidate (the same refusal whichever candidate was named)."""

    code, title = "context_exceeded", "The prompt and max_tokens exceed the context length"


async def admitted(gw: Gateway, caller: Caller, req: ChatCompletionRequest) -> tuple[ChatCompletionRequest, int, str]:
    """The request candidate ``req.model`` gets, the run's own prompt tokens and the model they are counted and priced
    as (see the module docstring). ``Unprocessable`` naming ``model`` for an unknown candidate;
    :class:`CandidateContextExceeded` when the messages do not fit every candidate; inference's problems as the run
    sees them (:func:`_candidate_problem`)."""
    system = _system(caller, req.model)
    served = candidates(caller)
    names = sorted(served)
    reference = served[names[0]].model
    asks = [candidate_request(req, served[name]) for name in names]
    try:
        counted = await gw.inference.chat_prompt_tokens(caller.ctx, [req.model_copy(update={"model": reference}), *asks],
                                                        context_tokens=caller.benchmark.evaluation.context_tokens)
    except UpstreamProblem as exc:
        raise UpstreamProblem(_candidate_problem(exc.problem, req.model)) from None
    own, *prompts = counted.prompt_tokens
    if any(tokens + (ask.max_tokens or 0) > context for ask, tokens, context in zip(asks, prompts, counted.context_tokens[1:], strict=True)):
        raise CandidateContextExceeded(f"{req.model}: {_CANDIDATE_PROBLEM['context_exceeded']}", field="messages")
    return candidate_request(req, system), own, reference
_KEPT = ("type", "title", "status", "code", "field", "retry_after_s")


def _candidate_problem(problem: dict[str, Any], name: str) -> dict[str, Any]:
    """Inference's problem of a candidate call, as the run sees it: its type, status, code, field and retry delay, and a
    detail that names the candidate and nothing of its system (inference's own detail may quote the candidate's
    ``max_tokens``, its prompt's length with the system prompt, or its model)."""
    code = str(problem.get("code", ""))
    detail = f"{name}: {_CANDIDATE_PROBLEM.get(code, problem.get('title') or 'the candidate could not answer this request')}"
    at_fault = {"field": "messages"} if code == "context_exceeded" else {}  # inference's own field says whether the prompt alone fits
    return with_openai_error({k: v for k, v in problem.items() if k in _KEPT} | {"detail": detail} | at_fault)


def _masked(value: Any, model: str, name: str) -> Any:
    """``value`` (an event) with every mention of ``model`` replaced by ``name``."""
    if isinstance(value, str):
        return value.replace(model, name)
    if isinstance(value, dict):
        return {k: _masked(v, model, name) for k, v in value.items()}
    if isinstance(value, list):
        return [_masked(v, model, name) for v in value]
    return value


async def chat(gw: Gateway, caller: Caller, req: ChatCompletionRequest) -> ChatCompletion:
    """A non-streamed chat completion of the candidate ``req.model`` (see the module docstring)."""
    ask, own, reference = await admitted(gw, caller, req)
    try:
        out = await gw.inference.chat_completions(caller.ctx, ask, context_tokens=caller.benchmark.evaluation.context_tokens,
                                                  billed_prompt_tokens=own, billed_model=reference)
    except UpstreamProblem as exc:
        raise UpstreamProblem(_candidate_problem(exc.problem, req.model)) from None
    return renamed(out, req.model)


@contextlib.asynccontextmanager
async def chat_stream(gw: Gateway, caller: Caller, req: ChatCompletionRequest) -> AsyncIterator[AsyncIterator[bytes]]:
    """A streamed chat completion of the candidate ``req.model``: inference's server-sent events, each naming the
    candidate. Opening it raises as :func:`chat` does."""
    ask, own, reference = await admitted(gw, caller, req)
    try:
        async with gw.inference.chat_completions_stream(caller.ctx, ask, context_tokens=caller.benchmark.evaluation.context_tokens,
                                                        billed_prompt_tokens=own, billed_model=reference) as chunks:
            yield _renamed_events(chunks, ask.model, req.model)
    except UpstreamProblem as exc:
        raise UpstreamProblem(_candidate_problem(exc.problem, req.model)) from None


async def _renamed_events(chunks: AsyncIterator[bytes], model: str, name: str) -> AsyncIterator[bytes]:
    """Server-sent events with ``model`` replaced by ``name`` in each ``data:`` event (events may span chunks)."""
    pending = b""
    async for chunk in chunks:
        pending += chunk
        *lines, pending = pending.split(b"\n")
        yield b"".join(_renamed_line(line, model, name) + b"\n" for line in lines)
    if pending:
        yield _renamed_line(pending, model, name)


def _renamed_line(line: bytes, model: str, name: str) -> bytes:
    if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
        return line
    try:
        event = json.loads(line[6:])
    except ValueError:
        return line
    return b"data: " + json.dumps(_masked(event, model, name), separators=(",", ":")).encode()
