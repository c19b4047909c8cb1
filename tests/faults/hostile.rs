//! Scenario `hostile_input`: property-based hostile input (proptest) over repo names,
//! URLs, refs and branch names, ids, paths, command arrays, env and JSON, first against
//! the validators and the tool layer directly (many cases, cheap), then through the real
//! CLI, worker and HTTP API (fewer cases). Nothing may escape a workspace, crash a
//! worker or the server, or be stored unvalidated; every refusal is a typed error.

use std::path::{Path, PathBuf};
use std::time::Duration;

use grove_core::commands::Command;
use grove_core::layout::Layout;
use grove_core::model::{branch_for, WorkspaceKey, WorkspaceMode};
use grove_core::validate::{
    validate_branch_scope_id, validate_command, validate_env, validate_owner_id, validate_ref,
    RepoName, RepoUrl,
};
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, TestRunner};
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::server::{Server, ALICE};
use crate::{env_or_skip, leaked_dirs, replay_ok, scale, Figures, Fleet};

/// Pieces that hostile input is made of: traversal, options, transports, credentials,
/// control characters, look-alikes of '/' and '.', ref syntax, overlong names.
const ATOMS: &[&str] = &[
    "..",
    "../",
    "/",
    "//",
    "-",
    "--upload-pack=touch /tmp/grove-pwned",
    "-oProxyCommand=touch /tmp/grove-pwned",
    "ext::sh -c touch% /tmp/grove-pwned",
    "fd::3",
    "file://",
    "file:///etc/",
    "https://",
    "https://user:ghp_secret@127.0.0.1/",
    "http://127.0.0.1:9/",
    "ssh://-oProxyCommand=x/",
    "git@127.0.0.1:",
    "git://127.0.0.1/",
    "\0",
    "\n",
    "\r",
    "\t",
    " ",
    "~",
    "^",
    ":",
    "@{",
    ".lock",
    ".git",
    "\u{2215}",
    "\u{ff0e}\u{ff0e}",
    "\u{2024}\u{2024}",
    "\u{202e}",
    "\u{200b}",
    "%2e%2e",
    "\\",
    "o",
    "r",
    "main",
    "a",
    ".",
    "refs/heads/",
    "HEAD",
    "*",
    "?",
    "[",
    "$(touch /tmp/grove-pwned)",
    "`id`",
    ";",
    "|",
    "'",
    "\"",
];

fn hostile() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        4 => prop::sample::select(ATOMS).prop_map(str::to_string),
        2 => "[a-zA-Z0-9._-]{1,12}",
        1 => any::<String>(),
        1 => (1usize..5000).prop_map(|n| "x".repeat(n)),
    ];
    prop::collection::vec(piece, 0..7).prop_map(|v| v.concat())
}

const FIELDS: &[&str] = &[
    "command",
    "argv",
    "env",
    "cwd",
    "repo_name",
    "repo_url",
    "base_ref",
    "mode",
    "conversation_id",
    "task_id",
    "project_id",
    "user_id",
    "workspace_id",
    "idempotency_key",
    "timeout_ms",
    "max_output_bytes",
    "kind",
    "network",
    "runtime",
    "stdin",
    "fetch",
    "until",
    "destroy_runtime",
    "path",
    "op",
];

