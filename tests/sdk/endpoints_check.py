"""The official OpenAI Python SDK's images, audio and moderations against
the gateway. Run by tests/tests/endpoints.rs:

    python endpoints_check.py BASE_URL KEY WORKDIR

Prints one JSON object: what each call returned (shapes and sizes) or
raised.
"""
import io
import json
import os
import struct
import sys

import openai

base, key, work = sys.argv[1], sys.argv[2], sys.argv[3]
client = openai.OpenAI(base_url=base, api_key=key, max_retries=0, timeout=30)
out = {}


def wav(seconds, rate=8000):
    """A mono 16-bit PCM WAV of silence, `seconds` long."""
    data = b"\x00\x00" * int(rate * seconds)
    head = b"RIFF" + struct.pack("<I", 36 + len(data)) + b"WAVE"
    fmt = b"fmt " + struct.pack("<IHHIIHH", 16, 1, 1, rate, rate * 2, 2, 16)
    return head + fmt + b"data" + struct.pack("<I", len(data)) + data


def error(e):
    return {"class": type(e).__name__, "status": e.status_code, "code": getattr(e, "code", None)}


# A 1x1 PNG.
PNG = bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c63f8cfc0f01f0005000201e5270b2d0000000049454e44ae426082"
)

r = client.images.generate(model="dall-e-3", prompt="a red fox", size="1024x1792", quality="hd")
out["dalle"] = {"n": len(r.data), "url": r.data[0].url}
r = client.images.generate(model="gpt-image-1", prompt="two blue cats", n=2)
out["gpt_image"] = {
    "n": len(r.data),
    "b64": [len(d.b64_json or "") for d in r.data],
    "output_tokens": r.usage.output_tokens if r.usage else None,
}
r = client.images.edit(model="gpt-image-1", image=("in.png", PNG, "image/png"), prompt="make it green")
out["edit"] = {"n": len(r.data)}

audio = wav(3.0)
out["wav_bytes"] = len(audio)
t = client.audio.transcriptions.create(model="whisper-1", file=("speech.wav", audio, "audio/wav"))
out["transcription"] = {"text": t.text}
t = client.audio.translations.create(model="whisper-1", file=("speech.wav", audio, "audio/wav"))
out["translation"] = {"text": t.text}
t = client.audio.transcriptions.create(
    model="whisper-1", file=("speech.wav", audio, "audio/wav"), response_format="text"
)
out["transcription_text"] = t if isinstance(t, str) else str(t)

path = os.path.join(work, "speech.mp3")
with client.audio.speech.with_streaming_response.create(model="tts-1", voice="alloy", input="hello world") as resp:
    out["speech_headers"] = {k: resp.headers.get(k) for k in ["content-type", "x-portcullis-provider"]}
    resp.stream_to_file(path)
with open(path, "rb") as f:
    body = f.read()
out["speech"] = {"bytes": len(body), "head": body[:3].decode("latin-1")}

m = client.moderations.create(model="omni-moderation-latest", input=["I will kill the process", "hello"])
out["moderation"] = {"flagged": [x.flagged for x in m.results], "model": m.model}

try:
    client.images.generate(model="gpt-image-1", prompt="x", n=11)
    out["too_many"] = None
except openai.APIStatusError as e:
    out["too_many"] = error(e)
try:
    client.audio.transcriptions.create(model="no-such-model", file=("a.wav", audio, "audio/wav"))
    out["missing_model"] = None
except openai.APIStatusError as e:
    out["missing_model"] = error(e)
try:
    client.audio.speech.create(model="text-embedding-3-small", voice="alloy", input="hi")
    out["not_served"] = None
except openai.APIStatusError as e:
    out["not_served"] = error(e)
print(json.dumps(out))
