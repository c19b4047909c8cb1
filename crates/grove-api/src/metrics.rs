//! `/metrics`: Prometheus' text format, written by the `prometheus` crate's encoder
//! (ADR 30). What this process counted (HTTP requests here; jobs, lock waits, execs and
//! evictions in `grove_postgres::telemetry`) is joined at scrape time with gauges read
//! from the database (`grove_postgres::fleet`): open jobs and the oldest wait per queue,
//! live workers, workspaces and repo caches per node and state, bytes per node.
//!
//! Who may scrape: on the API's address an operator's bearer token (a user's token
//! answers 403); `--metrics-bind` serves the same text without a token on an address of
//! its own, for a network only Prometheus reaches. Each request also runs in a trace
//! span when traces are exported (ADR 30). No label names a user, a repository,
//! a path or an id: HTTP requests are labelled by the matched route template.

use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use axum::extract::{MatchedPath, Request, State};
use axum::http::{header, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use grove_core::error::{CommandError, ErrorKind};
use grove_core::state::{RepoCacheState, WorkspaceState};
use grove_postgres::fleet::{FleetGauges, StateCount};
use grove_postgres::telemetry::DURATION_BUCKETS;
use prometheus::{
    register_histogram_vec, register_int_counter_vec, Encoder, GaugeVec, HistogramVec,
    IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry, TextEncoder,
};
use sqlx::PgPool;
use tracing::Instrument;

use crate::auth::Caller;
use crate::error::ApiError;
use crate::AppState;

/// A worker counts as alive if it heart-beat within this (as orphan recovery judges).
const ALIVE_WITHIN: Duration = Duration::from_secs(15);

static REQUESTS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        "grove_http_requests_total",
        "HTTP requests answered, by method, matched route template and status.",
        &["method", "route", "status"]
    )
    .expect("a metric name registered once")
});

static REQUEST_SECONDS: LazyLock<HistogramVec> = LazyLock::new(|| {
    register_histogram_vec!(
        "grove_http_request_duration_seconds",
        "Time to the response's head, by method and matched route template.",
        &["method", "route"],
        DURATION_BUCKETS.to_vec()
    )
    .expect("a metric name registered once")
});

/// Why the metrics could not be rendered.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    #[error(transparent)]
    Store(#[from] grove_postgres::StoreError),
    #[error("encoding metrics: {0}")]
    Encode(#[from] prometheus::Error),
}

impl From<MetricsError> for ApiError {
    fn from(e: MetricsError) -> Self {
        match e {
            MetricsError::Store(e) => ApiError::Store(e),
            MetricsError::Encode(e) => ApiError::Command(CommandError::new(
                ErrorKind::Internal,
                format!("encoding metrics: {e}"),
            )),
        }
    }
}

/// Counts every request by its matched route (`unmatched` for the fallback). A layer
/// of the API's router.
pub async fn track(req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_owned())
        .unwrap_or_else(|| "unmatched".into());
    let method = method_label(req.method());
    let span = request_span(&req, method, &route);
    let started = Instant::now();
    let response = next.run(req).instrument(span).await;
    REQUEST_SECONDS
        .with_label_values(&[method, &route])
        .observe(started.elapsed().as_secs_f64());
    REQUESTS
        .with_label_values(&[method, &route, response.status().as_str()])
        .inc();
    response
}

/// The request's trace span (ADR 30), continuing a caller's `traceparent` header; a
/// disabled span when this process exports no traces.
fn request_span(req: &Request, method: &'static str, route: &str) -> tracing::Span {
    use grove_postgres::trace_context;
    if !trace_context::enabled() {
        return tracing::Span::none();
    }
    let span = tracing::trace_span!(target: trace_context::TARGET, "http.request", http.request.method = method, http.route = route);
    if let Some(parent) = req
        .headers()
        .get("traceparent")
        .and_then(|v| v.to_str().ok())
    {
        trace_context::adopt(&span, parent);
    }
    span
}

fn method_label(method: &Method) -> &'static str {
    match *method {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        Method::PATCH => "PATCH",
        Method::HEAD => "HEAD",
        Method::OPTIONS => "OPTIONS",
        _ => "other",
    }
}

/// `GET /metrics` on the API's router: operators only.
pub fn routes() -> Router<Arc<AppState>> {
    Router::new().route("/metrics", get(scrape))
}

async fn scrape(caller: Caller, State(state): State<Arc<AppState>>) -> Result<Response, ApiError> {
    if !caller.operator {
        return Err(ApiError::Command(CommandError::new(
            ErrorKind::AuthFailed,
            "metrics are for operators",
        )));
    }
    Ok(text(render(&state.pool).await?))
}

