"""The rollout model endpoint: the one network peer of a code harness's sandbox.

Each eval worker process serves one small OpenAI-compatible HTTP app (:class:`ModelEndpoint`), on a Unix socket of
each rollout's own, opened when the rollout is bound and closed when it ends. The sandbox backends bind that socket
into the rollout's sandbox, where the sandbox's init forwards ``127.0.0.1:8000`` to it, and the harness gets
``OPENAI_BASE_URL=http://127.0.0.1:8000/v1`` and ``OPENAI_API_KEY=<token>``. What one rollout may take of the worker is
capped on its socket, so a harness can exhaust only its own rollout (:class:`_CappedH11`):

- at most :data:`MAX_CONNECTIONS` connections open at once; one more is closed as soon as it is accepted, before a
  byte of it is read (a harness holding thousands of half-open connections holds that many of the worker's files);
- a request's line, headers and body must all arrive within :data:`READ_TIMEOUT_S` seconds of the connection (or of
  the last answer on it); headers of at most 16 KiB (uvicorn's h11 limit), a body of at most :data:`MAX_BODY_BYTES`
  (413) and :data:`MAX_MESSAGES` messages (422); a connection idle :data:`KEEP_ALIVE_S` seconds after an answer is
  closed, and any still open when the rollout ends is cut soon after.

A token is bound to one rollout (:class:`Binding`) for as long as it runs, is accepted on that rollout's socket alone,
and is useless after:

- it serves exactly the rollout's model (the evaluated base model or checkpoint; for an evaluator's rollout, one
  candidate system under its opaque name, :mod:`services.common.candidates`); a request naming any other model is a
  404 ``model_not_found``, whoever owns it;
- every completion is charged against the evaluation's budget hold under the idempotency key
  ``<eval>:<item>:<sample>:<call>`` (test grading: not charged), through inference's own metering; a candidate's call
  is reported, counted and charged for the evaluator's own messages, never its hidden harness's prompt;
- at most ``max_calls`` completions per rollout (429 after), and at most ``max_total_tokens`` tokens where it is set (a
  call made once they are spent is a 429), :data:`MAX_INFLIGHT` at once (429 beyond), one choice
  each (``n`` > 1: 422), ``max_tokens`` at most the benchmark's cap (a request without it gets the cap; one asking for
  more is a 422 naming ``max_tokens``), the evaluation's context length;
- a call whose harness is gone (it ended, or was killed) still completes, is charged and recorded: the rollout waits
  for it before it ends (:meth:`ModelEndpoint.unbind`), while the evaluation's hold is still open;
- ``stream: true`` is refused (422 naming ``stream``): a harness reads whole answers;
- every call is recorded (request messages, the answer, token counts) for the rollout's trajectory.

**The null model** (a binding's ``null_model``; the null-model ablation of final grading and of a validation evaluation
that asks for it): the rollout sees the same API, under the same caps and refusals, but every completion is one empty
assistant message (``finish_reason`` ``stop``, zero tokens) answered here, without an inference call, and so uncharged.
What a harness scores against it is what it scores without a model (``model_free_score``).

Routes: ``GET /v1/models`` (the bound model), ``POST /v1/chat/completions``, and no other (no docs, health or metrics:
a 404). Errors are problem+json with OpenAI's
``message``/``param``, as on the gateway, so an unmodified ``openai`` client reads them.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import itertools
import secrets
import socket
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import h11
import structlog
import uvicorn
from fastapi import Depends, Header, Request
from prometheus_client import Counter, Gauge, Histogram
from pydantic import Field
from uvicorn.protocols.http.h11_impl import H11Protocol

from grader.sandboxes.base import MODEL_PORT, WORKSPACE_PREFIX
from grader.schemas import RolloutModels
from grader.service import Grader
from services.common.app import create_service_app
from services.common.auth import RunContext
from services.common.candidates import candidate_request, renamed
from services.common.contracts import SystemSpec
from services.common.errors import NotFound, TooManyRequests, Unauthorized, Unprocessable, problem_responses
from services.common.openai_protocol import AssistantMessage, ChatChoice, ChatCompletion, ChatCompletionRequest, ChatMessage, ModelOut, Usage
from services.common.processes import process_tag

log = structlog.get_logger("grader")

MAX_BODY_BYTES = 2 * 1024 * 1024
"""The largest request body a harness may send (bytes); larger is a 413."""

MAX_MESSAGES = 1024
"""The most messages one chat request may carry (422 naming ``messages`` beyond), so that validating a body costs the
worker little whatever it holds (a million empty messages were a million validation errors, gigabytes, on the loop
every rollout shares)."""

MAX_INFLIGHT = 2
"""Model calls one rollout may have in flight at once (a 429 ``calls_in_flight`` beyond)."""

MAX_CONNECTIONS = 16
"""Connections one rollout may hold open to its socket at once; one more is closed on arrival."""

READ_TIMEOUT_S = 30.0
"""Seconds a connection has to send a whole request (line, headers and body), from its start or the last answer."""

KEEP_ALIVE_S = 5.0
"""Seconds an idle connection is kept after an answer."""

CALLS = Counter("crucible_rollout_model_calls_total", "Chat completions rollouts asked of this worker's model endpoint, by HTTP status", ["status"])
CALL_SECONDS = Histogram("crucible_rollout_model_call_seconds", "Seconds a rollout's chat completion took at the model endpoint")
SOCKETS = Gauge("crucible_rollout_sockets_open", "Rollouts bound to this worker's model endpoint (a socket each)")
REFUSED = Counter("crucible_rollout_connections_refused_total", "Connections closed on arrival: their rollout held its cap")
CUT_OFF = Counter("crucible_rollout_connections_cut_off_total", "Connections closed for not sending a whole request in time")
"""The worker's own metrics of the endpoint (aggregates, no rollout named), served by the worker's metrics port
(``worker_metrics_port``), never by the endpoint."""

NULL_MODEL = "null_model"
"""The ablation that replaces an evaluated system's model by the null model (:func:`null_completion`)."""

