//! HTTP: health, Prometheus metrics, the query API and the dashboard.

use crate::db::Db;
use crate::since::parse_since;
use crate::store::Stats;
use crate::summary;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::Deserialize;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

#[derive(Clone)]
pub struct Api {
    pub reader: Arc<Mutex<Db>>,
    pub stats: Arc<Stats>,
    /// The plugin config budgets are read from (`--plugin-config`).
    pub plugin: Option<Arc<crate::budgets::PluginConfig>>,
    /// The OTLP export's counters, when it is on (`--otlp-endpoint`).
    pub otlp: Option<Arc<crate::otlp::Stats>>,
}

/// The routes behind the access checks (`access`: the Host allow-list and
/// the read token).
pub fn router_with(api: Api, access: crate::access::Access) -> Router {
    let access = Arc::new(access);
    router(api)
        .route(
            "/login",
            axum::routing::post(crate::access::login).with_state(access.clone()),
        )
        .layer(axum::middleware::from_fn_with_state(
            access,
            crate::access::guard,
        ))
}

pub fn router(api: Api) -> Router {
    Router::new()
        .route(
            "/",
            get(|| async { axum::response::Redirect::temporary("/dashboard") }),
        )
        .route("/healthz", get(health))
        .route("/metrics", get(metrics))
        .route("/v1/metrics/summary", get(summary_handler))
        .route("/v1/requests/recent", get(recent_handler))
        .route("/v1/metrics/timeseries", get(timeseries_handler))
        .route("/v1/budgets", get(budgets_handler))
        .route(
            "/dashboard",
            get(|| async {
                (
                    [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
                    DASHBOARD,
                )
            }),
        )
        .with_state(api)
}

const DASHBOARD: &str = include_str!("dashboard.html");

fn error(status: StatusCode, msg: String) -> Response {
    (status, Json(serde_json::json!({"error": {"message": msg}}))).into_response()
}

async fn with_reader<T: Send + 'static>(
    api: &Api,
    f: impl FnOnce(&mut Db) -> crate::db::Result<T> + Send + 'static,
) -> Result<T, Response> {
    let reader = api.reader.clone();
    tokio::task::spawn_blocking(move || {
        let mut db = reader
            .lock()
            .map_err(|_| "reader lock poisoned".to_string())?;
        f(&mut db).map_err(|e| e.to_string())
    })
    .await
    .map_err(|e| error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?
    .map_err(|e| error(StatusCode::INTERNAL_SERVER_ERROR, e))
}

async fn health(State(api): State<Api>) -> Response {
    match with_reader(&api, |db| db.ping()).await {
        Ok(_) => (StatusCode::OK, "ok\n").into_response(),
        Err(r) => r,
    }
}

async fn metrics(State(api): State<Api>) -> Response {
    let s = &api.stats;
    let commits = s.commits.load(Ordering::Relaxed);
    let micros = s.commit_micros_total.load(Ordering::Relaxed);
    let body = format!(
        "# TYPE portcullis_collector_ingested_total counter\nportcullis_collector_ingested_total {}\n\
         # TYPE portcullis_collector_duplicates_total counter\nportcullis_collector_duplicates_total {}\n\
         # TYPE portcullis_collector_rejected_total counter\nportcullis_collector_rejected_total {}\n\
         # TYPE portcullis_collector_batches_total counter\nportcullis_collector_batches_total {}\n\
         # TYPE portcullis_collector_queue_depth gauge\nportcullis_collector_queue_depth {}\n\
         # TYPE portcullis_collector_commit_seconds summary\nportcullis_collector_commit_seconds_sum {}\nportcullis_collector_commit_seconds_count {}\n\
         # TYPE portcullis_collector_failed_commits_total counter\nportcullis_collector_failed_commits_total {}\n\
         # TYPE portcullis_collector_ingest_unauthenticated_total counter\nportcullis_collector_ingest_unauthenticated_total {}\n",
        s.ingested.load(Ordering::Relaxed),
        s.duplicates.load(Ordering::Relaxed),
        s.rejected.load(Ordering::Relaxed),
        s.batches.load(Ordering::Relaxed),
        s.queue_depth.load(Ordering::Relaxed),
        micros as f64 / 1e6,
        commits,
        s.failed_commits.load(Ordering::Relaxed),
        s.unauthenticated.load(Ordering::Relaxed),
    );
    let mut body = body;
    if let Some(o) = &api.otlp {
        body.push_str(&format!(
            "# TYPE portcullis_collector_otlp_exported_spans_total counter\nportcullis_collector_otlp_exported_spans_total {}\n\
             # TYPE portcullis_collector_otlp_dropped_spans_total counter\nportcullis_collector_otlp_dropped_spans_total {}\n\
             # TYPE portcullis_collector_otlp_queued_spans gauge\nportcullis_collector_otlp_queued_spans {}\n\
             # TYPE portcullis_collector_otlp_failed_exports_total counter\nportcullis_collector_otlp_failed_exports_total {}\n\
             # TYPE portcullis_collector_otlp_metric_exports_total counter\nportcullis_collector_otlp_metric_exports_total {}\n\
             # TYPE portcullis_collector_otlp_failed_metric_exports_total counter\nportcullis_collector_otlp_failed_metric_exports_total {}\n",
            o.exported_spans.load(Ordering::Relaxed),
            o.dropped_spans.load(Ordering::Relaxed),
            o.queued_spans.load(Ordering::Relaxed),
            o.failed_exports.load(Ordering::Relaxed),
            o.metric_exports.load(Ordering::Relaxed),
            o.failed_metric_exports.load(Ordering::Relaxed),
        ));
    }
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], body).into_response()
}

