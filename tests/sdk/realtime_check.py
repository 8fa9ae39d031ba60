"""The Realtime API through the gateway: the official OpenAI SDK's
realtime client and the `websockets` package (what the SDK itself runs
on, here with its defaults: it offers compression). Run by
tests/tests/realtime.rs:

    python realtime_check.py MODE BASE_URL KEY [ARGS...]

MODE is one of:
- `session`: the SDK, two text turns; then `websockets` with the key as a
  browser sends it (a subprotocol), one turn.
- `limit [MODEL]`: the SDK, turns until the gateway ends the session; the
  error event and the close frame it saw.
- `refused`: the SDK's connect with this key (or model ARGS[0]) and the
  HTTP answer that refused it; or, opened, the events of a response asked
  for (and the close) when the gateway ends the session.
- `concurrent N`: N sessions open at once (`websockets`, asyncio), one turn
  each once all are open.
- `guarded`: a turn whose answer holds a secret (redacted in flight), then
  one whose prompt holds a password (the session ends).

Prints one JSON object.
"""
import asyncio
import json
import sys

import openai
import websockets
from websockets.sync.client import connect as sync_connect

mode, base, key = sys.argv[1], sys.argv[2], sys.argv[3]


def refusal_hook(kind, value, tb):
    """A refused upgrade says why (its status and body) before failing."""
    r = getattr(value, "response", None)
    if r is not None:
        print(f"upgrade refused: {r.status_code} {r.body!r}", file=sys.stderr)
    sys.__excepthook__(kind, value, tb)


sys.excepthook = refusal_hook
args = sys.argv[4:]
ws_base = base.replace("http://", "ws://", 1)
MODEL = "gpt-realtime"
out = {}


def client(k=key):
    return openai.OpenAI(base_url=base, api_key=k, max_retries=0, timeout=30)


def closed_of(e):
    """What a closed connection said: the close frame it got."""
    rcvd = getattr(e, "rcvd", None)
    return {"code": rcvd.code if rcvd else None, "reason": rcvd.reason if rcvd else None}


def turn(conn, text):
    """One text turn with the SDK: the events' types, the answer, usage."""
    conn.conversation.item.create(
        item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
    )
    conn.response.create()
    kinds, answer = [], ""
    for event in conn:
        kinds.append(event.type)
        if event.type == "response.output_text.delta":
            answer += event.delta
        if event.type == "error":
            return {"error": event.error.model_dump(), "kinds": kinds}
        if event.type == "response.done":
            u = event.response.usage
            return {
                "answer": answer,
                "usage": {"input": u.input_tokens, "output": u.output_tokens},
                "status": event.response.status,
                "kinds": kinds,
            }
    return {"ended": True, "kinds": kinds}


if mode == "session":
    with client().realtime.connect(model=MODEL) as conn:
        first = conn.recv()
        out["first"] = first.type
        conn.session.update(session={"type": "realtime", "instructions": "Be brief."})
        for event in conn:
            if event.type == "session.updated":
                out["instructions"] = event.session.instructions
                break
        out["turns"] = [turn(conn, "hello there"), turn(conn, "and again")]
    # A browser's way: the key as a subprotocol, no Authorization; the
    # client offers compression (the gateway declines it for the server).
    with sync_connect(
        f"{ws_base}/realtime?model={MODEL}",
        subprotocols=["realtime", f"openai-insecure-api-key.{key}"],
    ) as ws:
        out["subprotocol"] = ws.subprotocol
        out["extensions"] = [type(e).__name__ for e in ws.protocol.extensions]
        created = json.loads(ws.recv())
        ws.send(json.dumps({"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "from a browser"}]}}))
        ws.send(json.dumps({"type": "response.create"}))
        answer = ""
        while True:
            e = json.loads(ws.recv())
            if e["type"] == "response.output_text.delta":
                answer += e["delta"]
            if e["type"] == "response.done":
                break
        out["browser"] = {"created": created["type"], "answer": answer}
        # An unknown event: the provider's error event, the session goes on.
        ws.send(json.dumps({"type": "no.such.event"}))
        out["unknown"] = json.loads(ws.recv())["error"]["code"]

elif mode == "limit":
    turns, after = [], []
    with client().realtime.connect(model=args[0] if args else MODEL) as conn:
        conn.recv()
        try:
            for i in range(10):
                # Each answer reports 400 output tokens.
                turns.append(turn(conn, f"turn {i} usage:400"))
        except websockets.exceptions.ConnectionClosed:
            # What came before the close: the error event.
            try:
                while True:
                    after.append(conn.recv().model_dump())
            except websockets.exceptions.ConnectionClosed as e:
                out["closed"] = closed_of(e)
    out["turns"] = turns
    out["after"] = after

elif mode == "refused":
    model = args[0] if args else MODEL
    try:
        with client().realtime.connect(model=model) as conn:
            out["refused"] = None
            # Opened: a response asked for, its events read until it is
            # done or the gateway ends the session (a limit counted across
            # the fleet answers while the session opens; the end comes at
            # the session's next event).
            events = [conn.recv().type]
            if events[0] != "error":
                conn.response.create()
            try:
                while events[-1] != "response.done":
                    e = conn.recv()
                    events.append(e.type)
                    if e.type == "error":
                        out["error"] = e.error.code
            except websockets.exceptions.ConnectionClosed as e:
                out["closed"] = closed_of(e)
            out["events"] = events
    except websockets.exceptions.InvalidStatus as e:
        r = e.response
        out["refused"] = {"status": r.status_code, "body": json.loads(r.body or b"null")}

elif mode == "guarded":
    with client().realtime.connect(model=MODEL) as conn:
        conn.recv()
        out["redacted"] = turn(conn, "say:the code is SECRET-4242 ok")
        conn.conversation.item.create(
            item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": "my password: hunter2"}]}
        )
        events = []
        try:
            while True:
                events.append(conn.recv().model_dump())
        except websockets.exceptions.ConnectionClosed as e:
            out["closed"] = closed_of(e)
        out["denied"] = events

elif mode == "concurrent":
    n = int(args[0])

    async def one(i, all_open):
        async with websockets.connect(
            f"{ws_base}/realtime?model={MODEL}",
            additional_headers={"authorization": f"Bearer {key}"},
            open_timeout=60,
        ) as ws:
            json.loads(await ws.recv())
            all_open.append(i)
            while len(all_open) < n:
                await asyncio.sleep(0.01)
            await ws.send(json.dumps({"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": f"session {i}"}]}}))
            await ws.send(json.dumps({"type": "response.create"}))
            answer = ""
            while True:
                e = json.loads(await ws.recv())
                if e["type"] == "response.output_text.delta":
                    answer += e["delta"]
                if e["type"] == "response.done":
                    return answer == f"You said: session {i}"

    async def main():
        all_open = []
        results = await asyncio.wait_for(
            asyncio.gather(*(one(i, all_open) for i in range(n)), return_exceptions=True), 120
        )
        return {
            "ok": sum(1 for r in results if r is True),
            "errors": sorted({repr(r)[:120] for r in results if r is not True}),
            "open_at_once": len(all_open),
        }

    out["concurrent"] = asyncio.run(main())

print(json.dumps(out))
