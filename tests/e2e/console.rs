//! The operator console (`/ui`) over HTTP against a real `grove serve`: sign-in, tenancy,
//! kept output on the timeline, and the attacks: no cookie, a forged or another user's
//! cookie, a form without its CSRF token or from another origin, and markup in argv,
//! output and file names (rendered escaped). The browser tests are tests/console_browser.

use grove_e2e::http::{Server, ALICE, BOB, OPS};
use reqwest::header::{CONTENT_TYPE, COOKIE, LOCATION, ORIGIN, SET_COOKIE};
use reqwest::StatusCode;
use serde_json::json;

use crate::env_or_skip;

pub(crate) fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

/// The CSRF token the console puts in the forms of the session of `token`.
pub(crate) fn csrf(token: &str) -> String {
    use sha2::Digest;
    let mut h = sha2::Sha256::new();
    h.update(b"grove.console.csrf\0");
    h.update(token.as_bytes());
    hex::encode(h.finalize())
}

fn session(token: &str) -> String {
    format!("grove_console={token}")
}

pub(crate) async fn page(server: &Server, path: &str, token: Option<&str>) -> (StatusCode, String) {
    let mut req = client().get(server.url(path));
    if let Some(t) = token {
        req = req.header(COOKIE, session(t));
    }
    let resp = req.send().await.unwrap();
    let status = resp.status();
    let location = resp
        .headers()
        .get(LOCATION)
        .map(|l| l.to_str().unwrap().to_owned());
    let body = resp.text().await.unwrap();
    (status, location.unwrap_or(body))
}

