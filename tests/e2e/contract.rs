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
    // The rest of that body is left unread, so the answer closes the connection and
    // says so: the client must not reuse it for the next request.
    let big = json!({"repo_name": "o/r", "repo_url": "x".repeat(3 << 20)});
    let resp = server
        .http
        .post(server.url("/v1/repo-caches/ensure"))
        .bearer_auth(ALICE)
        .json(&big)
        .send()
        .await
        .expect("request");
    assert_eq!(resp.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(
        resp.headers()
            .get("connection")
            .and_then(|v| v.to_str().ok()),
        Some("close"),
        "a 413 must close the connection it leaves unread"
    );
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["error"]["kind"], "invalid_input", "{body}");
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

/// The properties of the documented schema `name`: (required, all).
fn schema_keys(doc: &Value, name: &str) -> (Vec<String>, Vec<String>) {
    let schema = &doc["components"]["schemas"][name];
    let names = |v: &Value| -> Vec<String> {
        match v {
            Value::Array(a) => a.iter().map(|k| k.as_str().unwrap().to_string()).collect(),
            Value::Object(o) => o.keys().cloned().collect(),
            _ => vec![],
        }
    };
    let all = names(&schema["properties"]);
    assert!(!all.is_empty(), "{name} is not a documented object schema");
    (names(&schema["required"]), all)
}

/// Asserts `data` has every required key of `schema` and no undocumented key.
fn assert_shape(doc: &Value, schema: &str, data: &Value) {
    let (required, all) = schema_keys(doc, schema);
    let obj = data
        .as_object()
        .unwrap_or_else(|| panic!("not an object: {data}"));
    for k in &required {
        assert!(obj.contains_key(k), "{schema}: {k} missing in {data}");
    }
    for k in obj.keys() {
        assert!(all.contains(k), "{schema}: {k} is not documented ({data})");
    }
}

