"""The official OpenAI and Anthropic Python SDKs reading streams the gateway
held to a clamped cap. Run by tests/tests/tenancy.rs:

    python stream_cap_check.py BASE_URL OPENAI_KEY ANTHROPIC_KEY MODEL

The mock ignores the cap and streams far past it; the gateway ends each
stream at the cap. Prints one JSON object: for each SDK, the text length,
the last finish or stop reason, the usage the stream reported, and any
exception the SDK raised while reading.
"""
import json
import sys

import anthropic
import openai

base, key, anthropic_key, model = sys.argv[1:5]
out = {}

client = openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0, timeout=20)
try:
    text, finish, usage = "", None, None
    stream = client.chat.completions.create(
        model=model, stream=True, stream_options={"include_usage": True},
        messages=[{"role": "user", "content": "Write at length"}])
    for chunk in stream:
        if chunk.usage:
            usage = chunk.usage.completion_tokens
        for c in chunk.choices:
            text += c.delta.content or ""
            finish = c.finish_reason or finish
    out["openai"] = {"chars": len(text), "finish": finish, "completion_tokens": usage, "raised": None}
except Exception as e:  # noqa: BLE001 - the test asserts there is none
    out["openai"] = {"raised": f"{type(e).__name__}: {e}"}

client = anthropic.Anthropic(base_url=base, api_key=anthropic_key, max_retries=0, timeout=20)
try:
    with client.messages.stream(model=model, max_tokens=4096,
                                messages=[{"role": "user", "content": "Write at length"}]) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    out["anthropic"] = {"chars": len(text), "stop": final.stop_reason,
                        "output_tokens": final.usage.output_tokens, "raised": None}
except Exception as e:  # noqa: BLE001
    out["anthropic"] = {"raised": f"{type(e).__name__}: {e}"}
print(json.dumps(out))
