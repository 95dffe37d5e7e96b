"""The agent API as MCP tools, for coding agents (Claude Code, Codex) and LLM loops: the official ``mcp`` SDK's ``MCPServer``.

Every tool is one or two calls to the gateway's own ``/v1`` HTTP API made with the caller's run key, so MCP reaches
exactly what HTTP reaches and decides nothing itself: the same key check (401), track and editable space (403), rate
and evaluation limits (429), budget (402), episode log and train/eval isolation. Two transports serve the same tools:

- **stdio** (``crucible mcp --api-key … --gateway …``, :func:`stdio_server`): a process beside the agent that calls
  the gateway over HTTP. Tools that take a ``path`` read or write the agent's own files.
- **streamable HTTP** at the gateway's ``/mcp`` (:class:`MCPEndpoint`): the run key as ``Authorization: Bearer``;
  a missing, unknown or revoked key is refused with the HTTP API's 401 before any MCP message is read. The calls go
  in process (ASGI) to the same app with the caller's key. A ``path`` argument is refused there (the gateway's disk is
  not the agent's); archives and rows travel inline.

A refused call is an MCP tool error (``is_error: true``) whose structured content is the problem+json the HTTP API
answered (``status``, ``code``, ``detail`` and, where it names one, ``field``), its text ``"<status> <code>: <detail>"``
followed by that JSON. A successful call's structured content is the route's JSON (a list under ``data``).
"""

from __future__ import annotations

import base64
import functools
import hmac
import json
import secrets
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any

import httpx
from fastapi import FastAPI
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError, UnexpectedToolError
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from mcp_types import CallToolResult, TextContent, ToolAnnotations
from pydantic import Field, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import Receive, Scope, Send

from services.common.app import problem_response
from services.common.contracts import Ablation
from services.common.errors import TooManyRequests, Unauthorized, Unprocessable, UpstreamUnavailable

INSTRUCTIONS = (
    "Crucible: improve an agent system (a model and the harness that drives it) under a fixed budget. Start with run_card "
    "(benchmark, track and what you may edit, recipe policy, limits, deadline, budget). Training jobs and evaluations run "
    "in the background: poll training_job / evaluation. Validation evaluations are rate-limited and charged; the hidden "
    "test split is graded only when you submit (submit), once per allowed submission. Money is in micro-USD."
)
COUNTED = "X-Crucible-MCP-Counted"  # header of a tool's in-process call: its /mcp request was counted (value: a secret of the process)
MAX_TRAJECTORIES = 200  # trajectories per call: an LLM's context is the limit, not the route's


class Refused(Exception):
    """A problem+json answer (status ≥ 400) of the gateway, or a refusal of the tool itself before any call."""

    def __init__(self, problem: dict[str, Any]) -> None:
        super().__init__(problem.get("detail", ""))
        self.problem = problem


def _refuse(detail: str, field: str | None) -> Refused:
    """A call refused before any request: the API's 422 ``invalid_input`` problem naming ``field``."""
    return Refused(Unprocessable(detail, field=field).to_problem())


def _result(value: Any) -> CallToolResult:
    structured = value if isinstance(value, dict) else {"data": value}
    return CallToolResult(content=[TextContent(type="text", text=json.dumps(value, indent=1, default=str))], structured_content=structured)


def _error(problem: dict[str, Any]) -> CallToolResult:
    head = f"{problem.get('status', '')} {problem.get('code', 'error')}: {problem.get('detail', '')}".strip()
    return CallToolResult(content=[TextContent(type="text", text=f"{head}\n{json.dumps(problem, indent=1)}")], structured_content=problem,
                          is_error=True)


