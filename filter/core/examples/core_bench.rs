//! `make bench-core`: the pure core's per-request steps for the 212-byte chat
//! body of `make bench`, natively and as wasm32-wasip1 in V8 (Node's WASI). A
//! benchmark, not a test: it shows which step of the request path costs what.

use portcullis_core::guard::{self, pii::Pii, Stage};
use portcullis_core::{cache, compile, request, routing, telemetry::record, usage, wire::sse};
use std::hint::black_box;
use std::time::Instant;

const BODY: &[u8] = br#"{"model":"gpt-4o-mini","messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"Say hello to the benchmark in five words or fewer, please."}],"temperature":0.2,"max_tokens":16}"#;
const ANSWER: &[u8] = br#"{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"gpt-4o-mini","choices":[{"index":0,"message":{"role":"assistant","content":"Hello benchmark, hello there!"},"finish_reason":"stop"}],"usage":{"prompt_tokens":20,"completion_tokens":6,"total_tokens":26}}"#;
const ROUNDS: u32 = 200_000;

/// The fastest of 7 batches: the machines are shared and noisy, and the
/// minimum is the figure least disturbed by neighbours.
fn time<T>(name: &str, mut f: impl FnMut() -> T) {
    let best = (0..7)
        .map(|_| {
            let start = Instant::now();
            for _ in 0..ROUNDS / 7 {
                black_box(f());
            }
            start.elapsed().as_nanos() as f64 / f64::from(ROUNDS / 7)
        })
        .fold(f64::INFINITY, f64::min);
    println!("| {name} | {best:.0} |");
}

fn main() -> Result<(), String> {
    let yaml = std::fs::read("envoy/plugin.yaml").map_err(|e| format!("envoy/plugin.yaml: {e}"))?;
    let gw = compile::compile(&yaml)?;
    let auth = Some("Bearer sk-portcullis-demo");
    let (_, client) = routing::authenticate(&gw, auth, 0).map_err(|e| e.message)?;
    let chat = request::ChatRequest::parse(BODY).map_err(|e| e.message)?;
    println!("| step | ns per request |\n|---|---|");
    time("authenticate (SHA-256 of the key)", || {
        routing::authenticate(&gw, auth, 0).map(|(k, _)| k)
    });
    time("parse the body (one strict pass, fields borrowed)", || {
        request::ChatRequest::parse(BODY).map(|c| c.model.len())
    });
    time("resolve the route", || {
        routing::resolve(&gw, client, &chat.model, 12345).map(|r| r.model)
    });
    time("body with the provider's model id", || {
        chat.body_for_with("gpt-4o-mini-2024", false)
            .map(|b| b.len())
    });
    time("cache: document tree (built on first use)", || {
        request::ChatRequest::parse(BODY).map(|c| c.document().map(|d| d.len()).unwrap_or(0))
    });
    time("cache: canonical key (BLAKE3, texts read in place)", || {
        cache::key("primary", "gpt-4o-mini", &chat, false, None).map(|k| k[0])
    });
    time("cache: replay as SSE", || sse::replay(ANSWER, true));
    time("usage from a whole answer", || {
        usage::Usage::from_body(ANSWER)
    });
    time("request record, encoded", || {
        record::Record {
            request_id: "0b7c0d9e-1f2a-4b3c".into(),
            client: "demo".into(),
            provider: "primary".into(),
            model: "gpt-4o-mini".into(),
            requested_model: "gpt-4o-mini".into(),
            cache: "off".into(),
            ..Default::default()
        }
        .encode()
    });
    guard_checks()?;
    translations()
}

