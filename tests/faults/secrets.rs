//! Scenario `secrets`: git tokens in real use (clone, fetch, acquire and push through a
//! loopback git server that refuses anyone without the token; over the CLI and the
//! HTTP API; a wrong token; a worker killed while a token-carrying job runs), then a
//! scan for either token in `$GROVE_HOME`, every git config, the event log, the ledger
//! and job rows, worker and server logs, CLI output, HTTP responses and error messages.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::Duration;

use grove_e2e::{files_containing, git};
use reqwest::Method;
use serde_json::json;

use crate::server::{Server, ALICE};
use crate::{env_or_skip, replay_ok, scale, Figures, Fleet, Rng};
use grove_gitserver::{GitServer, Options};

const ROUNDS: u64 = 2;

#[tokio::test(flavor = "multi_thread")]
async fn git_tokens_used_across_clone_fetch_acquire_and_push_are_found_nowhere() {
    let env = env_or_skip!("git_tokens_used_across_clone_fetch_acquire_and_push_are_found_nowhere");
    let mut rng = Rng::new("secrets");
    let token = format!("ghp_faults{}", uuid::Uuid::new_v4().simple());
    let wrong = format!("ghp_wrong{}", uuid::Uuid::new_v4().simple());
    // The private upstream: a bare repository served only to the token.
    let seed = env.fixture_repo("seed", &[("README.md", "private\n")]);
    let srv = env.dir.path().join("srv");
    std::fs::create_dir_all(srv.join("o")).unwrap();
    git(
        env.dir.path(),
        &[
            "clone",
            "-q",
            "--bare",
            seed.trim_start_matches("file://"),
            srv.join("o/private.git").to_str().unwrap(),
        ],
    );
    git(
        &srv.join("o/private.git"),
        &["config", "http.receivepack", "true"],
    );
    let server = GitServer::start(
        &srv,
        Options {
            token: Some(token.clone()),
            ..Options::default()
        },
    )
    .expect("git server");
    let url = format!("{}/o/private.git", server.base);

    let mut fleet = Fleet::new(&env, &[("GROVE_LOG", "debug")], 4);
    fleet.spawn().await;
    fleet.spawn().await;
    let api = Server::start(&env, &["--no-worker"], &[("GROVE_LOG", "debug")]).await;
    let mut figures = Figures {
        injected: 2,
        ..Default::default()
    };
    let mut outputs: Vec<String> = Vec::new();
    let good = [("GIT_TOKEN", token.as_str())];
    let bad = [("GIT_TOKEN", wrong.as_str())];
    let run = |out: std::process::Output, outputs: &mut Vec<String>| {
        let s = format!(
            "{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        outputs.push(s.clone());
        (out.status.code(), s)
    };

    for round in 0..ROUNDS * scale() {
        let ensure = [
            "repo",
            "ensure",
            "--repo",
            "o/private",
            "--url",
            &url,
            "--fetch",
            "--token-env",
            "GIT_TOKEN",
            "--json",
        ];
        let (code, text) = run(env.grove_env(&ensure, &good).await, &mut outputs);
        assert_eq!(code, Some(0), "ensure with the token: {text}");
        // A wrong token and no token are refused by the remote, and say so in a line.
        let (code, text) = run(env.grove_env(&ensure, &bad).await, &mut outputs);
        assert_ne!(code, Some(0), "a wrong token must not fetch: {text}");
        let (code, text) = run(
            env.grove(&[
                "repo",
                "ensure",
                "--repo",
                "o/private",
                "--url",
                &url,
                "--fetch",
            ])
            .await,
            &mut outputs,
        );
        assert_ne!(code, Some(0), "no token must not fetch: {text}");
        figures.trials += 3;

        // An acquire with the token while a worker is killed: the retry reads the
        // token again from the hand-off table.
        let conversation = format!("r{round}");
        let acquire = grove_e2e::acquire_args(
            &url,
            "edit",
            &[
                "--conversation",
                &conversation,
                "--token-env",
                "GIT_TOKEN",
                "--json",
            ],
        )
        .iter()
        .map(|s| s.replace("o/fixture", "o/private"))
        .collect::<Vec<_>>();
        let acquire: Vec<&str> = acquire.iter().map(String::as_str).collect();
        let pending = env.grove_env(&acquire, &good);
        let killer = async {
            tokio::time::sleep(Duration::from_millis(rng.range(0, 400))).await;
            fleet.kill9(rng.next_u64() as usize).await;
            fleet.spawn().await;
        };
        let (out, ()) = tokio::join!(pending, killer);
        figures.injected += 1;
        let (code, text) = run(out, &mut outputs);
        figures.trials += 1;
        assert_eq!(code, Some(0), "acquire with the token: {text}");
        let ws: serde_json::Value =
            serde_json::from_str(text.lines().next().unwrap_or_default()).unwrap();
        let id = ws["id"].as_str().unwrap().to_string();

        // Commit and push with the token.
        for args in [
            vec![
                "tool",
                &id,
                "write",
                "work.txt",
                "--content",
                "agent work\n",
            ],
            vec!["tool", &id, "commit", "-m", "agent work"],
            vec![
                "tool",
                &id,
                "push",
                "--set-upstream",
                "--token-env",
                "GIT_TOKEN",
            ],
        ] {
            let (code, text) = run(env.grove_env(&args, &good).await, &mut outputs);
            assert_eq!(code, Some(0), "{args:?}: {text}");
            figures.trials += 1;
        }
        let branch = format!("refs/heads/agent/edits-{conversation}");
        assert!(
            !git(
                &srv.join("o/private.git"),
                &["rev-parse", "--verify", &branch]
            )
            .is_empty(),
            "the push reached the remote"
        );

        // The same over HTTP, the token in its header.
        for (path, body) in [
            (
                "/v1/repo-caches/ensure",
                json!({"repo_name": "o/private", "repo_url": url, "fetch": true}),
            ),
            (
                "/v1/sessions",
                json!({"project_id": "p1", "repo_name": "o/private", "repo_url": url,
                       "base_ref": "main", "mode": "edit",
                       "conversation_id": format!("h{round}")}),
            ),
        ] {
            for t in [&token, &wrong] {
                // A new workspace for the wrong token (the right one's is alice's to
                // re-acquire without asking the remote).
                let mut body = body.clone();
                if t == &wrong && body.get("conversation_id").is_some() {
                    body["conversation_id"] = json!(format!("w{round}"));
                }
                let resp = api
                    .http
                    .request(Method::POST, format!("{}{path}", api.base))
                    .bearer_auth(ALICE)
                    .header("X-Grove-Git-Token", t.as_str())
                    .json(&body)
                    .send()
                    .await
                    .unwrap();
                let ok = resp.status().is_success();
                let text = resp.text().await.unwrap_or_default();
                assert_eq!(
                    ok,
                    t == &token,
                    "{path} with the {} token: {text}",
                    if t == &token { "right" } else { "wrong" }
                );
                outputs.push(text);
                figures.trials += 1;
            }
        }
    }
    assert!(
        server.seen.authorized.load(Ordering::SeqCst) > 0
            && server.seen.refused.load(Ordering::SeqCst) > 0,
        "the remote demanded the token and got it"
    );

    // The scan.
    let mut places: Vec<(String, String)> = Vec::new();
    for (i, o) in outputs.iter().enumerate() {
        places.push((format!("CLI output or HTTP response #{i}"), o.clone()));
    }
    places.push(("worker logs".into(), fleet.all_logs()));
    places.push((
        "server log".into(),
        std::fs::read_to_string(&api.log).unwrap_or_default(),
    ));
    for cfg in [
        "/etc/gitconfig",
        "/root/.gitconfig",
        "/root/.config/git/config",
    ] {
        places.push((cfg.into(), std::fs::read_to_string(cfg).unwrap_or_default()));
    }
    let dumps: Vec<(String, String)> = sqlx::query_as(
        "SELECT 'events', coalesce(string_agg(payload::text || metadata::text, ''), '') FROM grove.events
         UNION ALL SELECT 'ledger', coalesce(string_agg(payload::text || coalesce(result::text, '') || coalesce(error::text, ''), ''), '') FROM grove.commands
         UNION ALL SELECT 'jobs', coalesce(string_agg(convert_from(job, 'UTF8') || coalesce(last_result::text, ''), ''), '') FROM apalis.jobs
         UNION ALL SELECT 'secrets left', coalesce(string_agg(command_id::text, ','), '') FROM grove.command_secrets
         UNION ALL SELECT 'projections', coalesce((SELECT string_agg(t::text, '') FROM grove.sandbox_repo_caches t), '')
                       || coalesce((SELECT string_agg(t::text, '') FROM grove.sandbox_workspaces t), '')",
    )
    .fetch_all(&env.pool)
    .await
    .unwrap();
    for (what, text) in dumps {
        if what == "secrets left" && !text.is_empty() {
            figures.leaked += 1;
            figures.note(format!("command_secrets rows left: {text}"));
        }
        places.push((what, text));
    }
    for t in [&token, &wrong] {
        for (what, text) in &places {
            if text.contains(t.as_str()) {
                figures.leaked += 1;
                figures.note(format!("a token in {what}"));
            }
        }
        for hit in files_containing(&env.home(), t.as_bytes()) {
            figures.leaked += 1;
            figures.note(format!("a token in {}", hit.display()));
        }
        // Every git config grove wrote: caches and workspaces.
        for dir in git_dirs(&env.home()) {
            let out = std::process::Command::new("git")
                .args(["config", "--list", "--show-origin"])
                .current_dir(&dir)
                .env("GIT_CONFIG_NOSYSTEM", "0")
                .output()
                .unwrap();
            if String::from_utf8_lossy(&out.stdout).contains(t.as_str()) {
                figures.leaked += 1;
                figures.note(format!("a token in the git config of {}", dir.display()));
            }
        }
    }
    replay_ok(&env, &mut figures).await;
    figures.finish("secrets");
}

/// Directories under `root` that are git repositories (bare caches, checkouts).
fn git_dirs(root: &Path) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        if d.join("HEAD").is_file() || d.join(".git").exists() {
            found.push(d.clone());
            continue;
        }
        if let Ok(rd) = std::fs::read_dir(&d) {
            for e in rd.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    stack.push(e.path());
                }
            }
        }
    }
    found
}
