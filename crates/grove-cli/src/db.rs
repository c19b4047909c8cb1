//! Connecting the CLI to Postgres: a short connect timeout, the real cause when the
//! database cannot be reached, and database URLs shown without their password.

use std::str::FromStr;
use std::time::Duration;

use anyhow::Result;
use grove_core::error::{CommandError, ErrorKind};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection, PgConnection, PgPool};

/// How long the first connection may take before the CLI gives up.
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a command waits for a free connection of an established pool.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(30);

/// A pool on `url`, after one direct connection proved the database answers. A pool
/// alone retries a failing connect until its acquire timeout and then reports only
/// that it timed out; the direct attempt fails fast and keeps the cause.
pub(crate) async fn open_pool(url: &str, max: u32) -> Result<PgPool> {
    let options = PgConnectOptions::from_str(url).map_err(|e| {
        CommandError::new(
            ErrorKind::InvalidInput,
            format!(
                "invalid database URL {}: {}",
                redact_db_url(url),
                scrub(&e.to_string(), url)
            ),
        )
    })?;
    let shown = describe(&options);
    match tokio::time::timeout(CONNECT_TIMEOUT, PgConnection::connect_with(&options)).await {
        Err(_) => {
            return Err(unavailable(format!(
                "cannot connect to Postgres at {shown}: no answer within {} s",
                CONNECT_TIMEOUT.as_secs()
            )))
        }
        Ok(Err(e)) => return Err(connect_error(&e, &shown, url)),
        Ok(Ok(conn)) => {
            let _ = conn.close().await;
        }
    }
    PgPoolOptions::new()
        .max_connections(max)
        .acquire_timeout(ACQUIRE_TIMEOUT)
        .connect_with(options)
        .await
        .map_err(|e| connect_error(&e, &shown, url))
}

fn unavailable(message: String) -> anyhow::Error {
    CommandError::new(ErrorKind::Unavailable, message).into()
}

/// A failed connect as a typed error: refused credentials are `auth_failed`, the rest
/// `unavailable`; the message names the server and the cause, never the password.
fn connect_error(e: &sqlx::Error, shown: &str, url: &str) -> anyhow::Error {
    let auth = e
        .as_database_error()
        .and_then(|d| d.code())
        .is_some_and(|code| code.starts_with("28"));
    let kind = if auth {
        ErrorKind::AuthFailed
    } else {
        ErrorKind::Unavailable
    };
    let cause = scrub(&e.to_string(), url);
    CommandError::new(
        kind,
        format!("cannot connect to Postgres at {shown}: {cause}"),
    )
    .into()
}

/// Where the options point, for messages: user, server (or socket) and database.
fn describe(options: &PgConnectOptions) -> String {
    let server = match options.get_socket() {
        Some(dir) => format!("[{}]:{}", dir.display(), options.get_port()),
        None => format!("{}:{}", options.get_host(), options.get_port()),
    };
    format!(
        "postgres://{}@{}/{}",
        options.get_username(),
        server,
        options.get_database().unwrap_or("")
    )
}

/// The URL with its password (in the userinfo or a `password=` parameter) replaced by
/// `***`.
pub(crate) fn redact_db_url(url: &str) -> String {
    let mut out = url.to_string();
    if let Some(scheme_end) = url.find("://") {
        let rest = &url[scheme_end + 3..];
        let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
        if let Some(at) = rest[..authority_end].rfind('@') {
            let userinfo = &rest[..at];
            if let Some((user, _)) = userinfo.split_once(':') {
                out = format!("{}{user}:***{}", &url[..scheme_end + 3], &rest[at..]);
            }
        }
    }
    if let Some(q) = out.find('?') {
        let (head, query) = out.split_at(q + 1);
        let params: Vec<String> = query
            .split('&')
            .map(|p| match p.split_once('=') {
                Some((k, _)) if k.eq_ignore_ascii_case("password") => format!("{k}=***"),
                _ => p.to_string(),
            })
            .collect();
        out = format!("{head}{}", params.join("&"));
    }
    out
}

