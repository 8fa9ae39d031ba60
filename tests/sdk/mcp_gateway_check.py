"""The official `mcp` SDK's client (streamable HTTP) through the gateway's
MCP endpoint with a client key, for tests/tests/mcp_gateway.rs:

    python mcp_gateway_check.py URL KEY SERVER [TRACEPARENT]

Prints one JSON object: what the client saw of each step (a refusal as
its JSON-RPC code and message) and the session id, which it leaves open
(the test ends it with DELETE).
"""
import asyncio
import json
import sys

import httpx2
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError


def texts(result):
    return [c.text for c in result.content if getattr(c, "text", None) is not None]


async def main(url, key, server, traceparent):
    out, session = {}, {}

    async def remember(response):
        if response.headers.get("mcp-session-id"):
            session["id"] = response.headers["mcp-session-id"]

    headers = {"authorization": f"Bearer {key}"}
    if traceparent:
        headers["traceparent"] = traceparent
    client = httpx2.AsyncClient(headers=headers, timeout=30, event_hooks={"response": [remember]})

    async def step(name, call):
        try:
            out[name] = await call
        except MCPError as e:
            out[name] = {"code": e.error.code, "message": e.error.message}

    async with streamable_http_client(url, http_client=client, terminate_on_close=False) as (read, write, *_):
        async with ClientSession(read, write) as s:
            init = await s.initialize()
            out["server"] = init.server_info.name
            out["tools"] = sorted(t.name for t in (await s.list_tools()).tools)

            async def call(tool, args, **kw):
                r = await s.call_tool(tool, args, **kw)
                return {"error": True, "text": texts(r)} if r.is_error else texts(r)

            await step("echo", call("echo", {"text": "hi"}))
            progress = []

            async def on_progress(p, total, message):
                progress.append(p)

            await step("count", call("count", {"n": 3}, progress_callback=on_progress))
            out["progress"] = progress
            await step("secret", call("secret", {}))
            await step("card", call("card", {"text": "paid with 5500 0000 0000 0004"}))
            await step("headers", call("headers", {}))

            async def resource():
                r = await s.read_resource(f"info://{server}")
                return [c.text for c in r.contents]

            await step("resource", resource())

            async def prompt():
                p = await s.get_prompt("greet", {"who": "Ada"})
                return [m.content.text for m in p.messages]

            await step("prompt", prompt())
    out["session"] = session.get("id")
    print(json.dumps(out))


asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] if len(sys.argv) > 4 else None))
