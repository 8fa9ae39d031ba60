"""The official `mcp` SDK's client (streamable HTTP) through an MCP
endpoint, for tests/tests/mcp_envoy.rs:

    python mcp_check.py URL

Prints one JSON object: the server's name, the tools listed, a call's
answer.
"""
import asyncio
import json
import sys

from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client


async def main(url):
    out = {}
    async with streamable_http_client(url) as (read, write, *_):
        async with ClientSession(read, write) as s:
            init = await s.initialize()
            out["server"] = init.server_info.name
            out["tools"] = sorted(t.name for t in (await s.list_tools()).tools)
            r = await s.call_tool("alpha__add", {"a": 2, "b": 3})
            out["call"] = [c.text for c in r.content]
            r = await s.call_tool("beta__echo", {"text": "hi"})
            out["echo"] = [c.text for c in r.content]
    print(json.dumps(out))


asyncio.run(main(sys.argv[1]))
