//! Files and batches in real Envoy (#48): the official OpenAI SDK uploads
//! a batch file of about 10 MB, creates a batch, reads it completed,
//! downloads its output and cancels another, through the gateway to the
//! mock's files and batches; the ids it sees carry the provider and the
//! client (another key, a forged id: 404); a batch's requests count
//! against the key's request rate; every call is recorded.
mod common;
use common::*;
use portcullis_tests::*;
use serde_json::{json, Value};
use std::time::Duration;

const OTHER_KEY: &str = "sk-batches-other";
const SMALL_KEY: &str = "sk-batches-small";
const BUDGET_KEY: &str = "sk-batches-budget";

fn plugin() -> String {
    test_plugin()
        .replace("flush_interval_ms: 250", "flush_interval_ms: 100")
        .replace(
            "clients:\n",
            &format!(
                "clients:\n  - name: other\n    key_sha256: {}\n  - name: small\n    key_sha256: {}\n    limits: {{requests_per_minute: 20}}\n  - name: budgeted\n    key_sha256: {}\n    limits: {{budget_usd_per_day: 0.01}}\n",
                key_hash(OTHER_KEY),
                key_hash(SMALL_KEY),
                key_hash(BUDGET_KEY)
            ),
        )
}

/// A multipart upload of a batch file of `lines` requests, by plain HTTP.
fn upload(s: &Stack, key: &str, lines: usize) -> Resp {
    upload_of(s, key, lines, "hi")
}

