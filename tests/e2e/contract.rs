//! The HTTP contract for bad requests against a real `grove serve`: every refusal is a
//! typed error in the error envelope, with the status the OpenAPI document declares,
//! and changes nothing.

use grove_e2e::http::{Server, ALICE};
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::env_or_skip;

/// Sends `req`, returns its status and its body parsed as the error envelope.
async fn envelope(req: reqwest::RequestBuilder) -> (StatusCode, Value) {
    let resp = req.send().await.expect("request");
    let status = resp.status();
    let text = resp.text().await.unwrap();
    let body: Value = serde_json::from_str(&text)
        .unwrap_or_else(|_| panic!("{status}: not the JSON error envelope: {text:?}"));
    assert!(
        body["error"]["kind"].is_string() && body["error"]["message"].is_string(),
        "{status}: not the error envelope: {body}"
    );
    (status, body)
}

async fn commands(env: &grove_e2e::TestEnv) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM grove.commands")
        .fetch_one(&env.pool)
        .await
        .unwrap()
}

/// The statuses the committed document declares for `method path`.
fn documented_statuses(path: &str, method: &str) -> Vec<String> {
    let doc: Value = serde_json::from_str(grove_api_doc()).unwrap();
    doc["paths"][path][method]["responses"]
        .as_object()
        .unwrap_or_else(|| panic!("{method} {path} is not documented"))
        .keys()
        .cloned()
        .collect()
}

fn grove_api_doc() -> &'static str {
    include_str!("../../docs/openapi.json")
}