class GatewayAccess:
    """How the tools reach the ``/v1`` API: ``client`` (its base URL and transport) and the caller's ``Authorization``.

    ``key``: a fixed run key (stdio); ``None``: the key each MCP request carries (streamable HTTP). ``local_files``:
    whether ``path`` arguments name files the tools may read and write (stdio only). ``headers``: sent on every call
    (in process: the marker that the ``/mcp`` request was already counted against the key's rate limits).
    A gateway that cannot be reached is a 503 ``upstream_unavailable`` problem."""

    def __init__(self, client: httpx.AsyncClient, *, key: str | None, local_files: bool, headers: dict[str, str] | None = None) -> None:
        self.client, self.key, self.local_files, self.headers = client, key, local_files, headers or {}

    def authorization(self, ctx: Context) -> str:
        if self.key is not None:
            return f"Bearer {self.key}"
        return (ctx.headers or {}).get("authorization", "")

    async def call(self, ctx: Context, method: str, path: str, *, raw: bool = False, **kw: Any) -> Any:
        """One gateway call with the caller's key; ``Refused`` carrying the problem for a status ≥ 400."""
        headers = {"Authorization": self.authorization(ctx)} | self.headers | kw.pop("headers", {})
        try:
            resp = await self.client.request(method, path, headers=headers, **kw)
        except httpx.TransportError as exc:
            raise Refused(UpstreamUnavailable(f"the gateway at {self.client.base_url} cannot be reached "
                                              f"({exc.__class__.__name__}); check --gateway and retry").to_problem()) from exc
        if resp.status_code >= 400:
            try:
                problem = resp.json()
            except ValueError:
                problem = {"status": resp.status_code, "code": "error", "detail": resp.text[:500]}
            raise Refused(problem if isinstance(problem, dict) else {"status": resp.status_code, "detail": str(problem)})
        return resp.content if raw else resp.json()

    def local_path(self, path: str, field: str) -> Path:
        """``path`` as a local file path (stdio); refused over HTTP, where it would name the gateway's own files."""
        if not self.local_files:
            raise _refuse("file paths are read only by the stdio server (`crucible mcp`); over HTTP send the content inline", field)
        return Path(path).expanduser()


Task = Annotated[str | None, Field(description="The benchmark's task (see run_card); leave it out when the benchmark has one.")]
JobId = Annotated[str, Field(pattern=r"^job_[0-9a-z]{26}$", description="`job_…`")]
EvalId = Annotated[str, Field(pattern=r"^eval_[0-9a-z]{26}$", description="`eval_…`")]
SubId = Annotated[str, Field(pattern=r"^sub_[0-9a-z]{26}$", description="`sub_…`")]
HarnessId = Annotated[str, Field(pattern=r"^har_[0-9a-z]{26}$", description="`har_…`")]
JsonObject = dict[str, Any]
ToolFn = Callable[..., Awaitable[Any]]


def tool(description: str, *, read_only: bool = False) -> Callable[[ToolFn], ToolFn]:
    """Mark a method of :class:`Tools` as an MCP tool described by ``description`` (what it does, costs and refuses);
    ``read_only``: it changes nothing (MCP's ``readOnlyHint``)."""
    def mark(fn: ToolFn) -> ToolFn:
        fn.mcp_tool = (description, read_only)  # type: ignore[attr-defined]
        return fn
    return mark


