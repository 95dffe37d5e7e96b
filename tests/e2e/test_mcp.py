"""A coding agent's MCP calls, with the official ``mcp`` SDK's own client, against the real stack: the gateway's ``/mcp``
(streamable HTTP, the run key as a bearer token) and ``crucible mcp`` (stdio, a child process calling the gateway).

Every tool is listed with a description that states its cost, every tool is called, and what the HTTP API refuses comes
back as a tool error (``is_error``) carrying the problem's ``status``, ``code``, ``detail`` and ``field``. A missing,
unknown or revoked key is refused at the HTTP level before any MCP message, as ``/v1`` refuses it.
"""

from __future__ import annotations

import asyncio
import base64
import json
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from tests.archives import code_harness
from tests.mcp_client import over_http, run_mcp

pytestmark = pytest.mark.e2e

MODEL = "smollm2-135m-instruct"
TOOLS = {"run_card", "budget", "run_report", "list_models", "train_sample", "candidate_scores", "validation_items", "upload_dataset", "list_datasets",
         "create_training_job", "training_job", "list_training_jobs", "cancel_training_job", "chat", "list_harnesses", "download_harness",
         "upload_harness", "create_evaluation", "evaluation", "list_evaluations", "trajectories", "submit", "submission", "list_submissions", "note"}


def over_stdio(stack: Any, key: str, cwd: Path) -> Client:
    """An MCP client of ``crucible mcp`` launched as a child process, as Claude Code or Codex launch it."""
    return Client(StdioServerParameters(command=str(Path(sys.executable).parent / "crucible"), args=["mcp", "--api-key", key, "--gateway", stack.gateway_url],
                                        cwd=str(cwd)))


async def ok(c: Client, tool: str, **args: Any) -> Any:
    """The tool's structured answer (a list comes under ``data``); fails the test on a tool error."""
    result = await c.call_tool(tool, args)
    assert not result.is_error, f"{tool}: {result.content[0].text}"  # type: ignore[union-attr]
    answer = json.loads(result.content[0].text)  # type: ignore[union-attr]
    assert result.structured_content == (answer if isinstance(answer, dict) else {"data": answer})
    return answer


async def refused(c: Client, tool: str, **args: Any) -> dict[str, Any]:
    """The problem a refused call carries (fails the test if the call succeeded)."""
    result = await c.call_tool(tool, args)
    assert result.is_error, f"{tool} was not refused: {result.content[0].text[:300]}"  # type: ignore[union-attr]
    problem = result.structured_content
    assert problem is not None and problem["code"] and problem["detail"]
    assert result.content[0].text.startswith(f"{problem['status']} {problem['code']}: ")  # type: ignore[union-attr]
    return problem


def test_every_tool_over_http_answers_what_the_http_api_answers(stack, new_run) -> None:  # noqa: ANN001
    run, http = new_run("mcp-http")

    async def body(c: Client) -> None:
        tools = {t.name: t for t in (await c.list_tools()).tools}
        assert set(tools) == TOOLS
        for t in tools.values():  # what it costs and what it refuses, for the agent to read
            assert "Free" in t.description or "Costs" in t.description or "Not charged" in t.description, t.name
        card = await ok(c, "run_card")
        assert card["run_id"] == run["id"] and card == http.run() | {"seconds_left": card["seconds_left"]}
        assert (await ok(c, "budget"))["budget_usd_micros"] == http.budget()["budget_usd_micros"]
        assert [m["id"] for m in await ok(c, "list_models")] == [m["id"] for m in http.http.get("/v1/models").json()["data"]]
        assert await ok(c, "train_sample", limit=3) == http.train_sample(limit=3)
        validation = await ok(c, "validation_items")
        assert validation == http.validation_items()

        rows = [{"prompt": v["question"], "completion": v["answer"]} for v in validation[:4]]
        dataset = await ok(c, "upload_dataset", rows=rows, name="mcp.jsonl")
        assert dataset["rows"] == 4 and [d["id"] for d in await ok(c, "list_datasets")] == [dataset["id"]]
        job = await ok(c, "create_training_job", model=MODEL, datasets=[dataset["id"]], recipe={"max_steps": 200}, idempotency_key="mcp-1")
        assert (await ok(c, "create_training_job", model=MODEL, datasets=[dataset["id"]], recipe={"max_steps": 200},
                         idempotency_key="mcp-1"))["id"] == job["id"]
        status = await ok(c, "training_job", job_id=job["id"])
        assert status["job"]["id"] == job["id"] and isinstance(status["latest_events"], list) and isinstance(status["checkpoints"], list)
        assert [j["id"] for j in await ok(c, "list_training_jobs")] == [job["id"]]
        assert (await ok(c, "cancel_training_job", job_id=job["id"]))["id"] == job["id"]

        answer = await ok(c, "chat", model=MODEL, messages=[{"role": "user", "content": "Say hi."}], params={"max_tokens": 3, "temperature": 0})
        assert answer["object"] == "chat.completion" and answer["usage"]["completion_tokens"] <= 3

        archive = code_harness("echo 0")
        mine = await ok(c, "upload_harness", archive_base64=base64.b64encode(archive).decode(), name="mine")
        assert [h["id"] for h in await ok(c, "list_harnesses") if not h["platform"]] == [mine["id"]]
        back = await ok(c, "download_harness", harness_id=mine["id"])
        assert base64.b64decode(back["archive_base64"]) == archive and back["bytes"] == len(archive)

        ev = await ok(c, "create_evaluation", model=MODEL, limit=1)
        deadline = time.monotonic() + 300
        while (ev := await ok(c, "evaluation", eval_id=ev["id"]))["status"] not in ("succeeded", "failed", "cancelled"):
            assert time.monotonic() < deadline
            await asyncio.sleep(0.5)
        assert ev["status"] == "succeeded" and [e["id"] for e in await ok(c, "list_evaluations")] == [ev["id"]]
        page = await ok(c, "trajectories", eval_id=ev["id"], limit=5)
        assert page["total"] == 1 and page["data"] == http.trajectories(ev["id"])
        report = await ok(c, "run_report")
        assert report["run_id"] == run["id"]

        sub = await ok(c, "submit", model=MODEL, note="via mcp")
        assert (await ok(c, "submission", sub_id=sub["id"]))["id"] == sub["id"]
        assert [s["id"] for s in await ok(c, "list_submissions")] == [sub["id"]]
        assert (await refused(c, "submit", model=MODEL))["code"] == "submission_limit"  # the benchmark allows one

    run_mcp(over_http(stack.gateway_url, run["api_key"]), body)
    http.close()


