"""A small MCP server for the MCP tests (tests/tests/mcp_envoy.rs,
tests/tests/mcp_gateway.rs): the official `mcp` SDK's MCPServer over
streamable HTTP.

    python mcp_server.py NAME PORT [json]

Tools: `echo`, `add`, `secret` (a tool most keys may not see), `count`
(streams a progress notification per step before its answer), `wait`
(answers after a while), `card` (a
result with a card number in it, for the output guardrails) and
`headers` (the request headers the server got: the credential, the trace).
A resource `info://NAME` and a prompt `greet`. With `json`, answers are
JSON instead of SSE streams.
"""
import asyncio
import json
import sys

from mcp.server.mcpserver import Context, MCPServer

name, port = sys.argv[1], int(sys.argv[2])
json_response = len(sys.argv) > 3 and sys.argv[3] == "json"
server = MCPServer(name)


@server.tool()
def echo(text: str) -> str:
    """Echo the text back, with the server's name."""
    return f"{name}: {text}"


@server.tool()
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


@server.tool()
def secret() -> str:
    """A tool only some keys may call."""
    return f"{name}: the secret"


@server.tool()
async def count(n: int, ctx: Context) -> str:
    """Count to n, reporting progress at each step."""
    for i in range(1, n + 1):
        await ctx.report_progress(i, n, f"step {i}")
    return f"counted to {n}"


@server.tool()
async def wait(seconds: float) -> str:
    """Answer after a while (calls in flight)."""
    await asyncio.sleep(seconds)
    return f"waited {seconds}"


@server.tool()
def card(text: str) -> str:
    """Answer with a card number in the text."""
    return f"{text} 4111 1111 1111 1111"


@server.tool()
def headers(ctx: Context) -> str:
    """The request headers this server got, as JSON."""
    req = ctx.request_context.request
    return json.dumps({k.lower(): v for k, v in req.headers.items()} if req else {})


@server.resource(f"info://{name}")
def info() -> str:
    """What this server is."""
    return f"server {name}"


@server.prompt()
def greet(who: str) -> str:
    """A greeting."""
    return f"Hello {who}, from {name}"


server.run("streamable-http", host="127.0.0.1", port=port, json_response=json_response)
