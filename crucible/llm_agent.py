"""The LLM-driven reference researcher: any OpenAI-compatible chat model makes the decisions, through the run's MCP tools.

The loop (:class:`LLMAgent`) connects to the gateway's ``/mcp`` with the run key (the official ``mcp`` SDK's client),
lists the tools and offers them to the model as OpenAI ``tools`` (name, description, input schema as ``parameters``).
The model gets a short system prompt and the run card; then, turn by turn, the loop sends the conversation, runs the
tool calls the model answers with and appends their results (each cut to ``max_result_chars``). The text of every
assistant message goes to the run's episode log as a note (the ``note`` tool), beside the calls it led to.

Nothing the model answers ends the loop with an exception: arguments that are not a JSON object, an unknown tool, a
refused call (a tool error, 402 and 403 included) come back to it as that call's result, and it goes on.

Stop rules, checked before each turn: the step limit (model turns), the agent's own wall-clock limit, the run's
deadline within ``deadline_reserve_s`` (a tenth of the run's time, if less), the budget left (remaining and held) within
``budget_reserve_fraction`` of the budget or ``budget_reserve_usd_micros``; besides, the model's own submission of every task, ``idle_turns`` answers in
a row without a tool call, and a model that stops answering (an error of the chat API). Then, for every task the model
did not submit, the loop submits the best system it has seen, exactly once: the model's succeeded validation
evaluation with the highest score (its model and the harness it was evaluated with), else the task's initial model.
A model that fails on the very first turn (a wrong URL, key or model name) submits nothing: :class:`LLMUnavailable`.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from rich.console import Console
from rich.markup import escape

ChatFn = Callable[[list[dict[str, Any]], list[dict[str, Any]]], Awaitable[dict[str, Any]]]
"""``(messages, tools) → assistant message`` (OpenAI chat format: ``content`` and ``tool_calls``); raises when the model
cannot be reached."""

SYSTEM_PROMPT = """You are a research agent on Crucible. Goal: the highest hidden-test score for the system (a model and \
the harness that drives it) you submit, within the run's budget and deadline. Your tools call the platform's API.

How to work:
1. Read the run card: the task(s), your track and what you may edit (data, trainer, harness), the recipe policy, limits.
2. Evaluate the initial system on validation (create_evaluation, then poll evaluation until it ends) and read its \
trajectories to see which items fail and why.
3. Improve what you may edit: build training rows from train_sample (never validation items), upload_dataset, \
create_training_job and poll training_job; evaluate its checkpoints (ckpt_...). Or try a better harness.
4. Keep what scores best on validation. Evaluations and training cost money (check budget); a refused call tells you why.
5. When you are done, call submit once with your best system. If you stop without submitting, your best validated \
system is submitted for you.
Say in one or two sentences what you think and plan before each tool call; it is kept in the run's log."""

NUDGE = "You answered without calling a tool. Call a tool to go on, or submit your best system when you are done."
ELIDED = "(Earlier turns were dropped to fit the context; list_evaluations, list_training_jobs and run_report recall them.)"
FINAL = {"succeeded", "failed", "cancelled", "graded"}  # statuses of work that has ended
POLL_TOOLS = {"evaluation", "training_job", "submission"}


class LLMUnavailable(RuntimeError):
    """The model failed on the first turn: nothing was decided, so nothing is submitted."""


class UnknownTools(ValueError):
    """``LLMAgentConfig.tools`` names a tool the gateway does not serve (raised before the first turn)."""


@dataclass
class LLMAgentConfig:
    """Limits and pacing of the loop (see the module's stop rules)."""

    max_steps: int = 40  # model turns
    tools: frozenset[str] | None = None  # the tools offered to the model (None: every one); the loop's own calls use any
    max_wall_s: float | None = None  # the agent's own wall-clock limit; None: the run's deadline only
    deadline_reserve_s: float = 300.0
    budget_reserve_fraction: float = 0.01  # the loop stops when the budget left is at most this share of the budget,
    budget_reserve_usd_micros: int = 1000  # or this much ($0.001: less than a short evaluation of a small model costs)
    idle_turns: int = 3  # answers in a row without a tool call before it stops
    max_result_chars: int = 4000  # of each tool result the model reads
    max_history_chars: int = 60_000  # of the conversation sent (oldest turns dropped first)
    poll_wait_s: float = 10.0  # pause after a turn that only polled work still running
    grade_wait_s: float = 3600.0  # how long to wait for the final grade (0: do not wait)
    poll_s: float = 2.0


