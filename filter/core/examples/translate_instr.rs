//! `scripts/bench-translate.sh`: one translation step, run `N` times
//! natively, for callgrind to count (the step's instructions per request
//! and, with symbols, where they go; Envoy's V8 code has none). A
//! benchmark, not a test.
//!
//! `translate_instr STEP N`, STEP one of: `parse` (the strict parse every
//! request pays), `direct` (the untranslated body: model id spliced in),
//! `chat_anthropic`, `messages_chat`, `responses_anthropic` (the request
//! translations, each including the parse), `anthropic_answer`,
//! `chat_messages_answer`, `chat_responses_answer` (the whole answers
//! back), `responses_echo` (the settings a translated response echoes, read
//! from the request). The bodies are those of `portcullis-load` and the mock's answers
//! to them.

use portcullis_core::api::Api;
use portcullis_core::request::ChatRequest;
use portcullis_core::translate;
use portcullis_core::{compile, config};
use std::hint::black_box;

const CHAT: &[u8] = br#"{"model":"gpt-4o-mini","messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"Say hello to the benchmark in five words or fewer, please."}],"temperature":0.2,"max_tokens":16}"#;
const RESPONSES: &[u8] = br#"{"model":"gpt-4o-mini","instructions":"You are terse.","input":"Say hello to the benchmark in five words or fewer, please.","temperature":0.2,"max_output_tokens":16}"#;
const MESSAGES: &[u8] = br#"{"model":"gpt-4o-mini","system":"You are terse.","messages":[{"role":"user","content":"Say hello to the benchmark in five words or fewer, please."}],"temperature":0.2,"max_tokens":16}"#;
const ANTHROPIC_ANSWER: &[u8] = br#"{"id":"msg_mock_1","type":"message","role":"assistant","model":"gpt-4o-mini-2024-07-18","content":[{"type":"text","text":"Hello from the mock provider bench."}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":10,"output_tokens":6,"cache_read_input_tokens":0,"cache_creation_input_tokens":0}}"#;
const CHAT_ANSWER: &[u8] = br#"{"id":"chatcmpl-mock-1","object":"chat.completion","created":1700000000,"model":"gpt-4o-mini-2024-07-18","choices":[{"index":0,"message":{"role":"assistant","content":"Hello from the mock provider bench.","refusal":null},"logprobs":null,"finish_reason":"stop"}],"usage":{"prompt_tokens":10,"completion_tokens":6,"total_tokens":16},"system_fingerprint":"fp_mock"}"#;

fn provider(schema: &str) -> Result<config::Provider, String> {
    let yaml = format!(
        "providers:\n  - name: p\n    cluster: p\n    host: p.mock\n    base_path: /v1\n    schema: {schema}\n    models:\n      - name: gpt-4o-mini\nclients:\n  - name: demo\n    key_sha256: 1f39b34977fb885c1f5e66609a5a880cd58f383952eb98ce438069cc57aeccf8\n"
    );
    let gw = compile::compile(yaml.as_bytes())?;
    gw.providers
        .into_iter()
        .next()
        .ok_or_else(|| "no provider".to_string())
}

fn body_len(p: &config::Provider, api: Api, body: &[u8], model_id: &str) -> Result<usize, String> {
    let req = ChatRequest::parse_for(api, body).map_err(|e| e.message)?;
    let prepared = translate::request_body(p, api, &req, model_id, true).map_err(|e| e.message)?;
    Ok(prepared.body.map_or(0, |b| b.len()))
}

fn main() -> Result<(), String> {
    let args: Vec<String> = std::env::args().collect();
    let step = args.get(1).map_or("parse", String::as_str);
    let n: u32 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(1000);
    let openai = provider("openai")?;
    let anthropic = provider("anthropic")?;
    let id = "gpt-4o-mini-2024-07-18";
    let mut total = 0usize;
    for _ in 0..n {
        total += match step {
            "parse" => ChatRequest::parse(black_box(CHAT))
                .map_err(|e| e.message)?
                .body_len(),
            "direct" => body_len(&openai, Api::ChatCompletions, black_box(CHAT), id)?,
            "chat_anthropic" => body_len(&anthropic, Api::ChatCompletions, black_box(CHAT), id)?,
            "responses_anthropic" => {
                body_len(&anthropic, Api::Responses, black_box(RESPONSES), id)?
            }
            "messages_chat" => body_len(&openai, Api::Messages, black_box(MESSAGES), id)?,
            "anthropic_answer" => translate::back(&anthropic, Api::ChatCompletions)
                .and_then(|b| b.answer(black_box(ANTHROPIC_ANSWER), 1))
                .map_or(0, |b| b.len()),
            "chat_responses_answer" => translate::pivot::answer_from_pivot(
                Api::Responses,
                black_box(CHAT_ANSWER),
                1,
                &portcullis_core::api::responses::Echo::default(),
            )
            .map_or(0, |b| b.len()),
            "responses_echo" => portcullis_core::api::responses::Echo::of(black_box(RESPONSES))
                .members()
                .len(),
            "chat_messages_answer" => translate::back(&openai, Api::Messages)
                .and_then(|b| b.answer(black_box(CHAT_ANSWER), 1))
                .map_or(0, |b| b.len()),
            other => return Err(format!("unknown step `{other}`")),
        };
    }
    println!("{step} x{n}: {total} bytes");
    Ok(())
}
