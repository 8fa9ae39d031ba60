#![allow(dead_code)]
use portcullis_tests::*;

pub const DEMO_KEY: &str = "sk-portcullis-demo";
/// The credential the shipped demo's MCP server `notes` takes.
pub const MCP_NOTES_TOKEN: &str = "sk-mock-notes";
pub const MINI_KEY: &str = "sk-portcullis-mini";
pub const PRIMARY_KEY: &str = "sk-primary-provider";
pub const BACKUP_KEY: &str = "sk-backup-provider";
pub const INGEST_TOKEN: &str = "ingest-token-for-tests";

pub fn mock(name: &str, api_key: Option<&str>) -> Mock {
    Mock::start(env!("CARGO_BIN_EXE_portcullis-mock"), name, api_key)
}

/// The shipped topology: two mock providers (each checking its own key) and
/// Envoy with the filter and the given plugin config.
pub struct Stack {
    pub primary: Mock,
    pub backup: Mock,
    pub envoy: Envoy,
}

impl Stack {
    pub fn start(plugin_yaml: &str, workers: u32) -> Stack {
        Self::start_with(plugin_yaml, workers, false)
    }

    /// `primary_dead`: Envoy's primary cluster points at a port nobody
    /// listens on (connection refused); the primary mock is still started.
    pub fn start_with(plugin_yaml: &str, workers: u32, primary_dead: bool) -> Stack {
        Self::start_full(plugin_yaml, workers, primary_dead, dead_port())
    }

    pub fn start_full(
        plugin_yaml: &str,
        workers: u32,
        primary_dead: bool,
        collector_port: u16,
    ) -> Stack {
        Self::start_patched(
            plugin_yaml,
            workers,
            primary_dead,
            collector_port,
            Vec::new(),
        )
    }

    /// The same with edits of `envoy/envoy.yaml` (each text must occur).
    pub fn start_patched(
        plugin_yaml: &str,
        workers: u32,
        primary_dead: bool,
        collector_port: u16,
        bootstrap_patch: Vec<(&str, &str)>,
    ) -> Stack {
        let primary = mock("primary", Some(PRIMARY_KEY));
        let backup = mock("backup", Some(BACKUP_KEY));
        let envoy = Envoy::start(EnvoyOpts {
            plugin_yaml,
            collector_port,
            ratelimit_port: dead_port(),
            primary_port: if primary_dead {
                dead_port()
            } else {
                primary.port
            },
            backup_port: backup.port,
            workers,
            side_tls: None,
            bootstrap_patch,
            control: None,
            clusters: None,
            env: vec![
                ("OPENAI_API_KEY", PRIMARY_KEY),
                ("BACKUP_API_KEY", BACKUP_KEY),
                // The shipped demo's Anthropic-format provider is the primary mock.
                ("ANTHROPIC_API_KEY", PRIMARY_KEY),
                // The collector tests that require it check it.
                ("PORTCULLIS_INGEST_TOKEN", INGEST_TOKEN),
                // The shipped demo's MCP server `notes` takes it.
                ("MCP_NOTES_TOKEN", MCP_NOTES_TOKEN),
            ],
        });
        Stack {
            primary,
            backup,
            envoy,
        }
    }

    pub fn shipped(workers: u32) -> Stack {
        Self::start(&test_plugin(), workers)
    }

    pub fn chat(&self, key: &str, body: &str) -> Resp {
        let auth = format!("Bearer {key}");
        post(
            &self.envoy.url("/v1/chat/completions"),
            &[("authorization", &auth)],
            body,
        )
    }
}

/// Run a script of `tests/sdk/` with the venv's Python (the official SDKs,
/// installed by `make sdk`); what it printed, as JSON.
pub fn sdk_script(script: &str, args: &[&str]) -> serde_json::Value {
    let python = std::env::var("PORTCULLIS_PYTHON")
        .unwrap_or_else(|_| repo_root().join(".venv/bin/python").display().to_string());
    let out = std::process::Command::new(&python)
        .arg(repo_root().join("tests/sdk").join(script))
        .args(args)
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run {python} (`make sdk` installs the SDKs into .venv): {e}")
        });
    assert!(
        out.status.success(),
        "{script} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("the script prints JSON")
}

