"""The official `mcp` SDK's client (streamable HTTP) through an MCP
endpoint, for tests/tests/mcp_envoy.rs:

    python mcp_check.py URL

Prints one JSON object: the server's name, the tools listed, calls'
answers, which of the client's headers reached a server.
"""
import asyncio
import json
import sys

import httpx2
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client


async def main(url):
    out = {}
    # Headers a gateway in front would want to pass on (a credential, the
    # trace): the call to `headers` shows which reach the server.
    client = httpx2.AsyncClient(
        headers={"authorization": "Bearer probe", "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
        timeout=30,
    )
    async with streamable_http_client(url, http_client=client) as (read, write, *_):
        async with ClientSession(read, write) as s:
            init = await s.initialize()
            out["server"] = init.server_info.name
            out["tools"] = sorted(t.name for t in (await s.list_tools()).tools)
            r = await s.call_tool("alpha__add", {"a": 2, "b": 3})
            out["call"] = [c.text for c in r.content]
            r = await s.call_tool("beta__echo", {"text": "hi"})
            out["echo"] = [c.text for c in r.content]
            r = await s.call_tool("alpha__headers", {})
            seen = json.loads(r.content[0].text)
            out["forwarded"] = sorted(h for h in ("authorization", "traceparent") if h in seen)
    print(json.dumps(out))


asyncio.run(main(sys.argv[1]))
