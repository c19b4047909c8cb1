//! `/metrics` of a real `grove serve` after real work (a repo ensured, a session
//! acquired, a command run, a failing command, a tool call), parsed strictly as
//! Prometheus' text format and checked against that work; who may scrape it; and the
//! token-less listener of `grove worker --metrics-bind`.

use std::collections::BTreeMap;
use std::process::Stdio;
use std::time::Duration;

use grove_e2e::http::{Server, ALICE, OPS};
use reqwest::StatusCode;
use serde_json::json;
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::env_or_skip;

/// One sample line.
#[derive(Debug, Clone, PartialEq)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

/// A scrape, parsed.
struct Exposition {
    samples: Vec<Sample>,
    types: BTreeMap<String, String>,
}

impl Exposition {
    /// Parses the text format (version 0.0.4) strictly: every line is a `# HELP`, a
    /// `# TYPE` or a sample of a declared family; labels are quoted and escaped.
    fn parse(text: &str) -> Self {
        let mut samples = Vec::new();
        let mut types = BTreeMap::new();
        for line in text.lines() {
            if line.is_empty() {
                continue;
            }
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').expect("# TYPE name kind");
                assert!(
                    ["counter", "gauge", "histogram", "summary", "untyped"].contains(&kind),
                    "type {kind}"
                );
                assert!(types.insert(name.to_string(), kind.to_string()).is_none());
                continue;
            }
            if line.starts_with("# HELP ") {
                continue;
            }
            assert!(!line.starts_with('#'), "stray comment: {line}");
            let sample = parse_sample(line);
            let family = ["_bucket", "_sum", "_count", ""]
                .iter()
                .find_map(|s| {
                    let base = sample.name.strip_suffix(s)?;
                    types.get(base).map(|_| base)
                })
                .unwrap_or_else(|| panic!("sample of an undeclared family: {line}"));
            if sample.name.ends_with("_bucket") && types[family] == "histogram" {
                assert!(sample.labels.contains_key("le"), "{line}");
            }
            samples.push(sample);
        }
        Self { samples, types }
    }

    /// The value of the sample named `name` whose labels include `labels`; the sum if
    /// several match, 0 if none.
    fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.matching(name, labels).map(|s| s.value).sum()
    }

    fn matching<'a>(
        &'a self,
        name: &'a str,
        labels: &'a [(&'a str, &'a str)],
    ) -> impl Iterator<Item = &'a Sample> + 'a {
        self.samples.iter().filter(move |s| {
            s.name == name
                && labels
                    .iter()
                    .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
        })
    }

    fn has(&self, name: &str, labels: &[(&str, &str)]) -> bool {
        self.matching(name, labels).next().is_some()
    }
}

fn parse_sample(line: &str) -> Sample {
    let name_end = line
        .find(['{', ' '])
        .unwrap_or_else(|| panic!("no value: {line}"));
    let name = &line[..name_end];
    assert!(
        !name.is_empty()
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':'),
        "metric name {name:?}"
    );
    let mut rest = &line[name_end..];
    let mut labels = BTreeMap::new();
    if let Some(body) = rest.strip_prefix('{') {
        let mut chars = body.char_indices().peekable();
        loop {
            let (start, c) = chars.next().expect("unterminated labels");
            if c == '}' {
                rest = &body[start + 1..];
                break;
            }
            if c == ',' {
                continue;
            }
            let eq = body[start..].find('=').expect("label=") + start;
            let key = &body[start..eq];
            assert!(
                key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'),
                "{key}"
            );
            while chars.peek().is_some_and(|(i, _)| *i <= eq) {
                chars.next();
            }
            assert_eq!(chars.next().map(|(_, c)| c), Some('"'), "{line}");
            let mut value = String::new();
            loop {
                match chars.next().expect("unterminated label value").1 {
                    '"' => break,
                    '\\' => match chars.next().expect("escape").1 {
                        'n' => value.push('\n'),
                        c @ ('\\' | '"') => value.push(c),
                        c => panic!("bad escape \\{c} in {line}"),
                    },
                    c => value.push(c),
                }
            }
            assert!(labels.insert(key.to_string(), value).is_none(), "{line}");
        }
    }
    let value = rest.trim_start_matches(' ');
    let value = value.split(' ').next().unwrap();
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v
            .parse::<f64>()
            .unwrap_or_else(|_| panic!("value {v:?}: {line}")),
    };
    Sample {
        name: name.to_string(),
        labels,
        value,
    }
}