/// A router serving only `GET /metrics`, without a token (`--metrics-bind`).
pub fn standalone(pool: PgPool) -> Router {
    Router::new()
        .route(
            "/metrics",
            get(|State(pool): State<PgPool>| async move {
                match render(&pool).await {
                    Ok(body) => text(body),
                    Err(e) => {
                        tracing::warn!(error = %e, "rendering metrics failed");
                        (StatusCode::INTERNAL_SERVER_ERROR, "metrics unavailable\n").into_response()
                    }
                }
            }),
        )
        .with_state(pool)
}

/// Serves [`standalone`] on `listener` until `shutdown` resolves.
pub async fn serve_standalone(
    listener: tokio::net::TcpListener,
    pool: PgPool,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, standalone(pool))
        .with_graceful_shutdown(shutdown)
        .await
}

fn text(body: String) -> Response {
    ([(header::CONTENT_TYPE, prometheus::TEXT_FORMAT)], body).into_response()
}

/// The exposition: this process's instruments and the database's gauges, read now.
pub async fn render(pool: &PgPool) -> Result<String, MetricsError> {
    let fleet = grove_postgres::fleet::read(pool, ALIVE_WITHIN).await?;
    let scraped = Registry::new();
    register_fleet(&scraped, &fleet)?;
    let mut families = prometheus::gather();
    families.extend(scraped.gather());
    families.sort_by(|a, b| a.name().cmp(b.name()));
    let mut out = Vec::new();
    TextEncoder::new().encode(&families, &mut out)?;
    Ok(String::from_utf8_lossy(&out).into_owned())
}

fn int_gauges(
    registry: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
) -> Result<IntGaugeVec, prometheus::Error> {
    let g = IntGaugeVec::new(Opts::new(name, help), labels)?;
    registry.register(Box::new(g.clone()))?;
    Ok(g)
}

/// The gauges of one scrape, in a registry of their own (so a queue or node that has
/// gone leaves no stale series).
fn register_fleet(registry: &Registry, fleet: &FleetGauges) -> Result<(), prometheus::Error> {
    let jobs = int_gauges(
        registry,
        "grove_queue_jobs",
        "Open jobs per queue: pending (due or in a retry's backoff) and running (claimed).",
        &["queue", "state"],
    )?;
    let oldest = GaugeVec::new(
        Opts::new(
            "grove_queue_oldest_pending_seconds",
            "How long the oldest due pending job of each queue has waited.",
        ),
        &["queue"],
    )?;
    registry.register(Box::new(oldest.clone()))?;
    for q in &fleet.queues {
        jobs.with_label_values(&[&q.queue, "pending"])
            .set(q.pending);
        jobs.with_label_values(&[&q.queue, "running"])
            .set(q.running);
        oldest.with_label_values(&[&q.queue]).set(q.oldest_due_secs);
    }
    let alive = IntGauge::new(
        "grove_workers_alive",
        "Workers that heart-beat within the last 15 s.",
    )?;
    registry.register(Box::new(alive.clone()))?;
    alive.set(fleet.workers_alive);
    let workspace_states: Vec<&str> = WorkspaceState::ALL.iter().map(|s| s.as_str()).collect();
    let cache_states: Vec<&str> = RepoCacheState::ALL.iter().map(|s| s.as_str()).collect();
    by_state(registry, "workspaces", &fleet.workspaces, &workspace_states)?;
    by_state(registry, "repo_caches", &fleet.repo_caches, &cache_states)?;
    let used = int_gauges(
        registry,
        "grove_node_used_bytes",
        "Cached sizes of each node's workspaces and repo caches that are not evicted.",
        &["node"],
    )?;
    for row in fleet.workspaces.iter().chain(&fleet.repo_caches) {
        let g = used.with_label_values(&[&row.node]);
        if row.state != "evicted" {
            g.add(row.bytes);
        }
    }
    Ok(())
}

/// `grove_<what>{node,state}` and `grove_<what>_bytes{node,state}`, with every known
/// state of each node present (0 when none), so a state emptied reads 0.
fn by_state(
    registry: &Registry,
    what: &str,
    rows: &[StateCount],
    states: &[&str],
) -> Result<(), prometheus::Error> {
    let count = int_gauges(
        registry,
        &format!("grove_{what}"),
        &format!("Records of {what} per node and state."),
        &["node", "state"],
    )?;
    let bytes = int_gauges(
        registry,
        &format!("grove_{what}_bytes"),
        &format!("Cached sizes of {what} per node and state."),
        &["node", "state"],
    )?;
    for row in rows {
        for state in states {
            count.with_label_values(&[row.node.as_str(), state]);
            bytes.with_label_values(&[row.node.as_str(), state]);
        }
        count
            .with_label_values(&[&row.node, &row.state])
            .set(row.count);
        bytes
            .with_label_values(&[&row.node, &row.state])
            .set(row.bytes);
    }
    Ok(())
}
