"""The official `mcp` SDK's client through the gateway's MCP endpoint, for
tests/tests/vendor_guardrails.rs: one session, the `echo` tool called with
each text in turn.

    python vendor_mcp_check.py URL KEY [--tool=NAME] TEXT [TEXT ...]

(`--tool`: another name for `echo`, e.g. `tools__echo` at the aggregated
endpoint.)

Prints a JSON list: for each call, what the tool echoed (its texts) or the
refusal as its JSON-RPC code and message.
"""
import asyncio
import json
import sys

import httpx2
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError


async def main(url, key, texts):
    tool = "echo"
    if texts and texts[0].startswith("--tool="):
        tool, texts = texts[0].split("=", 1)[1], texts[1:]
    out = []
    client = httpx2.AsyncClient(headers={"authorization": f"Bearer {key}"}, timeout=30)
    async with streamable_http_client(url, http_client=client) as (read, write, *_):
        async with ClientSession(read, write) as s:
            await s.initialize()
            for text in texts:
                try:
                    r = await s.call_tool(tool, {"text": text})
                    out.append([c.text for c in r.content if getattr(c, "text", None) is not None])
                except MCPError as e:
                    out.append({"code": e.error.code, "message": e.error.message})
    print(json.dumps(out))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3:]))
