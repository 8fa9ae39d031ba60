//! `portcullis-load URL N CONNECTIONS [KEY]`: exactly N chat requests,
//! spread over CONNECTIONS keep-alive connections, as fast as they are
//! answered (for the instruction counts of `make bench`, which need a fixed
//! number of requests; wrk runs for a time). Prints `<N> <non-2xx>`.
//! With `PORTCULLIS_LOAD_UNIQUE=1` every body differs (a 10-digit request
//! number in the prompt, so the length stays the same): each request is a
//! cache miss. With `PORTCULLIS_LOAD_CYCLE=K` the bodies go round K
//! prompts (request i asks prompt i mod K, the same K in every run: a set a
//! warm-up stores and the measured run asks again).
//! `PORTCULLIS_LOAD_API=responses` or `messages` sends the same
//! question in that API's shape (to the URL given).
//! `PORTCULLIS_LOAD_BYTES=N` (chat and Messages) pads the body to about N
//! bytes with an earlier user turn of plain text, as an agent resends its
//! conversation (`make bench-sizes`).
//! `PORTCULLIS_LOAD_TRACEPARENT=<value>` sends that `traceparent` with
//! every request, as a traced client does (`make bench-instructions`).
//! `PORTCULLIS_LOAD_API=mcp` sends an MCP `tools/call` of `echo`,
//! `mcp_list` a `tools/list`, in the session `PORTCULLIS_LOAD_MCP_SESSION`
//! names (`make bench-instructions`' MCP variants).
//! `PORTCULLIS_LOAD_API=images`, `speech`, `rerank` send an images
//! generation, a speech request, a rerank; `transcription` a multipart
//! transcription of a WAV of `PORTCULLIS_LOAD_BYTES` bytes (default 16 KB);
//! `upload` a multipart `POST /v1/files` of a batch file (JSONL chat
//! requests) of about `PORTCULLIS_LOAD_BYTES` bytes (default 1 MB).
//! `PORTCULLIS_LOAD_API=realtime`: a Realtime session per connection (URL
//! is the upgrade's), each request one event sent and its answers read
//! (see `realtime`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

const BODY: &str = r#"{"model":"gpt-4o-mini","messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"Say hello to the benchmark in five words or fewer, please."}],"temperature":0.2,"max_tokens":16}"#;
const RESPONSES_BODY: &str = r#"{"model":"gpt-4o-mini","instructions":"You are terse.","input":"Say hello to the benchmark in five words or fewer, please.","temperature":0.2,"max_output_tokens":16}"#;
const MCP_CALL_BODY: &str = r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"echo","arguments":{"text":"Say hello to the benchmark in five words or fewer, please."}}}"#;
const MCP_LIST_BODY: &str = r#"{"jsonrpc":"2.0","id":8,"method":"tools/list"}"#;
const IMAGES_BODY: &str = r#"{"model":"gpt-4o-mini","prompt":"Say hello to the benchmark in five words or fewer, please.","size":"1024x1024","response_format":"url"}"#;
const SPEECH_BODY: &str = r#"{"model":"gpt-4o-mini","voice":"alloy","input":"Say hello to the benchmark in five words or fewer, please."}"#;
const RERANK_BODY: &str = r#"{"model":"gpt-4o-mini","query":"hello benchmark","documents":["Say hello to the benchmark","in five words","or fewer, please."],"top_n":2}"#;
const BOUNDARY: &str = "portcullisloadboundary";

