"""The OpenAI Agents SDK runs an agent whose model is called through the
gateway and whose tools are reached through the gateway's MCP endpoint,
both under one trace (the client's `traceparent` on every call). Run by
tests/tests/mcp_gateway.rs, which scripts the mock: a call of
`alpha__echo`, then the answer.

    python agents_mcp_check.py GATEWAY_URL KEY MODEL TRACEPARENT

Prints one JSON object: the final output, the tools the agent saw.
"""
import asyncio
import json
import sys

from agents import Agent, Runner, set_default_openai_api, set_default_openai_client, set_tracing_disabled
from agents.mcp import MCPServerStreamableHttp
from openai import AsyncOpenAI

gateway, key, model, traceparent = sys.argv[1:5]
set_tracing_disabled(True)
set_default_openai_client(
    AsyncOpenAI(base_url=f"{gateway}/v1", api_key=key, max_retries=0, timeout=20,
                default_headers={"traceparent": traceparent}),
    use_for_tracing=False,
)
set_default_openai_api("chat_completions")


async def main():
    params = {"url": f"{gateway}/mcp", "headers": {"authorization": f"Bearer {key}", "traceparent": traceparent}, "timeout": 20}
    async with MCPServerStreamableHttp(params=params, cache_tools_list=True, name="gateway") as server:
        agent = Agent(name="tools", instructions="Use the tools.", model=model, mcp_servers=[server])
        result = await Runner.run(agent, "Echo hi, please.")
        tools = sorted(t.name for t in await server.list_tools())
    print(json.dumps({"final": result.final_output, "tools": tools}))


asyncio.run(main())
