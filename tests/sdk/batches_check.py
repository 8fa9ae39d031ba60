"""The official OpenAI Python SDK's files and batches against the gateway.
Run by tests/tests/batches.rs:

    python batches_check.py BASE_URL KEY OTHER_KEY LINES PAD

Uploads a batch file of LINES chat requests (each padded with PAD
characters: about 10 MB for the test), creates a batch, reads it back
completed, downloads its output, cancels a second batch, and tries the ids
with another key. Prints one JSON object.
"""
import json
import sys

import openai

base, key, other_key, lines, pad = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
client = openai.OpenAI(base_url=base, api_key=key, max_retries=0, timeout=60)
other = openai.OpenAI(base_url=base, api_key=other_key, max_retries=0, timeout=60)
out = {}


def error(e):
    return {"class": type(e).__name__, "status": e.status_code, "code": getattr(e, "code", None)}


body = "".join(
    json.dumps(
        {
            "custom_id": f"req-{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": f"question {i} " + "x" * pad}]},
        }
    )
    + "\n"
    for i in range(lines)
).encode()
out["upload_bytes"] = len(body)
f = client.files.create(file=("requests.jsonl", body, "application/jsonl"), purpose="batch")
out["file"] = {"id": f.id, "bytes": f.bytes, "purpose": f.purpose, "filename": f.filename}
out["retrieved"] = client.files.retrieve(f.id).id == f.id
b = client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h", metadata={"run": "test"})
out["created"] = {"id": b.id, "status": b.status, "input_file_id": b.input_file_id, "metadata": b.metadata}
r = client.batches.retrieve(b.id)
out["retrieved_batch"] = {
    "status": r.status,
    "total": r.request_counts.total if r.request_counts else None,
    "output_file_id": r.output_file_id,
}
content = client.files.content(r.output_file_id)
results = [json.loads(line) for line in content.text.splitlines() if line.strip()]
out["results"] = {
    "n": len(results),
    "custom_ids": sorted(x["custom_id"] for x in results)[:3],
    "usage": results[0]["response"]["body"]["usage"],
}
b2 = client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
c = client.batches.cancel(b2.id)
out["cancelled"] = {"status": c.status, "id_kept": c.id == b2.id}
try:
    client.batches.cancel(b.id)
    out["cancel_completed"] = None
except openai.APIStatusError as e:
    out["cancel_completed"] = error(e)
listed = client.batches.list()
out["listed"] = sorted(x.id for x in listed.data) == sorted([b.id, b2.id])
# Another key cannot use these ids.
for name, call in [
    ("other_file", lambda: other.files.retrieve(f.id)),
    ("other_batch", lambda: other.batches.retrieve(b.id)),
    ("other_create", lambda: other.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")),
    ("forged", lambda: client.files.retrieve(f.id[:-3] + ("0" if f.id[-3] != "0" else "1") + f.id[-2:])),
    ("list_files", lambda: client.files.list()),
]:
    try:
        call()
        out[name] = None
    except openai.APIStatusError as e:
        out[name] = error(e)
out["other_list"] = [x.id for x in other.batches.list().data]
d = client.files.delete(f.id)
out["deleted"] = {"deleted": d.deleted, "id_kept": d.id == f.id}
print(json.dumps(out))
