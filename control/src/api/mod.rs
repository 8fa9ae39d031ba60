//! The admin API (HTTP/JSON; docs/control-plane.md has every call with an
//! example). Every endpoint but `/healthz` wants an admin token
//! (`Authorization: Bearer pct-...`): a `read` token may look, a `write`
//! token may change. Every change is compiled by the filter's core before
//! it is kept, and pushed to every subscribed Envoy once it is.

mod keys;
mod teams;

use keys::{create_key, get_key, list_keys, revoke_key, rotate_key, update_key};
use teams::{delete_team, get_team, list_teams, patch_team, put_team};

use crate::secret;
use crate::state::{merge, yaml_to_json, ClientRow, PreviousKey, State, TeamRow, CLIENT_OWN};
use crate::store::{Change, Holder, Refusal, Role, Store, Version};
use crate::xds::{Nodes, Snapshot, Template};
use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, State as AxState};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use portcullis_service::AllowedHosts;
use serde_json::{json, Map, Value as Json};
use std::sync::Arc;
use tokio::sync::watch;

#[derive(Clone)]
pub struct App {
    pub store: Store,
    pub snapshots: Arc<watch::Sender<Option<Arc<Snapshot>>>>,
    /// The resource Envoys are served (none: the API runs without xDS).
    pub template: Option<Arc<Template>>,
    pub nodes: Nodes,
    /// A rotated-out key's grace period when the call names none.
    pub default_grace_s: u64,
    /// Where each version served is also written (the collector's
    /// `--plugin-config`, for its budgets view), atomically.
    pub write_config: Option<std::path::PathBuf>,
    /// The collector whose spend the dashboard shows.
    pub collector: Option<Arc<crate::collector::Collector>>,
    /// The largest plugin config `PUT /v1/config` takes (`--max-config-bytes`;
    /// the filter's own default limit, `PORTCULLIS_MAX_CONFIG_BYTES`).
    pub max_config_bytes: usize,
}

pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

impl App {
    /// Serve `v` to every Envoy, unless a newer version is served already.
    pub fn publish(&self, v: &Version) {
        let newer = self.snapshots.send_if_modified(|cur| {
            if cur.as_ref().is_some_and(|c| c.version >= v.version) {
                return false;
            }
            *cur = Some(Arc::new(Snapshot {
                version: v.version,
                resource: self.template.as_ref().map(|t| t.resource(&v.yaml)),
                clusters: crate::cds::clusters(&v.yaml),
            }));
            true
        });
        if let (true, Some(path)) = (newer, &self.write_config) {
            let tmp = path.with_extension("tmp");
            let written = std::fs::write(&tmp, &v.yaml).and_then(|()| std::fs::rename(&tmp, path));
            if let Err(e) = written {
                eprintln!("portcullis-control: --write-config {}: {e}", path.display());
            }
        }
    }

    /// Apply a change as `who`, publish the result.
    async fn change<T: Send + 'static>(
        &self,
        who: &Holder,
        action: &str,
        target: &str,
        detail: String,
        f: impl FnOnce(&mut State, i64) -> Result<T, Refusal> + Send + 'static,
    ) -> Result<(T, Version), Refusal> {
        let change = Change {
            actor: who.name.clone(),
            action: action.into(),
            target: target.into(),
            detail,
        };
        let now = now_ms();
        let (out, v) = self
            .store
            .call(move |inner| inner.change(change, now, |s| f(s, now)))
            .await?;
        self.publish(&v);
        Ok((out, v))
    }
}

/// A refusal in the API's error shape.
pub struct ApiError(pub Refusal);