/// The passwords `url` carries, as written and percent-decoded.
fn passwords(url: &str) -> Vec<String> {
    let mut found = Vec::new();
    if let Some(scheme_end) = url.find("://") {
        let rest = &url[scheme_end + 3..];
        let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
        if let Some(at) = rest[..authority_end].rfind('@') {
            if let Some((_, pw)) = rest[..at].split_once(':') {
                found.push(pw.to_string());
            }
        }
    }
    if let Some((_, query)) = url.split_once('?') {
        for p in query.split('&') {
            if let Some((k, v)) = p.split_once('=') {
                if k.eq_ignore_ascii_case("password") {
                    found.push(v.to_string());
                }
            }
        }
    }
    let decoded: Vec<String> = found.iter().map(|p| percent_decode(p)).collect();
    found.extend(decoded);
    found.retain(|p| !p.is_empty());
    found
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("");
            if let Ok(b) = u8::from_str_radix(hex, 16) {
                out.push(b);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `message` with the database URL and its password removed.
pub(crate) fn scrub(message: &str, url: &str) -> String {
    if url.is_empty() {
        return message.to_string();
    }
    let mut out = message.replace(url, &redact_db_url(url));
    for pw in passwords(url) {
        // Always where it stands as userinfo or a parameter; bare only when long enough
        // not to be an ordinary word of the message (a password like `grove`).
        out = out.replace(&format!(":{pw}@"), ":***@");
        out = out.replace(&format!("password={pw}"), "password=***");
        if pw.chars().count() >= MIN_BARE_SCRUB {
            out = out.replace(&pw, "***");
        }
    }
    out
}

/// Passwords at least this long are removed wherever they appear in a message.
const MIN_BARE_SCRUB: usize = 6;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_password_is_redacted_from_database_urls() {
        assert_eq!(
            redact_db_url("postgres://grove:s3cret@db:5432/grove"),
            "postgres://grove:***@db:5432/grove"
        );
        assert_eq!(
            redact_db_url("postgres://grove@db/grove?sslmode=require&password=s3cret"),
            "postgres://grove@db/grove?sslmode=require&password=***"
        );
        assert_eq!(redact_db_url("postgres://db/grove"), "postgres://db/grove");
    }

    #[test]
    fn messages_lose_the_url_and_the_password_in_any_form() {
        let url = "postgres://grove:p%40ssw0rd@db/grove";
        let msg = format!("failed for {url}: password p@ssw0rd rejected, p%40ssw0rd");
        let out = scrub(&msg, url);
        assert!(
            !out.contains("p@ssw0rd") && !out.contains("p%40ssw0rd"),
            "{out}"
        );
        assert!(out.contains("postgres://grove:***@db/grove"), "{out}");
    }

    #[test]
    fn a_short_password_is_scrubbed_without_mangling_the_message() {
        let url = "postgres://grove:grove@db/grove";
        let msg = "role grove: see postgres://grove:grove@db/other";
        assert_eq!(
            scrub(msg, url),
            "role grove: see postgres://grove:***@db/other"
        );
    }

    #[tokio::test]
    async fn a_closed_port_fails_fast_with_the_cause_and_no_password() {
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let url = format!("postgres://grove:s3cretpw@127.0.0.1:{port}/grove");
        let started = std::time::Instant::now();
        let err = open_pool(&url, 1).await.unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(5));
        let c = err.downcast_ref::<CommandError>().expect("typed error");
        assert_eq!(c.kind, ErrorKind::Unavailable);
        assert!(
            c.message.contains("cannot connect to Postgres"),
            "{}",
            c.message
        );
        assert!(
            c.message.to_lowercase().contains("refused"),
            "{}",
            c.message
        );
        assert!(!c.message.contains("s3cretpw"), "{}", c.message);
    }
}
