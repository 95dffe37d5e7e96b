"""A coding agent's MCP client of the gateway's ``/mcp``, for the tests: the official ``mcp`` SDK's ``Client`` over
streamable HTTP with the run key as bearer token, and a walk over every read-only tool (what the isolation tests add to
the HTTP routes they crawl)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client


def over_http(gateway_url: str, key: str | None) -> Client:
    """An MCP client of ``gateway_url``'s ``/mcp`` sending ``key`` as the bearer token (none: no Authorization header)."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return Client(streamable_http_client(f"{gateway_url}/mcp", http_client=httpx2.AsyncClient(headers=headers, timeout=120)))


def run_mcp(client: Client, body: Callable[[Client], Awaitable[Any]]) -> Any:
    """``body(client)`` in a session of ``client``, from synchronous test code."""
    async def session() -> Any:
        async with client as c:
            return await body(c)
    return asyncio.run(session())


def read_everything(gateway_url: str, key: str, ids: dict[str, str]) -> list[tuple[str, bool, dict[str, Any] | None]]:
    """Call every read-only tool once, its required arguments taken from ``ids`` (``eval_id``, ``sub_id``, ``job_id``,
    ``harness_id`` …; a tool needing one not given is left out): ``(tool, is_error, structured content)`` by tool name."""
    async def walk(c: Client) -> list[tuple[str, bool, dict[str, Any] | None]]:
        out = []
        for tool in sorted((await c.list_tools()).tools, key=lambda t: t.name):
            if not (tool.annotations and tool.annotations.read_only_hint):
                continue
            required = tool.input_schema.get("required", [])
            if not set(required) <= set(ids):
                continue
            try:
                result = await c.call_tool(tool.name, {name: ids[name] for name in required})
            except Exception as exc:  # noqa: BLE001 - a protocol error, not a tool's: name the tool
                raise AssertionError(f"MCP tool {tool.name} ({ {name: ids[name] for name in required} }) answered a protocol error: {exc!r}") from exc
            out.append((tool.name, bool(result.is_error), result.structured_content))
        return out
    return run_mcp(over_http(gateway_url, key), walk)
