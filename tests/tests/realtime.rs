//! The Realtime API in real Envoy (#48): WebSocket sessions through the
//! gateway to the mock's Realtime server, with the official OpenAI SDK's
//! realtime client and the `websockets` package. Usage counted from each
//! `response.done` into the record and the key's limits; a token limit
//! reached mid-session ends it with OpenAI's error event and a close
//! frame; keys without rights refused at the upgrade; guardrails on the
//! text both ways; frames that break the protocol answered with the
//! error event and a 1002 close while the worker keeps serving; 200
//! sessions at once.
mod common;
use common::*;
use portcullis_tests::*;
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::time::Duration;

const LIMITED_KEY: &str = "sk-realtime-limited";
const BUDGET_KEY: &str = "sk-realtime-budget";

/// The test config's primary serves `gpt-realtime` (its default price:
/// $4 and $16 per 1M text tokens); a key with 1,000 tokens a minute;
/// guardrails on prompts and answers.
fn plugin() -> String {
    let anchor =
        "        apis: [embeddings]      # served on /v1/embeddings only (a chat request is a 404)\n";
    let p = test_plugin();
    assert!(p.contains(anchor), "the test config changed");
    let p = p.replace(
        anchor,
        &format!("{anchor}      - {{name: gpt-realtime, weight: 0, apis: [realtime]}}\n"),
    );
    let p = p.replace(
        "clients:\n",
        &format!(
            "clients:\n  - name: realtime-limited\n    key_sha256: {}\n    limits: {{tokens_per_minute: 1000}}\n  - name: realtime-budget\n    key_sha256: {}\n    limits: {{budget_usd_per_day: 0.003}}\n",
            key_hash(LIMITED_KEY),
            key_hash(BUDGET_KEY)
        ),
    );
    p + &[
        "guardrails:",
        "  input:",
        "    - {name: secrets, regex: '(?i)password\\s*[:=]', action: deny}",
        "  output:",
        "    - {name: codes, regex: 'SECRET-[0-9]+', action: redact}",
        "",
    ]
    .join("\n")
}

fn check(mode: &str, s: &Stack, key: &str, more: &[&str]) -> Value {
    let url = s.envoy.url("/v1");
    let mut args = vec![mode, url.as_str(), key];
    args.extend_from_slice(more);
    sdk_script("realtime_check.py", &args)
}

#[test]
fn sessions_pass_through_counted_priced_and_recorded() {
    let dir = TempDir::new("realtime-records");
    let c = Collector::start(&dir.0.join("log.db"), 0);
    let s = Stack::start_full(
        &plugin().replace("flush_interval_ms: 250", "flush_interval_ms: 100"),
        2,
        false,
        c.grpc_port,
    );
    let v = check("session", &s, DEMO_KEY, &[]);
    assert_eq!(v["first"], "session.created", "{v}");
    assert_eq!(v["instructions"], "Be brief.");
    let turns = v["turns"].as_array().unwrap();
    assert_eq!(turns[0]["answer"], "You said: hello there", "{v}");
    assert_eq!(turns[1]["answer"], "You said: and again");
    assert_eq!(turns[1]["status"], "completed");
    // The browser's session: the key in a subprotocol, compression offered
    // and not negotiated (the gateway reads the frames).
    assert_eq!(v["subprotocol"], "realtime");
    assert_eq!(v["extensions"], json!([]));
    assert_eq!(
        v["browser"],
        json!({"created": "session.created", "answer": "You said: from a browser"})
    );
    assert_eq!(v["unknown"], "invalid_value");
    // What the provider got: its own key, never the client's (neither in
    // `Authorization` nor in a subprotocol), no compression offer.
    let ups: Vec<Value> = s
        .primary
        .requests()
        .into_iter()
        .filter(|r| {
            r["path"]
                .as_str()
                .is_some_and(|p| p.starts_with("/v1/realtime?"))
        })
        .collect();
    assert_eq!(ups.len(), 2, "{ups:?}");
    for r in &ups {
        assert_eq!(r["path"], "/v1/realtime?model=gpt-realtime");
        assert_eq!(
            r["headers"]["authorization"],
            format!("Bearer {PRIMARY_KEY}")
        );
        assert!(
            r["headers"].get("sec-websocket-extensions").is_none(),
            "{r}"
        );
        assert!(!r.to_string().contains(DEMO_KEY), "{r}");
    }
    assert_eq!(ups[1]["headers"]["sec-websocket-protocol"], "realtime");
    // One record a session: the responses' usage summed, priced at the
    // default $4 and $16 per 1M.
    let rows = poll_until(Duration::from_secs(15), "the sessions' records", || {
        let r = c.recent(20);
        (r.iter().filter(|x| x["api"] == "realtime").count() >= 2).then_some(r)
    });
    let sum = |k: &str| -> u64 { turns.iter().map(|t| t["usage"][k].as_u64().unwrap()).sum() };
    let sdk = rows
        .iter()
        .find(|x| x["api"] == "realtime" && x["prompt_tokens"] == sum("input"))
        .unwrap_or_else(|| panic!("no record of the two-turn session: {rows:?}"));
    assert_eq!(sdk["prompt_tokens"], sum("input"), "{sdk}");
    assert_eq!(sdk["completion_tokens"], sum("output"), "{sdk}");
    let cost = (sdk["cost_usd"].as_f64().unwrap() * 1e6).round() as u64;
    assert_eq!(cost, 4 * sum("input") + 16 * sum("output"), "{sdk}");
    assert_eq!(sdk["status"], 101);
    assert_eq!(sdk["provider"], "primary");
    assert_eq!(sdk["model"], "gpt-realtime");
    // A session refused at the upgrade is recorded too.
    let r = get(
        &s.envoy.url("/v1/realtime?model=gpt-realtime"),
        &[
            ("authorization", "Bearer sk-nobody"),
            ("upgrade", "websocket"),
            ("connection", "Upgrade"),
            ("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ=="),
            ("sec-websocket-version", "13"),
        ],
    );
    assert_eq!(r.status, 401, "{}", r.body);
    poll_until(Duration::from_secs(15), "the refusal's record", || {
        c.recent(20)
            .into_iter()
            .find(|x| x["api"] == "realtime" && x["status"] == 401)
    });
}