/// The same, each request's prompt `content`.
fn upload_of(s: &Stack, key: &str, lines: usize, content: &str) -> Resp {
    let b = "batchboundary";
    let file: String = (0..lines)
        .map(|i| {
            json!({"custom_id": format!("r{i}"), "method": "POST", "url": "/v1/chat/completions",
                "body": {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": content}]}})
            .to_string()
                + "\n"
        })
        .collect();
    let body = format!("--{b}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n--{b}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"r.jsonl\"\r\nContent-Type: application/jsonl\r\n\r\n{file}\r\n--{b}--\r\n");
    post(
        &s.envoy.url("/v1/files"),
        &[
            ("authorization", &format!("Bearer {key}")),
            (
                "content-type",
                &format!("multipart/form-data; boundary={b}"),
            ),
        ],
        &body,
    )
}

#[test]
fn the_openai_sdk_runs_a_batch_through_the_gateway_and_its_ids_are_its_own() {
    let dir = TempDir::new("batches-records");
    let c = Collector::start(&dir.0.join("log.db"), 0);
    let s = Stack::start_full(&plugin(), 2, false, c.grpc_port);
    // 2,000 requests of about 5 KB: a 10 MB file.
    let v = sdk_script(
        "batches_check.py",
        &[&s.envoy.url("/v1"), DEMO_KEY, OTHER_KEY, "2000", "5000"],
    );
    let upload_bytes = v["upload_bytes"].as_u64().unwrap();
    assert!(upload_bytes > 10_000_000, "{upload_bytes}");
    let id = v["file"]["id"].as_str().unwrap();
    let (inner, seal) = id.rsplit_once('~').expect("a sealed id");
    assert!(inner.starts_with("file-mock"), "{id}");
    assert!(
        seal.ends_with("2000"),
        "the file's requests are in its id: {id}"
    );
    assert_eq!(v["file"]["bytes"], upload_bytes);
    assert_eq!(v["file"]["purpose"], "batch");
    assert_eq!(v["retrieved"], true);
    let created = &v["created"];
    assert!(created["id"].as_str().unwrap().starts_with("batch_mock"));
    assert!(created["id"].as_str().unwrap().contains('~'));
    assert_eq!(created["status"], "validating");
    // The batch's file id as the client knows it, and the client's
    // metadata with the owner's mark.
    assert!(created["input_file_id"]
        .as_str()
        .unwrap()
        .starts_with(inner));
    assert_eq!(created["metadata"]["run"], "test");
    assert!(created["metadata"]["portcullis_owner"].is_string());
    assert_eq!(v["retrieved_batch"]["status"], "completed");
    assert_eq!(v["retrieved_batch"]["total"], 2000);
    assert!(v["retrieved_batch"]["output_file_id"]
        .as_str()
        .unwrap()
        .contains('~'));
    assert_eq!(v["results"]["n"], 2000);
    assert_eq!(
        v["results"]["custom_ids"],
        json!(["req-0", "req-1", "req-10"])
    );
    assert_eq!(
        v["cancelled"],
        json!({"status": "cancelling", "id_kept": true})
    );
    assert_eq!(v["cancel_completed"]["status"], 400);
    assert_eq!(v["listed"], true, "{v}");
    for k in ["other_file", "other_batch", "other_create", "forged"] {
        assert_eq!(v[k]["status"], 404, "{k}: {v}");
    }
    assert_eq!(v["list_files"]["status"], 403);
    assert_eq!(v["other_list"], json!([]), "another key lists none of them");
    assert_eq!(v["deleted"], json!({"deleted": true, "id_kept": true}));
    // What the provider got: its own ids and key, never a sealed id or the
    // client's key; the whole file.
    let sent = s.primary.requests();
    let create = sent
        .iter()
        .find(|r| r["path"] == "/v1/batches" && r["body"]["input_file_id"].is_string())
        .expect("the batch's creation");
    assert_eq!(create["body"]["input_file_id"], inner);
    assert_eq!(
        create["headers"]["authorization"],
        format!("Bearer {PRIMARY_KEY}")
    );
    assert!(sent
        .iter()
        .all(|r| !r["path"].as_str().unwrap_or("").contains('~')));
    let up = sent
        .iter()
        .find(|r| r["path"] == "/v1/files")
        .expect("the upload");
    assert!(up["body"]["bytes"].as_u64().unwrap() > upload_bytes);
    // Records: each call, its API and provider; the upload names the
    // batch's model.
    let rows = poll_until(Duration::from_secs(15), "the batch records", || {
        let r = c.recent(50);
        (r.iter().filter(|x| x["api"] == "batches").count() >= 5).then_some(r)
    });
    let upload_rec = rows
        .iter()
        .find(|x| x["api"] == "files" && x["model"] == "gpt-4o-mini")
        .expect("the upload's record");
    assert_eq!(upload_rec["provider"], "primary");
    assert_eq!(upload_rec["status"], 200);
    assert!(rows
        .iter()
        .any(|x| x["api"] == "files" && x["status"] == 404 && x["client"] == "other"));
}

#[test]
fn a_batchs_requests_count_against_the_request_rate() {
    let s = Stack::start(&plugin(), 1);
    // 20 a minute: the upload takes one, a batch of 15 takes 15 (with its
    // own call), a second batch of 15 is refused and never sent.
    let r = upload(&s, SMALL_KEY, 15);
    assert_eq!(r.status, 200, "{}", r.body);
    let file = r.json()["id"].as_str().unwrap().to_string();
    let batch = |key: &str| {
        post(
            &s.envoy.url("/v1/batches"),
            &[
                ("authorization", &format!("Bearer {key}")),
                ("content-type", "application/json"),
            ],
            &json!({"input_file_id": file, "endpoint": "/v1/chat/completions", "completion_window": "24h"}).to_string(),
        )
    };
    let first = batch(SMALL_KEY);
    assert_eq!(first.status, 200, "{}", first.body);
    let hits = s.primary.hits();
    let second = batch(SMALL_KEY);
    assert_eq!(second.status, 429, "{}", second.body);
    let e: Value = serde_json::from_str(&second.body).unwrap();
    assert_eq!(e["error"]["code"], "rate_limit_exceeded");
    assert_eq!(s.primary.hits(), hits, "the refused batch never left");
    // Bad bodies: a batch without its file, an upload without a file.
    let r = post(
        &s.envoy.url("/v1/batches"),
        &[
            ("authorization", &format!("Bearer {DEMO_KEY}")),
            ("content-type", "application/json"),
        ],
        &json!({"endpoint": "/v1/chat/completions", "completion_window": "24h"}).to_string(),
    );
    assert_eq!(r.status, 400, "{}", r.body);
    assert_eq!(r.json()["error"]["code"], "missing_input_file_id");
    let b = "bb";
    let r = post(
        &s.envoy.url("/v1/files"),
        &[
            ("authorization", &format!("Bearer {DEMO_KEY}")),
            (
                "content-type",
                &format!("multipart/form-data; boundary={b}"),
            ),
        ],
        &format!(
            "--{b}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n--{b}--\r\n"
        ),
    );
    assert_eq!(r.status, 400, "{}", r.body);
    assert_eq!(r.json()["error"]["code"], "missing_file");
    assert_eq!(s.primary.hits(), hits);
}

#[test]
fn a_finished_batchs_cost_is_charged_to_the_budget_once() {
    let dir = TempDir::new("batches-budget");
    let c = Collector::start(&dir.0.join("log.db"), 0);
    let s = Stack::start_full(&plugin(), 1, false, c.grpc_port);
    let chat = || {
        post(
            &s.envoy.url("/v1/chat/completions"),
            &[
                ("authorization", &format!("Bearer {BUDGET_KEY}")),
                ("content-type", "application/json"),
            ],
            &json!({"model": "gpt-4o-mini", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}).to_string(),
        )
    };
    // 200 requests of 700 words: the mock counts 140,000 input and 400
    // output tokens, $0.0106 at half gpt-4o-mini's price ($0.15 and $0.60
    // per 1M), over the key's $0.01 a day.
    let words = vec!["word"; 700].join(" ");
    let r = upload_of(&s, BUDGET_KEY, 200, &words);
    assert_eq!(r.status, 200, "{}", r.body);
    let file = r.json()["id"].as_str().unwrap().to_string();
    let r = post(
        &s.envoy.url("/v1/batches"),
        &[
            ("authorization", &format!("Bearer {BUDGET_KEY}")),
            ("content-type", "application/json"),
        ],
        &json!({"input_file_id": file, "endpoint": "/v1/chat/completions", "completion_window": "24h"}).to_string(),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let id = r.json()["id"].as_str().unwrap().to_string();
    let r = chat();
    assert_eq!(
        r.status, 200,
        "the budget is whole until the batch is done: {}",
        r.body
    );
    // Read done: its usage is charged; read again and listed: not again.
    let auth = format!("Bearer {BUDGET_KEY}");
    for path in [
        format!("/v1/batches/{id}"),
        format!("/v1/batches/{id}"),
        "/v1/batches".into(),
    ] {
        let r = get(&s.envoy.url(&path), &[("authorization", &auth)]);
        assert_eq!(r.status, 200, "{path}: {}", r.body);
    }
    let r = chat();
    assert_eq!(r.status, 429, "{}", r.body);
    assert_eq!(r.json()["error"]["code"], "budget_exceeded", "{}", r.body);
    let rows = poll_until(Duration::from_secs(15), "the batch reads' records", || {
        let r = c.recent(50);
        (r.iter()
            .filter(|x| x["api"] == "batches" && x["client"] == "budgeted")
            .count()
            >= 4)
            .then_some(r)
    });
    let costs: Vec<(i64, u64, u64)> = rows
        .iter()
        .filter(|x| x["api"] == "batches" && x["client"] == "budgeted")
        .map(|x| {
            (
                (x["cost_usd"].as_f64().unwrap_or(0.0) * 1e6).round() as i64,
                x["prompt_tokens"].as_u64().unwrap_or(0),
                x["completion_tokens"].as_u64().unwrap_or(0),
            )
        })
        .filter(|c| c.0 > 0)
        .collect();
    let expected = (140_000.0 * 0.075 + 400.0 * 0.3_f64).ceil() as i64;
    assert_eq!(costs, vec![(expected, 140_000, 400)], "{rows:?}");
}

#[test]
fn the_anthropic_sdk_runs_a_message_batch_through_the_gateway() {
    // The shipped demo's Anthropic provider (`claude`, on the primary mock).
    let plugin = shipped_plugin()
        .replace("cache:\n  enabled: true", "cache:\n  enabled: false")
        .replace(
            "clients:\n",
            &format!(
                "clients:\n  - name: other\n    key_sha256: {}\n",
                key_hash(OTHER_KEY)
            ),
        );
    assert!(
        plugin.contains("name: claude-sonnet"),
        "the demo's Anthropic model changed"
    );
    let dir = TempDir::new("message-batches-records");
    let c = Collector::start(&dir.0.join("log.db"), 0);
    let s = Stack::start_full(
        &plugin.replace("flush_interval_ms: 250", "flush_interval_ms: 100"),
        1,
        false,
        c.grpc_port,
    );
    let v = sdk_script(
        "anthropic_batches_check.py",
        &[&s.envoy.url(""), DEMO_KEY, OTHER_KEY, "claude-sonnet"],
    );
    let id = v["created"]["id"].as_str().unwrap();
    assert!(id.starts_with("msgbatch_mock") && id.contains('~'), "{v}");
    assert_eq!(v["created"]["status"], "in_progress");
    assert_eq!(v["created"]["processing"], 3);
    assert_eq!(v["retrieved"]["status"], "ended");
    assert_eq!(v["retrieved"]["succeeded"], 3);
    // The results are fetched from the gateway, by the sealed id.
    assert_eq!(
        v["retrieved"]["results_url"],
        format!("{}/v1/messages/batches/{id}/results", s.envoy.url("")).as_str()
    );
    assert_eq!(
        v["results"],
        json!([
            {"custom_id": "q0", "type": "succeeded", "text": "batch answer"},
            {"custom_id": "q1", "type": "succeeded", "text": "batch answer"},
            {"custom_id": "q2", "type": "succeeded", "text": "batch answer"}
        ])
    );
    assert_eq!(
        v["cancelled"],
        json!({"status": "canceling", "id_kept": true})
    );
    assert_eq!(v["other_retrieve"]["status"], 404, "{v}");
    assert_eq!(
        v["other_retrieve"]["type"], "not_found_error",
        "Anthropic's error shape"
    );
    assert_eq!(v["other_results"]["status"], 404);
    assert_eq!(v["list"]["status"], 403);
    assert_eq!(
        v["deleted"],
        json!({"type": "message_batch_deleted", "id_kept": true})
    );
    // The provider got its own model id and key, Anthropic's headers, and
    // never a sealed id.
    let sent = s.primary.requests();
    let create = sent
        .iter()
        .find(|r| r["path"] == "/v1/messages/batches" && r["body"]["requests"].is_array())
        .expect("the batch's creation");
    assert_eq!(
        create["body"]["requests"][0]["params"]["model"],
        "claude-sonnet-4-5"
    );
    assert_eq!(create["headers"]["x-api-key"], PRIMARY_KEY);
    assert!(create["headers"]["anthropic-version"].is_string());
    assert!(create["headers"].get("authorization").is_none());
    assert!(sent
        .iter()
        .all(|r| !r["path"].as_str().unwrap_or("").contains('~')));
    // The results, read as they passed: their usage (each answer's 2
    // output tokens) charged once at half the model's price, on the
    // record of the call that fetched them.
    let rows = poll_until(Duration::from_secs(15), "the results' record", || {
        let r = c.recent(50);
        r.iter()
            .find(|x| x["api"] == "message_batches" && x["completion_tokens"].as_u64() > Some(0))
            .cloned()
    });
    assert_eq!(rows["completion_tokens"], 6, "{rows}");
    assert!(rows["prompt_tokens"].as_u64() > Some(0), "{rows}");
    assert!(rows["cost_usd"].as_f64() > Some(0.0), "{rows}");
}

/// The id seal of #48 as it was: 12 hex digits of SHA-256 over the
/// provider's credential, the owner, the provider, the id and the count.
/// With a keyless provider the credential was empty, so anyone who knew a
/// raw id and an owner's name could write this id.
fn seal_keyed_by_the_providers_credential(
    id: &str,
    provider: &str,
    owner: &str,
    credential: &str,
    n: u64,
) -> String {
    use sha2::{Digest, Sha256};
    let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
    let tag = hex(&Sha256::digest(provider.as_bytes())[..4]);
    let mut h = Sha256::new();
    for part in [credential, owner, provider, id, &n.to_string()] {
        h.update((part.len() as u64).to_le_bytes());
        h.update(part.as_bytes());
    }
    format!("{id}~{tag}{}{n}", hex(&h.finalize()[..6]))
}

/// An Envoy in front of one keyless provider (`primary`, no
/// `OPENAI_API_KEY`, as a vLLM or Ollama preset is) with `env` added.
fn keyless_envoy(primary: &Mock, env: Vec<(&'static str, &'static str)>) -> Envoy {
    Envoy::start(EnvoyOpts {
        plugin_yaml: &plugin(),
        primary_port: primary.port,
        backup_port: dead_port(),
        collector_port: dead_port(),
        ratelimit_port: dead_port(),
        workers: 1,
        side_tls: None,
        bootstrap_patch: Vec::new(),
        control: None,
        clusters: None,
        env,
    })
}

/// Ids sealed by the gateway's own secret (#61): a provider without a key
/// is as safe as one with (an id forged the way a credential-keyed seal
/// allowed opens nothing); the provider's key and the seal secret rotate
/// without turning live ids into 404s; a gateway without a secret refuses
/// files and batches rather than hand out ids anyone could forge.
#[test]
fn ids_are_sealed_by_the_gateways_secret_whatever_the_providers_key() {
    let primary = mock("primary", None);
    let first = keyless_envoy(
        &primary,
        vec![("PORTCULLIS_SEAL_SECRET", "the first seal secret")],
    );
    let s = Stack {
        primary,
        backup: mock("backup", None),
        envoy: first,
    };
    let r = upload(&s, DEMO_KEY, 3);
    assert_eq!(r.status, 200, "{}", r.body);
    let id = r.json()["id"].as_str().unwrap().to_string();
    let raw = id.rsplit_once('~').unwrap().0.to_string();
    let as_other = format!("Bearer {OTHER_KEY}");
    let as_owner = format!("Bearer {DEMO_KEY}");
    let read = |e: &Envoy, auth: &str, id: &str| {
        get(
            &e.url(&format!("/v1/files/{id}")),
            &[("authorization", auth)],
        )
    };
    // Forged by a caller that knows the raw id and the names: its own,
    // the owner's.
    for owner in ["other", "demo"] {
        let forged = seal_keyed_by_the_providers_credential(&raw, "primary", owner, "", 3);
        let r = read(&s.envoy, &as_other, &forged);
        assert_openai_error(&r, 404, "not_found");
    }
    let r = read(&s.envoy, &as_other, &id);
    assert_openai_error(&r, 404, "not_found");
    assert_eq!(read(&s.envoy, &as_owner, &id).status, 200);
    // Another replica: the provider now has a key, and the seal secret
    // rotates (the new one seals, the old one still opens).
    let rotated = keyless_envoy(
        &s.primary,
        vec![
            ("OPENAI_API_KEY", "sk-the-providers-new-key"),
            ("PORTCULLIS_SEAL_SECRET", "the second seal secret"),
            ("PORTCULLIS_SEAL_SECRET_PREVIOUS", "the first seal secret"),
        ],
    );
    let r = read(&rotated, &as_owner, &id);
    assert_eq!(r.status, 200, "{}", r.body);
    // What it answers is sealed with the new secret.
    let resealed = r.json()["id"].as_str().unwrap().to_string();
    assert!(
        resealed.starts_with(&format!("{raw}~")) && resealed != id,
        "{resealed}"
    );
    let r = read(&rotated, &as_other, &id);
    assert_openai_error(&r, 404, "not_found");
    // The old secret removed: ids it sealed are gone, the new ones open; a
    // gateway with no secret at all refuses, saying what to set.
    let done = keyless_envoy(
        &s.primary,
        vec![("PORTCULLIS_SEAL_SECRET", "the second seal secret")],
    );
    assert_openai_error(&read(&done, &as_owner, &id), 404, "not_found");
    assert_eq!(read(&done, &as_owner, &resealed).status, 200);
    let none = keyless_envoy(&s.primary, vec![("PORTCULLIS_SEAL_SECRET", "")]);
    let r = read(&none, &as_owner, &id);
    assert_openai_error(&r, 503, "seal_secret_missing");
    assert!(r.body.contains("PORTCULLIS_SEAL_SECRET"), "{}", r.body);
}

/// A batch file with `lines` (custom_id `r{i}`, one line each), uploaded
/// as the key.
fn upload_lines(s: &Stack, key: &str, lines: &[Value]) -> Resp {
    let b = "batchboundary";
    let file: String = lines.iter().map(|l| l.to_string() + "\n").collect();
    let body = format!("--{b}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n--{b}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"r.jsonl\"\r\nContent-Type: application/jsonl\r\n\r\n{file}\r\n--{b}--\r\n");
    post(
        &s.envoy.url("/v1/files"),
        &[
            ("authorization", &format!("Bearer {key}")),
            (
                "content-type",
                &format!("multipart/form-data; boundary={b}"),
            ),
        ],
        &body,
    )
}

fn line(i: usize, model: &str, text: &str) -> Value {
    json!({"custom_id": format!("r{i}"), "method": "POST", "url": "/v1/chat/completions",
        "body": {"model": model, "messages": [{"role": "user", "content": text}]}})
}

/// Every line of a batch file is checked as the request it will be (#61):
/// its model one the key may use, its prompt through the key's input
/// guardrails; the first line that fails is named (number, custom_id) in
/// an error of OpenAI's shape and nothing reaches the provider; a
/// redaction rewrites the line in the file the provider keeps.
#[test]
fn every_line_of_a_batch_file_is_checked_and_a_failing_line_is_named() {
    let p = plugin()
        + "guardrails:\n  input:\n    - {name: secrets, regex: '(?i)password\\s*[:=]', action: deny}\n    - {name: cards, pii: [card], action: redact}\n";
    let s = Stack::start(&p, 1);
    let hits = s.primary.hits();
    // mini-only may use gpt-4o-mini alone: its third line names gpt-4o.
    let lines: Vec<Value> = (0..5)
        .map(|i| line(i, if i == 2 { "gpt-4o" } else { "gpt-4o-mini" }, "hi"))
        .collect();
    let r = upload_lines(&s, MINI_KEY, &lines);
    assert_openai_error(&r, 403, "model_not_allowed");
    assert!(
        r.body.contains("Batch file line 3 (custom_id `r2`)"),
        "{}",
        r.body
    );
    // Its fifth line holds a secret.
    let lines: Vec<Value> = (0..5)
        .map(|i| {
            line(
                i,
                "gpt-4o-mini",
                if i == 4 { "my password: hunter2" } else { "hi" },
            )
        })
        .collect();
    let r = upload_lines(&s, MINI_KEY, &lines);
    assert_openai_error(&r, 400, "guardrail_denied");
    assert!(
        r.body.contains("Batch file line 5 (custom_id `r4`)"),
        "{}",
        r.body
    );
    // A line that is no request.
    let mut lines: Vec<Value> = (0..2).map(|i| line(i, "gpt-4o-mini", "hi")).collect();
    lines.push(json!("not a request"));
    let r = upload_lines(&s, MINI_KEY, &lines);
    assert_openai_error(&r, 400, "invalid_batch_line");
    assert!(r.body.contains("Batch file line 3"), "{}", r.body);
    assert_eq!(
        s.primary.hits(),
        hits,
        "no refused file reached the provider"
    );
    // A card number in the second line: redacted in the file the
    // provider keeps, the other lines as they were.
    let lines: Vec<Value> = (0..3)
        .map(|i| {
            line(
                i,
                "gpt-4o-mini",
                if i == 1 {
                    "card 4111 1111 1111 1111"
                } else {
                    "hi"
                },
            )
        })
        .collect();
    let r = upload_lines(&s, MINI_KEY, &lines);
    assert_eq!(r.status, 200, "{}", r.body);
    let id = r.json()["id"].as_str().unwrap().to_string();
    let content = get(
        &s.envoy.url(&format!("/v1/files/{id}/content")),
        &[("authorization", &format!("Bearer {MINI_KEY}"))],
    );
    assert_eq!(content.status, 200, "{}", content.body);
    let kept: Vec<Value> = content
        .body
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(kept.len(), 3, "{}", content.body);
    assert_eq!(kept[0], lines[0]);
    assert_eq!(kept[2], lines[2]);
    let text = kept[1]["body"]["messages"][0]["content"].as_str().unwrap();
    assert!(
        !text.contains("4111") && text.contains("[REDACTED:card]"),
        "{text}"
    );
    assert_eq!(kept[1]["custom_id"], "r1");
}
