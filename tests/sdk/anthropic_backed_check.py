"""The official OpenAI Python SDK against a model an Anthropic provider
serves (the gateway translates both ways). Run by tests/tests/provider_apis.rs:

    python anthropic_backed_check.py BASE_URL KEY MODEL

The test scripts the mock's answers in this order: a plain answer, a
stream, a tool call plain, a tool call streamed, then a 400.
Prints one JSON object with what each call returned or raised.
"""
import json
import sys

import openai

base, key, model = sys.argv[1], sys.argv[2], sys.argv[3]
client = openai.OpenAI(base_url=base, api_key=key, max_retries=0, timeout=20)
out = {}
tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hi"}]

r = client.chat.completions.create(model=model, messages=msgs, max_tokens=50)
out["plain"] = {"content": r.choices[0].message.content, "finish": r.choices[0].finish_reason,
                "usage": r.usage.model_dump() if r.usage else None, "object": r.object}

text, usage, roles, finish = "", None, 0, None
for c in client.chat.completions.create(model=model, messages=msgs, stream=True,
                                        stream_options={"include_usage": True}):
    if c.usage:
        usage = c.usage.total_tokens
    for ch in c.choices:
        if ch.delta.role:
            roles += 1
        if ch.delta.content:
            text += ch.delta.content
        if ch.finish_reason:
            finish = ch.finish_reason
out["stream"] = {"text": text, "usage_total": usage, "roles": roles, "finish": finish}

ask = [{"role": "user", "content": "Weather in Paris?"}]
r = client.chat.completions.create(model=model, messages=ask, tools=tools)
call = r.choices[0].message.tool_calls[0]
out["tool_plain"] = {"name": call.function.name, "arguments": json.loads(call.function.arguments),
                     "finish": r.choices[0].finish_reason, "id": call.id}

calls = {}
finish = None
for c in client.chat.completions.create(model=model, messages=ask, tools=tools, stream=True):
    for ch in c.choices:
        for tc in ch.delta.tool_calls or []:
            entry = calls.setdefault(tc.index, {"name": "", "arguments": ""})
            if tc.function.name:
                entry["name"] = tc.function.name
            if tc.function.arguments:
                entry["arguments"] += tc.function.arguments
        if ch.finish_reason:
            finish = ch.finish_reason
out["tool_stream"] = {"calls": {str(k): {"name": v["name"], "arguments": json.loads(v["arguments"])} for k, v in calls.items()},
                      "finish": finish}

# The tool result goes back: a tool_result answering the tool_use.
follow = ask + [{"role": "assistant", "content": None, "tool_calls": [
    {"id": out["tool_plain"]["id"], "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
    {"role": "tool", "tool_call_id": out["tool_plain"]["id"], "content": "sunny"}]
r = client.chat.completions.create(model=model, messages=follow, tools=tools)
out["tool_result_turn"] = r.choices[0].message.content

try:
    client.chat.completions.create(model=model, messages=msgs)
    out["error"] = None
except openai.APIStatusError as e:
    out["error"] = {"class": type(e).__name__, "status": e.status_code, "code": getattr(e, "code", None)}
print(json.dumps(out))