#[test]
fn limits_guardrails_and_bad_frames_end_a_session_cleanly() {
    let s = Stack::start(&plugin(), 1);
    // 1,000 tokens a minute: each answer reports 400 output tokens, so the
    // third response.done spends the rest and the session ends after it.
    let v = check("limit", &s, LIMITED_KEY, &[]);
    let turns = v["turns"].as_array().unwrap();
    assert_eq!(turns.len(), 3, "{v}");
    assert!(turns.iter().all(|t| t["status"] == "completed"), "{v}");
    let after = v["after"].as_array().unwrap();
    let err = after
        .iter()
        .find(|e| e["type"] == "error")
        .unwrap_or_else(|| panic!("{v}"));
    assert_eq!(err["error"]["code"], "rate_limit_exceeded", "{v}");
    assert!(
        err["error"]["message"]
            .as_str()
            .unwrap()
            .contains("tokens per minute"),
        "{v}"
    );
    assert_eq!(
        v["closed"],
        json!({"code": 1008, "reason": "rate_limit_exceeded"}),
        "{v}"
    );
    // A budget of $0.003 a day: the first answer's 400 output tokens at
    // $16 per 1M spend it, and the session ends after it.
    let v = check("limit", &s, BUDGET_KEY, &[]);
    let done = v["turns"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["status"] == "completed")
        .count();
    assert_eq!(done, 1, "{v}");
    let err = v["after"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["type"] == "error")
        .unwrap_or_else(|| panic!("{v}"));
    assert_eq!(err["error"]["code"], "budget_exceeded", "{v}");
    assert_eq!(v["closed"]["code"], 1008, "{v}");
    let r = check("refused", &s, BUDGET_KEY, &[]);
    assert_eq!(
        r["refused"]["status"], 429,
        "a spent budget refuses the next session: {r}"
    );
    // The key's tokens are spent: its next request waits.
    let r = post(
        &s.envoy.url("/v1/chat/completions"),
        &[
            ("authorization", &format!("Bearer {LIMITED_KEY}")),
            ("content-type", "application/json"),
        ],
        &json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]})
            .to_string(),
    );
    assert_eq!(r.status, 429, "{}", r.body);
    let r = check("refused", &s, LIMITED_KEY, &[]);
    assert_eq!(r["refused"]["status"], 429, "{r}");
    // Keys without rights never reach the provider.
    let r = check("refused", &s, MINI_KEY, &[]);
    assert_eq!(r["refused"]["status"], 403, "{r}");
    let r = check("refused", &s, "sk-nobody", &[]);
    assert_eq!(r["refused"]["status"], 401, "{r}");
    assert_eq!(
        r["refused"]["body"]["error"]["code"], "invalid_api_key",
        "{r}"
    );
    let r = check("refused", &s, DEMO_KEY, &["text-embedding-3-small"]);
    assert_eq!(r["refused"]["status"], 404, "{r}");
    // Not an upgrade: OpenAI's 400; a POST: the 404 naming the paths.
    let r = get(
        &s.envoy.url("/v1/realtime?model=gpt-realtime"),
        &[("authorization", &format!("Bearer {DEMO_KEY}"))],
    );
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.body.contains("Upgrade: websocket"), "{}", r.body);
    // Guardrails: a secret in an answer is redacted as it passes; a
    // password in a prompt ends the session.
    let g = check("guarded", &s, DEMO_KEY, &[]);
    let answer = g["redacted"]["answer"].as_str().unwrap();
    assert!(
        !answer.contains("SECRET-4242") && answer.contains("the code is"),
        "{g}"
    );
    let denied = g["denied"].as_array().unwrap();
    let err = denied
        .iter()
        .find(|e| e["type"] == "error")
        .unwrap_or_else(|| panic!("{g}"));
    assert_eq!(err["error"]["code"], "guardrail_denied", "{g}");
    assert_eq!(g["closed"]["code"], 1008, "{g}");
    // The mock logs every event it hears: some did reach it, the denied
    // one did not.
    let events = heard(&s.primary);
    assert!(
        events
            .iter()
            .any(|e| e.contains("conversation.item.create")),
        "{events:?}"
    );
    assert!(
        !events.iter().any(|t| t.contains("hunter2")),
        "the denied prompt reached the provider"
    );
    // Frames that break the protocol: OpenAI's error event, then a 1002
    // close; nothing of them reaches the provider.
    let mut big = vec![0x81u8, 0xFF];
    big.extend_from_slice(&(1u64 << 63).to_be_bytes());
    big.extend_from_slice(&[1, 2, 3, 4]);
    for (what, frame) in [
        ("an unmasked client frame", vec![0x81u8, 0x02, b'h', b'i']),
        ("a 2^63 length", big),
    ] {
        let frames = raw_session(s.envoy.port, &frame);
        let texts: Vec<Value> = frames
            .iter()
            .filter(|(op, _)| *op == 1)
            .map(|(_, p)| serde_json::from_slice(p).unwrap())
            .collect();
        let err = texts
            .iter()
            .find(|e| e["type"] == "error")
            .unwrap_or_else(|| panic!("{what}: {texts:?}"));
        assert_eq!(err["error"]["code"], "invalid_frame", "{what}");
        let close = frames
            .iter()
            .find(|(op, _)| *op == 8)
            .unwrap_or_else(|| panic!("{what}: no close"));
        assert_eq!(&close.1[..2], &1002u16.to_be_bytes(), "{what}");
    }
    // The worker keeps serving.
    let r = post(
        &s.envoy.url("/v1/chat/completions"),
        &[
            ("authorization", &format!("Bearer {DEMO_KEY}")),
            ("content-type", "application/json"),
        ],
        &json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "still there?"}]})
            .to_string(),
    );
    assert_eq!(r.status, 200, "{}", r.body);
}