class Tools:
    """The tools, one method each (named as the tool, its parameters the tool's arguments), calling the gateway through
    ``access``; a method answers the route's JSON or raises :class:`Refused`."""

    def __init__(self, access: GatewayAccess) -> None:
        self.access = access
        self.call = access.call

    # ------------------------------------------------------------------ the run

    @tool("The run card: benchmark and its tasks, track and editable parts (data, trainer, harness), recipe allow/lock policy, "
          "evaluation settings and limits left, deadline and budget. Free.", read_only=True)
    async def run_card(self, ctx: Context) -> Any:
        return await self.call(ctx, "GET", "/v1/run")

    @tool("Budget in micro-USD: remaining, held (by running jobs and evaluations) and spent, by usage kind. Free; works after exhaustion.",
          read_only=True)
    async def budget(self, ctx: Context) -> Any:
        return await self.call(ctx, "GET", "/v1/budget")

    @tool("Where the run's time and money went: wall time by activity (training, evaluating, queued, final grading, the agent's own), "
          "spend over time, and the designs tried (datasets, recipes, harnesses, checkpoints) with their best validation score. Free.",
          read_only=True)
    async def run_report(self, ctx: Context) -> Any:
        return await self.call(ctx, "GET", "/v1/run/report")

    @tool("Append a note (your reasoning, a plan, a finding; 1 to 4,000 characters) to the run's episode log, where the operator "
          "reads it beside your calls. Free. Refused: 422 naming `text` when it is empty or too long.")
    async def note(self, ctx: Context, text: str) -> Any:
        return await self.call(ctx, "POST", "/v1/run/notes", json={"text": text})

    @tool("The base models the run may train and query (checkpoints `ckpt_…` of the run are served too). Free.", read_only=True)
    async def list_models(self, ctx: Context) -> Any:
        return (await self.call(ctx, "GET", "/v1/models"))["data"]

    # ------------------------------------------------------------------ suite data

    @tool("Question/answer items of the task's public training pool (never validation or hidden test items). Free.", read_only=True)
    async def train_sample(self, ctx: Context, offset: Annotated[int, Field(ge=0)] = 0, limit: Annotated[int, Field(ge=1, le=10_000)] = 100,
                           task: Task = None) -> Any:
        return (await self.call(ctx, "GET", "/v1/suite/train-sample", params=_params(offset=offset, limit=limit, task=task)))["data"]

    @tool("Evaluator track: a development target's (`task`) score of each candidate, to compare your evaluator's scores with. Free. "
          "A sealed target's scores are never shown (404).", read_only=True)
    async def candidate_scores(self, ctx: Context, task: Task = None) -> Any:
        return (await self.call(ctx, "GET", "/v1/suite/candidate-scores", params=_params(task=task)))["data"]

    @tool("The task's visible validation items (questions and answers). Free. The hidden test split is never shown.", read_only=True)
    async def validation_items(self, ctx: Context, task: Task = None) -> Any:
        return (await self.call(ctx, "GET", "/v1/suite/validation", params=_params(task=task)))["data"]

    # ------------------------------------------------------------------ datasets

    @tool("Upload a training dataset: `rows` inline (each a JSON object: chat `messages`, or `prompt`/`completion`, or "
          "`prompt`/`chosen`/`rejected`), or `path` to a local JSONL file (stdio server only). Free; stored content-addressed. "
          "Refused: 403 when the track does not let you edit data, 422 naming the bad `line` and `field`, 413 over the upload limit.")
    async def upload_dataset(self, ctx: Context, rows: list[JsonObject] | None = None, path: str | None = None, name: str | None = None) -> Any:
        if (rows is None) == (path is None):
            raise _refuse("give exactly one of `rows` and `path`", "rows")
        if path is not None:
            local = self.access.local_path(path, "path")
            content, name = local.read_bytes(), name or local.name
        else:
            content = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows or []).encode()
        return await self.call(ctx, "POST", "/v1/datasets", files={"file": (name or "dataset.jsonl", content, "application/jsonl")},
                          data={"name": name} if name else None)

    @tool("The run's datasets (id, name, rows, tokens, sha256). Free.", read_only=True)
    async def list_datasets(self, ctx: Context) -> Any:
        return (await self.call(ctx, "GET", "/v1/datasets"))["data"]

    # ------------------------------------------------------------------ training

    @tool("Start a training job on `model` (a base model or one of the run's `ckpt_…`) with `datasets` and a `recipe` "
          "(method sft|dpo|orpo|grpo|merge, adapter lora|full, max_steps, learning_rate, batch_size, …; see run_card's recipe policy). "
          "Costs training tokens: the estimated cost is held first and the tokens processed are charged when it ends. "
          "Refused: 402 when the budget cannot cover the estimate, 403 naming `recipe.<field>` the track locks, 422 naming a bad field. "
          "With `idempotency_key`, repeating the call returns the first job.")
    async def create_training_job(self, ctx: Context, model: str, datasets: list[str] | None = None, recipe: JsonObject | None = None,
                                  harness: JsonObject | None = None, merge: JsonObject | None = None,
                                  idempotency_key: str | None = None) -> Any:
        body = {"model": model, "datasets": datasets or [], "recipe": recipe or {}} | _params(harness=harness, merge=merge)
        return await self.call(ctx, "POST", "/v1/training/jobs", json=body, headers={"Idempotency-Key": idempotency_key} if idempotency_key else {})

    @tool("A training job's status and its latest `events` (loss, learning rate, step, tokens/s) and checkpoints. Free.", read_only=True)
    async def training_job(self, ctx: Context, job_id: JobId, events: Annotated[int, Field(ge=0, le=500)] = 20) -> Any:
        job = await self.call(ctx, "GET", f"/v1/training/jobs/{job_id}")
        log = (await self.call(ctx, "GET", f"/v1/training/jobs/{job_id}/events", params={"limit": 5000}))["data"]
        checkpoints = (await self.call(ctx, "GET", f"/v1/training/jobs/{job_id}/checkpoints"))["data"]
        return {"job": job, "latest_events": log[-events:] if events else [], "checkpoints": checkpoints}

    @tool("The run's training jobs, oldest first. Free.", read_only=True)
    async def list_training_jobs(self, ctx: Context) -> Any:
        return (await self.call(ctx, "GET", "/v1/training/jobs"))["data"]

    @tool("Cancel a training job. Free; it stops after its current step, the tokens it processed are charged and the rest of its hold released. "
          "Refused: 409 when it has already ended.")
    async def cancel_training_job(self, ctx: Context, job_id: JobId) -> Any:
        return await self.call(ctx, "POST", f"/v1/training/jobs/{job_id}/cancel")

    # ------------------------------------------------------------------ inference

    @tool("Chat with `model` (a base model or one of the run's `ckpt_…`), OpenAI chat-completions style; `params` takes any other "
          "OpenAI parameter (temperature, max_tokens, n, tools, response_format …). Costs prompt and completion tokens (the worst "
          "case is held first: 402 when the budget cannot cover it); 422 names a parameter that cannot be honoured.")
    async def chat(self, ctx: Context, model: str, messages: list[JsonObject], params: JsonObject | None = None) -> Any:
        body = (params or {}) | {"model": model, "messages": messages, "stream": False}
        return await self.call(ctx, "POST", "/v1/chat/completions", json=body)

    # ------------------------------------------------------------------ harnesses

    @tool("The run's code-harness archives, then the suites' own (`platform: true`, a starting point to edit). Free.", read_only=True)
    async def list_harnesses(self, ctx: Context) -> Any:
        return (await self.call(ctx, "GET", "/v1/harnesses"))["data"]

    @tool("Download a harness archive (.tar.gz): written to local `path` (stdio server), else returned base64-encoded. Free.",
          read_only=True)
    async def download_harness(self, ctx: Context, harness_id: HarnessId, path: str | None = None) -> Any:
        local = self.access.local_path(path, "path") if path is not None else None
        data = await self.call(ctx, "GET", f"/v1/harnesses/{harness_id}/archive", raw=True)
        if local is not None:
            local.write_bytes(data)
            return {"harness_id": harness_id, "path": str(local), "bytes": len(data)}
        return {"harness_id": harness_id, "bytes": len(data), "archive_base64": base64.b64encode(data).decode()}

    @tool("Upload a code-harness archive (.tar.gz with `harness.toml` at its root): `path` to a local file (stdio server) or "
          "`archive_base64`. Free. Refused: 403 when the track does not let you edit the harness, 422 naming the bad `member`.")
    async def upload_harness(self, ctx: Context, path: str | None = None, archive_base64: str | None = None, name: str | None = None) -> Any:
        if (path is None) == (archive_base64 is None):
            raise _refuse("give exactly one of `path` and `archive_base64`", "archive_base64")
        try:
            data = self.access.local_path(path, "path").read_bytes() if path is not None else base64.b64decode(archive_base64 or "", validate=True)
        except ValueError as exc:
            raise _refuse(f"not base64: {exc}", "archive_base64") from exc
        return await self.call(ctx, "POST", "/v1/harnesses", files={"file": ("harness.tar.gz", data, "application/gzip")},
                          data={"name": name} if name else None)

    # ------------------------------------------------------------------ evaluations

    @tool("Evaluate `model` on the validation split, with a declarative `harness` (prompt template, sampling …) or a code harness "
          "`harness_archive` (neither: the suite's default); `limit` grades only the first items. Runs in the background: poll "
          "evaluation. Costs inference tokens (and sandbox seconds for code harnesses), held first. Refused: 429 past the "
          "evaluation rate limits (retry_after_s), 403 past the failed-evaluation limit or a harness the track locks, 402 over budget. "
          "Evaluator track: give only `harness_archive` (your evaluator), no `model`: it runs on each candidate (or on the "
          "`candidates` you name, two or more: a pilot) and is scored by its agreement with the development targets. "
          "`ablation: null_model` replaces the model by one that answers every call empty (no tokens spent): what the harness "
          "scores by itself, as final grading measures it.")
    async def create_evaluation(self, ctx: Context, model: str | None = None, harness: JsonObject | None = None, harness_archive: str | None = None,
                                limit: Annotated[int | None, Field(ge=1)] = None, candidates: list[str] | None = None,
                                ablation: Ablation | None = None, task: Task = None) -> Any:
        body = {"split": "validation"} | _params(model=model, harness=harness, harness_archive=harness_archive, limit=limit, candidates=candidates,
                                                 ablation=ablation)
        return await self.call(ctx, "POST", "/v1/evaluations", json=body, params=_params(task=task))

    @tool("A validation evaluation's status, items graded so far and score (with its interval once done). Free.", read_only=True)
    async def evaluation(self, ctx: Context, eval_id: EvalId) -> Any:
        return await self.call(ctx, "GET", f"/v1/evaluations/{eval_id}")

    @tool("The run's validation evaluations, oldest first. Free.", read_only=True)
    async def list_evaluations(self, ctx: Context) -> Any:
        return (await self.call(ctx, "GET", "/v1/evaluations"))["data"]

    @tool(f"Per-item validation trajectories of an evaluation (prompt, completion, extracted answer, score), `offset`/`limit` "
          f"(at most {MAX_TRAJECTORIES}) of them. Free.", read_only=True)
    async def trajectories(self, ctx: Context, eval_id: EvalId, offset: Annotated[int, Field(ge=0)] = 0,
                           limit: Annotated[int, Field(ge=1, le=MAX_TRAJECTORIES)] = 20) -> Any:
        items = (await self.call(ctx, "GET", f"/v1/evaluations/{eval_id}/trajectories"))["data"]
        return {"total": len(items), "offset": offset, "data": items[offset:offset + limit]}

    # ------------------------------------------------------------------ submissions

    @tool("Submit the final system (`model`, optional `harness` or `harness_archive`) for grading on the task's hidden test split. "
          "Not charged; only the aggregate score is returned. Refused: 403 once the benchmark's final submissions are used up. "
          "Evaluator track: give only `harness_archive` (the evaluator to freeze), no `model`.")
    async def submit(self, ctx: Context, model: str | None = None, harness: JsonObject | None = None, harness_archive: str | None = None,
                     note: str | None = None, task: Task = None) -> Any:
        body = _params(model=model, harness=harness, harness_archive=harness_archive, note=note)
        return await self.call(ctx, "POST", "/v1/submissions", json=body, params=_params(task=task))

    @tool("A submission's status and, once graded, its hidden-test score. Free.", read_only=True)
    async def submission(self, ctx: Context, sub_id: SubId) -> Any:
        return await self.call(ctx, "GET", f"/v1/submissions/{sub_id}")

    @tool("The run's submissions. Free.", read_only=True)
    async def list_submissions(self, ctx: Context) -> Any:
        return (await self.call(ctx, "GET", "/v1/submissions"))["data"]


