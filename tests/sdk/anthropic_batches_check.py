"""The official Anthropic Python SDK's Message Batches against the gateway.
Run by tests/tests/batches.rs:

    python anthropic_batches_check.py BASE_URL KEY OTHER_KEY MODEL

Creates a batch of three requests, reads it back ended, iterates its
results (the SDK fetches `results_url`, which must point at the gateway),
deletes it, cancels a second, and tries the ids with another key. Prints
one JSON object.
"""
import json
import sys

import anthropic

base, key, other_key, model = sys.argv[1:5]
client = anthropic.Anthropic(base_url=base, api_key=key, max_retries=0, timeout=30)
other = anthropic.Anthropic(base_url=base, api_key=other_key, max_retries=0, timeout=30)
out = {}


def error(e):
    return {"class": type(e).__name__, "status": e.status_code, "type": (e.body or {}).get("error", {}).get("type") if isinstance(e.body, dict) else None}


requests = [
    {"custom_id": f"q{i}", "params": {"model": model, "max_tokens": 20, "messages": [{"role": "user", "content": f"question number {i}"}]}}
    for i in range(3)
]
b = client.messages.batches.create(requests=requests)
out["created"] = {"id": b.id, "status": b.processing_status, "processing": b.request_counts.processing}
r = client.messages.batches.retrieve(b.id)
out["retrieved"] = {"status": r.processing_status, "succeeded": r.request_counts.succeeded, "results_url": r.results_url}
results = list(client.messages.batches.results(b.id))
out["results"] = sorted(
    [{"custom_id": x.custom_id, "type": x.result.type, "text": x.result.message.content[0].text} for x in results],
    key=lambda x: x["custom_id"],
)
b2 = client.messages.batches.create(requests=requests[:1])
c = client.messages.batches.cancel(b2.id)
out["cancelled"] = {"status": c.processing_status, "id_kept": c.id == b2.id}
for name, call in [
    ("other_retrieve", lambda: other.messages.batches.retrieve(b.id)),
    ("other_results", lambda: list(other.messages.batches.results(b.id))),
    ("list", lambda: client.messages.batches.list()),
]:
    try:
        call()
        out[name] = None
    except anthropic.APIStatusError as e:
        out[name] = error(e)
d = client.messages.batches.delete(b.id)
out["deleted"] = {"type": d.type, "id_kept": d.id == b.id}
print(json.dumps(out))