/// What a client reads from an OpenAI stream: the contents joined, its
/// error event, its usage chunk's usage.
pub fn stream_text(body: &str) -> (String, Option<serde_json::Value>, Option<serde_json::Value>) {
    use serde_json::Value;
    let (mut text, mut error, mut usage) = (String::new(), None, None);
    for data in body.split("\n\n").filter_map(|e| e.strip_prefix("data: ")) {
        if data == "[DONE]" {
            continue;
        }
        let v: Value = serde_json::from_str(data).unwrap();
        if v.get("error").is_some() {
            error = Some(v);
        } else if v.get("usage").is_some_and(Value::is_object) {
            usage = Some(v["usage"].clone());
        } else if let Some(c) = v["choices"][0]["delta"]["content"].as_str() {
            text.push_str(c);
        }
    }
    (text, error, usage)
}

/// The message of an OpenAI-style error with this status and code.
pub fn openai_error_message(r: &Resp, status: u16, code: &str) -> String {
    assert_openai_error(r, status, code);
    r.json()["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// An OpenAI-style error body with this status and code.
pub fn assert_openai_error(r: &Resp, status: u16, code: &str) {
    assert_eq!(r.status, status, "body: {}", r.body);
    let v = r.json();
    assert_eq!(v["error"]["code"], code, "body: {}", r.body);
    assert!(v["error"]["type"].is_string(), "body: {}", r.body);
    assert!(
        !v["error"]["message"].as_str().unwrap_or("").is_empty(),
        "body: {}",
        r.body
    );
    assert_eq!(r.header("content-type"), Some("application/json"));
}

/// The answers of the mock's script for `anthropic_backed_check.py` (a
/// plain answer with cache reads, a stream, a tool call plain and
/// streamed, the tool-result turn, a 400), for a translated provider.
pub fn backed_sdk_script() -> serde_json::Value {
    let tool = serde_json::json!({"name": "get_weather", "input": {"city": "Paris"}});
    serde_json::json!([
        {"content": "Hi there friend", "usage": {"prompt_tokens": 9, "completion_tokens": 3}, "cache_read": 4},
        {"content": "Hi there friend", "usage": {"prompt_tokens": 9, "completion_tokens": 3}, "chunk_delay_ms": 5},
        {"content": "Let me check.", "tool_call": tool},
        {"content": "Let me check.", "tool_call": tool},
        {"content": "It is sunny."},
        {"status": 400}
    ])
}

/// What `anthropic_backed_check.py` saw of [`backed_sdk_script`]'s answers
/// through a translated provider: its prompt count (13 where cache reads
/// are added to the input, 9 where they are in it) and its 400's code.
pub fn assert_backed_sdk_run(v: &serde_json::Value, prompt_tokens: u64, error_code: &str) {
    use serde_json::json;
    assert_eq!(v["plain"]["content"], "Hi there friend");
    assert_eq!(v["plain"]["finish"], "stop");
    assert_eq!(v["plain"]["object"], "chat.completion");
    assert_eq!(v["plain"]["usage"]["prompt_tokens"], prompt_tokens);
    assert_eq!(v["plain"]["usage"]["completion_tokens"], 3);
    assert_eq!(
        v["plain"]["usage"]["prompt_tokens_details"]["cached_tokens"],
        4
    );
    assert_eq!(v["stream"]["text"], "Hi there friend");
    assert_eq!(v["stream"]["usage_total"], 12);
    assert_eq!(v["stream"]["roles"], 1, "the role only in the first chunk");
    assert_eq!(v["stream"]["finish"], "stop");
    assert_eq!(v["tool_plain"]["name"], "get_weather");
    assert_eq!(v["tool_plain"]["arguments"], json!({"city": "Paris"}));
    assert_eq!(v["tool_plain"]["finish"], "tool_calls");
    assert_eq!(
        v["tool_stream"]["calls"]["0"]["arguments"],
        json!({"city": "Paris"})
    );
    assert_eq!(v["tool_stream"]["finish"], "tool_calls");
    assert_eq!(v["tool_result_turn"], "It is sunny.");
    assert_eq!(v["error"]["class"], "BadRequestError");
    assert_eq!(v["error"]["code"], error_code);
}

/// The mock's answers for `anthropic_sdk_check.py` through a translated
/// provider: a message, a stream, a tool use plain and streamed, a 400.
pub fn anthropic_sdk_script() -> serde_json::Value {
    let tool = serde_json::json!({"name": "get_weather", "input": {"city": "Paris"}});
    serde_json::json!([
        {"content": "Hi there friend", "usage": {"prompt_tokens": 9, "completion_tokens": 3}},
        {"content": "Hi there friend", "usage": {"prompt_tokens": 9, "completion_tokens": 3}, "chunk_delay_ms": 5},
        {"content": "Checking.", "tool_call": tool},
        {"content": "Checking.", "tool_call": tool},
        {"status": 400}
    ])
}

/// What `anthropic_sdk_check.py` saw of [`anthropic_sdk_script`]'s answers
/// (the count and the 400's class left to the caller).
pub fn assert_anthropic_sdk_run(v: &serde_json::Value) {
    use serde_json::json;
    assert_eq!(
        v["create"],
        json!({"text": "Hi there friend", "stop": "end_turn", "input": 9, "output": 3, "type": "message"})
    );
    assert_eq!(
        v["stream"],
        json!({"text": "Hi there friend", "output": 3, "stop": "end_turn"})
    );
    for k in ["tool", "tool_stream"] {
        assert_eq!(
            v[k],
            json!({"name": "get_weather", "input": {"city": "Paris"}, "stop": "tool_use"}),
            "{k}"
        );
    }
    assert_eq!(v["errors"]["provider_400"]["class"], "BadRequestError");
    assert_eq!(v["errors"]["bad_key"]["class"], "AuthenticationError");
    assert_eq!(v["errors"]["unknown_model"]["class"], "NotFoundError");
}

/// The mock's answers for `responses_check.py` (a response, a stream, a
/// function call, the answer to its output, a structured answer).
pub fn responses_script() -> serde_json::Value {
    let tool = serde_json::json!({"name": "get_weather", "input": {"city": "Paris"}});
    serde_json::json!([
        {"content": "Hi there friend", "usage": {"prompt_tokens": 9, "completion_tokens": 3}},
        {"content": "Hi there friend", "usage": {"prompt_tokens": 9, "completion_tokens": 3}},
        {"content": "Checking.", "tool_call": tool},
        {"content": "It is sunny."},
        {"content": "Checking.", "tool_call": tool},
        {"content": "A red square."},
        {"content": "{\"a\": 1}"}
    ])
}

/// What `responses_check.py` (the conversation resent, not chained) saw
/// of [`responses_script`]'s answers through a translated provider.
pub fn assert_responses_run(v: &serde_json::Value) {
    use serde_json::json;
    assert_eq!(
        v["create"],
        json!({"text": "Hi there friend", "status": "completed", "input": 9, "output": 3, "object": "response"})
    );
    assert_eq!(
        v["stream"],
        json!({"text": "Hi there friend", "final": "Hi there friend", "output": 3, "first": "response.created", "last": "response.completed"})
    );
    assert_eq!(
        v["tool"],
        json!({"name": "get_weather", "arguments": {"city": "Paris"}})
    );
    assert_eq!(
        v["tool_result"],
        json!({"text": "It is sunny.", "status": "completed"})
    );
    assert_eq!(
        v["tool_stream"],
        json!({"calls": ["get_weather"], "arguments": {"city": "Paris"}})
    );
    assert_eq!(
        v["image"],
        json!({"text": "A red square.", "status": "completed"})
    );
    assert_eq!(v["structured"], json!({"text": "{\"a\": 1}"}));
    assert_eq!(v["errors"]["unknown_model"]["class"], "NotFoundError");
    // Every Responses object and event read, valid Open Responses: the
    // seven successful calls (and the chained run's read back by id).
    assert_eq!(
        v["conformance"]["failures"],
        json!([]),
        "{}",
        v["conformance"]
    );
    assert!(
        v["conformance"]["checked"].as_u64() >= Some(7),
        "{}",
        v["conformance"]
    );
}

fn python() -> String {
    std::env::var("PORTCULLIS_PYTHON")
        .unwrap_or_else(|_| repo_root().join(".venv/bin/python").display().to_string())
}

/// An MCP server built with the official `mcp` SDK (tests/sdk/mcp_server.py)
/// on `port`, answering SSE streams, or JSON with `json`.
pub fn mcp_server(name: &str, port: u16, json: bool) -> Proc {
    let port_s = port.to_string();
    let mut args = vec![name, port_s.as_str()];
    if json {
        args.push("json");
    }
    sdk_server(
        "mcp_server.py",
        &args,
        port,
        "an MCP server (`make sdk` installs `mcp`)",
    )
}

/// A real Presidio analyzer (`tests/sdk/presidio_server.py`, its pattern
/// recognizers) on `port`, ready.
pub fn presidio_server(port: u16) -> Proc {
    sdk_server(
        "presidio_server.py",
        &[&port.to_string()],
        port,
        "Presidio (`make sdk` installs `presidio-analyzer`)",
    )
}

/// A server of `tests/sdk/` run with the venv's Python, once it takes
/// connections on `port`.
fn sdk_server(script: &str, args: &[&str], port: u16, what: &str) -> Proc {
    let child = std::process::Command::new(python())
        .arg(repo_root().join("tests/sdk").join(script))
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("start {what}: {e}"));
    let proc = Proc(child);
    poll_until(std::time::Duration::from_secs(60), what, || {
        std::net::TcpStream::connect(("127.0.0.1", port)).ok()
    });
    proc
}

/// An Envoy of a fleet (2 workers) whose limiter cluster is `ratelimit_port`
/// and whose collector is `collector_port`, with the providers' keys and
/// the limiter's token in its environment.
pub fn fleet_envoy(
    plugin: &str,
    primary: &Mock,
    backup: &Mock,
    ratelimit_port: u16,
    collector_port: u16,
) -> Envoy {
    fleet_envoy_workers(plugin, primary, backup, ratelimit_port, collector_port, 2)
}

/// [`fleet_envoy`] with this many workers.
pub fn fleet_envoy_workers(
    plugin: &str,
    primary: &Mock,
    backup: &Mock,
    ratelimit_port: u16,
    collector_port: u16,
    workers: u32,
) -> Envoy {
    Envoy::start(EnvoyOpts {
        plugin_yaml: plugin,
        primary_port: primary.port,
        backup_port: backup.port,
        collector_port,
        ratelimit_port,
        workers,
        side_tls: None,
        bootstrap_patch: Vec::new(),
        control: None,
        clusters: None,
        env: vec![
            ("OPENAI_API_KEY", PRIMARY_KEY),
            ("BACKUP_API_KEY", BACKUP_KEY),
            ("PORTCULLIS_LIMITER_TOKEN", LIMITER_TOKEN),
        ],
    })
}

/// `plugin` with its `cache:` section replaced by `section` (whole, from
/// its `cache:` line).
pub fn with_cache_section(plugin: &str, section: &str) -> String {
    assert!(plugin.contains("\ncache:\n"), "no cache section to replace");
    let mut out = String::new();
    let mut in_cache = false;
    for line in plugin.lines() {
        if line == "cache:" {
            in_cache = true;
            out.push_str(section);
            continue;
        }
        if !line.starts_with(' ') {
            in_cache = false;
        }
        if !in_cache {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}
