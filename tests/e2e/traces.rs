//! Traces over OTLP/HTTP from a real `grove serve` to a collector stand-in on loopback
//! (an OTLP/HTTP JSON receiver written here, answering as the OTLP specification says):
//! one trace per command from the HTTP request and its enqueue, across the queue to the
//! claim, the job, its effect, its locks and its commit, each naming the command id;
//! and for a command the server's worker runs inline (ADR 31), from the request to its
//! `grove.inline` span, its locks and its commit, without enqueue or claim.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::http::{header, HeaderMap, StatusCode as Status};
use axum::routing::post;
use axum::Router;
use grove_e2e::http::{Server, ALICE};
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::env_or_skip;

/// One received span, as OTLP/JSON encodes it (ids in hex).
#[derive(Debug, Clone)]
struct Span {
    trace_id: String,
    span_id: String,
    parent: String,
    name: String,
    attributes: BTreeMap<String, String>,
}

type Received = Arc<Mutex<Vec<Span>>>;

/// `POST /v1/traces` with `Content-Type: application/json` (an
/// `ExportTraceServiceRequest`): its spans are kept and `{}` (an empty
/// `ExportTraceServiceResponse`) answered; any other content type is 415.
async fn receive(spans: Received, headers: HeaderMap, body: Bytes) -> (Status, HeaderMap, String) {
    let mut out = HeaderMap::new();
    out.insert(header::CONTENT_TYPE, "application/json".parse().unwrap());
    let json_body = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if !json_body {
        return (Status::UNSUPPORTED_MEDIA_TYPE, out, "{}".into());
    }
    let Ok(request) = serde_json::from_slice::<Value>(&body) else {
        return (Status::BAD_REQUEST, out, "{}".into());
    };
    let mut got = spans.lock().unwrap();
    for rs in request["resourceSpans"].as_array().into_iter().flatten() {
        for ss in rs["scopeSpans"].as_array().into_iter().flatten() {
            for s in ss["spans"].as_array().into_iter().flatten() {
                got.push(span_of(s));
            }
        }
    }
    (Status::OK, out, "{}".into())
}

fn span_of(s: &Value) -> Span {
    let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
    let attributes = s["attributes"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|kv| {
            let v = &kv["value"];
            let value = v
                .get("stringValue")
                .map(text)
                .or_else(|| v.get("intValue").map(|i| i.to_string()))
                .or_else(|| v.get("boolValue").map(|b| b.to_string()))
                .unwrap_or_default();
            (text(&kv["key"]), value)
        })
        .collect();
    Span {
        trace_id: text(&s["traceId"]),
        span_id: text(&s["spanId"]),
        parent: text(&s["parentSpanId"]),
        name: text(&s["name"]),
        attributes,
    }
}

async fn start_collector() -> (String, Received) {
    let spans: Received = Arc::default();
    let keep = spans.clone();
    let app = Router::new().route(
        "/v1/traces",
        post(move |h: HeaderMap, b: Bytes| receive(keep.clone(), h, b)),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (format!("http://{addr}"), spans)
}

/// The one span named `name` whose `command_id` is `id`.
fn one<'a>(spans: &'a [Span], name: &str, id: &str) -> &'a Span {
    let found: Vec<&Span> = spans
        .iter()
        .filter(|s| {
            s.name == name && s.attributes.get("command_id").map(String::as_str) == Some(id)
        })
        .collect();
    assert_eq!(found.len(), 1, "{name} of {id}: {spans:#?}");
    found[0]
}

