"""The OpenAI Agents SDK runs an agent with one tool through the gateway on
its default API (Responses). Run by tests/tests/responses_api.rs:

    python agents_check.py BASE_URL KEY MODEL

The test scripts the mock: first a call of the tool, then the answer.
Prints one JSON object: the final output and the tool's calls.
"""
import json
import sys

from agents import Agent, Runner, function_tool, set_default_openai_api, set_default_openai_client, set_tracing_disabled
from openai import AsyncOpenAI

base, key, model = sys.argv[1], sys.argv[2], sys.argv[3]
set_tracing_disabled(True)
set_default_openai_client(AsyncOpenAI(base_url=base, api_key=key, max_retries=0, timeout=20), use_for_tracing=False)
set_default_openai_api("responses")
calls = []


@function_tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    calls.append(city)
    return f"sunny in {city}"


agent = Agent(name="weather", instructions="Answer with the tool's help.", model=model, tools=[get_weather])
result = Runner.run_sync(agent, "Weather in Paris?")
print(json.dumps({"final": result.final_output, "calls": calls}))
