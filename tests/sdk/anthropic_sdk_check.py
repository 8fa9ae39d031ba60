"""The official Anthropic Python SDK against the gateway's /v1/messages.
Run by tests/tests/messages_api.rs:

    python anthropic_sdk_check.py BASE_URL KEY MODEL

The test scripts the mock's answers in this order: a message, a stream, a
tool use, a streamed tool use, then a 400.
Prints one JSON object with what each call returned or raised.
"""
import json
import sys

import anthropic

base, key, model = sys.argv[1], sys.argv[2], sys.argv[3]
client = anthropic.Anthropic(base_url=base, api_key=key, max_retries=0, timeout=20)
out = {}
msgs = [{"role": "user", "content": "Say hi"}]
tools = [{"name": "get_weather", "description": "Weather in a city",
          "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]

m = client.messages.create(model=model, max_tokens=100, system="Be brief.", messages=msgs)
out["create"] = {"text": m.content[0].text, "stop": m.stop_reason, "input": m.usage.input_tokens,
                 "output": m.usage.output_tokens, "type": m.type}

with client.messages.stream(model=model, max_tokens=100, messages=msgs) as s:
    text = "".join(s.text_stream)
    final = s.get_final_message()
out["stream"] = {"text": text, "output": final.usage.output_tokens, "stop": final.stop_reason}

ask = [{"role": "user", "content": "Weather in Paris?"}]
m = client.messages.create(model=model, max_tokens=100, messages=ask, tools=tools)
use = [b for b in m.content if b.type == "tool_use"][0]
out["tool"] = {"name": use.name, "input": use.input, "stop": m.stop_reason}

with client.messages.stream(model=model, max_tokens=100, messages=ask, tools=tools) as s:
    final = s.get_final_message()
use = [b for b in final.content if b.type == "tool_use"][0]
out["tool_stream"] = {"name": use.name, "input": use.input, "stop": final.stop_reason}


c = client.messages.count_tokens(model=model, system="Be brief.", messages=msgs)
raw = client.messages.with_raw_response.count_tokens(model=model, messages=msgs)
out["count"] = {"input_tokens": c.input_tokens, "estimated": raw.headers.get("x-portcullis-estimated")}


def error_of(fn):
    try:
        fn()
        return None
    except anthropic.APIStatusError as e:
        body = e.body if isinstance(e.body, dict) else {}
        return {"class": type(e).__name__, "status": e.status_code, "type": (body.get("error") or {}).get("type")}


out["errors"] = {
    "provider_400": error_of(lambda: client.messages.create(model=model, max_tokens=10, messages=msgs)),
    "bad_key": error_of(lambda: anthropic.Anthropic(base_url=base, api_key="sk-nope", max_retries=0)
                        .messages.create(model=model, max_tokens=10, messages=msgs)),
    "unknown_model": error_of(lambda: client.messages.create(model="claude-none", max_tokens=10, messages=msgs)),
}
print(json.dumps(out))