class _Server(MCPServer):
    """The SDK's server, answering a call it cannot make (an unknown tool, arguments of the wrong type or out of bounds)
    as the API answers a bad request: a tool error carrying a 422 ``invalid_input`` problem that names the argument."""

    async def call_tool(self, name: str, arguments: dict[str, Any], context: Any = None) -> Any:  # noqa: ANN401 - the SDK's result types
        try:
            return await super().call_tool(name, arguments, context)
        except ToolError as exc:
            if isinstance(exc, UnexpectedToolError):
                raise
            cause = exc.__cause__
            if isinstance(cause, ValidationError):
                err = cause.errors()[0]
                field = ".".join(str(p) for p in err["loc"] if p != "arguments") or None
                return _error(_refuse(f"{field or 'arguments'}: {err['msg']}", field).problem)
            return _error(_refuse(str(exc), "name").problem)


def build_server(access: GatewayAccess) -> MCPServer:
    """The MCP server of :class:`Tools` calling the gateway through ``access``. Raises nothing; every tool answers a
    :class:`~mcp_types.CallToolResult` (an error one for a refused call)."""
    server = _Server("crucible", instructions=INSTRUCTIONS)
    tools = Tools(access)
    for name, fn in vars(Tools).items():
        if hasattr(fn, "mcp_tool"):
            description, read_only = fn.mcp_tool
            server.add_tool(_answering(getattr(tools, name)), name=name, description=description, structured_output=False,
                            annotations=ToolAnnotations(read_only_hint=read_only, open_world_hint=False))
    return server