SCOPE_KEY = "crucible.rollout_token"
"""The ASGI scope key under which a rollout's socket names the one token it accepts."""


class _CappedH11(H11Protocol):
    """uvicorn's h11 protocol with the per-socket caps of the module docstring. uvicorn keeps the open connections of
    one server (here: one rollout's socket) in ``self.connections``; a connection over :data:`MAX_CONNECTIONS` is
    aborted in :meth:`connection_made`, and a timer closes one whose client has not finished its request
    (h11's ``their_state`` still ``IDLE`` or ``SEND_BODY``) :data:`READ_TIMEOUT_S` after it opened or was last answered."""

    _refused = False
    _read_deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        if len(self.connections) >= MAX_CONNECTIONS:
            self._refused = True
            REFUSED.inc()
            transport.abort()
            return
        super().connection_made(transport)
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if not self._refused:
            super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if not self._refused:
            super().data_received(data)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._arm()

    def _arm(self) -> None:
        self._disarm()
        self._read_deadline = asyncio.get_running_loop().call_later(READ_TIMEOUT_S, self._expire)

    def _disarm(self) -> None:
        if self._read_deadline is not None:
            self._read_deadline.cancel()
            self._read_deadline = None

    def _expire(self) -> None:
        self._read_deadline = None
        if self.conn.their_state in (h11.IDLE, h11.SEND_BODY) and not self.transport.is_closing():
            CUT_OFF.inc()
            self.transport.close()


class RolloutChatRequest(ChatCompletionRequest):
    """OpenAI's chat request as a rollout sends it: at most :data:`MAX_MESSAGES` messages."""

    messages: list[ChatMessage] = Field(min_length=1, max_length=MAX_MESSAGES)


@dataclass(frozen=True)
class Bound:
    """A rollout bound to the endpoint: its ``token`` (``OPENAI_API_KEY``) and its own Unix ``socket`` (bind it into the
    rollout's sandbox as ``model_socket``)."""

    token: str
    socket: Path


@dataclass
class Call:
    """One completion a rollout asked for: the request's messages, the answer's message, its tokens and when."""

    messages: list[dict[str, Any]]
    message: dict[str, Any]
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int
    at: str