#[tokio::test(flavor = "multi_thread")]
async fn malformed_requests_get_typed_errors_in_the_envelope_and_change_nothing() {
    let env =
        env_or_skip!("malformed_requests_get_typed_errors_in_the_envelope_and_change_nothing");
    let server = Server::start(&env).await;
    let before = commands(&env).await;

    // A NUL byte in a query parameter: bad input, not a database failure.
    let (status, body) = envelope(
        server
            .http
            .get(server.url("/v1/workspaces?user=a%00b"))
            .bearer_auth(ALICE),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["error"]["kind"], "invalid_input");
    assert!(documented_statuses("/v1/workspaces", "get").contains(&"400".into()));

    // A JSON body sent as text/plain (or with no type) is refused before it is read.
    let ensure = json!({"repo_name": "o/r", "repo_url": "https://example.invalid/o/r"});
    for content_type in [Some("text/plain"), None] {
        let mut req = server
            .http
            .post(server.url("/v1/repo-caches/ensure"))
            .bearer_auth(ALICE)
            .body(ensure.to_string());
        if let Some(t) = content_type {
            req = req.header("content-type", t);
        }
        let (status, body) = envelope(req).await;
        assert_eq!(
            status,
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "{content_type:?}: {body}"
        );
        assert_eq!(body["error"]["kind"], "invalid_input");
    }
    assert!(documented_statuses("/v1/repo-caches/ensure", "post").contains(&"415".into()));

    // A wrong method on a route that exists: 405 with the envelope, not an empty body.
    let (status, body) = envelope(
        server
            .http
            .delete(server.url("/v1/repo-caches/ensure"))
            .bearer_auth(ALICE),
    )
    .await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED, "{body}");
    assert_eq!(body["error"]["kind"], "invalid_input");
    let resp = server
        .http
        .delete(server.url("/v1/repo-caches/ensure"))
        .bearer_auth(ALICE)
        .send()
        .await
        .unwrap();
    let allow = resp.headers().get("allow").and_then(|v| v.to_str().ok());
    assert_eq!(
        allow,
        Some("POST"),
        "a 405 names the methods the route takes"
    );

    // A body over the limit: 413, documented.
    let big = json!({"repo_name": "o/r", "repo_url": "x".repeat(3 << 20)});
    let (status, body) = envelope(
        server
            .http
            .post(server.url("/v1/repo-caches/ensure"))
            .bearer_auth(ALICE)
            .json(&big),
    )
    .await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{body}");
    assert!(documented_statuses("/v1/repo-caches/ensure", "post").contains(&"413".into()));

    // A non-UUID id: 400, documented on the route.
    let (status, body) = envelope(
        server
            .http
            .get(server.url("/v1/workspaces/not-a-uuid"))
            .bearer_auth(ALICE),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(documented_statuses("/v1/workspaces/{id}", "get").contains(&"400".into()));

    assert_eq!(
        commands(&env).await,
        before,
        "a refused request enqueued something"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_exec_with_a_zero_timeout_is_refused_and_not_run() {
    let env = env_or_skip!("an_exec_with_a_zero_timeout_is_refused_and_not_run");
    let url = env.fixture_repo("fixture", &[("f", "x\n")]);
    let server = Server::start(&env).await;
    let ws = server.acquire(ALICE, &url, "c-timeout").await;
    let before = commands(&env).await;
    for route in ["exec", "exec/stream"] {
        let (status, body) = envelope(
            server
                .http
                .post(server.url(&format!("/v1/workspaces/{ws}/{route}")))
                .bearer_auth(ALICE)
                .json(&json!({"argv": ["touch", "ran"], "timeout_ms": 0})),
        )
        .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{route}: {body}");
        assert_eq!(body["error"]["kind"], "invalid_input");
        assert!(
            body["error"]["message"]
                .as_str()
                .unwrap()
                .contains("timeout_ms"),
            "{body}"
        );
    }
    assert_eq!(commands(&env).await, before, "a refused exec was enqueued");
    // The same exec with a real timeout runs.
    let (status, body) = server
        .post(
            &format!("/v1/workspaces/{ws}/exec"),
            ALICE,
            json!({"argv": ["true"], "timeout_ms": 10000}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
}

/// Every workspace id of ALICE's list, page by page with `limit`, acquiring one more
/// workspace (`c-late`) after the first page.
async fn page_through(server: &Server, url: &str, limit: u32) -> Vec<String> {
    let mut seen = vec![];
    let mut cursor: Option<String> = None;
    loop {
        let mut path = format!("/v1/workspaces?limit={limit}");
        if let Some(c) = &cursor {
            path.push_str(&format!("&cursor={c}"));
        }
        let (status, page) = server.get(&path, ALICE).await;
        assert_eq!(status, StatusCode::OK, "{page}");
        let rows = page["workspaces"].as_array().unwrap();
        assert!(rows.len() <= limit as usize, "{page}");
        seen.extend(rows.iter().map(|w| w["id"].as_str().unwrap().to_string()));
        if cursor.is_none() {
            // A workspace created while the client pages comes after every row seen.
            server.acquire(ALICE, url, &format!("c-late-{limit}")).await;
        }
        match page["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => break,
        }
    }
    seen
}

#[tokio::test(flavor = "multi_thread")]
async fn the_workspace_list_pages_by_cursor_without_skipping_or_repeating() {
    let env = env_or_skip!("the_workspace_list_pages_by_cursor_without_skipping_or_repeating");
    let url = env.fixture_repo("fixture", &[("f", "x\n")]);
    let server = Server::start(&env).await;
    for c in ["c-1", "c-2", "c-3"] {
        server.acquire(ALICE, &url, c).await;
    }

    let seen = page_through(&server, &url, 2).await;
    let (status, all) = server.get("/v1/workspaces", ALICE).await;
    assert_eq!(status, StatusCode::OK, "{all}");
    assert!(
        all.get("next_cursor").is_none(),
        "one page by default: {all}"
    );
    let all: Vec<String> = all["workspaces"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(all.len(), 4, "three, and the one created while paging");
    assert_eq!(seen, all, "pages skipped, repeated or reordered a row");
    let seen = page_through(&server, &url, 1).await;
    assert_eq!(seen.len(), 5);
    assert_eq!(
        seen[..4],
        all[..],
        "pages skipped, repeated or reordered a row"
    );

    for bad in [
        "limit=0",
        "limit=1001",
        "limit=x",
        "cursor=nope",
        "cursor=1.2",
    ] {
        let (status, body) = server.get(&format!("/v1/workspaces?{bad}"), ALICE).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {body}");
        assert_eq!(body["error"]["kind"], "invalid_input", "{bad}");
    }
    let doc: Value = serde_json::from_str(grove_api_doc()).unwrap();
    let params = doc["paths"]["/v1/workspaces"]["get"]["parameters"].to_string();
    assert!(
        params.contains("\"cursor\"") && params.contains("\"limit\""),
        "{params}"
    );
}