pub(crate) async fn post_form(
    server: &Server,
    path: &str,
    token: Option<&str>,
    body: &str,
    origin: Option<&str>,
) -> reqwest::Response {
    let mut req = client()
        .post(server.url(path))
        .header(CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(body.to_owned());
    if let Some(t) = token {
        req = req.header(COOKIE, session(t));
    }
    if let Some(o) = origin {
        req = req.header(ORIGIN, o);
    }
    req.send().await.unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_console_signs_in_with_a_token_and_keeps_it_in_a_strict_http_only_cookie() {
    let env =
        env_or_skip!("the_console_signs_in_with_a_token_and_keeps_it_in_a_strict_http_only_cookie");
    let server = Server::start(&env).await;

    // No cookie, or a forged one: every page sends you to the login form.
    for path in ["/ui", "/ui/fleet", "/ui/workspaces", "/ui/events"] {
        let (status, location) = page(&server, path, None).await;
        assert_eq!(
            (status, location.as_str()),
            (StatusCode::SEE_OTHER, "/ui/login"),
            "{path}"
        );
        let (status, location) = page(&server, path, Some("forged-token-0123456789")).await;
        assert_eq!(
            (status, location.as_str()),
            (StatusCode::SEE_OTHER, "/ui/login"),
            "{path}"
        );
    }
    let resp = client().get(server.url("/ui/login")).send().await.unwrap();
    let csp = resp.headers()["content-security-policy"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(
        csp.contains("frame-ancestors 'none'") && csp.contains("script-src 'self'"),
        "{csp}"
    );
    assert_eq!(resp.headers()["x-frame-options"], "DENY");

    // A wrong token is refused without being echoed.
    let bad = post_form(
        &server,
        "/ui/login",
        None,
        "token=not-a-configured-token-xyz",
        None,
    )
    .await;
    assert_eq!(bad.status(), StatusCode::UNAUTHORIZED);
    assert!(bad.headers().get(SET_COOKIE).is_none());
    assert!(!bad
        .text()
        .await
        .unwrap()
        .contains("not-a-configured-token-xyz"));
    // From another origin, even a right token is refused.
    let cross = post_form(
        &server,
        "/ui/login",
        None,
        &format!("token={OPS}"),
        Some("https://evil.example"),
    )
    .await;
    assert_eq!(cross.status(), StatusCode::FORBIDDEN);

    let ok = post_form(&server, "/ui/login", None, &format!("token={OPS}"), None).await;
    assert_eq!(ok.status(), StatusCode::SEE_OTHER);
    let cookie = ok.headers()[SET_COOKIE].to_str().unwrap().to_owned();
    assert!(cookie.starts_with(&session(OPS)), "{cookie}");
    for attr in ["HttpOnly", "SameSite=Strict", "Path=/ui"] {
        assert!(cookie.contains(attr), "{attr} in {cookie}");
    }
    assert!(!cookie.contains("Secure"), "plain HTTP: {cookie}");
    let tls = client()
        .post(server.url("/ui/login"))
        .header(CONTENT_TYPE, "application/x-www-form-urlencoded")
        .header("x-forwarded-proto", "https")
        .body(format!("token={OPS}"))
        .send()
        .await
        .unwrap();
    assert!(tls.headers()[SET_COOKIE]
        .to_str()
        .unwrap()
        .contains("; Secure"));

    // The operator lands on Fleet, which names the in-process worker; the page never
    // carries the token.
    assert_eq!(page(&server, "/ui", Some(OPS)).await.1, "/ui/fleet");
    // The in-process worker registers as the server starts: give it a moment.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let (status, fleet) = loop {
        let (status, fleet) = page(&server, "/ui/fleet", Some(OPS)).await;
        if fleet.contains("grove:node:") || std::time::Instant::now() > deadline {
            break (status, fleet);
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    };
    assert_eq!(status, StatusCode::OK);
    assert!(
        fleet.contains("grove:node:"),
        "the worker's queues: {fleet}"
    );
    assert!(!fleet.contains(OPS), "the token is not on the page");
    // A user is not an operator: Fleet and Events answer 403, Workspaces is theirs.
    assert_eq!(page(&server, "/ui", Some(ALICE)).await.1, "/ui/workspaces");
    assert_eq!(
        page(&server, "/ui/fleet", Some(ALICE)).await.0,
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        page(&server, "/ui/events", Some(ALICE)).await.0,
        StatusCode::FORBIDDEN
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_timeline_shows_kept_output_escaped_to_its_owner_only_and_forms_need_their_csrf_token()
{
    let env = env_or_skip!(
        "the_timeline_shows_kept_output_escaped_to_its_owner_only_and_forms_need_their_csrf_token"
    );
    let url = env.fixture_repo("fixture", &[("README.md", "hello\n")]);
    let server = Server::start(&env).await;
    let ws = server.acquire(ALICE, &url, "console").await;

    // A command whose argv and output carry markup, one that asks not to keep its
    // output, and a file written under a name with markup.
    let evil = "<script>alert('argv')</script>";
    let (status, body) = server
        .post(
            &format!("/v1/workspaces/{ws}/exec"),
            ALICE,
            json!({"argv": ["sh", "-c", format!("echo 'kept-output-1 <img src=x onerror=alert(1)>'; echo '{evil}' >/dev/null")]}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, body) = server
        .post(
            &format!("/v1/workspaces/{ws}/exec"),
            ALICE,
            json!({"argv": ["echo", "secret-output-2"], "keep_output": false}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        body["stdout"], "secret-output-2\n",
        "the caller still gets it"
    );
    let (status, body) = server
        .post(
            &format!("/v1/workspaces/{ws}/tools/write_file"),
            ALICE,
            json!({"path": "<script>file</script>.txt", "content": "x"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");

    let (status, html) = page(&server, &format!("/ui/workspaces/{ws}"), Some(ALICE)).await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        html.contains("<pre class=\"out stdout\">kept-output-1 &lt;img src=x onerror=alert(1)&gt;"),
        "{html}"
    );
    assert!(!html.contains("<img src=x"), "output is escaped");
    assert!(!html.contains("<script>alert"), "argv is escaped");
    assert!(html.contains("&lt;script&gt;alert("), "argv is shown");
    assert!(!html.contains("<script>file"), "file names are escaped");
    assert!(
        html.contains("&lt;script&gt;file&lt;&#x2f;script&gt;.txt"),
        "{html}"
    );
    assert!(!html.contains("secret-output-2\n</pre>"), "not kept");
    assert!(html.contains("output not kept"), "{html}");
    assert!(html.contains("<dt>writable</dt><dd>yes</dd>"), "{html}");

    // Past its retention the output is blanked on the ledger; the step stays.
    let pruned = grove_postgres::output::prune_kept(&env.pool, std::time::Duration::ZERO)
        .await
        .unwrap();
    assert!(pruned >= 2, "both execs' output blanked: {pruned}");
    let (_, html) = page(&server, &format!("/ui/workspaces/{ws}"), Some(ALICE)).await;
    assert!(
        !html.contains("<pre class=\"out stdout\">kept-output-1"),
        "pruned"
    );
    assert!(
        html.contains("output pruned") && html.contains("exit 0"),
        "{html}"
    );

    // Another user: the same 404 as a workspace that does not exist; an operator sees it.
    let (status, html) = page(&server, &format!("/ui/workspaces/{ws}"), Some(BOB)).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(!html.contains("kept-output-1"));
    let missing = uuid::Uuid::now_v7();
    assert_eq!(
        page(&server, &format!("/ui/workspaces/{missing}"), Some(BOB))
            .await
            .0,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        page(
            &server,
            &format!("/ui/workspaces/{ws}/timeline?after=0"),
            Some(BOB)
        )
        .await
        .0,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        page(&server, &format!("/ui/workspaces/{ws}/follow"), Some(BOB))
            .await
            .0,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        page(&server, &format!("/ui/workspaces/{ws}"), Some(OPS))
            .await
            .0,
        StatusCode::OK
    );
    let (_, bobs) = page(&server, "/ui/workspaces", Some(BOB)).await;
    assert!(
        !bobs.contains(&ws[..8]),
        "bob's list has no alice workspace"
    );
    let (_, ops) = page(&server, "/ui/workspaces", Some(OPS)).await;
    assert!(
        ops.contains(&ws[..8]) && ops.contains("disk-chart"),
        "{ops}"
    );
    // Searched by an id's start or by any part of the user, in any case.
    for q in [&ws[..8], &ws[..8].to_uppercase(), "LIC", ws.as_str()] {
        let (_, found) = page(&server, &format!("/ui/workspaces?q={q}"), Some(OPS)).await;
        assert!(
            found.contains(&format!("/ui/workspaces/{ws}")),
            "{q}: {found}"
        );
    }
    let (_, none) = page(&server, "/ui/workspaces?q=nobody-xyz", Some(OPS)).await;
    assert!(!none.contains(&format!("/ui/workspaces/{ws}")) && none.contains("0 workspaces"));

    // replay --verify: refused without the CSRF token, with another session's, from
    // another origin, and to a user; run with it.
    let ops_csrf = csrf(OPS);
    for (token, body, origin) in [
        (OPS, String::new(), None),
        (OPS, format!("csrf={}", csrf(ALICE)), None),
        (
            OPS,
            format!("csrf={ops_csrf}"),
            Some("https://evil.example"),
        ),
        (ALICE, format!("csrf={}", csrf(ALICE)), None),
    ] {
        let resp = post_form(&server, "/ui/events/verify", Some(token), &body, origin).await;
        assert_eq!(resp.status(), StatusCode::FORBIDDEN, "{body} {origin:?}");
    }
    let runs = || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM grove.replay_verifications")
            .fetch_one(&env.pool)
            .await
            .unwrap()
    };
    assert_eq!(runs().await, 0, "no refused form ran anything");
    let resp = post_form(
        &server,
        "/ui/events/verify",
        Some(OPS),
        &format!("csrf={ops_csrf}"),
        None,
    )
    .await;
    assert_eq!(resp.status(), StatusCode::SEE_OTHER);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let (_, events) = page(&server, "/ui/events", Some(OPS)).await;
        if events.contains(" 0 differences") {
            assert!(events.contains("exec.finished"), "{events}");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "verification result: {events}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    // Signing out needs the token too.
    let resp = post_form(&server, "/ui/logout", Some(ALICE), "csrf=nope", None).await;
    assert_eq!(resp.status(), StatusCode::FORBIDDEN);
}
