"""The official `mcp` SDK's client (streamable HTTP) at the gateway's
aggregated MCP endpoint (every server behind one URL), for
tests/tests/mcp_gateway.rs:

    python mcp_aggregate_check.py URL KEY

Prints one JSON object: the server's name, the tools and prompts listed,
calls' answers (a refusal as its JSON-RPC code and message). The session
ends with DELETE as the client closes.
"""
import asyncio
import json
import sys

import httpx2
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError


async def main(url, key):
    out = {}
    client = httpx2.AsyncClient(headers={"authorization": f"Bearer {key}"}, timeout=30)

    async def step(name, call):
        try:
            out[name] = await call
        except MCPError as e:
            out[name] = {"code": e.error.code, "message": e.error.message}

    async def texts(call):
        r = await call
        return [c.text for c in r.content]

    async with streamable_http_client(url, http_client=client) as (read, write, *_):
        async with ClientSession(read, write) as s:
            init = await s.initialize()
            out["server"] = init.server_info.name
            out["tools"] = sorted(t.name for t in (await s.list_tools()).tools)
            out["prompts"] = sorted(p.name for p in (await s.list_prompts()).prompts)
            await step("echo", texts(s.call_tool("alpha__echo", {"text": "hi"})))
            await step("beta_echo", texts(s.call_tool("beta__echo", {"text": "hi"})))
            await step("headers", texts(s.call_tool("beta__headers", {})))
            await step("secret", texts(s.call_tool("alpha__secret", {})))
            await step("unknown", texts(s.call_tool("gamma__echo", {})))

            async def prompt():
                p = await s.get_prompt("beta__greet", {"who": "Ada"})
                return [m.content.text for m in p.messages]

            await step("prompt", prompt())
            await step("ping", s.send_ping())
            out["ping"] = "ok" if not isinstance(out["ping"], dict) or "code" not in out["ping"] else out["ping"]
    print(json.dumps(out, default=str))


asyncio.run(main(sys.argv[1], sys.argv[2]))
