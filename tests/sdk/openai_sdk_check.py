"""The official OpenAI Python SDK against the gateway: it must not notice
the gateway, except for the better. Run by tests/tests/openai_sdk.rs:

    python openai_sdk_check.py BASE_URL DEMO_KEY MINI_KEY

Prints one JSON object with what each call returned or raised.
"""
import json
import sys

import openai

base, demo_key, mini_key = sys.argv[1], sys.argv[2], sys.argv[3]
out = {}


def client(key):
    # No SDK retries: the test wants to see each answer as it came.
    return openai.OpenAI(base_url=base, api_key=key, max_retries=0, timeout=20)


def error_of(fn):
    try:
        fn()
        return None
    except openai.APIStatusError as e:
        return {"class": type(e).__name__, "status": e.status_code, "code": getattr(e, "code", None)}


demo = client(demo_key)
r = demo.chat.completions.create(model="mini", messages=[{"role": "user", "content": "hi"}])
raw = demo.chat.completions.with_raw_response.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
out["completion"] = {
    "content": r.choices[0].message.content,
    "model": r.model,
    "total_tokens": r.usage.total_tokens,
    "gateway_model_header": raw.headers.get("x-portcullis-model"),
}
chunks = list(demo.chat.completions.create(model="mini", stream=True, messages=[{"role": "user", "content": "count"}]))
out["stream"] = {
    "text": "".join((c.choices[0].delta.content or "") for c in chunks if c.choices),
    "chunks_without_choices": sum(1 for c in chunks if not c.choices),
}
usage_chunks = list(
    demo.chat.completions.create(
        model="mini", stream=True, stream_options={"include_usage": True}, messages=[{"role": "user", "content": "usage"}]
    )
)
out["stream_with_usage"] = {"usage_total": next((c.usage.total_tokens for c in usage_chunks if c.usage), None)}
out["models"] = sorted(m.id for m in client(mini_key).models.list())
retrieved = client(mini_key).models.retrieve("fast")
out["retrieved"] = {"id": retrieved.id, "owned_by": retrieved.owned_by}
out["errors"] = {
    "bad_key": error_of(lambda: client("sk-wrong").chat.completions.create(model="mini", messages=[{"role": "user", "content": "x"}])),
    "unknown_model": error_of(lambda: demo.chat.completions.create(model="gpt-9", messages=[{"role": "user", "content": "x"}])),
    "no_messages": error_of(lambda: demo.chat.completions.create(model="mini", messages=[])),
    "retrieve_hidden": error_of(lambda: client(mini_key).models.retrieve("gpt-4o")),
    "not_allowed": error_of(lambda: client(mini_key).chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "x"}])),
}
print(json.dumps(out))