#[test]
fn two_hundred_sessions_at_once() {
    let s = Stack::start(&plugin(), 2);
    let v = check("concurrent", &s, DEMO_KEY, &["200"]);
    assert_eq!(
        v["concurrent"],
        json!({"ok": 200, "errors": [], "open_at_once": 200}),
        "{v}"
    );
}

/// A session by hand: the upgrade, `session.created` read, then `frame`
/// sent; the frames the gateway sends back until its close (opcode,
/// payload).
fn raw_session(port: u16, frame: &[u8]) -> Vec<(u8, Vec<u8>)> {
    let mut sock = open_session(port, DEMO_KEY);
    sock.write_all(frame).unwrap();
    until_close(&mut sock)
}

/// The status line of an upgrade by hand for `key`, and the socket.
fn upgrade(port: u16, key: &str) -> (String, std::net::TcpStream) {
    let mut sock = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let head = format!(
        "GET /v1/realtime?model=gpt-realtime HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\nupgrade: websocket\r\nconnection: Upgrade\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\nsec-websocket-version: 13\r\nauthorization: Bearer {key}\r\n\r\n"
    );
    sock.write_all(head.as_bytes()).unwrap();
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    while !buf.ends_with(b"\r\n\r\n") {
        sock.read_exact(&mut byte).unwrap();
        buf.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&buf);
    (head.lines().next().unwrap_or("").to_string(), sock)
}

