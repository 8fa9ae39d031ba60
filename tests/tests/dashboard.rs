//! The dashboard loads in headless Chromium with data rendered.
use portcullis_collector::proto::{
    collector_client::CollectorClient, Attempt, RecordBatch, RequestRecord,
};
use portcullis_tests::*;
use std::process::Command;

fn chromium() -> String {
    for c in ["chromium", "chromium-browser", "google-chrome"] {
        if Command::new("which")
            .arg(c)
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false)
        {
            return c.to_string();
        }
    }
    panic!("no chromium: `make test` installs Debian's chromium package");
}

fn chrome(dir: &std::path::Path, args: &[&str], url: &str) -> std::process::Output {
    Command::new(chromium())
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--window-size=1280,1000",
            "--virtual-time-budget=8000",
        ])
        .arg(format!("--user-data-dir={}", dir.join("profile").display()))
        .args(args)
        .arg(url)
        .output()
        .expect("run chromium")
}

/// Send records to the collector's gRPC ingest, as the filter does.
fn ingest(port: u16, records: Vec<RequestRecord>) {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async move {
            let mut client = CollectorClient::connect(format!("http://127.0.0.1:{port}"))
                .await
                .unwrap();
            client.ingest(RecordBatch { records }).await.unwrap();
        });
}

