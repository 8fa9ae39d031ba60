"""A small MCP server for tests/tests/mcp_envoy.rs: the official `mcp`
SDK's MCPServer over streamable HTTP, two tools.

    python mcp_server.py NAME PORT
"""
import sys

from mcp.server.mcpserver import MCPServer

name, port = sys.argv[1], int(sys.argv[2])
server = MCPServer(name)


@server.tool()
def echo(text: str) -> str:
    """Echo the text back, with the server's name."""
    return f"{name}: {text}"


@server.tool()
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


server.run("streamable-http", host="127.0.0.1", port=port)
