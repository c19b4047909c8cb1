//! The console's session: the bearer token in a cookie, the viewer it names, and the
//! CSRF token of its forms.
//!
//! The cookie holds the token itself (nothing is stored server-side, so any server of a
//! deployment accepts it, and rotating a token in `GROVE_API_TOKENS` signs its sessions
//! out). It is `HttpOnly` (no script reads it), `SameSite=Strict` (no other site's page
//! sends it) and `Secure` when the request came over TLS (`X-Forwarded-Proto: https`
//! from the proxy in front) or `GROVE_CONSOLE_SECURE_COOKIE=1`. A form's CSRF token is
//! SHA-256 of a fixed label and the session's token: only a page that holds the session
//! can know it, and it never reveals the token.

use std::sync::Arc;

use axum::extract::{FromRequestParts, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::Form;
use serde::Deserialize;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::templates;
use super::ConsoleError;
use crate::auth::Caller;
use crate::AppState;

/// The session cookie's name.
pub const COOKIE: &str = "grove_console";

/// The CSRF token of the session whose bearer token is `token`.
pub fn csrf_token(token: &str) -> String {
    let mut h = Sha256::new();
    h.update(b"grove.console.csrf\0");
    h.update(token.as_bytes());
    hex::encode(h.finalize())
}

/// A signed-in user of the console, and the CSRF token of their forms.
#[derive(Debug, Clone)]
pub struct Viewer {
    pub caller: Caller,
    pub csrf: String,
}

impl Viewer {
    /// Refuses a form whose CSRF token is not this session's.
    pub fn check_csrf(&self, presented: &str) -> Result<(), ConsoleError> {
        if bool::from(self.csrf.as_bytes().ct_eq(presented.as_bytes())) {
            Ok(())
        } else {
            Err(ConsoleError::Csrf)
        }
    }

    /// Refuses a user on an operators' page or action.
    pub fn require_operator(&self) -> Result<(), ConsoleError> {
        if self.caller.operator {
            Ok(())
        } else {
            Err(ConsoleError::Forbidden)
        }
    }
}

/// The value of the session cookie in these headers, if any.
fn session_token(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE)
        .map(|(_, value)| value.to_owned())
}

/// Not signed in: pages redirect to the login form.
pub struct SignInFirst;

impl IntoResponse for SignInFirst {
    fn into_response(self) -> Response {
        Redirect::to("/ui/login").into_response()
    }
}

impl FromRequestParts<Arc<AppState>> for Viewer {
    type Rejection = SignInFirst;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &Arc<AppState>,
    ) -> Result<Self, SignInFirst> {
        let token = session_token(&parts.headers).ok_or(SignInFirst)?;
        let caller = state.tokens.authenticate(&token).ok_or(SignInFirst)?;
        Ok(Viewer {
            caller,
            csrf: csrf_token(&token),
        })
    }
}

/// Refuses a POST whose `Origin` (when the browser sends one) is not this server.
pub fn check_origin(headers: &HeaderMap) -> Result<(), ConsoleError> {
    let Some(origin) = headers.get(header::ORIGIN) else {
        return Ok(());
    };
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok());
    let origin_host = origin
        .to_str()
        .ok()
        .and_then(|o| o.split_once("://"))
        .map(|(_, rest)| rest);
    match (origin_host, host) {
        (Some(o), Some(h)) if o == h => Ok(()),
        _ => Err(ConsoleError::Csrf),
    }
}

fn secure(headers: &HeaderMap) -> bool {
    let forwarded_tls = headers
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("https"));
    forwarded_tls || std::env::var("GROVE_CONSOLE_SECURE_COOKIE").is_ok_and(|v| v == "1")
}

fn cookie(value: &str, max_age: Option<u32>, secure: bool) -> String {
    let mut c = format!("{COOKIE}={value}; Path=/ui; HttpOnly; SameSite=Strict");
    if let Some(age) = max_age {
        c.push_str(&format!("; Max-Age={age}"));
    }
    if secure {
        c.push_str("; Secure");
    }
    c
}

/// The login form.
pub async fn login_form() -> Result<Html<String>, ConsoleError> {
    Ok(Html(templates::render(
        "login.html",
        minijinja::context! {},
    )?))
}

#[derive(Deserialize)]
pub struct LoginForm {
    token: String,
}

/// Signs in with a bearer token: sets the session cookie and goes to the console.
pub async fn login(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    Form(form): Form<LoginForm>,
) -> Result<Response, ConsoleError> {
    check_origin(&headers)?;
    let token = form.token.trim();
    // A token that could not travel in a cookie is no configured token either.
    let cookie_safe = token
        .bytes()
        .all(|b| b.is_ascii_graphic() && b != b';' && b != b',' && b != b'"' && b != b'\\');
    if !cookie_safe || state.tokens.authenticate(token).is_none() {
        let page = templates::render(
            "login.html",
            minijinja::context! { error => "That token is not configured on this server." },
        )?;
        return Ok((StatusCode::UNAUTHORIZED, Html(page)).into_response());
    }
    let set = cookie(token, None, secure(&headers));
    Ok(([(header::SET_COOKIE, set)], Redirect::to("/ui")).into_response())
}

#[derive(Deserialize)]
pub struct CsrfForm {
    #[serde(default)]
    pub csrf: String,
}

/// Signs out: clears the cookie.
pub async fn logout(
    viewer: Viewer,
    headers: HeaderMap,
    Form(form): Form<CsrfForm>,
) -> Result<Response, ConsoleError> {
    check_origin(&headers)?;
    viewer.check_csrf(&form.csrf)?;
    Ok((
        [(header::SET_COOKIE, cookie("", Some(0), secure(&headers)))],
        Redirect::to("/ui/login"),
    )
        .into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_session_token_is_read_from_among_other_cookies() {
        let mut h = HeaderMap::new();
        h.insert(
            header::COOKIE,
            "a=1; grove_console=tok-123; b=2".parse().unwrap(),
        );
        assert_eq!(session_token(&h).as_deref(), Some("tok-123"));
        h.insert(header::COOKIE, "grove_console_x=1".parse().unwrap());
        assert_eq!(session_token(&h), None);
    }

    #[test]
    fn csrf_tokens_differ_per_session_and_do_not_contain_the_token() {
        let a = csrf_token("aaaaaaaaaaaaaaaa");
        assert_ne!(a, csrf_token("bbbbbbbbbbbbbbbb"));
        assert!(!a.contains("aaaaaaaaaaaaaaaa"));
        assert_eq!(a.len(), 64);
    }

    #[test]
    fn another_origin_is_refused_and_the_same_one_accepted() {
        let mut h = HeaderMap::new();
        h.insert(header::HOST, "127.0.0.1:8080".parse().unwrap());
        assert!(check_origin(&h).is_ok());
        h.insert(header::ORIGIN, "http://127.0.0.1:8080".parse().unwrap());
        assert!(check_origin(&h).is_ok());
        h.insert(header::ORIGIN, "https://evil.example".parse().unwrap());
        assert!(matches!(check_origin(&h), Err(ConsoleError::Csrf)));
    }

    #[test]
    fn the_cookie_is_http_only_strict_and_secure_behind_tls() {
        let c = cookie("t", None, true);
        assert!(c.contains("HttpOnly") && c.contains("SameSite=Strict") && c.contains("Secure"));
        assert!(!cookie("t", None, false).contains("Secure"));
    }
}