#[test]
fn dashboard_renders_the_collectors_figures_in_a_real_browser() {
    let dir = TempDir::new("dashboard");
    // The gateway's plugin config, for the budgets: demo's day budget and
    // its team's month budget (batch-jobs is in it too).
    let plugin = dir.0.join("plugin.yaml");
    std::fs::write(
        &plugin,
        format!(
            "providers:\n  - {{name: primary, cluster: primary, host: primary, models: [{{name: gpt-4o-mini}}, {{name: llama-3.1-8b}}]}}\nprices:\n  llama-3.1-8b: {{input: 1, output: 1}}\nteams:\n  - name: research\n    limits: {{budgets: [{{usd: 1, period: month}}]}}\nclients:\n  - {{name: demo, key_sha256: \"{}\", team: research, limits: {{budget_usd_per_day: 0.002}}}}\n  - {{name: batch-jobs, key_sha256: \"{}\", team: research}}\n",
            "1".repeat(64),
            "2".repeat(64)
        ),
    )
    .unwrap();
    let db = dir.0.join("log.db");
    let c = Collector::start_args(
        db.as_os_str(),
        0,
        &["--plugin-config", plugin.to_str().unwrap()],
    );
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let records: Vec<RequestRecord> = (0..7)
        .map(|i| RequestRecord {
            request_id: format!("d-{i}"),
            time_ms: now - 1000 * i,
            client: if i < 4 {
                "demo".into()
            } else {
                "batch-jobs".into()
            },
            experiment: "ab".into(),
            arm: if i % 2 == 0 {
                "control".into()
            } else {
                "treatment".into()
            },
            model: if i < 5 {
                "gpt-4o-mini".into()
            } else {
                "llama-3.1-8b".into()
            },
            provider: if i < 5 {
                "primary".into()
            } else {
                "backup".into()
            },
            cache: if i == 0 { "hit".into() } else { "miss".into() },
            // The last two fell back from primary's timeouts.
            attempts: if i >= 5 {
                vec![
                    Attempt {
                        provider: "primary".into(),
                        status: 0,
                        cause: "timeout".into(),
                        ..Attempt::default()
                    },
                    Attempt {
                        provider: "backup".into(),
                        status: 200,
                        cause: String::new(),
                        ..Attempt::default()
                    },
                ]
            } else {
                Vec::new()
            },
            status: 200,
            latency_ms: 40 + i,
            // Two streams, their first tokens after 20 and 30 ms.
            stream: i == 1 || i == 2,
            ttft_ms: if i == 1 || i == 2 { 10 * (i + 1) } else { 0 },
            prompt_tokens: 10,
            completion_tokens: 20,
            cost_micros: 250,
            // The oldest one's model had no price: it says so.
            price_source: if i == 6 {
                String::new()
            } else {
                "config".into()
            },
            ..Default::default()
        })
        .collect();
    ingest(c.grpc_port, records);
    let url = c.url("/dashboard");
    let dom = chrome(&dir.0, &["--dump-dom"], &url);
    let html = String::from_utf8_lossy(&dom.stdout);
    assert!(
        html.contains("data-loaded=\"yes\""),
        "the page did not finish loading data:\n{html}\n{}",
        String::from_utf8_lossy(&dom.stderr)
    );
    assert!(
        html.contains("<div class=\"v\">7</div><div class=\"l\">requests</div>"),
        "{html}"
    );
    assert!(html.contains("14.3%"), "cache hit rate 1/7: {html}");
    assert!(
        html.contains(r#"<td>primary</td><td><span class="err">timeout</span></td><td>2</td>"#),
        "the failed attempts: {html}"
    );
    assert!(
        html.contains("llama-3.1-8b") && html.contains("backup"),
        "{html}"
    );
    // The experiment's arms side by side, spend per client, a time series;
    // the budgets, least left first: demo's day (4 x $0.00025 of $0.002),
    // then the team's month (7 x $0.00025 of $1).
    for want in [
        "<td class=\"\">config</td>",
        "<td class=\"err\">unpriced</td>",
        "<td>key demo</td><td>day</td><td>$0.0020</td>",
        "<td>$0.0010</td><td class=\"\">$0.0010</td>",
        "<td>team research</td><td>month</td><td>$1.00</td>",
        "<td class=\"\">$0.998",
        "<td>ab/control</td><td>4</td>",
        "<td>ab/treatment</td><td>3</td>",
        "<td>batch-jobs</td><td>3</td>",
        "<td>demo</td><td>4</td>",
        "<button data-w=\"24h\" class=\"on\">24h</button>",
        // Read from the histogram (within 10%): 20 ms and 30 ms.
        "<div class=\"v\">20 / 29 ms</div><div class=\"l\">time to first token p50 / p95</div>",
    ] {
        assert!(html.contains(want), "{want} in {html}");
    }
    let series = get(&c.url("/v1/metrics/timeseries?since=1h"), &[]).json();
    assert_eq!(series["step_ms"], 60_000);
    let total: i64 = series["points"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["requests"].as_i64().unwrap())
        .sum();
    assert_eq!(total, 7);
    let shot = dir.0.join("dashboard.png");
    let out = chrome(&dir.0, &[&format!("--screenshot={}", shot.display())], &url);
    let png = std::fs::read(&shot).unwrap_or_else(|e| {
        panic!(
            "no screenshot ({e}): {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    assert_eq!(&png[1..4], b"PNG");
    assert!(
        png.len() > 20_000,
        "a blank page is smaller ({} bytes)",
        png.len()
    );
    // Kept for people to look at: target/dashboard.png.
    let _ = std::fs::copy(&shot, repo_root().join("target/dashboard.png"));
    // MCP tool calls (#47): per tool, the refused ones counted apart; a
    // tools/list is no call.
    let mcp = |i: u64, method: &str, tool: &str, status: u32, rpc_error: i64| RequestRecord {
        request_id: format!("m-{i}"),
        time_ms: now - 100 * i,
        client: "demo".into(),
        api: "mcp".into(),
        mcp_method: method.into(),
        model: tool.into(),
        provider: "alpha".into(),
        status,
        rpc_error,
        latency_ms: 10,
        ..Default::default()
    };
    ingest(
        c.grpc_port,
        vec![
            mcp(1, "tools/call", "alpha__echo", 200, 0),
            mcp(2, "tools/call", "alpha__echo", 403, -32602),
            mcp(3, "tools/list", "", 200, 0),
        ],
    );
    let html = String::from_utf8_lossy(&chrome(&dir.0, &["--dump-dom"], &url).stdout).to_string();
    assert!(
        html.contains(r#"<td>alpha__echo</td><td>2</td><td><span class="err">1</span></td><td>10 ms</td><td>demo</td>"#),
        "the MCP tools: {html}"
    );
}

/// The control plane's keys and teams page (`/dashboard` of
/// portcullis-control) in headless Chromium: keys (one made through the
/// API, one revoked), teams with their keys, spend against budget from the
/// collector's records, which budgets it knows from the config the control
/// plane writes for it (`--write-config`).
#[test]
fn the_control_planes_keys_page_shows_keys_teams_and_spend_in_a_real_browser() {
    let dir = TempDir::new("keys-page");
    let served = dir.0.join("served.yaml");
    let c = Collector::start_args(
        dir.0.join("log.db").as_os_str(),
        0,
        &["--plugin-config", served.to_str().unwrap()],
    );
    let plugin = test_plugin()
        .replacen(
            "  - name: demo\n",
            "  - name: demo\n    team: research\n    limits: {budget_usd_per_day: 0.002}\n",
            1,
        )
        .replacen(
            "clients:\n",
            "teams:\n  - name: research\n    limits: {budgets: [{usd: 1, period: month}]}\nclients:\n",
            1,
        );
    let control_dir = TempDir::new("keys-page-control");
    let db = control_dir.0.join("control.db").into_os_string();
    let control = Control::start_in(
        control_dir,
        db,
        &plugin,
        &[
            "--write-config",
            served.to_str().unwrap(),
            "--collector",
            &format!("http://127.0.0.1:{}", c.http_port),
        ],
    );
    control.write("POST", "/v1/keys", r#"{"name":"web","team":"research"}"#);
    control.write("POST", "/v1/keys/mini-only/revoke", "");
    // The collector reads the budgets of the config the control plane wrote.
    poll_until(
        std::time::Duration::from_secs(10),
        "the served config written",
        || {
            std::fs::read_to_string(&served)
                .ok()
                .filter(|t| t.contains("name: web"))
        },
    );
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let records: Vec<RequestRecord> = (0..4)
        .map(|i| RequestRecord {
            request_id: format!("k-{i}"),
            time_ms: now - 1000 * i,
            client: "demo".into(),
            team: "research".into(),
            model: "gpt-4o-mini".into(),
            provider: "primary".into(),
            status: 200,
            cost_micros: 250,
            price_source: "config".into(),
            ..Default::default()
        })
        .collect();
    ingest(c.grpc_port, records);
    // The spend through the control plane's API, then the page.
    let spend = control.call("GET", "/v1/spend", Some(&control.read_token), None);
    assert_eq!(spend.status, 200, "{}", spend.body);
    assert!(spend.body.contains("\"research\""), "{}", spend.body);
    let url = format!("{}#token={}", control.url("/dashboard"), control.read_token);
    let dom = chrome(&dir.0, &["--dump-dom"], &url);
    let html = String::from_utf8_lossy(&dom.stdout);
    assert!(
        html.contains("data-loaded=\"yes\""),
        "the page did not finish loading:\n{html}\n{}",
        String::from_utf8_lossy(&dom.stderr)
    );
    assert!(
        !html.contains(&control.read_token),
        "the token left the address bar and the page"
    );
    for want in [
        // demo: its day budget, 4 x $0.00025 spent.
        "<td>demo</td><td>research</td><td>all</td><td>active</td><td>$0.0020 / day</td><td>$0.0010</td>",
        "<td>web</td><td>research</td><td>all</td><td>active</td><td class=\"off\">none</td>",
        "<tr class=\"off\"><td>mini-only</td><td></td><td>gpt-4o-mini</td><td>revoked</td>",
        "<button class=\"revoke\" data-name=\"web\">revoke</button>",
        // The team: its keys, its month budget, the same spend.
        "<td>research</td><td>demo, web</td><td>$1.00 / month</td><td>$0.0010</td>",
        "no Envoy subscribed",
    ] {
        assert!(html.contains(want), "{want} in {html}");
    }
    // Without a token the page asks for one and shows nothing.
    let bare = chrome(
        &dir.0,
        &["--dump-dom", "--incognito"],
        &control.url("/dashboard"),
    );
    let html = String::from_utf8_lossy(&bare.stdout);
    assert!(html.contains("data-loaded=\"no-token\""), "{html}");
    assert!(!html.contains("<td>demo</td>"), "{html}");
}

/// The dashboard as an operator sees it after a busy day: 15 providers and
/// 15 models with long names, 30 clients, traffic in a few hours of the
/// 24 h window. Bar charts show the top 7 and "others", their labels never
/// overlap nor leave the chart; tables list at most 10 rows and fit their
/// column or scroll in it (the page's own `?audit` check: nothing cropped,
/// no table over another); the time series draws the whole window.
#[test]
fn the_dashboard_reads_at_a_glance_on_a_busy_day() {
    let dir = TempDir::new("dashboard-busy");
    let c = Collector::start_args(dir.0.join("log.db").as_os_str(), 0, &[]);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let records: Vec<RequestRecord> = (0..300u64)
        .map(|i| RequestRecord {
            request_id: format!("busy-{i}"),
            // Four busy hours of the day: now, 3 h, 9 h and 20 h ago.
            time_ms: now - [0, 3, 9, 20][(i % 4) as usize] * 3_600_000 - i * 1000,
            client: format!("client-team-{:02}-service", i % 30),
            model: format!("model-{:02}-with-a-rather-long-name", i % 15),
            provider: format!("provider-{:02}-with-a-long-name", (i / 2) % 15),
            status: if i % 17 == 0 { 502 } else { 200 },
            latency_ms: 40 + i % 50,
            prompt_tokens: 10,
            completion_tokens: 20,
            cost_micros: 250,
            price_source: "config".into(),
            ..Default::default()
        })
        .collect();
    ingest(c.grpc_port, records);
    let dom = chrome(&dir.0, &["--dump-dom"], &c.url("/dashboard?audit"));
    let html = String::from_utf8_lossy(&dom.stdout).to_string();
    assert!(html.contains("data-loaded=\"yes\""), "{html}");
    let unescape = |v: &str| {
        v.replace("&quot;", "\"")
            .replace("&lt;", "<")
            .replace("&gt;", ">")
            .replace("&amp;", "&")
    };
    // An attribute's value in the serialized DOM (its quotes are escaped).
    let value_after = |from: usize, name: &str| -> String {
        let tag_end = from + html[from..].find('>').unwrap();
        let tag = &html[from..tag_end];
        let key = format!("{name}=\"");
        let at = tag
            .find(&key)
            .unwrap_or_else(|| panic!("no {name} in {tag}"))
            + key.len();
        unescape(&tag[at..at + tag[at..].find('"').unwrap()])
    };
    let attr = |id: &str, name: &str| -> String {
        let at = html
            .find(&format!("id=\"{id}\""))
            .unwrap_or_else(|| panic!("no {id}"));
        value_after(html[..at].rfind('<').unwrap(), name)
    };
    let body = html.find("<body").unwrap();
    let overflow = value_after(body, "data-overflow");
    assert_eq!(overflow, "[]", "cropped or overlapping: {overflow}");
    for chart in ["byProvider", "byModel"] {
        let labels: serde_json::Value = serde_json::from_str(&attr(chart, "data-labels"))
            .unwrap_or_else(|e| panic!("{chart}: {e}"));
        let labels = labels.as_array().unwrap();
        assert_eq!(labels.len(), 8, "{chart}: top 7 and others: {labels:?}");
        assert!(
            labels[7]["text"]
                .as_str()
                .unwrap()
                .starts_with("others (8)"),
            "{labels:?}"
        );
        for (i, a) in labels.iter().enumerate() {
            let (ax, aw) = (a["x"].as_f64().unwrap(), a["w"].as_f64().unwrap());
            assert!(
                ax >= 0.0 && ax + aw <= 640.0,
                "{chart}: label {a} leaves the chart"
            );
            for b in labels.iter().skip(i + 1) {
                if a["y"] != b["y"] {
                    continue;
                }
                let (bx, bw) = (b["x"].as_f64().unwrap(), b["w"].as_f64().unwrap());
                assert!(ax + aw <= bx || bx + bw <= ax, "{chart}: {a} overlaps {b}");
            }
        }
    }
    let clients = html
        .split("id=\"clients\">")
        .nth(1)
        .and_then(|r| r.split("</tbody>").next())
        .unwrap();
    assert_eq!(clients.matches("<tr>").count(), 10, "{clients}");
    assert!(clients.contains("others (21)"), "{clients}");
    let slots: u32 = attr("traffic", "data-slots").parse().unwrap();
    assert!(
        (24..=25).contains(&slots),
        "the 24 h window drawn whole: {slots} slots"
    );
}