@dataclass
class ToolCallRecord:
    """One tool call: by the model (``step`` its turn) or by the loop itself; ``result`` is what the model read."""

    step: int
    by: Literal["model", "agent"]
    name: str
    arguments: dict[str, Any] | None
    ok: bool
    result: str
    structured: Any = None


@dataclass
class System:
    """What the loop would submit for a task: a model, the harness it was evaluated with, and why."""

    model: str
    harness: dict[str, Any] | None = None
    harness_archive: str | None = None
    score: float | None = None
    evaluation: str | None = None


@dataclass
class LLMAgentResult:
    stop_reason: str
    steps: int
    calls: list[ToolCallRecord]
    submissions: list[dict[str, Any]] = field(default_factory=list)


# --------------------------------------------------------------------------- the model and the tools


def openai_chat(model: str, base_url: str, api_key: str, *, max_tokens: int | None = 1024, temperature: float | None = None,
                timeout_s: float = 600.0) -> ChatFn:
    """A :data:`ChatFn` of ``model`` behind the OpenAI-compatible ``base_url`` (the ``openai`` SDK, its retries on 429 and 5xx).
    Raises ``ImportError`` naming the extra to install when the SDK is not installed (``pip install 'crucible[agent]'``)."""
    try:
        from openai import NOT_GIVEN, AsyncOpenAI
    except ImportError as exc:
        raise ImportError("crucible agent --llm needs the openai SDK: pip install 'crucible[agent]'") from exc

    client = AsyncOpenAI(base_url=base_url, api_key=api_key, timeout=timeout_s)

    async def chat(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> dict[str, Any]:
        resp = await client.chat.completions.create(model=model, messages=messages, tools=tools or NOT_GIVEN,  # type: ignore[arg-type]
                                                    max_tokens=max_tokens if max_tokens is not None else NOT_GIVEN,
                                                    temperature=temperature if temperature is not None else NOT_GIVEN)
        return resp.choices[0].message.model_dump(exclude_none=True)

    return chat


def gateway_mcp(gateway_url: str, run_key: str, timeout_s: float = 300.0) -> Client:
    """An MCP client of the gateway's ``/mcp`` (streamable HTTP) with ``run_key`` as its bearer token."""
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {run_key}"}, timeout=timeout_s)
    return Client(streamable_http_client(f"{gateway_url.rstrip('/')}/mcp", http_client=http))


def openai_tools(tools: list[Any]) -> list[dict[str, Any]]:
    """MCP tools as OpenAI function tools."""
    return [{"type": "function", "function": {"name": t.name, "description": t.description or "",
                                              "parameters": t.input_schema or {"type": "object", "properties": {}}}} for t in tools]


def assistant_message(raw: dict[str, Any], step: int) -> dict[str, Any]:
    """The model's answer as the conversation keeps it: ``content`` and well-formed ``tool_calls`` (an id for each)."""
    calls = []
    for i, call in enumerate(raw.get("tool_calls") or []):
        fn = call.get("function") or {}
        arguments = fn.get("arguments")
        calls.append({"id": call.get("id") or f"call_{step}_{i}", "type": "function",
                      "function": {"name": str(fn.get("name") or ""), "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments or {})}})
    text = raw.get("content")
    message: dict[str, Any] = {"role": "assistant", "content": text if isinstance(text, str) and text else (None if calls else "")}
    if calls:
        message["tool_calls"] = calls
    return message


def trim_history(messages: list[dict[str, Any]], max_chars: int) -> list[dict[str, Any]]:
    """``messages`` whose JSON fits ``max_chars``: the system prompt and the first user message kept, then whole turns
    (an assistant message and the results and nudges after it) dropped oldest first, the last turn always kept."""
    head, turns = messages[:2], []
    for m in messages[2:]:
        if m["role"] == "assistant" or not turns:
            turns.append([])
        turns[-1].append(m)
    size = sum(len(json.dumps(m)) for m in messages)
    dropped = False
    while len(turns) > 1 and size > max_chars:
        size -= sum(len(json.dumps(m)) for m in turns.pop(0))
        dropped = True
    return head + ([{"role": "user", "content": ELIDED}] if dropped else []) + [m for t in turns for m in t]


def clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + f"… [cut: {len(text) - limit} more characters; ask for less, e.g. a smaller limit]"


def best_systems(evaluations: list[dict[str, Any]], launched: dict[str, dict[str, Any]], initial: dict[str, str]) -> dict[str, System]:
    """Per task (``initial``: task → its initial model), the system to submit: of the evaluations the model started
    (``launched``: evaluation id → the harness arguments it sent), the succeeded validation one with the highest score,
    the earliest among equals; else the initial model."""
    best = {task: System(model=model) for task, model in initial.items()}
    for ev in evaluations:
        task = ev.get("task") if len(initial) > 1 else next(iter(initial))
        if ev["id"] not in launched or ev.get("status") != "succeeded" or not ev.get("score") or task not in best:
            continue
        score = float(ev["score"]["value"])
        if best[task].score is None or score > best[task].score:  # type: ignore[operator]
            sent = launched[ev["id"]]
            best[task] = System(model=ev["model"], harness=sent.get("harness"), harness_archive=sent.get("harness_archive"), score=score,
                                evaluation=ev["id"])
    return best


def _pct(x: float | None) -> str:
    return "no validation score" if x is None else f"validation {100 * x:.1f}%"


def _args(arguments: dict[str, Any] | None) -> str:
    return escape(json.dumps(arguments, ensure_ascii=False)[:120]) if arguments else ""


# --------------------------------------------------------------------------- the loop


class LLMAgent:
    """The research loop of one run: ``session`` an open MCP client of the gateway, ``chat`` the model."""

    def __init__(self, session: Client, chat: ChatFn, config: LLMAgentConfig | None = None, console: Console | None = None) -> None:
        self.session, self.chat = session, chat
        self.config = config or LLMAgentConfig()
        self.console = console or Console()
        self.calls: list[ToolCallRecord] = []
        self.launched: dict[str, dict[str, Any]] = {}  # evaluation id -> harness arguments the model sent
        self.submitted: dict[str, dict[str, Any]] = {}  # task -> the session's submission
        self.tools: dict[str, Any] = {}  # name -> MCP tool
        self.tasks: dict[str, str] = {}  # task -> its initial model
        self.left: dict[str, int | None] = {}  # task -> final submissions left when the loop began (None: no limit)
        self.step = self.idle = 0  # turns so far; answers in a row without a tool call
        self.started = self.deadline = time.monotonic()
        self.deadline_reserve_s = self.config.deadline_reserve_s

    def say(self, message: str) -> None:
        self.console.print(f"[bold magenta]llm-agent[/] {message}")

    # ------------------------------------------------------------------ tools

    async def call(self, name: str, arguments: dict[str, Any], by: Literal["model", "agent"] = "agent") -> ToolCallRecord:
        """Call tool ``name``; a refusal or a failure of the call itself becomes an error record, never an exception."""
        try:
            result = await self.session.call_tool(name, arguments)
        except Exception as exc:  # noqa: BLE001 - the transport, or the SDK refusing the call: the model reads why
            record = ToolCallRecord(self.step, by, name, arguments, False, f"error: the call failed: {type(exc).__name__}: {exc}")
        else:
            text = "\n".join(getattr(c, "text", "") for c in result.content)
            if result.structured_content is not None:  # compact JSON: the same content, fewer tokens
                body = json.dumps(result.structured_content, ensure_ascii=False, separators=(",", ":"), default=str)
                text = f"{text.splitlines()[0]}\n{body}" if result.is_error and text else body
            record = ToolCallRecord(self.step, by, name, arguments, not result.is_error, text, result.structured_content)
        self.calls.append(record)
        if record.ok:
            self._remember(record)
        return record

    def _remember(self, record: ToolCallRecord) -> None:
        """What the loop keeps of a successful call: the evaluations the model started, the submissions made."""
        out = record.structured if isinstance(record.structured, dict) else {}
        if record.name == "create_evaluation" and "id" in out:
            self.launched[out["id"]] = {k: (record.arguments or {}).get(k) for k in ("harness", "harness_archive")}
        elif record.name == "submit" and "id" in out:
            self.submitted[self.task_name(out.get("task"))] = out

    async def run_tool_call(self, call: dict[str, Any]) -> ToolCallRecord:
        """One of the model's tool calls, run or refused here: a tool not offered, arguments that are not a JSON object."""
        name, raw = call["function"]["name"], call["function"]["arguments"]
        if name not in self.tools:
            return self._refused(name, None, f"error: unknown tool {name!r}; the tools are: {', '.join(sorted(self.tools))}")
        try:
            arguments = json.loads(raw) if raw.strip() else {}
        except json.JSONDecodeError as exc:
            return self._refused(name, None, f"error: the arguments of {name} are not valid JSON ({exc.msg} at character {exc.pos}); "
                                             "send one JSON object")
        if not isinstance(arguments, dict):
            return self._refused(name, None, f"error: the arguments of {name} must be a JSON object, not {type(arguments).__name__}")
        return await self.call(name, arguments, by="model")

    def _refused(self, name: str, arguments: dict[str, Any] | None, text: str) -> ToolCallRecord:
        record = ToolCallRecord(self.step, "model", name, arguments, False, text)
        self.calls.append(record)
        return record

    async def note(self, text: str) -> None:
        """The model's words into the episode log (a failure is printed, nothing more)."""
        record = await self.call("note", {"text": text[:4000]})
        if not record.ok:
            self.say(f"[yellow]note not kept:[/] {escape(record.result[:200])}")

    # ------------------------------------------------------------------ run facts

    def task_name(self, task: str | None) -> str:
        return task if task and len(self.tasks) > 1 else next(iter(self.tasks))

    async def stop_reason(self) -> str | None:
        """Why the loop must stop before the next turn, or ``None``."""
        cfg = self.config
        if self.step >= cfg.max_steps:
            return f"step limit ({cfg.max_steps} turns)"
        if cfg.max_wall_s is not None and time.monotonic() - self.started >= cfg.max_wall_s:
            return f"wall-clock limit ({cfg.max_wall_s:.0f} s)"
        if self.deadline - time.monotonic() <= self.deadline_reserve_s:
            return f"deadline near ({max(0.0, self.deadline - time.monotonic()):.0f} s left)"
        if all(t in self.submitted or self.left.get(t) == 0 for t in self.tasks):
            return "every task submitted (or without a submission left)"
        budget = await self.call("budget", {})
        if budget.ok:
            left = budget.structured["remaining_usd_micros"] + budget.structured["held_usd_micros"]
            if left <= max(cfg.budget_reserve_fraction * budget.structured["budget_usd_micros"], cfg.budget_reserve_usd_micros):
                return f"budget near its end ({left} micro-USD left)"
        return None

    # ------------------------------------------------------------------ the loop

    async def run(self) -> LLMAgentResult:
        """Run the loop to one of its stop rules, then submit what the model did not (see the module)."""
        messages, tools = await self.begin()
        while (reason := await self.stop_reason()) is None:
            if (reason := await self.turn(messages, tools)) is not None:
                break
        self.say(f"stopping: {escape(reason)}")
        await self.submit_remaining()
        await self.wait_for_grades()
        return LLMAgentResult(stop_reason=reason, steps=self.step, calls=self.calls, submissions=list(self.submitted.values()))

    async def begin(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """Read the tools and the run card: ``(the first messages, the tools offered as OpenAI tools)``. :class:`UnknownTools`
        for a configured tool that does not exist."""
        cfg = self.config
        self.started = time.monotonic()
        listed = {t.name: t for t in (await self.session.list_tools()).tools}
        if unknown := sorted((cfg.tools or set()) - set(listed)):
            raise UnknownTools(f"no such tools: {', '.join(unknown)} (the tools are: {', '.join(sorted(listed))})")
        self.tools = {name: t for name, t in listed.items() if cfg.tools is None or name in cfg.tools}
        card_call = await self.call("run_card", {})
        if not card_call.ok:
            raise RuntimeError(f"the run card cannot be read: {card_call.result[:300]}")
        card = card_call.structured
        self.tasks = {t["name"]: t["initial_system"]["model"] for t in card["benchmark"]["tasks"]}
        limits = card["limits"]
        self.left = ({t: row["left"] for t, row in limits["final_submissions_by_task"].items()} if "final_submissions_by_task" in limits
                     else {self.task_name(None): limits["final_submissions"]["left"]})
        self.deadline = self.started + card["seconds_left"]
        self.deadline_reserve_s = min(cfg.deadline_reserve_s, card["seconds_left"] / 10)
        self.say(f"run {card['run_id']} on {escape(card['benchmark']['name'])} ({card['track']} track, may edit {', '.join(card['editable']) or 'nothing'}); "
                 f"{len(self.tools)} tools; at most {cfg.max_steps} turns")
        messages = [{"role": "system", "content": SYSTEM_PROMPT},
                    {"role": "user", "content": "The run card:\n" + clip(json.dumps(card, separators=(",", ":"), default=str), cfg.max_result_chars)}]
        return messages, openai_tools(list(self.tools.values()))

    async def turn(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> str | None:
        """One model turn: ask, keep its words as a note, run its tool calls and append their results to ``messages``. A
        stop reason when the model stopped answering or keeps answering without a tool call, else ``None``."""
        cfg = self.config
        self.step += 1
        try:
            raw = await self.chat(trim_history(messages, cfg.max_history_chars), tools)
        except Exception as exc:  # noqa: BLE001 - whatever the chat client raises
            if self.step == 1:
                raise LLMUnavailable(f"the model did not answer its first turn: {type(exc).__name__}: {exc}") from exc
            return f"the model stopped answering ({type(exc).__name__}: {str(exc)[:200]})"
        message = assistant_message(raw, self.step)
        messages.append(message)
        self.say(f"step {self.step}/{cfg.max_steps}" + (f": {escape(message['content'][:300])}" if message["content"] else ""))
        if message["content"]:
            await self.note(message["content"])
        if not message.get("tool_calls"):
            self.idle += 1
            if self.idle >= cfg.idle_turns:
                return f"{self.idle} answers in a row without a tool call"
            messages.append({"role": "user", "content": NUDGE})
            return None
        self.idle, waiting = 0, True
        for call in message["tool_calls"]:
            record = await self.run_tool_call(call)
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": clip(record.result, cfg.max_result_chars)})
            mark = "[green]✓[/]" if record.ok else "[red]✗[/]"
            self.console.print(f"  → {escape(record.name)} {_args(record.arguments)} {mark} {escape(record.result[:100])}")
            waiting = waiting and record.ok and record.name in POLL_TOOLS and self._running(record)
        if waiting and cfg.poll_wait_s:  # only polled work still running: give it time before the next turn
            await asyncio.sleep(cfg.poll_wait_s)
        return None

    @staticmethod
    def _running(record: ToolCallRecord) -> bool:
        out = record.structured if isinstance(record.structured, dict) else {}
        status = (out.get("job") or {}).get("status") if record.name == "training_job" else out.get("status")
        return status is not None and status not in FINAL

    async def submit_remaining(self) -> None:
        """Submit, once per task the model did not submit (and that has a submission left), the best system seen."""
        todo = {t: m for t, m in self.tasks.items() if t not in self.submitted and self.left.get(t) != 0}
        if not todo:
            return
        listed = await self.call("list_evaluations", {})
        evaluations = listed.structured.get("data", []) if listed.ok else []
        for task, system in best_systems(evaluations, self.launched, todo).items():
            label = escape(f"[{task}] ") if len(self.tasks) > 1 else ""
            why = f"{system.evaluation}, {_pct(system.score)}" if system.evaluation else "the initial model: no validation score"
            self.say(f"{label}submitting {escape(system.model)} ({why})")
            args: dict[str, Any] = {"model": system.model, "note": f"LLM agent: best seen on validation ({why})"}
            args |= {k: v for k, v in (("harness", system.harness), ("harness_archive", system.harness_archive),
                                       ("task", task if len(self.tasks) > 1 else None)) if v is not None}
            record = await self.call("submit", args)
            if not record.ok:
                self.say(f"[red]{label}submission refused:[/] {escape(record.result[:300])}")

    async def wait_for_grades(self) -> None:
        """Poll the session's submissions until graded or failed, for ``grade_wait_s`` at most."""
        until = time.monotonic() + self.config.grade_wait_s
        for task, sub in list(self.submitted.items()):
            while sub.get("status") not in FINAL and time.monotonic() < until:
                await asyncio.sleep(self.config.poll_s)
                record = await self.call("submission", {"sub_id": sub["id"]})
                if record.ok:
                    sub = self.submitted[task] = record.structured
            score = sub.get("score") or {}
            graded = f": hidden test {100 * score['value']:.1f}%" if score else ""
            self.say(f"submission {sub['id']} ({escape(sub['model'])}) {sub['status']}{graded}")


async def run_llm_agent(gateway_url: str, run_key: str, chat: ChatFn, config: LLMAgentConfig | None = None,
                        console: Console | None = None) -> LLMAgentResult:
    """Connect to the gateway's MCP tools with ``run_key`` and run :class:`LLMAgent` with ``chat`` as its model. An exception
    of the loop (:class:`LLMUnavailable`) is raised as itself, not inside the MCP client's exception group."""
    failure: Exception | None = None
    async with gateway_mcp(gateway_url, run_key) as session:
        try:
            return await LLMAgent(session, chat, config, console).run()
        except Exception as exc:  # noqa: BLE001 - raised again below, once the client has closed
            failure = exc
    raise failure