/// Splits server-sent events text into (event name, JSON data) messages.
fn sse_messages(text: &str) -> Vec<(String, Value)> {
    text.split("\n\n")
        .filter_map(|m| {
            let mut name = "message".to_string();
            let mut data = None;
            for line in m.lines() {
                if let Some(n) = line.strip_prefix("event: ") {
                    name = n.to_string();
                } else if let Some(d) = line.strip_prefix("data: ") {
                    data = Some(serde_json::from_str(d).expect("JSON data"));
                }
            }
            data.map(|d| (name, d))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn streamed_messages_carry_the_data_shapes_the_document_declares() {
    let env = env_or_skip!("streamed_messages_carry_the_data_shapes_the_document_declares");
    let doc: Value = serde_json::from_str(grove_api_doc()).unwrap();
    let stream_ref = &doc["paths"]["/v1/workspaces/{id}/exec/stream"]["post"]["responses"]["200"]
        ["content"]["text/event-stream"]["schema"]["properties"]["data"]["contentSchema"]["$ref"];
    assert_eq!(stream_ref, "#/components/schemas/ExecStreamData");
    let events_ref = &doc["paths"]["/v1/workspaces/{id}/events"]["get"]["responses"]["200"]
        ["content"]["text/event-stream"]["schema"]["properties"]["data"]["contentSchema"]["$ref"];
    assert_eq!(events_ref, "#/components/schemas/Event");

    let url = env.fixture_repo("fixture", &[("README.md", "hello\n")]);
    let server = Server::start(&env).await;
    let ws = server.acquire(ALICE, &url, "c1").await;
    let text = server
        .http
        .post(server.url(&format!("/v1/workspaces/{ws}/exec/stream")))
        .bearer_auth(ALICE)
        .json(&json!({"argv": ["sh", "-c", "echo out; echo err >&2"]}))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let messages = sse_messages(&text);
    let names: Vec<&str> = messages.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names.first(), Some(&"started"), "{text}");
    assert_eq!(names.last(), Some(&"finished"), "{text}");
    assert!(names.contains(&"output"), "{text}");
    for (name, data) in &messages {
        let schema = match name.as_str() {
            "started" => "ExecStarted",
            "output" => "ExecOutput",
            "finished" => "ExecFinished",
            "error" => "ErrorResponse",
            other => panic!("undocumented event {other}: {text}"),
        };
        assert_shape(&doc, schema, data);
    }

    // A followed event stream: each message is one documented `Event`.
    let mut resp = server
        .http
        .get(server.url(&format!("/v1/workspaces/{ws}/events?follow=true")))
        .bearer_auth(ALICE)
        .send()
        .await
        .unwrap();
    assert_eq!(
        resp.headers()["content-type"].to_str().unwrap(),
        "text/event-stream"
    );
    let mut text = String::new();
    while !text.contains("\n\n") {
        let chunk = tokio::time::timeout(std::time::Duration::from_secs(30), resp.chunk())
            .await
            .expect("the follow went silent for 30 s")
            .unwrap()
            .expect("the follow ended early");
        text.push_str(&String::from_utf8_lossy(&chunk));
    }
    let messages = sse_messages(&text);
    assert!(!messages.is_empty(), "{text}");
    for (_, data) in &messages {
        assert_shape(&doc, "Event", data);
    }
}

/// True when the document lets `method path` take a `null` JSON body.
fn declares_null_body(doc: &Value, path: &str, method: &str) -> bool {
    doc["paths"][path][method]["requestBody"]["content"]["application/json"]["schema"]["oneOf"]
        .as_array()
        .is_some_and(|alts| alts.iter().any(|s| s["type"] == "null"))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_null_body_where_the_document_allows_one_means_no_options() {
    let env = env_or_skip!("a_null_body_where_the_document_allows_one_means_no_options");
    let doc: Value = serde_json::from_str(grove_api_doc()).unwrap();
    assert!(declares_null_body(&doc, "/v1/workspaces/{id}/pin", "post"));
    assert!(declares_null_body(
        &doc,
        "/v1/sessions/{id}/release",
        "post"
    ));

    let url = env.fixture_repo("fixture", &[("README.md", "hello\n")]);
    let server = Server::start(&env).await;
    let ws = server.acquire(ALICE, &url, "c1").await;
    let (status, pinned) = server
        .post(
            &format!("/v1/workspaces/{ws}/pin"),
            ALICE,
            json!({"until": "2999-01-01T00:00:00Z"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{pinned}");
    assert!(pinned["pinned_until"].is_string(), "{pinned}");

    // `null` unpins, as an absent body does.
    let (status, unpinned) = server
        .post(&format!("/v1/workspaces/{ws}/pin"), ALICE, Value::Null)
        .await;
    assert_eq!(status, StatusCode::OK, "{unpinned}");
    assert!(unpinned["pinned_until"].is_null(), "{unpinned}");

    // A body of the wrong type is still refused, and changes nothing.
    let before = commands(&env).await;
    let (status, body) = envelope(
        server
            .http
            .post(server.url(&format!("/v1/sessions/{ws}/release")))
            .bearer_auth(ALICE)
            .json(&json!("hibernate")),
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(commands(&env).await, before);

    // `null` releases with the defaults (hibernate).
    let (status, released) = server
        .post(&format!("/v1/sessions/{ws}/release"), ALICE, Value::Null)
        .await;
    assert_eq!(status, StatusCode::OK, "{released}");
    assert_eq!(released["state"], "released");
}

#[tokio::test(flavor = "multi_thread")]
async fn each_documented_tool_operation_is_served_with_its_argument_schema() {
    let env = env_or_skip!("each_documented_tool_operation_is_served_with_its_argument_schema");
    let doc: Value = serde_json::from_str(grove_api_doc()).unwrap();
    let url = env.fixture_repo("fixture", &[("README.md", "hello\n")]);
    let server = Server::start(&env).await;
    let ws = server.acquire(ALICE, &url, "c1").await;

    // Every tool the server lists has its own documented operation, with the schema the
    // server lists for it.
    let (status, list) = server
        .get(&format!("/v1/workspaces/{ws}/tools"), ALICE)
        .await;
    assert_eq!(status, StatusCode::OK, "{list}");
    let tools = list["tools"].as_array().unwrap();
    assert!(!tools.is_empty());
    for t in tools {
        let name = t["name"].as_str().unwrap();
        let op = &doc["paths"][format!("/v1/workspaces/{{id}}/tools/{name}")]["post"];
        assert!(op.is_object(), "{name} has no operation of its own");
        assert_eq!(
            doc["components"]["schemas"][format!("ToolArgs.{name}")],
            t["input_schema"],
            "{name}"
        );
    }

    // A typed operation answers at its own path.
    let (status, out) = server
        .post(
            &format!("/v1/workspaces/{ws}/tools/read_file"),
            ALICE,
            json!({"path": "README.md"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{out}");
    assert!(out.to_string().contains("hello"), "{out}");

    // An argument its schema does not declare is refused, and changes nothing.
    let before = commands(&env).await;
    let (status, body) = envelope(
        server
            .http
            .post(server.url(&format!("/v1/workspaces/{ws}/tools/read_file")))
            .bearer_auth(ALICE)
            .json(&json!({"path": "README.md", "follow_symlinks": true})),
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(commands(&env).await, before);
}