const KINDS: &[&str] = &[
    "ensure_repo_cache",
    "acquire_workspace",
    "exec",
    "release_session",
    "destroy_workspace",
    "tool",
    "evict_sweep",
    "pin_workspace",
    "release_scope",
];

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        (-1e300f64..1e300).prop_map(|f| json!(f)),
        hostile().prop_map(Value::from),
        prop::sample::select(KINDS).prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 24, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
            prop::collection::btree_map(
                prop_oneof![
                    3 => prop::sample::select(FIELDS).prop_map(str::to_string),
                    1 => "[a-z_]{1,8}",
                ],
                inner,
                0..7
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn cases(n: u32) -> Config {
    Config {
        cases: n * scale() as u32,
        failure_persistence: None,
        ..Config::default()
    }
}

fn safe_name(s: &str) -> bool {
    s.chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
        && !s.starts_with('-')
        && !s.starts_with('.')
        && !s.contains("..")
}

/// `git check-ref-format` agrees that an accepted name is a valid ref.
fn git_accepts_ref(name: &str, branch: bool) -> bool {
    let mut cmd = std::process::Command::new("git");
    cmd.arg("check-ref-format");
    if branch {
        cmd.arg("--branch");
    } else {
        cmd.arg("--allow-onelevel");
    }
    cmd.arg(name)
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

proptest! {
    #![proptest_config(cases(512))]

    #[test]
    fn an_accepted_repo_name_is_two_safe_segments(raw in hostile()) {
        if let Ok(name) = RepoName::parse(&raw) {
            let (owner, repo) = name.as_str().split_once('/').unwrap();
            prop_assert!(safe_name(owner) && safe_name(repo), "{raw:?}");
        }
    }

    #[test]
    fn an_accepted_url_carries_no_credentials_options_or_transport_helpers(raw in hostile()) {
        if let Ok(url) = RepoUrl::parse(&raw) {
            let s = url.as_str();
            prop_assert!(!s.starts_with('-'), "{raw:?}");
            prop_assert!(!s.contains("::"), "{raw:?}");
            prop_assert!(!s.chars().any(|c| c.is_control() || c.is_whitespace()), "{raw:?}");
            if let Some(rest) = s.strip_prefix("https://").or_else(|| s.strip_prefix("http://")) {
                let authority = rest.split('/').next().unwrap_or_default();
                prop_assert!(!authority.contains('@'), "credentials in {raw:?}");
            }
            let layout = Layout::new("/grove-home");
            let dir = layout.repo_cache_dir(url.identity());
            prop_assert!(dir.starts_with("/grove-home/repos"), "{raw:?} -> {dir:?}");
            prop_assert_eq!(dir.components().count(), 4, "{:?}", dir);
        }
    }

    #[test]
    fn an_accepted_ref_is_one_git_accepts(raw in hostile()) {
        if validate_ref(&raw).is_ok() {
            prop_assert!(git_accepts_ref(&raw, false), "git refuses {raw:?}");
            prop_assert!(!raw.starts_with('-'), "{raw:?}");
        }
    }

    #[test]
    fn accepted_ids_make_workspace_paths_and_branches_that_stay_put(
        user in hostile(), project in hostile(), scope in hostile()
    ) {
        let ids_ok = validate_owner_id("user", &user).is_ok()
            && validate_owner_id("project", &project).is_ok();
        let scope_ok = validate_branch_scope_id("conversation", &scope).is_ok();
        // Paths are built even from refused ids (hashed segments), and never escape.
        let layout = Layout::new("/grove-home");
        let key = WorkspaceKey {
            node: "local".into(),
            user_id: user.clone(),
            project_id: project.clone(),
            mode: WorkspaceMode::Edit,
            scope: scope.clone(),
        };
        let dir = layout.workspace_dir(&key);
        prop_assert!(dir.starts_with("/grove-home/workspaces"), "{dir:?}");
        prop_assert_eq!(dir.components().count(), 6, "{:?}", dir);
        for c in dir.components().skip(3) {
            let c = c.as_os_str().to_string_lossy();
            prop_assert!(safe_name(&c) && c != "." && c != "..", "{dir:?}");
        }
        if ids_ok && scope_ok {
            for mode in [WorkspaceMode::Edit, WorkspaceMode::Task] {
                let branch = branch_for(mode, &scope).unwrap();
                prop_assert!(validate_ref(&branch).is_ok(), "{branch:?}");
                prop_assert!(git_accepts_ref(&branch, true), "git refuses branch {branch:?}");
            }
        }
    }

    #[test]
    fn commands_and_env_are_refused_or_clean(argv in prop::collection::vec(hostile(), 0..4),
                                               key in hostile(), value in hostile()) {
        if validate_command(&argv).is_ok() {
            prop_assert!(!argv.is_empty() && argv.iter().all(|a| !a.contains('\0')));
        }
        if validate_env(&key, &value).is_ok() {
            prop_assert!(key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'));
            prop_assert!(!key.starts_with(|c: char| c.is_ascii_digit()));
            prop_assert!(!value.contains('\0'));
        }
    }

    #[test]
    fn any_json_that_decodes_as_a_command_validates_without_panicking(v in json_value()) {
        if let Ok(cmd) = serde_json::from_value::<Command>(v) {
            let _ = cmd.validate();
        }
    }
}

/// A workspace directory with symlinks that lead out (directly, through chains, in a
/// loop) and a sentinel file outside it.
struct PathWorld {
    _dir: tempfile::TempDir,
    root: PathBuf,
    outside: PathBuf,
}

const SENTINEL: &str = "grove-faults-outside-sentinel-7f3a";

impl PathWorld {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("ws");
        let outside = dir.path().join("outside");
        std::fs::create_dir_all(root.join("sub")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(outside.join("secret"), SENTINEL).unwrap();
        std::fs::write(root.join("inside.txt"), "inside\n").unwrap();
        use std::os::unix::fs::symlink;
        symlink(&outside, root.join("out")).unwrap();
        symlink(outside.join("secret"), root.join("secret")).unwrap();
        symlink("../outside", root.join("rel-out")).unwrap();
        symlink("chain2", root.join("chain1")).unwrap();
        symlink("sub/../rel-out", root.join("chain2")).unwrap();
        symlink("loop-b", root.join("loop-a")).unwrap();
        symlink("loop-a", root.join("loop-b")).unwrap();
        symlink("/etc/passwd", root.join("sub/passwd")).unwrap();
        Self {
            _dir: dir,
            root,
            outside,
        }
    }

    fn outside_names(&self) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(&self.outside)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }
}

fn tool_path() -> impl Strategy<Value = String> {
    let seg = prop_oneof![
        4 => prop::sample::select(&[
            "out", "secret", "rel-out", "chain1", "chain2", "loop-a", "sub", "passwd",
            "..", ".", "", "inside.txt", "new.txt", ".git", "\u{2215}..", "\u{ff0e}\u{ff0e}",
            "/", "/etc/passwd", "\0", "proc", "self", "fd",
        ][..])
        .prop_map(str::to_string),
        1 => hostile(),
    ];
    prop::collection::vec(seg, 1..5).prop_map(|v| v.join("/"))
}

proptest! {
    #![proptest_config(cases(512))]

    #[test]
    fn tool_paths_never_read_or_write_outside_the_workspace(path in tool_path()) {
        let world = PathWorld::new();
        let ws = grove_tools::Workspace::open(&world.root, true).unwrap();
        if let Ok((content, _)) = ws.read_file(&path) {
            prop_assert!(!content.contains(SENTINEL), "read {path:?} escaped");
        }
        if let Ok(listing) = ws.view(&path, None) {
            prop_assert!(!listing.contains(SENTINEL) && !listing.contains("root:"), "view {path:?} escaped");
        }
        let _ = ws.write_file(&path, "written");
        let _ = ws.create(&path, "written");
        prop_assert_eq!(world.outside_names(), vec!["secret".to_string()], "write {:?} escaped", path);
        prop_assert_eq!(std::fs::read_to_string(world.outside.join("secret")).unwrap(), SENTINEL);
    }
}

/// Replaces a string that grove would accept as a URL of a host other than this
/// machine by `local`: hostile cases must never make a worker reach out past loopback.
fn tame(s: &str, local: &str) -> String {
    match RepoUrl::parse(s) {
        Ok(u) if !(u.is_local() || matches!(u.host(), "127.0.0.1" | "localhost" | "[::1]")) => {
            local.to_string()
        }
        _ => s.to_string(),
    }
}

fn tame_json(v: &mut Value, local: &str) {
    match v {
        Value::String(s) => *s = tame(s, local),
        Value::Array(a) => a.iter_mut().for_each(|x| tame_json(x, local)),
        Value::Object(m) => m.values_mut().for_each(|x| tame_json(x, local)),
        _ => {}
    }
}

/// Samples `n` values of a strategy (no shrinking: these cases go through processes).
fn sample<S: Strategy>(s: S, n: u64, runner: &mut TestRunner) -> Vec<S::Value> {
    (0..n)
        .map(|_| s.new_tree(runner).unwrap().current())
        .collect()
}

fn typed_error(body: &str) -> bool {
    serde_json::from_str::<Value>(body).is_ok_and(|v| {
        v["error"]["kind"].as_str().is_some_and(|k| !k.is_empty())
            && v["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty())
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn hostile_input_through_cli_worker_and_http_is_refused_typed_and_contained() {
    let env =
        env_or_skip!("hostile_input_through_cli_worker_and_http_is_refused_typed_and_contained");
    let url = env.fixture_repo("fixture", &[("README.md", "fixture\n")]);
    // The image first: a worker picks the default sandbox image up when it starts.
    let docker = crate::docker_image(&env, "hostile_input").await.is_ok();
    let mut fleet = Fleet::new(&env, &[], 4);
    fleet.spawn().await;
    let server = Server::start(&env, &["--no-worker"], &[]).await;
    let mut figures = Figures::default();
    let mut runner = TestRunner::new(Config::default());
    let n = 12 * scale();

    // A sentinel outside GROVE_HOME, and links to it planted inside the workspace.
    let outside = env.dir.path().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("secret"), SENTINEL).unwrap();
    let ws = env
        .grove_json(&grove_e2e::acquire_args(
            &url,
            "edit",
            &["--conversation", "hostile"],
        ))
        .await;
    let ws_id = ws["id"].as_str().unwrap().to_string();
    let ws_path = PathBuf::from(ws["local_path"].as_str().unwrap());
    std::os::unix::fs::symlink(&outside, ws_path.join("out")).unwrap();
    std::os::unix::fs::symlink(outside.join("secret"), ws_path.join("secret")).unwrap();

    let check_cli = |what: String, out: std::process::Output, figures: &mut Figures| {
        figures.injected += 1;
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        let code = out.status.code();
        let exec_exit = what.starts_with("exec") && code.is_some();
        if !(matches!(code, Some(0..=4)) || exec_exit) {
            figures.lost += 1;
            figures.note(format!("{what}: exit {code:?}: {stderr}"));
        }
        if stderr.contains("panicked") {
            figures.lost += 1;
            figures.note(format!("{what}: panic: {stderr}"));
        }
        if code != Some(0) && !what.starts_with("exec") && stderr.trim_end().lines().count() != 1 {
            figures.note(format!("{what}: not one line: {stderr:?}"));
            figures.lost += 1;
        }
        if stdout.contains(SENTINEL) || stderr.contains(SENTINEL) {
            figures.leaked += 1;
            figures.note(format!("{what}: read outside the workspace"));
        }
    };

    // Repo names, URLs, refs and ids through acquire (the worker runs what passes).
    let tuples = sample(
        (
            hostile(),
            prop_oneof![hostile(), Just(url.clone())],
            hostile(),
            hostile(),
        ),
        n,
        &mut runner,
    );
    for (repo, u, base, conv) in tuples {
        let u = tame(&u, &url);
        if [&repo, &u, &base, &conv].iter().any(|s| s.contains('\0')) {
            continue; // argv cannot carry NUL; the HTTP cases below do.
        }
        let out = env
            .grove_env(
                &[
                    "workspace",
                    "acquire",
                    "--user",
                    "u1",
                    "--project",
                    "p1",
                    "--repo",
                    &repo,
                    "--url",
                    &u,
                    "--base",
                    &base,
                    "--mode",
                    "edit",
                    "--conversation",
                    &conv,
                ],
                &[("GROVE_CLAIM_TIMEOUT", "60")],
            )
            .await;
        check_cli(
            format!("acquire {repo:?} {u:?} {base:?} {conv:?}"),
            out,
            &mut figures,
        );
    }
    // Paths through the tool job, reading and writing.
    for p in sample(tool_path(), n, &mut runner) {
        if p.contains('\0') || p.starts_with('-') {
            continue;
        }
        let out = env.grove(&["tool", &ws_id, "read", &p]).await;
        check_cli(format!("tool read {p:?}"), out, &mut figures);
        let out = env
            .grove(&["tool", &ws_id, "write", &p, "--content", "hostile-write"])
            .await;
        check_cli(format!("tool write {p:?}"), out, &mut figures);
    }
    // Commands, cwd and env through exec: whatever runs, it cannot see the sentinel.
    let secret_abs = outside.join("secret").to_string_lossy().into_owned();
    for (cwd, key, value) in sample((tool_path(), hostile(), hostile()), n, &mut runner) {
        if [&cwd, &key, &value].iter().any(|s| s.contains('\0')) || cwd.starts_with('-') {
            continue;
        }
        let env_arg = format!("{key}={value}");
        let out = env
            .grove(&[
                "exec",
                &ws_id,
                "--cwd",
                &cwd,
                "--env",
                &env_arg,
                "--",
                "sh",
                "-c",
                "cat \"$1\" out/secret secret 2>/dev/null; ls -la / 2>/dev/null | head -3",
                "sh",
                &secret_abs,
            ])
            .await;
        check_cli(
            format!("exec --cwd {cwd:?} --env {env_arg:?}"),
            out,
            &mut figures,
        );
    }

    // JSON bodies of wrong types and hostile values to every POST route, then huge ones.
    let (_, doc) = server
        .call(Method::GET, "/openapi.json", None, None)
        .await
        .unwrap();
    let doc: Value = serde_json::from_str(&doc).unwrap();
    // The HTTP cases act on a workspace of the token's own user (another user's would
    // answer 404 before any body is looked at).
    let (status, session) = server
        .call(
            Method::POST,
            "/v1/sessions",
            Some(ALICE),
            Some(
                &json!({"project_id": "p1", "repo_name": "o/fixture", "repo_url": url,
                         "base_ref": "main", "mode": "edit", "conversation_id": "hostile"}),
            ),
        )
        .await
        .expect("an answer");
    assert_eq!(status, StatusCode::OK, "{session}");
    let ws_id = serde_json::from_str::<Value>(&session).unwrap()["session_id"]
        .as_str()
        .unwrap()
        .to_string();
    // Each POST route, and whether it reads a body at all (one that does not may
    // ignore whatever it is sent).
    let posts: Vec<(String, bool)> = doc["paths"]
        .as_object()
        .unwrap()
        .iter()
        .filter_map(|(p, ops)| {
            let post = ops.get("post")?;
            Some((p.replace("{id}", &ws_id), post.get("requestBody").is_some()))
        })
        .collect();
    let mut bodies = sample(json_value(), n * 4, &mut runner);
    bodies.iter_mut().for_each(|b| tame_json(b, &url));
    let huge = [
        json!({"argv": ["x".repeat(3 << 20)]}),
        json!({"argv": ["true"], "env": {"K": "v".repeat(64 << 10)}}),
        json!({"repo_name": "o/r".repeat(1 << 20), "repo_url": url}),
        json!({"project_id": "p", "repo_name": "o/r", "repo_url": url, "base_ref": "b".repeat(1 << 16), "mode": "edit", "conversation_id": "c"}),
    ];
    let nested = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    for (path, reads_body) in &posts {
        for (i, body) in bodies.iter().chain(huge.iter()).enumerate() {
            let over_limit = i >= bodies.len();
            let mut answer = server
                .call(Method::POST, path, Some(ALICE), Some(body))
                .await;
            if answer.is_none() && !over_limit {
                // A pooled connection the server closed after an over-limit body can
                // fail the next request before it is sent: ask once more, on a fresh
                // one (the failed connection leaves the pool). A server that cannot
                // answer fails this second call too.
                answer = server
                    .call(Method::POST, path, Some(ALICE), Some(body))
                    .await;
            }
            figures.injected += 1;
            match answer {
                Some((status, text)) if status.is_client_error() && typed_error(&text) => {}
                Some((status, _)) if status.is_success() => {}
                Some((status, text)) => {
                    figures.lost += 1;
                    let shown: String = text.chars().take(200).collect();
                    let b: String = body.to_string().chars().take(200).collect();
                    figures.note(format!("POST {path} {b}: {status} {shown}"));
                }
                // A body over the server's limit may be cut off by closing the
                // connection while the client still sends; the server must live on.
                None if over_limit
                    && server
                        .call(Method::GET, "/healthz", None, None)
                        .await
                        .is_some_and(|(s, _)| s == StatusCode::OK) => {}
                None => {
                    figures.lost += 1;
                    figures.note(format!("POST {path}: no answer"));
                }
            }
        }
        let send_nested = || {
            server
                .http
                .post(format!("{}{path}", server.base))
                .bearer_auth(ALICE)
                .header("content-type", "application/json")
                .body(nested.clone())
                .send()
        };
        let mut resp = send_nested().await;
        if resp.as_ref().is_err_and(|e| e.is_request()) {
            // As above: the pooled connection may be one the server closed after the
            // over-limit bodies; once more on a fresh one (a dead server fails again).
            resp = send_nested().await;
        }
        figures.injected += 1;
        match resp {
            Ok(r) if r.status().is_success() && !reads_body => {}
            Ok(r) if r.status().is_client_error() => {
                let text = r.text().await.unwrap_or_default();
                if !typed_error(&text) {
                    figures.lost += 1;
                    figures.note(format!("POST {path} nested: untyped {text}"));
                }
            }
            other => {
                figures.lost += 1;
                figures.note(format!("POST {path} nested: {other:?}"));
            }
        }
    }
    // Extreme numbers: timeouts of millions of years and an output cap past the limit,
    // on every runtime this machine has. Each either runs (the timeout is only an
    // upper bound) or is refused as bad input; none may break the worker.
    let mut runtimes = vec!["local"];
    if docker {
        runtimes.push("docker");
    }
    for runtime in runtimes {
        for extreme in [
            json!({"argv": ["true"], "runtime": runtime, "timeout_ms": u64::MAX}),
            json!({"argv": ["true"], "runtime": runtime, "timeout_ms": u64::MAX / 1000}),
            json!({"argv": ["true"], "runtime": runtime, "max_output_bytes": u64::MAX}),
        ] {
            figures.injected += 1;
            let answer = server
                .call(
                    Method::POST,
                    &format!("/v1/workspaces/{ws_id}/exec"),
                    Some(ALICE),
                    Some(&extreme),
                )
                .await;
            match answer {
                Some((status, text)) if status.is_client_error() && typed_error(&text) => {}
                Some((status, _)) if status.is_success() => {}
                other => {
                    figures.lost += 1;
                    figures.note(format!("exec {extreme}: {other:?}"));
                }
            }
        }
    }
    figures.trials = figures.injected;

    // Still standing: the server answers, the worker lives and logged no panic.
    let health = server.call(Method::GET, "/healthz", None, None).await;
    if health.is_none_or(|(s, _)| s != StatusCode::OK) {
        figures.lost += 1;
        figures.note("the server stopped answering".to_string());
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let probe = env.grove(&["exec", &ws_id, "--", "true"]).await;
    if !probe.status.success() || fleet.all_logs().contains("panicked") {
        figures.lost += 1;
        figures.note(format!(
            "the worker did not survive: {}",
            String::from_utf8_lossy(&probe.stderr)
        ));
    }
    // Nothing stored unvalidated: every recorded command validates as it stands.
    let payloads: Vec<Value> = sqlx::query_scalar("SELECT payload FROM grove.commands")
        .fetch_all(&env.pool)
        .await
        .unwrap();
    for p in payloads {
        let ok = serde_json::from_value::<Command>(p.clone()).map(|c| c.validate());
        if !matches!(ok, Ok(Ok(()))) {
            figures.leaked += 1;
            figures.note(format!("stored unvalidated: {p}"));
        }
    }
    // Nothing written outside the workspace: the sentinel's directory is unchanged
    // and no hostile write landed anywhere but in the workspace.
    let names: Vec<String> = std::fs::read_dir(&outside)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    if names != ["secret"] || Path::new("/tmp/grove-pwned").exists() {
        figures.leaked += 1;
        figures.note(format!("outside changed: {names:?}"));
    }
    let mut hits = grove_e2e::files_containing(&env.home(), b"hostile-write");
    hits.extend(grove_e2e::files_containing(&outside, b"hostile-write"));
    for hit in hits {
        if !hit.starts_with(&ws_path) {
            figures.leaked += 1;
            figures.note(format!("a hostile write landed at {}", hit.display()));
        }
    }
    leaked_dirs(&env, &mut figures).await;
    replay_ok(&env, &mut figures).await;
    figures.finish("hostile_input");
}