/// Anthropic's Messages API: a 2 KB chat request translated, a whole
/// answer back, and a 100-event stream back (each figure per request).
fn translations() -> Result<(), String> {
    use portcullis_core::providers::anthropic;
    let sentence = "Summarise the quarterly report in plain words for the board, please. ";
    let mut text = String::new();
    while text.len() < 1900 {
        text.push_str(sentence);
    }
    let body = serde_json::json!({"model": "claude", "max_tokens": 300, "temperature": 0.2,
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": text}]})
    .to_string();
    let chat = request::ChatRequest::parse(body.as_bytes()).map_err(|e| e.message)?;
    let opts = anthropic::Options {
        default_max_tokens: 1024,
        drop_unsupported: false,
    };
    println!("\n| Anthropic translation | ns per request |\n|---|---|");
    time(
        &format!(
            "request, {} bytes (parsed, read in place, translated, written)",
            body.len()
        ),
        || {
            let c = request::ChatRequest::parse(body.as_bytes()).ok()?;
            anthropic::request(c.body(), "claude-x", &opts)
                .ok()
                .map(|(b, _)| b.len())
        },
    );
    time("request, the body already parsed", || {
        anthropic::request(chat.body(), "claude-x", &opts)
            .map(|(b, _)| b.len())
            .ok()
    });
    let answer = br#"{"id":"msg_1","type":"message","role":"assistant","model":"claude-x","content":[{"type":"text","text":"Revenue grew, churn fell, and the roadmap holds."}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":480,"output_tokens":12,"cache_read_input_tokens":0,"cache_creation_input_tokens":0}}"#;
    time("whole answer back", || {
        anthropic::answer(answer, 1).map(|b| b.len())
    });
    let ev = |name: &str, v: serde_json::Value| format!("event: {name}\ndata: {v}\n\n");
    let mut stream = ev(
        "message_start",
        serde_json::json!({"type": "message_start", "message": {"id": "msg_1", "model": "claude-x", "usage": {"input_tokens": 480, "output_tokens": 1}}}),
    );
    stream.push_str(&ev("content_block_start", serde_json::json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}})));
    for i in 0..96 {
        stream.push_str(&ev("content_block_delta", serde_json::json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": format!("word{i} ")}})));
    }
    stream.push_str(&ev("message_delta", serde_json::json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 96}})));
    stream.push_str(&ev(
        "message_stop",
        serde_json::json!({"type": "message_stop"}),
    ));
    let chunks: Vec<&[u8]> = stream.as_bytes().chunks(256).collect();
    time("100-event stream back (256-byte network chunks)", || {
        let mut s = anthropic::Stream::new(1, true);
        chunks.iter().map(|c| s.push(c).len()).sum::<usize>()
    });
    Ok(())
}