def _answering(method: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[CallToolResult]]:
    """``method`` answering a :class:`~mcp_types.CallToolResult`: its JSON, or the problem of a refused call (a local
    file that cannot be read or written: 400 naming ``path``)."""
    @functools.wraps(method)
    async def run(*args: Any, **kwargs: Any) -> CallToolResult:
        try:
            return _result(await method(*args, **kwargs))
        except Refused as exc:
            return _error(exc.problem)
        except OSError as exc:
            return _error({"status": 400, "code": "file_error", "detail": str(exc), "field": "path"})
    return run


def _params(**values: Any) -> dict[str, Any]:
    return {k: v for k, v in values.items() if v is not None}


# --------------------------------------------------------------------------- transports


def stdio_server(gateway_url: str, api_key: str, *, timeout_s: float = 300.0) -> MCPServer:
    """The stdio server of ``crucible mcp``: the tools call ``gateway_url`` over HTTP with ``api_key``; paths are local files."""
    client = httpx.AsyncClient(base_url=gateway_url, timeout=timeout_s)
    return build_server(GatewayAccess(client, key=api_key, local_files=True))


async def _rate_limited(request: Request, exc: TooManyRequests) -> Response:
    """The answer to an MCP request past the key's rate limits: a JSON-RPC error whose message says so and when to retry
    (``data``: the problem), so that the agent's client shows it (the SDK turns an HTTP 429 into an opaque "Server
    returned an error response"); a body that is no JSON-RPC request gets the 429 problem+json."""
    try:
        message = json.loads(await request.body())
    except ValueError:
        message = None
    if not isinstance(message, dict) or "id" not in message:
        return problem_response(exc)
    problem = exc.to_problem()
    retry = f"; retry after {int(problem['retry_after_s'])} s" if "retry_after_s" in problem else ""
    error = {"code": -32000, "message": f"429 {problem['code']}: {problem['detail']}{retry}", "data": problem}
    return JSONResponse({"jsonrpc": "2.0", "id": message["id"], "error": error},
                        headers={"Retry-After": str(int(problem["retry_after_s"]))} if "retry_after_s" in problem else {})


