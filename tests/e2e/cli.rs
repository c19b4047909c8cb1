//! The CLI explains itself: an unreachable database fails fast, naming the cause and
//! never the password.

use std::net::TcpListener;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

const PASSWORD: &str = "s3cret-pw-do-not-print";

/// Runs `grove workspace list` against `url` with a fresh GROVE_HOME; returns the output
/// and how long it took.
fn list_with_database(url: &str) -> (Output, Duration) {
    let home = tempfile::tempdir().expect("temp home");
    let started = Instant::now();
    let out = Command::new(grove_e2e::grove_bin())
        .args(["workspace", "list"])
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("GROVE_HOME", home.path())
        .env("DATABASE_URL", url)
        .output()
        .expect("run grove");
    (out, started.elapsed())
}

fn assert_fails_fast(out: &Output, took: Duration, cause: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "stderr: {stderr}");
    assert!(took < Duration::from_secs(10), "took {took:?}: {stderr}");
    assert!(
        stderr.starts_with("grove: unavailable: cannot connect to Postgres at "),
        "{stderr}"
    );
    assert!(stderr.to_lowercase().contains(cause), "{stderr}");
    assert!(
        !stderr.contains(PASSWORD) && !stdout.contains(PASSWORD),
        "password shown: {stderr}{stdout}"
    );
}

#[test]
fn cli_closed_database_port_fails_fast_with_the_cause_and_no_password() {
    let port = {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr").port()
    };
    let url = format!("postgres://grove:{PASSWORD}@127.0.0.1:{port}/grove");
    let (out, took) = list_with_database(&url);
    assert_fails_fast(&out, took, "connection refused");
}

#[test]
fn cli_silent_database_fails_within_the_connect_timeout() {
    // Accepts connections (the kernel's backlog) but never answers the startup message.
    let silent = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = silent.local_addr().expect("addr").port();
    let url = format!("postgres://grove@127.0.0.1:{port}/grove?password={PASSWORD}");
    let (out, took) = list_with_database(&url);
    assert_fails_fast(&out, took, "no answer within");
    drop(silent);
}

/// Runs grove with no database configured at all (the commands fail before connecting).
fn grove_offline(args: &[&str]) -> (Option<i32>, String) {
    let home = tempfile::tempdir().expect("temp home");
    let out = Command::new(grove_e2e::grove_bin())
        .args(args)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("GROVE_HOME", home.path())
        .env("DATABASE_URL", "postgres://grove@127.0.0.1:1/grove")
        .output()
        .expect("run grove");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn cli_errors_share_one_format_and_exit_code() {
    // A usage error, a validation error and a bad id: each one line, kind first, exit 2.
    for (args, needle) in [
        (
            &["workspace", "list", "--no-such-flag"][..],
            "--no-such-flag",
        ),
        (
            &["exec", "not-a-uuid", "--", "true"][..],
            "invalid workspace id",
        ),
        (
            &[
                "exec",
                "00000000-0000-0000-0000-000000000001",
                "--kind",
                "fly",
                "--",
                "true",
            ][..],
            "fly",
        ),
    ] {
        let (code, stderr) = grove_offline(args);
        assert_eq!(code, Some(2), "{args:?}: {stderr}");
        assert!(
            stderr.starts_with("grove: invalid_input: "),
            "{args:?}: {stderr}"
        );
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr}");
    }
}

#[test]
fn cli_help_names_values_and_units() {
    let out = Command::new(grove_e2e::grove_bin())
        .args(["exec", "--help"])
        .output()
        .expect("run grove");
    assert_eq!(out.status.code(), Some(0));
    let help = String::from_utf8_lossy(&out.stdout);
    for needle in [
        "--timeout <SECONDS>",
        "read|write|install|test",
        "--max-output <BYTES>",
    ] {
        assert!(help.contains(needle), "{needle} missing from:\n{help}");
    }
}

#[tokio::test]
async fn cli_on_a_database_nobody_migrated_says_to_migrate() {
    let Some(env) = grove_e2e::TestEnv::unmigrated("cli_unmigrated").await else {
        return;
    };
    let out = env.grove(&["workspace", "list"]).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.starts_with("grove: unavailable: the database has no grove schema"),
        "{stderr}"
    );
    assert!(stderr.contains("grove migrate"), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    // Told, not done: the CLI did not migrate a database it was not asked to.
    let migrated: Option<String> =
        sqlx::query_scalar("SELECT to_regclass('grove.sandbox_workspaces')::text")
            .fetch_one(&env.pool)
            .await
            .expect("query");
    assert_eq!(migrated, None);
}