/// A YAML document without one top-level section (the shipped config's
/// own guardrails, replaced by the bench's).
fn without_section(yaml: &str, key: &str) -> String {
    let mut skip = false;
    let mut out = String::new();
    for line in yaml.lines() {
        if !line.starts_with([' ', '#', '-']) && !line.is_empty() {
            skip = line.starts_with(key);
        }
        if !skip {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// A 2 KB prompt of ordinary prose with one e-mail address, through each
/// built-in check alone and through five checks as `make bench` configures
/// them.
fn guard_checks() -> Result<(), String> {
    let sentence = "The quarterly report covers revenue, churn and the roadmap for next year; please summarise it in plain words. ";
    let mut text = String::new();
    while text.len() < 2000 {
        text.push_str(sentence);
    }
    text.push_str("Reply to jane.doe@example.com by Friday.");
    let body = serde_json::json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": text}]}).to_string();
    let yaml = format!(
        "{}\nguardrails:\n  input:\n    - {{name: email, pii: [email], action: redact}}\n    - {{name: cards, pii: [card, iban], action: deny}}\n    - {{name: keys, pii: [api_key], action: deny}}\n    - {{name: secret, regex: '(?i)top\\s+secret', action: deny}}\n    - {{name: size, max_words: 4000}}\n  output:\n    - {{name: phone, pii: [phone], action: redact}}\n",
        without_section(
            &std::fs::read_to_string("envoy/plugin.yaml").map_err(|e| e.to_string())?,
            "guardrails:"
        )
    );
    let gw = compile::compile(yaml.as_bytes())?;
    let g = gw.guardrails.as_ref().ok_or("no guardrails")?;
    let chat = request::ChatRequest::parse(body.as_bytes()).map_err(|e| e.message)?;
    println!(
        "\n| guardrail check on a {}-byte prompt | ns per request |\n|---|---|",
        body.len()
    );
    let mut spans = Vec::new();
    for p in Pii::ALL {
        time(&format!("pii: {}", p.name()), || {
            spans.clear();
            p.find(&text, &mut spans);
            spans.len()
        });
    }
    let re = regex::Regex::new(r"(?i)top\s+secret").map_err(|e| e.to_string())?;
    time("regex (?i)top\\s+secret", || re.find_iter(&text).count());
    time(
        "bounds alone: word count and token estimate (texts read from the body)",
        || guard::check_input(g, &[4], 0, chat.body()).verdicts.len(),
    );
    let active = g.active(Stage::Input, "demo", 0);
    time(
        "five input checks, the e-mail redacted (texts read, then tree and rewrite)",
        || guard::check_input(g, &active, 0, chat.body()).changed,
    );
    let clean_body = body.replace("jane.doe@example.com", "Jane");
    let clean = request::ChatRequest::parse(clean_body.as_bytes()).map_err(|e| e.message)?;
    time("five input checks, nothing found (no tree built)", || {
        guard::check_input(g, &active, 0, clean.body()).changed
    });
    let out_active = g.active(Stage::Output, "demo", 0);
    time("one output check on the answer (parse, check)", || {
        guard::check_answer(g, &out_active, false, ANSWER)
            .0
            .verdicts
            .len()
    });
    bedrock()
}

/// Bedrock (#26): SigV4 over a 2 KB body, and a 100-event ConverseStream
/// (AWS's binary framing) back to chat chunks in 256-byte network chunks.
fn bedrock() -> Result<(), String> {
    use portcullis_core::credentials::sigv4;
    use portcullis_core::providers::bedrock::Stream;
    use portcullis_core::wire::eventstream::encode;
    let keys = sigv4::Keys {
        access_key_id: "AKIDEXAMPLE".into(),
        secret_access_key: "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY".into(),
        session_token: Some("session-token".into()),
    };
    let scope = sigv4::Scope {
        region: "us-east-1",
        service: "bedrock",
    };
    let body = vec![b'x'; 2048];
    let req = sigv4::Request {
        method: "POST",
        path: "/model/anthropic.claude-3-haiku-20240307-v1%3A0/converse",
        query: "",
        host: "bedrock-runtime.us-east-1.amazonaws.com",
        body: &body,
    };
    time("SigV4 over a 2 KB body (session token)", || {
        sigv4::sign(&keys, &scope, &req, 1_700_000_000).len()
    });
    // What a request pays (#49): the day's key kept, a chat-sized body.
    let small = vec![b'x'; 300];
    let req = sigv4::Request {
        body: &small,
        ..req
    };
    let mut kept = None;
    time("SigV4 over a 300-byte body, the day's key kept", || {
        sigv4::sign_with(&keys, &scope, &req, 1_700_000_000, &mut kept).len()
    });
    let kb = vec![b'x'; 1024];
    time(
        "SHA-256 of 1 KB (sha2; SHA-NI where the CPU has it)",
        || {
            use sha2::Digest;
            sha2::Sha256::digest(&kb).first().copied()
        },
    );
    let frame = |kind: &str, payload: String| {
        encode(
            &[
                (":event-type", kind),
                (":content-type", "application/json"),
                (":message-type", "event"),
            ],
            payload.as_bytes(),
        )
    };
    let mut stream = frame("messageStart", r#"{"role":"assistant"}"#.into());
    for i in 0..98 {
        stream.extend(frame(
            "contentBlockDelta",
            format!(r#"{{"contentBlockIndex":0,"delta":{{"text":"word{i} "}},"p":"abcdefgh"}}"#),
        ));
    }
    stream.extend(frame("messageStop", r#"{"stopReason":"end_turn"}"#.into()));
    stream.extend(frame(
        "metadata",
        r#"{"usage":{"inputTokens":20,"outputTokens":98,"totalTokens":118}}"#.into(),
    ));
    time(
        "100-event Bedrock event stream back (256-byte network chunks)",
        || {
            let mut s = Stream::new(1, true, "claude");
            let mut n = 0;
            for c in stream.chunks(256) {
                n += s.push(c).len();
            }
            n + s.finish().len()
        },
    );
    Ok(())
}