#[derive(Deserialize)]
struct SinceQuery {
    since: Option<String>,
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// A query string that does not decode (bad percent-encoding, a number that
/// is not one) is the client's error, answered in the API's JSON shape.
fn query<T>(q: Result<Query<T>, QueryRejection>) -> Result<T, String> {
    q.map(|Query(q)| q)
        .map_err(|e| format!("bad query string: {}", e.body_text()))
}

/// The window a query asks for: (`since` in epoch ms, now).
fn window(q: Result<Query<SinceQuery>, QueryRejection>) -> Result<(i64, i64), String> {
    let q = query(q)?;
    let now = now_ms();
    Ok((parse_since(q.since.as_deref(), now)?, now))
}

async fn summary_handler(
    State(api): State<Api>,
    q: Result<Query<SinceQuery>, QueryRejection>,
) -> Response {
    let since = match window(q) {
        Ok((since, _)) => since,
        Err(e) => return error(StatusCode::BAD_REQUEST, e),
    };
    match with_reader(&api, move |c| summary::summary(c, since)).await {
        Ok(s) => Json(s).into_response(),
        Err(r) => r,
    }
}

async fn timeseries_handler(
    State(api): State<Api>,
    q: Result<Query<SinceQuery>, QueryRejection>,
) -> Response {
    let (since, now) = match window(q) {
        Ok(w) => w,
        Err(e) => return error(StatusCode::BAD_REQUEST, e),
    };
    match with_reader(&api, move |c| summary::timeseries(c, since, now)).await {
        Ok(s) => Json(s).into_response(),
        Err(r) => r,
    }
}

/// Spend against every budget of the plugin config, this period.
async fn budgets_handler(State(api): State<Api>) -> Response {
    let Some(plugin) = api.plugin.clone() else {
        return Json(serde_json::json!({"data": [],
            "note": "start the collector with --plugin-config (the gateway's plugin YAML) to see budgets"}))
        .into_response();
    };
    let gw = match tokio::task::spawn_blocking(move || plugin.current()).await {
        Ok(Ok(gw)) => gw,
        Ok(Err(e)) => {
            return error(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("plugin config: {e}"),
            )
        }
        Err(e) => return error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    };
    let now = now_ms();
    match with_reader(&api, move |c| crate::budgets::budgets(c, &gw, now)).await {
        Ok(rows) => Json(serde_json::json!({"data": rows})).into_response(),
        Err(r) => r,
    }
}

#[derive(Deserialize)]
struct LimitQuery {
    limit: Option<i64>,
}

async fn recent_handler(
    State(api): State<Api>,
    q: Result<Query<LimitQuery>, QueryRejection>,
) -> Response {
    let q = match query(q) {
        Ok(q) => q,
        Err(e) => return error(StatusCode::BAD_REQUEST, e),
    };
    let limit = q.limit.unwrap_or(50);
    if !(1..=1000).contains(&limit) {
        return error(
            StatusCode::BAD_REQUEST,
            "`limit` must be between 1 and 1000".into(),
        );
    }
    match with_reader(&api, move |c| summary::recent(c, limit)).await {
        Ok(rows) => Json(serde_json::json!({"data": rows})).into_response(),
        Err(r) => r,
    }
}
