"""The official OpenAI Python SDK's Responses API against the gateway. Run
by tests/tests/responses_api.rs:

    python responses_check.py BASE_URL KEY MODEL CHAINED

The test scripts the mock's answers in this order: a response, a stream, a
function call, the answer to its output, a streamed function call, an
answer about an image, then a structured answer (with the basic, streaming
and system prompt calls, the seven cases of the Open Responses compliance
test). CHAINED=1: the tool-output turn uses previous_response_id (a
provider that keeps responses); 0: it resends the whole conversation.

Every answer the SDK reads is recorded as it came off the wire, and every
successful Responses object and streaming event is validated against the
Open Responses schema (open_responses.py): `conformance` in the output.
CHAINED=1 means an OpenAI provider whose objects pass through untouched.
Prints one JSON object with what each call returned or raised.
"""
import json
import sys

import httpx2 as httpx
import openai

from open_responses import Checker

base, key, model, chained = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "1"


class Recording(httpx.BaseTransport):
    """Every answer, read whole, kept with its request's method and path."""

    def __init__(self):
        self.inner = httpx.HTTPTransport()
        self.seen = []

    def handle_request(self, request):
        r = self.inner.handle_request(request)
        body = r.read()
        self.seen.append((request.method, request.url.path, r.status_code,
                          r.headers.get("content-type", ""), body))
        return httpx.Response(r.status_code, headers=r.headers, content=body, request=request)


recording = Recording()
client = openai.OpenAI(base_url=base, api_key=key, max_retries=0, timeout=20,
                       http_client=httpx.Client(transport=recording))
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

# The compliance test's streamed tool call and image input.
calls, done_args = [], None
with client.responses.stream(model=model, input="Weather in Paris?", tools=tools) as s:
    for ev in s:
        if ev.type == "response.function_call_arguments.done":
            done_args = ev.arguments
    final = s.get_final_response()
calls = [o.name for o in final.output if o.type == "function_call"]
out["tool_stream"] = {"calls": calls, "arguments": json.loads(done_args) if done_args else None}
PIXEL = ("data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8"
         "z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg==")
r = client.responses.create(model=model, input=[{"role": "user", "content": [
    {"type": "input_text", "text": "What is in this image?"},
    {"type": "input_image", "image_url": PIXEL, "detail": "auto"}]}])
out["image"] = {"text": r.output_text, "status": r.status}

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
checker = Checker(openai_upstream=chained)
checked, failures = 0, []
for method, path, status, kind, body in recording.seen:
    where = f"{method} {path} ({status})"
    if status != 200 or "/responses" not in path or path.endswith("/input_items") or method == "DELETE":
        continue
    checked += 1
    if "text/event-stream" in kind:
        failures.extend(checker.sse(body.decode(), where))
    else:
        failures.extend(checker.response(json.loads(body), where))
out["conformance"] = {"checked": checked, "failures": failures}
print(json.dumps(out))
