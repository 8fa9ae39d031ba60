"""The official OpenAI Python SDK against guardrails: a denied prompt and a
denied answer raise the SDK's exception classes, a denied stream raises
while iterating, a redacted stream reads as plain text. Run by
tests/tests/guardrails.rs:

    python guardrails_sdk_check.py BASE_URL KEY

The test scripts the mock provider's answers: a secret twice (denied by
the `secret` output check), then a card number (redacted).
Prints one JSON object with what each call returned or raised.
"""
import json
import sys

import openai

base, key = sys.argv[1], sys.argv[2]
client = openai.OpenAI(base_url=base, api_key=key, max_retries=0, timeout=20)
out = {}


def msg(text):
    return [{"role": "user", "content": text}]


def error_of(fn):
    try:
        fn()
        return None
    except openai.APIStatusError as e:
        return {"class": type(e).__name__, "status": e.status_code, "code": getattr(e, "code", None)}


out["prompt_denied"] = error_of(
    lambda: client.chat.completions.create(model="mini", messages=msg("mail jane@example.com"))
)
out["answer_denied"] = error_of(lambda: client.chat.completions.create(model="mini", messages=msg("hi")))

received = []
try:
    for chunk in client.chat.completions.create(model="mini", stream=True, messages=msg("hi")):
        if chunk.choices and chunk.choices[0].delta.content:
            received.append(chunk.choices[0].delta.content)
    out["stream_denied"] = {"raised": None}
except openai.APIError as e:
    out["stream_denied"] = {
        "raised": type(e).__name__,
        "code": (e.body or {}).get("code") if isinstance(e.body, dict) else None,
        "received": "".join(received),
    }

text = ""
for chunk in client.chat.completions.create(model="mini", stream=True, messages=msg("card")):
    if chunk.choices and chunk.choices[0].delta.content:
        text += chunk.choices[0].delta.content
out["stream_redacted"] = text
print(json.dumps(out))