def test_refused_calls_are_tool_errors_naming_the_field(stack, new_run) -> None:  # noqa: ANN001
    run, http = new_run("mcp-refusals")
    other, other_http = new_run("mcp-other")
    other_dataset = other_http.upload_dataset(b'{"prompt": "1+1=", "completion": "2"}\n', "other.jsonl")

    async def body(c: Client) -> None:
        problem = await refused(c, "upload_dataset", rows=[{"prompt": "x"}])
        assert problem["status"] == 422 and problem["field"]
        assert (await refused(c, "create_training_job", model=MODEL, datasets=[other_dataset["id"]]))["status"] == 404  # another run's
        locked = await refused(c, "create_training_job", model=MODEL, datasets=[], recipe={"method": "dpo"})
        assert locked["status"] == 403 and locked["field"] == "recipe.method"
        assert (await refused(c, "evaluation", eval_id="eval_00000000000000000000000000"))["status"] == 404
        assert (await refused(c, "chat", model="no-such-model", messages=[{"role": "user", "content": "hi"}]))["field"] == "model"
        local = await refused(c, "upload_dataset", path="/etc/passwd")  # the gateway's own disk is not the agent's
        assert local["field"] == "path" and "stdio" in local["detail"]
        assert (await refused(c, "download_harness", harness_id="har_00000000000000000000000000", path="/tmp/x"))["field"] == "path"
        assert (await refused(c, "upload_harness", archive_base64="not base64!"))["field"] == "archive_base64"
        assert (await refused(c, "upload_dataset"))["field"] == "rows"
        # arguments the tool cannot take are refused as the API refuses a bad request: 422 naming the argument
        assert (await refused(c, "train_sample", limit=0))["field"] == "limit"
        assert (await refused(c, "trajectories", eval_id=123))["field"] == "eval_id"
        assert (await refused(c, "evaluation"))["field"] == "eval_id"
        assert (await refused(c, "no_such_tool"))["field"] == "name"
        for probe in ("../run", "../../admin/runs", "eval_00000000000000000000000000/../../run"):  # an id is an id, not a path
            problem = await refused(c, "evaluation", eval_id=probe)
            assert (problem["status"], problem["code"], problem["field"]) == (422, "invalid_input", "eval_id")

    run_mcp(over_http(stack.gateway_url, run["api_key"]), body)
    assert http.datasets() == []  # nothing half-written
    http.close()
    other_http.close()