async fn scrape(server: &Server, token: Option<&str>) -> (StatusCode, String) {
    let mut req = server.http.get(server.url("/metrics"));
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status();
    (status, resp.text().await.unwrap())
}

#[tokio::test(flavor = "multi_thread")]
async fn metrics_count_the_work_done_through_a_real_server() {
    let env = env_or_skip!("metrics_count_the_work_done_through_a_real_server");
    let url = env.fixture_repo("fixture", &[("README.md", "hello\n")]);
    let server = Server::start(&env).await;

    // Who may scrape: an operator's token only.
    assert_eq!(scrape(&server, None).await.0, StatusCode::UNAUTHORIZED);
    assert_eq!(scrape(&server, Some(ALICE)).await.0, StatusCode::FORBIDDEN);

    let (s, body) = server
        .post(
            "/v1/repo-caches/ensure",
            ALICE,
            json!({"repo_name": "o/fixture", "repo_url": url}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{body}");
    let ws = server.acquire(ALICE, &url, "c1").await;
    let exec_path = format!("/v1/workspaces/{ws}/exec");
    let exec = |argv: serde_json::Value| server.post(&exec_path, ALICE, json!({ "argv": argv }));
    let (s, ok) = exec(json!(["true"])).await;
    assert_eq!(
        (s, ok["exit_code"].as_i64()),
        (StatusCode::OK, Some(0)),
        "{ok}"
    );
    let (s, failed) = exec(json!(["sh", "-c", "exit 3"])).await;
    assert_eq!(
        (s, failed["exit_code"].as_i64()),
        (StatusCode::OK, Some(3)),
        "{failed}"
    );
    let (s, wrote) = server
        .post(
            &format!("/v1/workspaces/{ws}/tools/write_file"),
            ALICE,
            json!({"path": "notes.txt", "content": "x\n"}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{wrote}");
    // A job no worker serves: an open job in a queue of its own.
    sqlx::query("SELECT * FROM grove.enqueue(gen_random_uuid(), $1, 'grove:node:elsewhere')")
        .bind(json!({"command": "hibernate_runtime", "workspace_id": uuid::Uuid::new_v4()}))
        .execute(&env.pool)
        .await
        .unwrap();

    let (status, text) = scrape(&server, Some(OPS)).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let m = Exposition::parse(&text);
    check_jobs(&m);
    check_execs_and_locks(&m);
    check_http(&m);
    check_gauges(&m);
    // No tenant data in any label: no user, workspace id, repository or token.
    for sample in &m.samples {
        for value in sample.labels.values() {
            for secret in [ws.as_str(), "alice", url.as_str(), "fixture", ALICE, OPS] {
                assert!(!value.contains(secret), "{sample:?} names {secret}");
            }
        }
    }
}

fn check_jobs(m: &Exposition) {
    // (kind, run, enqueued): the execs and the file write ran inline in the server's
    // worker (ADR 31), started and finished without an enqueue.
    for (kind, n, enqueued) in [
        ("ensure_repo_cache", 1.0, 1.0),
        ("acquire_workspace", 1.0, 1.0),
        ("exec", 2.0, 0.0),
        ("tool", 1.0, 0.0),
    ] {
        let k = [("kind", kind)];
        assert_eq!(
            m.sum("grove_jobs_enqueued_total", &k),
            enqueued,
            "{kind} enqueued"
        );
        assert_eq!(m.sum("grove_jobs_started_total", &k), n, "{kind} started");
        let done = [("kind", kind), ("outcome", "succeeded")];
        assert_eq!(
            m.sum("grove_jobs_finished_total", &done),
            n,
            "{kind} finished"
        );
        let timed = [("kind", kind), ("result", "succeeded")];
        assert_eq!(m.sum("grove_job_duration_seconds_count", &timed), n);
        let inf = [("kind", kind), ("result", "succeeded"), ("le", "+Inf")];
        assert_eq!(m.sum("grove_job_duration_seconds_bucket", &inf), n);
    }
    assert_eq!(m.types["grove_jobs_finished_total"], "counter");
    assert_eq!(m.types["grove_job_duration_seconds"], "histogram");
    // The job in the unserved queue was enqueued by SQL, not by this process.
    assert_eq!(
        m.sum(
            "grove_jobs_enqueued_total",
            &[("kind", "hibernate_runtime")]
        ),
        0.0
    );
}

fn check_execs_and_locks(m: &Exposition) {
    let zero = [("outcome", "completed"), ("exit", "zero")];
    let nonzero = [("outcome", "completed"), ("exit", "nonzero")];
    assert_eq!(m.sum("grove_execs_finished_total", &zero), 1.0);
    assert_eq!(m.sum("grove_execs_finished_total", &nonzero), 1.0);
    assert_eq!(
        m.sum(
            "grove_exec_duration_seconds_count",
            &[("outcome", "completed")]
        ),
        2.0
    );
    // Both execs and the tool call took the workspace's command lock.
    let ws_lock = [("scope", "workspace_commands"), ("outcome", "acquired")];
    assert!(m.sum("grove_lock_wait_seconds_count", &ws_lock) >= 3.0);
    assert_eq!(m.types["grove_lock_wait_seconds"], "histogram");
}

fn check_http(m: &Exposition) {
    let execs = [
        ("method", "POST"),
        ("route", "/v1/workspaces/{id}/exec"),
        ("status", "200"),
    ];
    assert_eq!(m.sum("grove_http_requests_total", &execs), 2.0);
    let tool = [
        ("route", "/v1/workspaces/{id}/tools/{tool}"),
        ("status", "200"),
    ];
    assert_eq!(m.sum("grove_http_requests_total", &tool), 1.0);
    let refused = [("route", "/metrics"), ("status", "403")];
    assert_eq!(m.sum("grove_http_requests_total", &refused), 1.0);
    let unauth = [("route", "/metrics"), ("status", "401")];
    assert_eq!(m.sum("grove_http_requests_total", &unauth), 1.0);
    assert!(m.has(
        "grove_http_request_duration_seconds_bucket",
        &[("route", "/v1/sessions")]
    ));
}

fn check_gauges(m: &Exposition) {
    assert_eq!(m.sum("grove_workers_alive", &[]), 1.0);
    let ready = [("node", "local"), ("state", "ready")];
    assert_eq!(m.sum("grove_workspaces", &ready), 1.0);
    assert_eq!(m.sum("grove_repo_caches", &ready), 1.0);
    // Every state is there for the node, 0 when empty.
    assert!(m.has(
        "grove_workspaces",
        &[("node", "local"), ("state", "evicted")]
    ));
    assert!(m.has("grove_node_used_bytes", &[("node", "local")]));
    let elsewhere = [("queue", "grove:node:elsewhere"), ("state", "pending")];
    assert_eq!(m.sum("grove_queue_jobs", &elsewhere), 1.0);
    let oldest = m.sum(
        "grove_queue_oldest_pending_seconds",
        &[("queue", "grove:node:elsewhere")],
    );
    assert!((0.0..60.0).contains(&oldest), "{oldest}");
    // Nothing is left open in the served queues.
    assert_eq!(
        m.sum(
            "grove_queue_jobs",
            &[("queue", "grove:node:local"), ("state", "running")]
        ),
        0.0
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_worker_serves_metrics_without_a_token_on_its_own_address() {
    let env = env_or_skip!("a_worker_serves_metrics_without_a_token_on_its_own_address");
    let mut child = env
        .command(&["worker", "--metrics-bind", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn grove worker");
    let stdout = child.stdout.take().unwrap();
    let mut lines = BufReader::new(stdout).lines();
    let first = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
        .await
        .expect("the worker printed its metrics address within 60 s")
        .unwrap()
        .expect("a first line");
    let url = first
        .trim()
        .strip_prefix("grove: metrics on ")
        .unwrap_or_else(|| panic!("unexpected first line: {first}"))
        .to_string();
    // The worker registers as it starts running; wait for its heartbeat to show.
    let mut alive = 0.0;
    for _ in 0..100 {
        let text = reqwest::get(&url).await.unwrap().text().await.unwrap();
        alive = Exposition::parse(&text).sum("grove_workers_alive", &[]);
        if alive == 1.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = child.kill().await;
    assert_eq!(alive, 1.0);
}