/// Whether the command's commit span and the span its enqueue is a child of are in.
fn all_exported(spans: &[Span], id: &str) -> bool {
    let of = |name: &str| {
        spans.iter().find(|s| {
            s.name == name && s.attributes.get("command_id").map(String::as_str) == Some(id)
        })
    };
    let request_in = |enqueue: &Span| spans.iter().any(|s| s.span_id == enqueue.parent);
    of("grove.commit").is_some() && of("grove.enqueue").is_some_and(request_in)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_command_is_one_trace_from_the_request_across_the_queue_to_its_commit() {
    let env =
        env_or_skip!("a_command_is_one_trace_from_the_request_across_the_queue_to_its_commit");
    let (endpoint, received) = start_collector().await;
    let url = env.fixture_repo("fixture", &[("README.md", "hello\n")]);
    let server = Server::start_with(
        &env,
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"),
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
        ],
    )
    .await;
    // A new session is a queued command (acquire_workspace); its id is the ledger's.
    server.acquire(ALICE, &url, "c1").await;
    let id: String = sqlx::query_scalar(
        "SELECT command_id::text FROM grove.commands WHERE kind = 'acquire_workspace'",
    )
    .fetch_one(&env.pool)
    .await
    .unwrap();

    // Wait until the commit span and the request's span have both been exported: the
    // request's ends after the answer is sent, which may be after the commit's batch.
    let mut spans = Vec::new();
    for _ in 0..200 {
        spans = received.lock().unwrap().clone();
        if all_exported(&spans, &id) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let enqueue = one(&spans, "grove.enqueue", &id);
    let claim = one(&spans, "grove.claim", &id);
    let job = one(&spans, "grove.job", &id);
    let effect = one(&spans, "grove.effect", &id);
    let commit = one(&spans, "grove.commit", &id);
    // The request's span is the root; the enqueue its child.
    let request = spans
        .iter()
        .find(|s| s.span_id == enqueue.parent)
        .expect("the enqueue's parent was exported");
    assert_eq!(request.name, "http.request");
    assert_eq!(request.attributes["http.route"], "/v1/sessions");
    assert!(request.parent.is_empty(), "{request:?}");
    // Across the queue: the claim and the job continue the enqueue's trace.
    assert_eq!(claim.parent, enqueue.span_id);
    assert_eq!(job.parent, enqueue.span_id);
    assert_eq!(effect.parent, job.span_id);
    assert_eq!(commit.parent, job.span_id);
    let lock = spans
        .iter()
        .find(|s| {
            s.name == "grove.lock"
                && s.parent == effect.span_id
                && s.attributes["scope"] == "workspace_key"
        })
        .expect("the acquire's lock wait for its key, inside its effect");
    for s in [request, enqueue, claim, job, effect, commit, lock] {
        assert_eq!(
            s.trace_id, request.trace_id,
            "{s:?} is in the request's trace"
        );
        assert_eq!(s.trace_id.len(), 32);
    }
    assert_eq!(job.attributes["kind"], "acquire_workspace");
    // No trace id reached the log of events, the payload or the result.
    let leaked: i64 = sqlx::query_scalar(
        "SELECT (SELECT count(*) FROM grove.events WHERE payload::text LIKE '%' || $1 || '%' OR metadata::text LIKE '%' || $1 || '%')
              + (SELECT count(*) FROM grove.commands WHERE payload::text LIKE '%' || $1 || '%' OR coalesce(result::text, '') LIKE '%' || $1 || '%')",
    )
    .bind(&request.trace_id)
    .fetch_one(&env.pool)
    .await
    .unwrap();
    assert_eq!(leaked, 0);
    let kept: Option<String> =
        sqlx::query_scalar("SELECT trace_parent FROM grove.commands WHERE command_id = $1::uuid")
            .bind(&id)
            .fetch_one(&env.pool)
            .await
            .unwrap();
    assert_eq!(
        kept,
        Some(format!("00-{}-{}-01", request.trace_id, enqueue.span_id))
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_inline_exec_is_one_trace_from_the_request_to_its_commits() {
    let env = env_or_skip!("an_inline_exec_is_one_trace_from_the_request_to_its_commits");
    let (endpoint, received) = start_collector().await;
    let url = env.fixture_repo("fixture", &[("README.md", "hello\n")]);
    let server = Server::start_with(
        &env,
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"),
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
        ],
    )
    .await;
    let ws = server.acquire(ALICE, &url, "c1").await;
    let (status, exec) = server
        .post(
            &format!("/v1/workspaces/{ws}/exec"),
            ALICE,
            json!({"argv": ["true"]}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{exec}");
    let id = exec["exec_id"].as_str().unwrap().to_string();
    let exported = |spans: &[Span]| {
        let inline = spans
            .iter()
            .find(|s| s.name == "grove.inline" && s.attributes.get("command_id") == Some(&id));
        inline.is_some_and(|i| spans.iter().any(|s| s.span_id == i.parent))
            && spans
                .iter()
                .any(|s| s.name == "grove.commit" && s.attributes.get("command_id") == Some(&id))
    };
    let mut spans = Vec::new();
    for _ in 0..200 {
        spans = received.lock().unwrap().clone();
        if exported(&spans) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Run by the server's worker in the request's trace (ADR 31): no enqueue, no claim.
    let inline = one(&spans, "grove.inline", &id);
    let commit = one(&spans, "grove.commit", &id);
    let request = spans
        .iter()
        .find(|s| s.span_id == inline.parent)
        .expect("the inline command's parent was exported");
    assert_eq!(request.name, "http.request");
    assert_eq!(request.attributes["http.route"], "/v1/workspaces/{id}/exec");
    assert_eq!(commit.parent, inline.span_id);
    assert_eq!(inline.attributes["kind"], "exec");
    let lock = spans
        .iter()
        .find(|s| s.name == "grove.lock" && s.parent == inline.span_id)
        .expect("the exec's lock wait, inside the inline span");
    assert_eq!(lock.attributes["scope"], "workspace_commands");
    for s in [request, inline, commit, lock] {
        assert_eq!(s.trace_id, request.trace_id, "{s:?}");
    }
    for name in ["grove.enqueue", "grove.claim", "grove.job"] {
        assert!(
            !spans
                .iter()
                .any(|s| s.name == name && s.attributes.get("command_id") == Some(&id)),
            "{name} of an inline command"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn without_an_otlp_endpoint_no_trace_context_is_kept() {
    let env = env_or_skip!("without_an_otlp_endpoint_no_trace_context_is_kept");
    let url = env.fixture_repo("fixture", &[("README.md", "hello\n")]);
    let server = Server::start(&env).await;
    server.acquire(ALICE, &url, "c1").await;
    let kept: i64 =
        sqlx::query_scalar("SELECT count(*) FROM grove.commands WHERE trace_parent IS NOT NULL")
            .fetch_one(&env.pool)
            .await
            .unwrap();
    assert_eq!(kept, 0);
}