/// A session opened by hand for `key`, its `session.created` read.
fn open_session(port: u16, key: &str) -> std::net::TcpStream {
    let (status, mut sock) = upgrade(port, key);
    assert!(status.starts_with("HTTP/1.1 101"), "{status}");
    let first = read_frame(&mut sock).expect("session.created");
    assert!(String::from_utf8_lossy(&first.1).contains("session.created"));
    sock
}

/// The frames the gateway sends until its close.
fn until_close(sock: &mut std::net::TcpStream) -> Vec<(u8, Vec<u8>)> {
    let mut out = Vec::new();
    while let Some(f) = read_frame(sock) {
        let close = f.0 == 8;
        out.push(f);
        if close {
            break;
        }
    }
    out
}

/// A client's text frame (masked, one frame) of any length.
fn client_text(payload: &[u8]) -> Vec<u8> {
    let mask = [0x11u8, 0x22, 0x33, 0x44];
    let mut f = vec![0x81u8];
    match payload.len() {
        n if n < 126 => f.push(0x80 | n as u8),
        n if n <= 0xFFFF => {
            f.push(0x80 | 126);
            f.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            f.push(0x80 | 127);
            f.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    f.extend_from_slice(&mask);
    f.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    f
}

fn item_create(text: &str) -> Vec<u8> {
    client_text(
        json!({"type": "conversation.item.create", "item": {"type": "message", "role": "user",
            "content": [{"type": "input_text", "text": text}]}})
        .to_string()
        .as_bytes(),
    )
}

/// The text events the mock provider heard (its log).
fn heard(m: &Mock) -> Vec<String> {
    m.requests()
        .iter()
        .filter(|r| r["path"] == "/v1/realtime#event")
        .filter_map(|r| r["body"]["event"].as_str().map(str::to_string))
        .collect()
}

/// The error event and the close code the gateway ended a session with.
fn ended(frames: &[(u8, Vec<u8>)]) -> (Value, u16) {
    let err = frames
        .iter()
        .filter(|(op, _)| *op == 1)
        .filter_map(|(_, p)| serde_json::from_slice::<Value>(p).ok())
        .find(|e| e["type"] == "error")
        .unwrap_or_else(|| panic!("no error event: {frames:?}"));
    let close = frames
        .iter()
        .find(|(op, _)| *op == 8)
        .map(|(_, p)| u16::from_be_bytes([p[0], p[1]]))
        .unwrap_or_else(|| panic!("no close: {err}"));
    (err, close)
}

const SMALL_KEY: &str = "sk-realtime-small-events";
const ONE_AT_A_TIME_KEY: &str = "sk-realtime-one-at-a-time";
const REVOKED_KEY: &str = "sk-realtime-revoked";

/// Every client text event is read whatever its size, up to the key's
/// bound (#61): a 1.5 MiB `conversation.item.create` (past the 1 MiB the
/// reader once let pass unread) has its card number redacted before the
/// provider hears it; past the key's `max_body_bytes` an event ends the
/// session and never reaches the provider. A key revoked by a config
/// applied while its session is open is cut off at its next event.
#[test]
fn every_client_event_is_read_and_a_revoked_key_is_cut_off() {
    let with = |revoked: bool| {
        let mut p = plugin().replace(
            "\n  input:\n    - {name: secrets, regex:",
            "\n  input:\n    - {name: cards, pii: [card], action: redact}\n    - {name: secrets, regex:",
        );
        let mut clients = format!(
            "clients:\n  - name: realtime-small\n    key_sha256: {}\n    limits: {{max_body_bytes: 1048576}}\n  - name: realtime-one\n    key_sha256: {}\n    limits: {{max_concurrent: 1}}\n",
            key_hash(SMALL_KEY),
            key_hash(ONE_AT_A_TIME_KEY)
        );
        if !revoked {
            clients.push_str(&format!(
                "  - name: realtime-revoked\n    key_sha256: {}\n",
                key_hash(REVOKED_KEY)
            ));
        }
        assert!(p.contains("\nclients:\n  - name: realtime-limited\n"));
        p = p.replacen(
            "\nclients:\n  - name: realtime-limited\n",
            &format!("\n{clients}  - name: realtime-limited\n"),
            1,
        );
        p
    };
    let s = Stack::start(&with(false), 1);
    let pad = "x".repeat(3 << 19);
    let frames = {
        let mut sock = open_session(s.envoy.port, DEMO_KEY);
        sock.write_all(&item_create(&format!("{pad} card 4111 1111 1111 1111 end")))
            .unwrap();
        sock.write_all(&item_create("a small one after it"))
            .unwrap();
        let mut got = Vec::new();
        while got.len() < 4 {
            match read_frame(&mut sock) {
                Some(f) => got.push(f),
                None => break,
            }
        }
        got
    };
    assert!(frames.iter().all(|(op, _)| *op == 1), "the session goes on");
    let events = poll_until(Duration::from_secs(10), "the provider's events", || {
        let h = heard(&s.primary);
        (h.iter().any(|e| e.contains("a small one after it"))).then_some(h)
    });
    let big = events
        .iter()
        .find(|e| e.len() > 3 << 19)
        .expect("the big event reached the provider");
    assert!(!big.contains("4111"), "its card number went unread");
    assert!(big.contains("[REDACTED:card]"), "redacted in place");

    // Past the key's bound: the error event, a close; the provider never
    // heard it.
    let mut sock = open_session(s.envoy.port, SMALL_KEY);
    sock.write_all(&item_create(&format!("{pad} too big")))
        .unwrap();
    let (err, code) = ended(&until_close(&mut sock));
    assert_eq!(err["error"]["code"], "event_too_large", "{err}");
    assert_eq!(code, 1002);
    assert!(!heard(&s.primary).iter().any(|e| e.contains("too big")));

    // Revoked while open: the next event ends the session, and never
    // reaches the provider.
    let mut sock = open_session(s.envoy.port, REVOKED_KEY);
    sock.write_all(&item_create("before the revocation"))
        .unwrap();
    poll_until(Duration::from_secs(10), "the first event", || {
        heard(&s.primary)
            .iter()
            .any(|e| e.contains("before the revocation"))
            .then_some(())
    });
    s.envoy.reload(&with(true));
    poll_until(Duration::from_secs(20), "the reload", || {
        (s.envoy
            .stat("extension_config_discovery.http_filter.portcullis.config_reload")?
            >= 1)
            .then_some(())
    });
    sock.write_all(&item_create("after the revocation"))
        .unwrap();
    let (err, code) = ended(&until_close(&mut sock));
    assert_eq!(err["error"]["code"], "invalid_api_key", "{err}");
    assert_eq!(code, 1008);
    assert!(!heard(&s.primary)
        .iter()
        .any(|e| e.contains("after the revocation")));
    // Another key's session is untouched by it.
    let mut sock = open_session(s.envoy.port, DEMO_KEY);
    sock.write_all(&item_create("still welcome")).unwrap();
    let f = read_frame(&mut sock).expect("an answer");
    assert!(
        String::from_utf8_lossy(&f.1).contains("conversation.item"),
        "{f:?}"
    );

    // A session holds one of the key's `max_concurrent` slots while it is
    // open: a second is refused at the upgrade; the slot comes back when
    // the first ends.
    let first = open_session(s.envoy.port, ONE_AT_A_TIME_KEY);
    let (status, _) = upgrade(s.envoy.port, ONE_AT_A_TIME_KEY);
    assert!(status.contains(" 429 "), "{status}");
    drop(first);
    poll_until(Duration::from_secs(10), "the slot back", || {
        let (status, _) = upgrade(s.envoy.port, ONE_AT_A_TIME_KEY);
        status.contains(" 101 ").then_some(())
    });
}

/// One server frame (unmasked, unfragmented), `None` at the end.
fn read_frame(sock: &mut std::net::TcpStream) -> Option<(u8, Vec<u8>)> {
    let mut h = [0u8; 2];
    sock.read_exact(&mut h).ok()?;
    let len = match h[1] & 0x7F {
        126 => {
            let mut b = [0u8; 2];
            sock.read_exact(&mut b).ok()?;
            u16::from_be_bytes(b) as usize
        }
        127 => {
            let mut b = [0u8; 8];
            sock.read_exact(&mut b).ok()?;
            u64::from_be_bytes(b) as usize
        }
        n => n as usize,
    };
    let mut p = vec![0u8; len];
    sock.read_exact(&mut p).ok()?;
    Some((h[0] & 0x0F, p))
}