class MCPEndpoint:
    """The gateway's ``/mcp`` route (an ASGI app, ``POST`` only): streamable HTTP, stateless (any gateway worker answers any
    request; no standing event stream, so ``GET`` is a 405 as the protocol allows), JSON answers, bodies up to the
    gateway's own limit. The run key is checked first, as ``/v1`` checks it: each request counts once against the key's
    rate limits (429 problem+json), then a missing, unknown or revoked key is a 401 (in the audit log). The tools then
    call the app in process with that key and a marker (:data:`COUNTED`, a secret of this process) that keeps those
    calls from being counted a second time. Start it with :meth:`run` in the app's lifespan."""

    def __init__(self, app: FastAPI) -> None:
        self.marker = secrets.token_urlsafe(32)
        self.client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway", timeout=300.0)
        self.server = build_server(GatewayAccess(self.client, key=None, local_files=False, headers={COUNTED: self.marker}))
        # no DNS-rebinding check: every request carries a run key, which a page in a browser does not have; the body limit
        # is the gateway's (services.common.app.BodyLimit), not the SDK's 4 MiB
        self.server.streamable_http_app(stateless_http=True, json_response=True, max_request_body_size=2**40,
                                        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False))
        self.sessions: StreamableHTTPSessionManager = self.server.session_manager

    def run(self):  # noqa: ANN201 - an async context manager
        return self.sessions.run()

    def counted(self, request: Request) -> bool:
        """Whether ``request`` is a tool's call whose ``/mcp`` request was already counted against the key's rate limits."""
        return hmac.compare_digest(request.headers.get(COUNTED, ""), self.marker)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        from gateway.service import admit

        request = Request(scope, receive)
        try:
            await admit(request.app.state.gateway, request.headers.get("authorization"))
        except TooManyRequests as exc:
            response = await _rate_limited(request, exc)
            await response(scope, receive, send)
            return
        except Unauthorized as exc:
            await problem_response(exc)(scope, receive, send)
            return
        await self.sessions.handle_request(scope, receive, send)

    async def aclose(self) -> None:
        await self.client.aclose()