/// A multipart transcription of a silent 8 kHz 8-bit WAV of about `bytes`.
fn transcription(bytes: usize) -> String {
    let data = bytes.saturating_sub(44).max(8000);
    let mut wav = String::from("RIFF");
    let le = |n: u32| -> String { n.to_le_bytes().iter().map(|b| char::from(*b)).collect() };
    wav.push_str(&le(36 + data as u32));
    wav.push_str("WAVEfmt ");
    wav.push_str(&le(16));
    wav.push_str("\u{1}\0\u{1}\0");
    wav.push_str(&le(8000));
    wav.push_str(&le(8000));
    wav.push_str("\u{1}\0\u{8}\0data");
    wav.push_str(&le(data as u32));
    wav.push_str(&"\u{7f}".repeat(data));
    format!("--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\ngpt-4o-mini\r\n--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\nContent-Type: audio/wav\r\n\r\n{wav}\r\n--{BOUNDARY}--\r\n")
}
/// A multipart upload of a batch file of about `bytes`.
fn upload(bytes: usize) -> String {
    let line = format!("{{\"custom_id\":\"r\",\"method\":\"POST\",\"url\":\"/v1/chat/completions\",\"body\":{BODY}}}\n");
    let file = line.repeat((bytes / line.len()).max(1));
    format!("--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"requests.jsonl\"\r\nContent-Type: application/jsonl\r\n\r\n{file}\r\n--{BOUNDARY}--\r\n")
}
const MESSAGES_BODY: &str = r#"{"model":"gpt-4o-mini","system":"You are terse.","messages":[{"role":"user","content":"Say hello to the benchmark in five words or fewer, please."}],"temperature":0.2,"max_tokens":16}"#;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (Some(url), Some(n), Some(c)) = (args.get(1), args.get(2), args.get(3)) else {
        eprintln!("usage: portcullis-load URL N CONNECTIONS [KEY]");
        std::process::exit(2);
    };
    let n: u64 = n.parse().unwrap_or(1000);
    let c: u64 = c.parse().unwrap_or(4).max(1);
    let auth = format!(
        "Bearer {}",
        args.get(4).map_or("sk-portcullis-demo", |s| s.as_str())
    );
    if std::env::var("PORTCULLIS_LOAD_API").as_deref() == Ok("realtime") {
        realtime(url, n, c, &auth);
        return;
    }
    let unique = std::env::var("PORTCULLIS_LOAD_UNIQUE").is_ok_and(|v| v == "1");
    let cycle: Option<u64> = std::env::var("PORTCULLIS_LOAD_CYCLE")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|k| *k > 0);
    let traceparent = std::env::var("PORTCULLIS_LOAD_TRACEPARENT")
        .ok()
        .filter(|v| !v.is_empty());
    let template = match std::env::var("PORTCULLIS_LOAD_API").as_deref() {
        Ok("responses") => RESPONSES_BODY,
        Ok("messages") => MESSAGES_BODY,
        Ok("mcp") => MCP_CALL_BODY,
        Ok("mcp_list") => MCP_LIST_BODY,
        Ok("images") => IMAGES_BODY,
        Ok("speech") => SPEECH_BODY,
        Ok("rerank") => RERANK_BODY,
        _ => BODY,
    };
    let api = std::env::var("PORTCULLIS_LOAD_API").unwrap_or_default();
    let multipart = api == "transcription" || api == "upload";
    // The tool a `tools/call` names (`PORTCULLIS_LOAD_MCP_TOOL`, default
    // `echo`; `tools__echo` through an aggregating endpoint).
    let tool = std::env::var("PORTCULLIS_LOAD_MCP_TOOL").unwrap_or_default();
    let template = if tool.is_empty() {
        template.to_string()
    } else {
        template.replace(r#""name":"echo""#, &format!(r#""name":"{tool}""#))
    };
    let mcp_session = std::env::var("PORTCULLIS_LOAD_MCP_SESSION")
        .ok()
        .filter(|v| !v.is_empty());
    let bytes = std::env::var("PORTCULLIS_LOAD_BYTES")
        .ok()
        .and_then(|b| b.parse::<usize>().ok());
    let template: Arc<String> = Arc::new(match bytes {
        _ if api == "upload" => upload(bytes.unwrap_or(1_000_000)),
        _ if multipart => transcription(bytes.unwrap_or(16_000)),
        Some(bytes) => pad(&template, bytes),
        None => template.clone(),
    });
    let content_type: Arc<String> = Arc::new(if multipart {
        format!("multipart/form-data; boundary={BOUNDARY}")
    } else {
        "application/json".to_string()
    });
    // Requests of one run differ from those of the run before (its warm-up).
    let salt = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() % 100_000)
        * 100_000;
    let salt = u64::try_from(salt).unwrap_or(0);
    let next = Arc::new(AtomicU64::new(0));
    let bad = Arc::new(AtomicU64::new(0));
    let threads: Vec<_> = (0..c)
        .map(|_| {
            let content_type = content_type.clone();
            let (url, auth, next, bad, template, traceparent, mcp_session) = (
                url.clone(),
                auth.clone(),
                next.clone(),
                bad.clone(),
                template.clone(),
                traceparent.clone(),
                mcp_session.clone(),
            );
            std::thread::spawn(move || {
                let agent = ureq::AgentBuilder::new().build();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= n {
                        break;
                    }
                    let body = if let Some(k) = cycle {
                        template.replace("please.", &format!("please {:010}.", i % k))
                    } else if unique {
                        template.replace("please.", &format!("please {:010}.", salt + i))
                    } else {
                        template.as_ref().clone()
                    };
                    let mut req = agent
                        .post(&url)
                        .set("content-type", &content_type)
                        .set("authorization", &auth);
                    if let Some(tp) = &traceparent {
                        req = req.set("traceparent", tp);
                    }
                    if let Some(session) = &mcp_session {
                        req = req
                            .set("mcp-session-id", session)
                            .set("accept", "application/json, text/event-stream");
                    }
                    let ok = req
                        .send_string(&body)
                        .ok()
                        .and_then(|r| r.into_string().ok())
                        .is_some();
                    if !ok {
                        bad.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    for t in threads {
        let _ = t.join();
    }
    println!("{n} {}", bad.load(Ordering::Relaxed));
}

/// The body with a first user turn of plain text making it about `bytes`
/// long (as it was when shorter already).
pub fn pad(template: &str, bytes: usize) -> String {
    const LINE: &str = "Context line of a long agent conversation, resent every turn. ";
    const TURN: &str = r#"{"role":"user","content":""},"#;
    let room = bytes.saturating_sub(template.len() + TURN.len());
    if room == 0 || !template.contains(r#""messages":["#) {
        return template.to_string();
    }
    let mut filler = LINE.repeat(room / LINE.len() + 1);
    filler.truncate(room);
    template.replacen(
        r#""messages":["#,
        &format!(r#""messages":[{{"role":"user","content":"{filler}"}},"#),
        1,
    )
}

/// `PORTCULLIS_LOAD_API=realtime`: each connection opens one Realtime
/// session (the WebSocket upgrade of URL, `session.created` read); a
/// request is then one `conversation.item.create` of about
/// `PORTCULLIS_LOAD_BYTES` (default 1,000) sent, and the mock's two events
/// of the item (`conversation.item.added`, `.done`) read back.
fn realtime(url: &str, n: u64, c: u64, auth: &str) {
    let bytes = std::env::var("PORTCULLIS_LOAD_BYTES")
        .ok()
        .and_then(|b| b.parse::<usize>().ok())
        .unwrap_or(1000);
    let next = Arc::new(AtomicU64::new(0));
    let bad = Arc::new(AtomicU64::new(0));
    let rest = url.strip_prefix("http://").unwrap_or(url);
    let (addr, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let threads: Vec<_> = (0..c)
        .map(|_| {
            let (addr, path, auth, next, bad) = (
                addr.to_string(),
                path.to_string(),
                auth.to_string(),
                next.clone(),
                bad.clone(),
            );
            std::thread::spawn(move || {
                let Some(mut ws) = ws_open(&addr, &path, &auth) else {
                    bad.fetch_add(1, Ordering::Relaxed);
                    return;
                };
                let head = r#"{"type":"conversation.item.create","item":{"type":"message","role":"user","content":[{"type":"input_text","text":""#;
                let tail = r#""}]}}"#;
                let text = "Say hello to the benchmark. ".repeat(bytes / 28 + 1);
                let text = text.get(..bytes.saturating_sub(head.len() + tail.len())).unwrap_or("");
                let event = format!("{head}{text}{tail}");
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= n {
                        break;
                    }
                    if !ws_turn(&mut ws, event.as_bytes()) {
                        bad.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    for t in threads {
        let _ = t.join();
    }
    println!("{n} {}", bad.load(Ordering::Relaxed));
}

/// A WebSocket session opened by hand: the upgrade, then the first event.
fn ws_open(addr: &str, path: &str, auth: &str) -> Option<std::net::TcpStream> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    let _ = s.set_nodelay(true);
    write!(s, "GET {path} HTTP/1.1\r\nhost: {addr}\r\nupgrade: websocket\r\nconnection: Upgrade\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\nsec-websocket-version: 13\r\nauthorization: {auth}\r\n\r\n").ok()?;
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        s.read_exact(&mut b).ok()?;
        head.push(b[0]);
    }
    if !head.starts_with(b"HTTP/1.1 101") {
        return None;
    }
    ws_read(&mut s)?;
    Some(s)
}

/// One event sent (masked, as a client's), its two answers read.
fn ws_turn(s: &mut std::net::TcpStream, event: &[u8]) -> bool {
    use std::io::Write;
    let key = [0x5a, 0x17, 0xc3, 0x08];
    let mut f = vec![0x81u8];
    match event.len() {
        n if n < 126 => f.push(0x80 | n as u8),
        n if n < 65_536 => {
            f.push(0x80 | 126);
            f.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            f.push(0x80 | 127);
            f.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    f.extend_from_slice(&key);
    f.extend(event.iter().enumerate().map(|(i, b)| b ^ key[i % 4]));
    if s.write_all(&f).is_err() {
        return false;
    }
    loop {
        match ws_read(s) {
            Some(p) if p.windows(22).any(|w| w == b"conversation.item.done") => return true,
            Some(p) if p.windows(14).any(|w| w == b"\"type\":\"error\"") => return false,
            Some(_) => {}
            None => return false,
        }
    }
}

/// One server frame's payload (unmasked, not fragmented); `None` at a close.
fn ws_read(s: &mut std::net::TcpStream) -> Option<Vec<u8>> {
    use std::io::Read;
    let mut h = [0u8; 2];
    s.read_exact(&mut h).ok()?;
    let len = match h[1] & 0x7f {
        126 => {
            let mut b = [0u8; 2];
            s.read_exact(&mut b).ok()?;
            usize::from(u16::from_be_bytes(b))
        }
        127 => {
            let mut b = [0u8; 8];
            s.read_exact(&mut b).ok()?;
            usize::try_from(u64::from_be_bytes(b)).ok()?
        }
        n => usize::from(n),
    };
    let mut p = vec![0u8; len];
    s.read_exact(&mut p).ok()?;
    (h[0] & 0x0f != 8).then_some(p)
}