@pytest.mark.parametrize("key", ["none", "unknown", "revoked"])
def test_mcp_over_http_refuses_a_key_as_the_http_api_does(stack, admin, new_run, key: str) -> None:  # noqa: ANN001
    run, http = new_run(f"mcp-key-{key}")
    sent = {"none": None, "unknown": "crk_" + "x" * 40, "revoked": run["api_key"]}[key]
    if key == "revoked":
        admin.revoke(run["id"])
    initialize = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
                  "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}}
    headers = {"Accept": "application/json, text/event-stream"} | ({"Authorization": f"Bearer {sent}"} if sent else {})
    answer = httpx.post(f"{stack.gateway_url}/mcp", json=initialize, headers=headers, timeout=30)
    expected = httpx.get(f"{stack.gateway_url}/v1/run", headers={"Authorization": f"Bearer {sent}"} if sent else {}, timeout=30)
    assert answer.status_code == expected.status_code == 401
    assert answer.headers["content-type"].startswith("application/problem+json")
    assert answer.json()["detail"] == expected.json()["detail"]
    with pytest.raises(Exception):  # noqa: B017, PT011 - the SDK's client gives up on a 401, whatever it raises
        run_mcp(over_http(stack.gateway_url, sent), lambda c: c.list_tools())
    http.close()


def test_stdio_server_reads_and_writes_the_agents_own_files(stack, new_run, tmp_path: Path) -> None:  # noqa: ANN001
    run, http = new_run("mcp-stdio")
    data = tmp_path / "train.jsonl"
    data.write_text('{"prompt": "2+2=", "completion": "4"}\n{"prompt": "3+3=", "completion": "6"}\n')

    async def body(c: Client) -> None:
        assert {t.name for t in (await c.list_tools()).tools} == TOOLS
        assert (await ok(c, "run_card"))["run_id"] == run["id"]
        dataset = await ok(c, "upload_dataset", path=str(data))
        assert dataset["rows"] == 2 and dataset["name"] == "train.jsonl"
        (tmp_path / "harness.tar.gz").write_bytes(code_harness("echo 0"))
        mine = await ok(c, "upload_harness", path=str(tmp_path / "harness.tar.gz"))
        out = tmp_path / "back.tar.gz"
        written = await ok(c, "download_harness", harness_id=mine["id"], path=str(out))
        assert out.read_bytes() == (tmp_path / "harness.tar.gz").read_bytes() and written["bytes"] == out.stat().st_size
        assert (await refused(c, "upload_dataset", path=str(tmp_path / "missing.jsonl")))["field"] == "path"

    run_mcp(over_stdio(stack, run["api_key"], tmp_path), body)
    assert [d["id"] for d in http.datasets()] != []
    http.close()

    async def gone(c: Client) -> None:  # a gateway that cannot be reached: a 503 to retry, not a crash
        problem = await refused(c, "run_card")
        assert (problem["status"], problem["code"]) == (503, "upstream_unavailable") and "--gateway" in problem["detail"]

    unreachable = Client(StdioServerParameters(command=str(Path(sys.executable).parent / "crucible"),
                                               args=["mcp", "--api-key", run["api_key"], "--gateway", "http://127.0.0.1:9"], cwd=str(tmp_path)))
    run_mcp(unreachable, gone)


def test_a_call_past_the_keys_rate_limit_tells_the_agent_to_retry(stack, new_run) -> None:  # noqa: ANN001
    """Past the key's 30 calls a second, an MCP call's error says so, with when to retry (an HTTP 429 reached the
    unmodified MCP client as an opaque "Server returned an error response"); the call made again later succeeds."""
    from mcp.shared.exceptions import MCPError

    run, http = new_run("mcp-rate")

    async def body(c: Client) -> tuple[str, Any]:
        # 40 clients of the key call in a loop while the MCP call is made, so its window of a second is full whatever the
        # machine's load (a burst awaited before the call left the window to drain on a loaded machine); a refused call
        # comes back at once and goes again, so the window stays full until they stop
        limited, done = asyncio.Event(), asyncio.Event()
        async with httpx.AsyncClient(headers={"Authorization": f"Bearer {run['api_key']}"}, timeout=60) as burst:
            async def hammer() -> None:
                while not done.is_set():
                    if (await burst.get(f"{stack.gateway_url}/v1/budget")).status_code == 429:
                        limited.set()

            clients = [asyncio.create_task(hammer()) for _ in range(40)]
            try:
                await asyncio.wait_for(limited.wait(), 120)
                await c.call_tool("budget", {})
            except MCPError as exc:
                message = str(exc)
            else:
                message = "no error"
            finally:
                done.set()
                await asyncio.gather(*clients)
        await asyncio.sleep(1.1)
        return message, await c.call_tool("budget", {})

    message, again = run_mcp(over_http(stack.gateway_url, run["api_key"]), body)
    assert message.startswith("429 rate_limited") and "retry after" in message, message
    assert not again.is_error and again.structured_content["budget_usd_micros"] > 0
    http.close()