@dataclass
class Binding:
    """What a rollout's token allows. ``model``: the only model served; ``ctx``: the run (``None`` for a baseline);
    ``hold_id``: the evaluation's hold every completion is charged against (``None``: test grading, not charged);
    ``key``: the idempotency prefix ``<eval>:<item>:<sample>``; ``context_tokens``/``max_tokens``: the benchmark's
    caps (tokens); ``max_calls``: completions allowed. ``candidate``: an evaluator's rollout serves this candidate
    system under its opaque name instead (:mod:`services.common.candidates`: ``model`` is then the system's model,
    which the rollout never sees); ``max_total_tokens``: prompt and completion tokens allowed over the rollout (a call
    made once they are spent is a 429); ``null_model``: every completion is the null model's (:func:`null_completion`),
    no inference call. ``calls`` grows as the rollout calls."""

    model: str
    ctx: RunContext | None
    hold_id: str | None
    key: str
    context_tokens: int | None
    max_tokens: int
    max_calls: int
    candidate: tuple[str, SystemSpec] | None = None
    max_total_tokens: int | None = None
    null_model: bool = False
    calls: list[Call] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    inflight: int = 0
    idle: threading.Condition = field(init=False)

    def __post_init__(self) -> None:
        self.idle = threading.Condition(self.lock)

    @property
    def name(self) -> str:
        """The name the rollout calls its model by: a candidate's opaque name, else the model's."""
        return self.candidate[0] if self.candidate else self.model

    @property
    def tokens(self) -> tuple[int, int]:
        """``(prompt tokens, completion tokens)`` of every call so far."""
        done = [c for c in self.calls if c is not None]
        return sum(c.prompt_tokens for c in done), sum(c.completion_tokens for c in done)


def rollout_binding(request: Request, authorization: Annotated[str | None, Header()] = None) -> Binding:
    """The rollout the request's bearer token is bound to, when that rollout's socket received it (401 otherwise)."""
    token = (authorization or "").removeprefix("Bearer ").strip()
    if not secrets.compare_digest(token.encode(), str(request.scope.get(SCOPE_KEY, "")).encode()):
        raise Unauthorized("this token is not bound to this rollout")
    return request.app.state.endpoint.binding(token)


RolloutDep = Annotated["Binding", Depends(rollout_binding)]


