"""The official OpenAI Python SDK's Responses API against the gateway. Run
by tests/tests/responses_api.rs:

    python responses_check.py BASE_URL KEY MODEL CHAINED

The test scripts the mock's answers in this order: a response, a stream, a
function call, the answer to its output, then a structured answer.
CHAINED=1: the tool-output turn uses previous_response_id (a provider that
keeps responses); 0: it resends the whole conversation.
Prints one JSON object with what each call returned or raised.
"""
import json
import sys

import openai

base, key, model, chained = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "1"
client = openai.OpenAI(base_url=base, api_key=key, max_retries=0, timeout=20)
out = {}

r = client.responses.create(model=model, instructions="Be brief.", input="Say hi")
out["create"] = {"text": r.output_text, "status": r.status, "input": r.usage.input_tokens,
                 "output": r.usage.output_tokens, "object": r.object}

text, kinds, final = "", [], None
with client.responses.stream(model=model, input="Say hi") as s:
    for ev in s:
        kinds.append(ev.type)
        if ev.type == "response.output_text.delta":
            text += ev.delta
    final = s.get_final_response()
out["stream"] = {"text": text, "final": final.output_text, "output": final.usage.output_tokens,
                 "first": kinds[0], "last": kinds[-1]}

tools = [{"type": "function", "name": "get_weather", "description": "Weather in a city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
r = client.responses.create(model=model, input="Weather in Paris?", tools=tools)
call = [o for o in r.output if o.type == "function_call"][0]
out["tool"] = {"name": call.name, "arguments": json.loads(call.arguments)}
result = {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}
if chained:
    r2 = client.responses.create(model=model, previous_response_id=r.id, input=[result], tools=tools)
else:
    convo = [{"role": "user", "content": "Weather in Paris?"},
             {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
             result]
    r2 = client.responses.create(model=model, input=convo, tools=tools)
out["tool_result"] = {"text": r2.output_text, "status": r2.status}
if chained:
    # A kept response, read back by id through the gateway, then deleted.
    got = client.responses.retrieve(r2.id)
    items = client.responses.input_items.list(r2.id)
    deleted = client.responses.delete(r2.id)
    try:
        client.responses.retrieve(r2.id)
        after = None
    except openai.APIStatusError as e:
        after = e.status_code
    out["by_id"] = {"same": got.id == r2.id, "text": got.output_text, "items": len(items.data),
                    "deleted": deleted is None or getattr(deleted, "deleted", True), "after_delete": after}

r = client.responses.create(model=model, input="A JSON object please",
                            text={"format": {"type": "json_schema", "name": "answer",
                                             "schema": {"type": "object", "properties": {"a": {"type": "integer"}}}}})
out["structured"] = {"text": r.output_text}


def error_of(fn):
    try:
        fn()
        return None
    except openai.APIStatusError as e:
        return {"class": type(e).__name__, "status": e.status_code, "message": e.message}


out["errors"] = {
    "unknown_model": error_of(lambda: client.responses.create(model="no-such-model", input="x")),
    "stale_previous": error_of(lambda: client.responses.create(model=model, previous_response_id="resp_gone", input="x")),
    "unknown_id": error_of(lambda: client.responses.retrieve("resp_never_made")),
}
print(json.dumps(out))
