"""Candidate systems of the evaluator track, as a research agent and its evaluator reach them.

An evaluator-track benchmark names its candidates (systems: a model and a declarative harness). A run never learns
which is which: each is served under an opaque name, ``candidate-01`` … (:func:`assign`), in an order drawn from a
deployment's key, so neither the benchmark file's order nor a model's name tells a candidate's identity.

Served as a chat model under its name (the gateway's ``/v1/chat/completions`` for the run, the grader's rollout
endpoint for an evaluator's sandbox), a candidate answers as its system does (:func:`candidate_request`):

- its harness's system prompt comes first, before the request's own messages;
- its user template is applied to the text of each user message (``{{ question }}`` is that text);
- its temperature and top_p replace the request's, its ``max_tokens`` caps the request's (and is the default), and
  its stop strings are added to the request's;
- the answer names the candidate, never the model (:func:`renamed`).
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Sequence

from services.common.contracts import Harness, SystemSpec
from services.common.harness import render_user
from services.common.openai_protocol import ChatCompletion, ChatCompletionRequest, ChatMessage

MAX_CANDIDATES = 99


def assign(systems: Sequence[SystemSpec], key: str) -> dict[str, SystemSpec]:
    """Opaque name → system for ``systems`` (at most :data:`MAX_CANDIDATES`): ``candidate-01`` … in the order of
    ``HMAC-SHA256(key, "<index>:<system as JSON>")``, so the same key and systems give the same names and, without the
    key, a name says nothing of the system behind it. Raises ``ValueError`` for more than 99 systems."""
    if len(systems) > MAX_CANDIDATES:
        raise ValueError(f"at most {MAX_CANDIDATES} candidates; got {len(systems)}")

    def rank(i: int) -> str:
        system = json.dumps(systems[i].model_dump(mode="json"), sort_keys=True)
        return hmac.new(key.encode(), f"{i}:{system}".encode(), hashlib.sha256).hexdigest()

    order = sorted(range(len(systems)), key=rank)
    return {f"candidate-{n:02d}": systems[i] for n, i in enumerate(order, start=1)}


def candidate_request(body: ChatCompletionRequest, system: SystemSpec, *, max_tokens_cap: int | None = None) -> ChatCompletionRequest:
    """``body`` (which names the candidate) as the candidate's system makes it (see the module docstring), naming the
    system's model. ``max_tokens_cap``: a further cap (the rollout endpoint's). Template errors cannot happen here:
    a candidate's harness is checked when its benchmark is loaded."""
    harness = system.harness or Harness()
    messages = [ChatMessage(role="system", content=harness.system_prompt)] if harness.system_prompt else []
    for m in body.messages:
        messages.append(m.model_copy(update={"content": render_user(harness, m.content)}) if m.role == "user" and m.content is not None else m)
    asked = body.max_completion_tokens or body.max_tokens
    cap = min(x for x in (harness.max_tokens, max_tokens_cap) if x is not None)
    stop = body.stop if isinstance(body.stop, list) else ([body.stop] if body.stop else [])
    stop = list(dict.fromkeys([*stop, *(harness.stop or [])]))[:4] or None
    return body.model_copy(update={"model": system.model, "messages": messages, "max_tokens": min(asked or cap, cap), "max_completion_tokens": None,
                                   "temperature": harness.temperature, "top_p": harness.top_p, "stop": stop})


def renamed(out: ChatCompletion, name: str) -> ChatCompletion:
    """The answer ``out`` naming candidate ``name`` instead of its model."""
    return out.model_copy(update={"model": name})