impl From<Refusal> for ApiError {
    fn from(r: Refusal) -> ApiError {
        ApiError(r)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status =
            StatusCode::from_u16(self.0.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut error = Map::new();
        error.insert("message".into(), json!(self.0.message));
        if !self.0.problems.is_empty() {
            error.insert("problems".into(), json!(self.0.problems));
        }
        (status, axum::Json(json!({ "error": error }))).into_response()
    }
}

type Answer = Result<Response, ApiError>;

fn bad(message: impl Into<String>) -> ApiError {
    ApiError(Refusal::new(400, message))
}

fn not_found(what: &str, name: &str) -> Refusal {
    Refusal::new(404, format!("no {what} named `{name}`"))
}

/// A read of the state by a holder of any token: `f`'s answer, with the
/// version it was read at.
async fn read<T: Send + 'static>(
    app: &App,
    headers: &HeaderMap,
    f: impl FnOnce(i64, &State) -> T + Send + 'static,
) -> Result<T, ApiError> {
    auth(app, headers, Role::Read).await?;
    Ok(app.store.call(move |inner| inner.read(f)).await?)
}

/// The token's holder, if it may do `need`: 401 without a known token,
/// 403 with a read token where a write one is needed.
async fn auth(app: &App, headers: &HeaderMap, need: Role) -> Result<Holder, ApiError> {
    let token = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")))
        .map(|t| t.trim().to_string())
        .filter(|t| !t.is_empty())
        .ok_or_else(|| {
            ApiError(Refusal::new(
                401,
                "an admin token is required: Authorization: Bearer <token> (portcullis-control token create)",
            ))
        })?;
    let holder = app
        .store
        .call(move |inner| inner.holder(&token))
        .await?
        .ok_or_else(|| ApiError(Refusal::new(401, "this admin token is not known")))?;
    if need == Role::Write && holder.role != Role::Write {
        return Err(ApiError(Refusal::new(
            403,
            format!("the token of `{}` may read, not change", holder.name),
        )));
    }
    Ok(holder)
}

fn json_body(body: &Bytes) -> Result<Map<String, Json>, ApiError> {
    if body.is_empty() {
        return Ok(Map::new());
    }
    match serde_json::from_slice::<Json>(body) {
        Ok(Json::Object(m)) => Ok(m),
        Ok(_) => Err(bad("the body must be a JSON object")),
        Err(e) => Err(bad(format!("the body is not JSON: {e}"))),
    }
}

fn ok(status: StatusCode, body: Json) -> Answer {
    Ok((status, axum::Json(body)).into_response())
}

/// A name as the config and the URL carry it.
fn check_name(name: &str) -> Result<(), ApiError> {
    if name.is_empty() || name.len() > 128 || name.chars().any(|c| c.is_control() || c == '/') {
        return Err(bad(format!(
            "`{name}` is not a name: 1 to 128 characters, no `/` or control characters"
        )));
    }
    Ok(())
}

/// The whole plugin YAML being served.
async fn export(AxState(app): AxState<App>, headers: HeaderMap) -> Answer {
    auth(&app, &headers, Role::Read).await?;
    let v = app
        .store
        .call(|inner| inner.current())
        .await?
        .ok_or_else(|| Refusal::new(404, "no config yet: import one (PUT /v1/config)"))?;
    Ok((
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, "application/yaml".to_string()),
            (header::ETAG, format!("\"{}\"", v.version)),
        ],
        v.yaml,
    )
        .into_response())
}

/// Replace everything with a plugin YAML (keys keep their creation time).
async fn import(AxState(app): AxState<App>, headers: HeaderMap, body: Body) -> Answer {
    let who = auth(&app, &headers, Role::Write).await?;
    let limit = app.max_config_bytes;
    let body = axum::body::to_bytes(body, limit).await.map_err(|_| {
        ApiError(Refusal::new(
            413,
            format!(
                "the config is over the limit of {limit} bytes (the control plane's --max-config-bytes; \
                 every Envoy's PORTCULLIS_MAX_CONFIG_BYTES must allow a larger one too)"
            ),
        ))
    })?;
    let text = String::from_utf8(body.to_vec()).map_err(|_| bad("the body is not UTF-8"))?;
    let mut incoming =
        State::from_yaml(&text, now_ms()).map_err(|e| ApiError(Refusal::new(422, e)))?;
    let detail = format!(
        "{} clients, {} teams, {} bytes",
        incoming.clients.len(),
        incoming.teams.len(),
        text.len()
    );
    let (_, v) = app
        .change(&who, "config.import", "config", detail, move |s, _| {
            for c in &mut incoming.clients {
                if let Some(old) = s.client(&c.name) {
                    c.created_ms = old.created_ms;
                }
            }
            *s = incoming;
            Ok(())
        })
        .await?;
    ok(StatusCode::OK, json!({"version": v.version}))
}