class ModelEndpoint:
    """The worker's rollout endpoint (see the module docstring): :meth:`bind` a rollout (a token and a socket of its
    own), :meth:`unbind` it when the rollout ends. Sockets are served by uvicorn on one event loop, in a daemon thread
    of this process started on first use."""

    def __init__(self, grader: Grader, socket_dir: Path | None = None) -> None:
        self.grader = grader
        # named for its owner: a dead worker's is removed with its workspaces (grader.sandboxes.base.reap_workspaces)
        self._dir = Path(tempfile.mkdtemp(prefix=WORKSPACE_PREFIX.format(owner=process_tag()) + "model-", dir=socket_dir))
        self._dir.chmod(0o755)  # the sockets' directory: a sandbox's init (root, no capabilities) must reach them
        self._bindings: dict[str, Binding] = {}
        self._servers: dict[str, tuple[uvicorn.Server, Path]] = {}
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._numbers = itertools.count(1)
        self._app = None

    @property
    def base_url(self) -> str:
        """``OPENAI_BASE_URL`` inside a sandbox, where the sandbox's init forwards this port to the rollout's socket."""
        return f"http://127.0.0.1:{MODEL_PORT}/v1"

    def start(self) -> None:
        """Start the event loop the sockets are served on (idempotent)."""
        with self._lock:
            if self._loop is not None:
                return
            self._app = self.app()
            self._loop = asyncio.new_event_loop()
            threading.Thread(target=self._loop.run_forever, name="rollout-model-endpoint", daemon=True).start()

    def stop(self) -> None:
        """Close every rollout's socket and stop the loop."""
        with self._lock:
            servers, self._servers = list(self._servers.values()), {}
        for server, path in servers:
            server.should_exit = True
            path.unlink(missing_ok=True)
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)

    def bind(self, binding: Binding) -> Bound:
        """A fresh token (URL-safe, 256 bits) for ``binding``, and a socket that accepts that token alone, listening
        when this returns. Raises ``RuntimeError`` if the socket does not start within 30 s."""
        self.start()
        assert self._loop is not None
        token = "rk-" + secrets.token_urlsafe(32)
        path = self._dir / f"{next(self._numbers):x}.sock"  # short: a Unix socket's path is at most 107 bytes
        app = self._app

        async def asgi(scope, receive, send):  # noqa: ANN001, ANN202 - the rollout's socket names its token
            await app(scope if scope["type"] == "lifespan" else {**scope, SCOPE_KEY: token}, receive, send)

        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(str(path))  # here, so a path the kernel refuses (longer than 107 bytes) raises to the rollout
        except OSError:
            listener.close()
            raise
        path.chmod(0o600)  # the sandbox's init connects, as its owner (root, or the grader's uid); the harness's user cannot
        config = uvicorn.Config(asgi, http=_CappedH11, lifespan="off", log_config=None, log_level="warning", access_log=False,
                                timeout_keep_alive=int(KEEP_ALIVE_S), timeout_graceful_shutdown=5)
        server = uvicorn.Server(config)
        with self._lock:
            self._bindings[token] = binding
            self._servers[token] = (server, path)
            SOCKETS.set(len(self._servers))
        serving = asyncio.run_coroutine_threadsafe(server.serve(sockets=[listener]), self._loop)
        deadline = time.monotonic() + 30
        while not server.started:
            if time.monotonic() > deadline or serving.done():
                self.unbind(token, wait_s=0)
                raise RuntimeError(f"the rollout's model socket {path} did not start: {serving.exception() if serving.done() else 'no answer in 30 s'!r}")
            time.sleep(0.005)
        return Bound(token=token, socket=path)

    def unbind(self, token: str, wait_s: float = 1800.0) -> Binding:
        """End ``token``: later requests with it are 401 and its socket closes. Calls still in flight (their harness
        gone) are waited for, up to ``wait_s`` seconds, so that each is charged while the evaluation's hold is open and
        recorded. Returns the binding with the calls it made."""
        with self._lock:
            binding = self._bindings.pop(token)
            served = self._servers.pop(token, None)
            SOCKETS.set(len(self._servers))
        with binding.idle:
            binding.idle.wait_for(lambda: binding.inflight == 0, timeout=wait_s)
        if served is not None:
            server, path = served
            server.should_exit = True  # uvicorn closes the listener and the idle connections
            path.unlink(missing_ok=True)
            if self._loop is not None:  # and what a harness still holds (an answer it never reads) is cut a little later
                self._loop.call_soon_threadsafe(self._loop.call_later, KEEP_ALIVE_S + 1, _abort_all, server)
        return binding

    def open_sockets(self) -> int:
        """How many rollouts' sockets are open (bound rollouts)."""
        with self._lock:
            return len(self._servers)

    def binding(self, token: str) -> Binding:
        """The binding of ``token``; ``Unauthorized`` for a token no running rollout holds."""
        with self._lock:
            binding = self._bindings.get(token)
        if binding is None:
            raise Unauthorized("this token is not bound to a running rollout")
        return binding

    def app(self):  # noqa: ANN201 - a FastAPI app
        """The endpoint's FastAPI app."""
        app = create_service_app("rollout-model", title="Crucible rollout model endpoint", max_body_bytes=MAX_BODY_BYTES, service_routes=False,
                                 description="The OpenAI-compatible endpoint a harness's sandbox reaches: one model, one rollout.")
        app.state.endpoint = self  # its two routes and nothing else: no docs, health or metrics (the worker's, other rollouts' included)

        @app.get("/v1/models", summary="The rollout's model", responses=problem_responses(Unauthorized))
        def list_models(binding: RolloutDep) -> RolloutModels:
            """The one model this rollout may call."""
            return RolloutModels(data=[ModelOut(id=binding.name)])

        @app.post("/v1/chat/completions", summary="A chat completion of the rollout's model",
                  responses=problem_responses(Unauthorized, NotFound, Unprocessable, TooManyRequests))
        def chat_completions(body: RolloutChatRequest, binding: RolloutDep) -> ChatCompletion:
            """OpenAI's chat completion, non-streamed; see the module docstring for what is refused."""
            started, status = time.perf_counter(), 200
            try:
                return self._complete(binding, body)
            except Exception as exc:
                status = getattr(exc, "status", 500)
                raise
            finally:
                CALLS.labels(str(status)).inc()
                CALL_SECONDS.observe(time.perf_counter() - started)

        return app

    def _complete(self, binding: Binding, body: ChatCompletionRequest) -> ChatCompletion:
        if body.model != binding.name:
            raise NotFound(f"model {body.model!r} is not served to this rollout; it serves {binding.name!r} only", field="model")
        if body.stream:
            raise Unprocessable("the rollout endpoint does not stream; send stream: false", field="stream")
        asked = body.max_completion_tokens or body.max_tokens
        if asked is not None and asked > binding.max_tokens:
            raise Unprocessable(f"max_tokens {asked} is more than the benchmark allows per call ({binding.max_tokens})",
                                field="max_completion_tokens" if body.max_completion_tokens else "max_tokens")
        if body.n not in (None, 1):
            raise Unprocessable("the rollout endpoint answers one choice per call; send n: 1", field="n")
        with binding.lock:
            number = len(binding.calls)  # the call's number within the rollout
            if number >= binding.max_calls:
                raise TooManyRequests(f"this rollout has made its {binding.max_calls} model calls", limit="model_calls")
            if binding.inflight >= MAX_INFLIGHT:
                raise TooManyRequests(f"a rollout has at most {MAX_INFLIGHT} calls in flight; wait for one to answer", limit="calls_in_flight")
            if binding.max_total_tokens is not None and sum(binding.tokens) >= binding.max_total_tokens:
                raise TooManyRequests(f"this rollout has used its {binding.max_total_tokens} tokens", limit="tokens")
            binding.calls.append(None)  # type: ignore[arg-type] - reserves the number; filled below
            binding.inflight += 1
        if binding.candidate:
            request = candidate_request(body, binding.candidate[1], max_tokens_cap=binding.max_tokens)
        else:
            request = body.model_copy(update={"max_tokens": asked or binding.max_tokens, "max_completion_tokens": None})
        call = Call(messages=_messages(body), message={}, finish_reason="error", prompt_tokens=0, completion_tokens=0, at=_now())
        try:
            if binding.null_model:
                out = null_completion(binding.name)
            else:
                out = self.grader.inference.chat_completions(binding.ctx, request, hold_id=binding.hold_id, unmetered=binding.hold_id is None,
                                                             idempotency_key=f"{binding.key}:{number}", context_tokens=binding.context_tokens,
                                                             **self._billed(binding, body))
            choice = out.choices[0]
            call = Call(messages=call.messages, message=choice.message.model_dump(exclude_none=True), finish_reason=choice.finish_reason,
                        prompt_tokens=out.usage.prompt_tokens, completion_tokens=out.usage.completion_tokens, at=_now())
            return renamed(out, binding.name)
        finally:
            with binding.idle:
                binding.calls[number] = call
                binding.inflight -= 1
                binding.idle.notify_all()


    def _billed(self, binding: Binding, body: ChatCompletionRequest) -> dict[str, Any]:
        """A candidate's call is reported and charged for the evaluator's own messages (rendered by the candidate's model,
        as the gateway bills a run's: :mod:`gateway.evaluator`), never its hidden harness's prompt; other calls as run."""
        if not binding.candidate:
            return {}
        own = self.grader.inference.chat_prompt_tokens(binding.ctx, [body.model_copy(update={"model": binding.model})],
                                                       context_tokens=binding.context_tokens)
        return {"billed_prompt_tokens": own.prompt_tokens[0], "billed_model": binding.model}


def null_completion(model: str) -> ChatCompletion:
    """The null model's answer to any chat request for ``model``: one choice, an empty assistant message, ``finish_reason``
    ``stop``, zero prompt and completion tokens. No model runs and nothing is charged."""
    return ChatCompletion(id=f"chatcmpl-null-{secrets.token_hex(8)}", created=int(time.time()), model=model,
                          choices=[ChatChoice(index=0, message=AssistantMessage(content=""), finish_reason="stop")],
                          usage=Usage(prompt_tokens=0, completion_tokens=0, total_tokens=0))


def _abort_all(server: uvicorn.Server) -> None:
    for connection in list(server.server_state.connections):
        transport = getattr(connection, "transport", None)
        if transport is not None:
            transport.abort()


def _messages(body: ChatCompletionRequest) -> list[dict[str, Any]]:
    return [m.model_dump(exclude_none=True) for m in body.messages]


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat()
