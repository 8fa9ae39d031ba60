"""The official OpenAI Python SDK's embeddings against the gateway. Run by
tests/tests/embeddings.rs:

    python embeddings_check.py BASE_URL KEY MODEL [DIMENSIONS]

Prints one JSON object: what each call returned (vector lengths, indexes,
usage) or raised.
"""
import json
import sys

import openai

base, key, model = sys.argv[1], sys.argv[2], sys.argv[3]
dims = int(sys.argv[4]) if len(sys.argv) > 4 else 4
client = openai.OpenAI(base_url=base, api_key=key, max_retries=0, timeout=20)
out = {}


def summary(r):
    return {
        "model": r.model,
        "lengths": [len(d.embedding) for d in r.data],
        "indexes": [d.index for d in r.data],
        "prompt_tokens": r.usage.prompt_tokens,
        "total_tokens": r.usage.total_tokens,
    }


# The SDK asks for base64 by default and decodes it to floats itself.
out["default"] = summary(client.embeddings.create(model=model, input="hello there world"))
out["float"] = summary(
    client.embeddings.create(model=model, input=["one", "two words"], encoding_format="float", dimensions=dims)
)
try:
    out["tokens"] = summary(client.embeddings.create(model=model, input=[[1, 2, 3], [4, 5]]))
except openai.APIStatusError as e:
    out["tokens"] = {"class": type(e).__name__, "status": e.status_code, "message": e.message}
# The same vector whether it came as base64 (decoded by the SDK) or floats.
a = client.embeddings.create(model=model, input="hello there world").data[0].embedding
b = client.embeddings.create(model=model, input="hello there world", encoding_format="float").data[0].embedding
out["base64_equals_float"] = len(a) == len(b) > 0 and all(abs(x - y) < 1e-6 for x, y in zip(a, b))
raw = client.embeddings.with_raw_response.create(model=model, input="hello there world")
out["headers"] = {k: raw.headers.get(k) for k in ["x-portcullis-model", "x-portcullis-provider", "x-portcullis-cache"]}
try:
    client.embeddings.create(model="no-such-model", input="x")
    out["missing"] = None
except openai.APIStatusError as e:
    out["missing"] = {"class": type(e).__name__, "status": e.status_code}
print(json.dumps(out))