/// The version served, and every Envoy's view of it.
async fn nodes(AxState(app): AxState<App>, headers: HeaderMap) -> Answer {
    auth(&app, &headers, Role::Read).await?;
    let version = app.snapshots.borrow().as_ref().map(|s| s.version);
    let nodes: Vec<_> = app
        .nodes
        .lock()
        .map(|m| m.values().cloned().collect())
        .unwrap_or_default();
    ok(StatusCode::OK, json!({"version": version, "nodes": nodes}))
}

#[derive(serde::Deserialize)]
struct AuditQuery {
    limit: Option<i64>,
}

async fn audit(
    AxState(app): AxState<App>,
    headers: HeaderMap,
    Query(q): Query<AuditQuery>,
) -> Answer {
    auth(&app, &headers, Role::Read).await?;
    let limit = q.limit.unwrap_or(100).clamp(1, 10_000);
    let entries = app.store.call(move |inner| inner.audit(limit)).await?;
    ok(StatusCode::OK, json!({"entries": entries}))
}

async fn healthz() -> &'static str {
    "ok"
}

/// Spend against budget per key and team, from the collector's records
/// (`GET /v1/budgets` of `--collector`), for the dashboard.
async fn spend(AxState(app): AxState<App>, headers: HeaderMap) -> Answer {
    auth(&app, &headers, Role::Read).await?;
    let Some(c) = app.collector.clone() else {
        return ok(
            StatusCode::OK,
            json!({"data": [], "note": "start the control plane with --collector to see spend against budgets"}),
        );
    };
    match c.budgets().await {
        Ok(v) => ok(StatusCode::OK, v),
        Err(e) => Err(ApiError(Refusal::new(502, format!("the collector: {e}")))),
    }
}

/// The keys and teams page: spend against budget, create and revoke with
/// an admin token (typed in, or `#token=` in the URL; kept for the tab).
async fn dashboard() -> Response {
    (
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        include_str!("../dashboard.html"),
    )
        .into_response()
}

/// Answers 421 to a request naming a host this control plane does not
/// answer to (DNS rebinding: a page the operator opens cannot reach the
/// admin API or the dashboard through its own name). `/healthz` stays open
/// to probes, which name whatever address they reach.
async fn check_host(
    AxState(hosts): AxState<Arc<AllowedHosts>>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let host = AllowedHosts::of_request(req.headers(), req.uri());
    if req.uri().path() == "/healthz" || hosts.allows(host.as_deref()) {
        return next.run(req).await;
    }
    ApiError(Refusal::new(
        421,
        "This control plane does not answer to that host name (start it with --allowed-hosts to add one).",
    ))
    .into_response()
}

/// The admin API, the dashboard and the health check, answering only the
/// host names in `hosts`.
pub fn router(app: App, hosts: AllowedHosts) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/dashboard", get(dashboard))
        .route("/v1/spend", get(spend))
        .route("/v1/keys", get(list_keys).post(create_key))
        .route(
            "/v1/keys/{name}",
            get(get_key).patch(update_key).delete(revoke_key),
        )
        .route("/v1/keys/{name}/rotate", post(rotate_key))
        .route("/v1/keys/{name}/revoke", post(revoke_key))
        .route("/v1/teams", get(list_teams))
        .route(
            "/v1/teams/{name}",
            get(get_team)
                .put(put_team)
                .patch(patch_team)
                .delete(delete_team),
        )
        .route("/v1/config", get(export).put(import))
        .route("/v1/nodes", get(nodes))
        .route("/v1/audit", get(audit))
        .with_state(app)
        .layer(axum::middleware::from_fn_with_state(
            Arc::new(hosts),
            check_host,
        ))
}
