//! The console's history view (`/ui`, ADR 28 and 29) against a real `grove serve`: each
//! step's point and file counts on the timeline, a step's diff rendered escaped (hostile
//! file names and contents) and cut at its size limit, tenancy (another user's diff is
//! the 404 of a missing one), and the operators' rewind and fork through their
//! confirmation pages: users get 403, a form without its CSRF token or from another
//! origin changes nothing, and typed errors (a running command, an unknown point, a
//! fork scope that exists) are shown.

use grove_e2e::http::{Server, ALICE, BOB, OPS};
use reqwest::StatusCode;
use serde_json::json;

use crate::console::{csrf, page, post_form};
use crate::env_or_skip;

async fn write(server: &Server, ws: &str, path: &str, content: &str) {
    let (status, body) = server
        .post(
            &format!("/v1/workspaces/{ws}/tools/write_file"),
            ALICE,
            json!({"path": path, "content": content}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
}

async fn exec(server: &Server, ws: &str, script: &str) {
    let (status, body) = server
        .post(
            &format!("/v1/workspaces/{ws}/exec"),
            ALICE,
            json!({"argv": ["sh", "-c", script]}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["exit_code"], 0, "{body}");
}

async fn read(server: &Server, ws: &str, path: &str) -> String {
    let (status, body) = server
        .post(
            &format!("/v1/workspaces/{ws}/tools/read_file"),
            ALICE,
            json!({"path": path}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    body["content"].as_str().unwrap().to_owned()
}

async fn count(env: &grove_e2e::TestEnv, sql: &'static str) -> i64 {
    sqlx::query_scalar::<_, i64>(sql)
        .fetch_one(&env.pool)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn each_step_shows_its_point_and_its_diff_escaped_and_bounded_to_its_owner_only() {
    let env = env_or_skip!(
        "each_step_shows_its_point_and_its_diff_escaped_and_bounded_to_its_owner_only"
    );
    let url = env.fixture_repo("fixture", &[("README.md", "hello\n")]);
    let server = Server::start(&env).await;
    let ws = server.acquire(ALICE, &url, "history-view").await;

    // Point 1: a file whose name and content carry markup. Point 2: a command that
    // changes one file and adds one larger than the page shows.
    let hostile = "<img src=x onerror=alert(1)>.txt";
    write(&server, &ws, hostile, "<script>alert('content')</script>\n").await;
    exec(
        &server,
        &ws,
        "echo more >> README.md; i=0; while [ $i -lt 4000 ]; do echo \"line $i of a big file, padded to a hundred bytes or so ........................\"; i=$((i+1)); done > big.txt",
    )
    .await;

    let (status, html) = page(&server, &format!("/ui/workspaces/{ws}"), Some(ALICE)).await;
    assert_eq!(status, StatusCode::OK);
    for n in 0..3 {
        assert!(
            html.contains(&format!("id=\"point-{n}\"")),
            "point {n}: {html}"
        );
        assert_eq!(
            html.contains(&format!("/ui/workspaces/{ws}/points/{n}/diff")),
            n > 0,
            "a diff link on each point but the first: {n}"
        );
    }
    assert!(html.contains("1 added, 0 modified, 0 deleted"), "{html}");
    assert!(html.contains("1 added, 1 modified, 0 deleted"), "{html}");
    assert!(!html.contains("rewind-1"), "a user sees no rewind button");
    assert!(!html.contains("<img src=x"), "the file name is escaped");
    let (_, ops_html) = page(&server, &format!("/ui/workspaces/{ws}"), Some(OPS)).await;
    assert!(
        ops_html.contains("id=\"rewind-1\"") && ops_html.contains("id=\"fork-1\""),
        "an operator sees the buttons"
    );

    // Point 1's diff: the hostile name and content, escaped.
    let (status, diff) = page(
        &server,
        &format!("/ui/workspaces/{ws}/points/1/diff"),
        Some(ALICE),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{diff}");
    assert!(
        diff.contains("What changed from point 0 to point 1: 1 file."),
        "{diff}"
    );
    assert!(
        diff.contains("&lt;img src=x onerror=alert(1)&gt;.txt"),
        "{diff}"
    );
    assert!(diff.contains("+&lt;script&gt;alert("), "{diff}");
    assert!(!diff.contains("<img src=x"), "no markup from a file name");
    assert!(
        !diff.contains("<script>alert"),
        "no markup from a file's content"
    );
    assert!(!diff.contains("id=\"diff-cut\""), "a small diff is whole");

    // Point 2's diff is larger than the page shows: cut, and it says so.
    let (status, diff) = page(
        &server,
        &format!("/ui/workspaces/{ws}/points/2/diff"),
        Some(ALICE),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        diff.contains("<td class=\"modified\">modified</td><td class=\"mono path\">README.md</td>"),
        "{diff}"
    );
    assert!(diff.contains("+more"), "{diff}");
    assert!(diff.contains("id=\"diff-cut\""), "cut, and said so");
    assert!(!diff.contains("line 3999 of a big file"), "past the cut");
    assert!(diff.len() < 400 * 1024, "bounded: {} bytes", diff.len());

    // The creation has nothing before it.
    let (status, first) = page(
        &server,
        &format!("/ui/workspaces/{ws}/points/0/diff"),
        Some(ALICE),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert!(first.contains("id=\"no-previous\""), "{first}");

    // An unknown point is a typed 404; another user's workspace, a missing one and a
    // malformed point are 404 too, and none of them runs anything.
    let (status, unknown) = page(
        &server,
        &format!("/ui/workspaces/{ws}/points/99/diff"),
        Some(ALICE),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(unknown.contains("not_found"), "{unknown}");
    let tools = count(
        &env,
        "SELECT count(*) FROM grove.commands WHERE kind = 'tool'",
    )
    .await;
    let missing = uuid::Uuid::now_v7();
    for path in [
        format!("/ui/workspaces/{ws}/points/1/diff"),
        format!("/ui/workspaces/{missing}/points/1/diff"),
        format!("/ui/workspaces/{ws}/points/x/diff"),
    ] {
        let token = if path.contains(&ws) && !path.contains("/x/") {
            BOB
        } else {
            ALICE
        };
        let (status, body) = page(&server, &path, Some(token)).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{path}");
        assert!(
            !body.contains("onerror"),
            "{path}: nothing of the workspace"
        );
    }
    assert_eq!(
        count(
            &env,
            "SELECT count(*) FROM grove.commands WHERE kind = 'tool'"
        )
        .await,
        tools,
        "a refused diff submits no command"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_operator_rewinds_and_forks_after_confirming_and_users_and_forged_forms_change_nothing()
{
    let env = env_or_skip!(
        "an_operator_rewinds_and_forks_after_confirming_and_users_and_forged_forms_change_nothing"
    );
    let url = env.fixture_repo("fixture", &[("README.md", "hello\n")]);
    let server = Server::start(&env).await;
    let ws = server.acquire(ALICE, &url, "history-actions").await;
    exec(&server, &ws, "echo v1 > f.txt").await; // point 1
    exec(&server, &ws, "echo v2 > f.txt").await; // point 2

    let ops = csrf(OPS);
    let rewind = format!("/ui/workspaces/{ws}/points/1/rewind");
    let rewind_confirm = format!("{rewind}/confirm");
    let fork = format!("/ui/workspaces/{ws}/points/1/fork");
    let fork_confirm = format!("{fork}/confirm");
    let snapshots =
        "SELECT count(*) FROM grove.events WHERE event_type = 'workspace.snapshot_taken'";
    let before = (
        count(
            &env,
            "SELECT count(*) FROM grove.commands WHERE kind = 'tool'",
        )
        .await,
        count(&env, snapshots).await,
        count(&env, "SELECT count(*) FROM grove.sandbox_workspaces").await,
    );
    // A user (with her own valid token), no token, another session's token, another
    // origin: 403, and nothing is submitted.
    let refused = [
        (ALICE, format!("csrf={}", csrf(ALICE)), None),
        (OPS, String::new(), None),
        (OPS, format!("csrf={}", csrf(ALICE)), None),
        (OPS, format!("csrf={ops}"), Some("https://evil.example")),
    ];
    for (token, body, origin) in &refused {
        for path in [&rewind, &rewind_confirm, &fork, &fork_confirm] {
            let body = format!("{body}&scope=forged-fork");
            let resp = post_form(&server, path, Some(token), &body, *origin).await;
            assert_eq!(
                resp.status(),
                StatusCode::FORBIDDEN,
                "{path} {body} {origin:?}"
            );
        }
    }
    let after = (
        count(
            &env,
            "SELECT count(*) FROM grove.commands WHERE kind = 'tool'",
        )
        .await,
        count(&env, snapshots).await,
        count(&env, "SELECT count(*) FROM grove.sandbox_workspaces").await,
    );
    assert_eq!(before, after, "no refused form ran anything");
    assert_eq!(read(&server, &ws, "f.txt").await, "v2\n");

    // Step 1 only asks.
    let resp = post_form(&server, &rewind, Some(OPS), &format!("csrf={ops}"), None).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let ask = resp.text().await.unwrap();
    assert!(
        ask.contains("Rewind workspace") && ask.contains(&rewind_confirm),
        "{ask}"
    );
    assert!(ask.contains("id=\"confirm-rewind\""), "{ask}");
    assert_eq!(
        read(&server, &ws, "f.txt").await,
        "v2\n",
        "asking changed nothing"
    );

    // Step 2 rewinds, as ops: the new point is shown and the files are back.
    let resp = post_form(
        &server,
        &rewind_confirm,
        Some(OPS),
        &format!("csrf={ops}"),
        None,
    )
    .await;
    assert_eq!(resp.status(), StatusCode::OK);
    let done = resp.text().await.unwrap();
    assert!(done.contains("id=\"new-point\">3<"), "{done}");
    assert_eq!(read(&server, &ws, "f.txt").await, "v1\n");
    assert_eq!(
        count(
            &env,
            "SELECT count(*) FROM grove.command_requesters r JOIN grove.commands c USING (command_id)
             WHERE r.requested_by = 'ops' AND r.via = 'console' AND c.payload ->> 'op' = 'rewind'"
        )
        .await,
        1,
        "the operator is recorded as the requester"
    );
    let (_, timeline) = page(&server, &format!("/ui/workspaces/{ws}"), Some(ALICE)).await;
    assert!(timeline.contains("rewound to point 1"), "{timeline}");
    assert!(
        timeline.contains("asked for by ops from the console"),
        "{timeline}"
    );

    // Typed errors: an unknown point (404), a command running (409); nothing changes.
    let resp = post_form(
        &server,
        &format!("/ui/workspaces/{ws}/points/99/rewind/confirm"),
        Some(OPS),
        &format!("csrf={ops}"),
        None,
    )
    .await;
    assert_eq!(resp.status(), StatusCode::NOT_FOUND);
    assert!(resp.text().await.unwrap().contains("not_found"));
    let running = {
        let server_url = server.url(&format!("/v1/workspaces/{ws}/exec"));
        tokio::spawn(async move {
            reqwest::Client::new()
                .post(server_url)
                .bearer_auth(ALICE)
                .json(&json!({"argv": ["sh", "-c", "sleep 6; echo v3 > f.txt"]}))
                .send()
                .await
                .unwrap()
                .status()
        })
    };
    let started = "SELECT count(*) FROM grove.events WHERE event_type = 'exec.started'";
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while count(&env, started).await < 3 {
        assert!(
            std::time::Instant::now() < deadline,
            "the sleep never started"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let resp = post_form(
        &server,
        &rewind_confirm,
        Some(OPS),
        &format!("csrf={ops}"),
        None,
    )
    .await;
    assert_eq!(resp.status(), StatusCode::CONFLICT);
    assert!(resp.text().await.unwrap().contains("conflict: "), "typed");
    assert_eq!(running.await.unwrap(), StatusCode::OK);
    assert_eq!(
        read(&server, &ws, "f.txt").await,
        "v3\n",
        "the refused rewind did nothing"
    );

    // Fork at point 1 under a new scope: asked, confirmed, and a workspace of alice's
    // with point 1's files; the source keeps its own. A scope that exists is a 409.
    let bad = post_form(
        &server,
        &fork,
        Some(OPS),
        &format!("csrf={ops}&scope=..%2Fescape"),
        None,
    )
    .await;
    assert_eq!(bad.status(), StatusCode::BAD_REQUEST);
    let resp = post_form(
        &server,
        &fork,
        Some(OPS),
        &format!("csrf={ops}&scope=second-attempt"),
        None,
    )
    .await;
    assert_eq!(resp.status(), StatusCode::OK);
    let ask = resp.text().await.unwrap();
    assert!(ask.contains("id=\"fork-scope\">second-attempt<"), "{ask}");
    let form = format!("csrf={ops}&scope=second-attempt");
    let resp = post_form(&server, &fork_confirm, Some(OPS), &form, None).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let done = resp.text().await.unwrap();
    let fork_id = done
        .split("id=\"fork-link\" href=\"/ui/workspaces/")
        .nth(1)
        .and_then(|rest| rest.get(..36))
        .unwrap_or_else(|| panic!("a link to the fork: {done}"))
        .to_owned();
    let (status, fork) = server
        .get(&format!("/v1/workspaces/{fork_id}"), ALICE)
        .await;
    assert_eq!(status, StatusCode::OK, "the fork is alice's: {fork}");
    assert_eq!(read(&server, &fork_id, "f.txt").await, "v1\n");
    assert_eq!(
        read(&server, &ws, "f.txt").await,
        "v3\n",
        "the source is unchanged"
    );
    let (status, fork_page) = page(&server, &format!("/ui/workspaces/{fork_id}"), Some(OPS)).await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        fork_page.contains(&format!("forked from workspace {ws} at point 1")),
        "{fork_page}"
    );
    let again = post_form(&server, &fork_confirm, Some(OPS), &form, None).await;
    assert_eq!(again.status(), StatusCode::CONFLICT);
}
