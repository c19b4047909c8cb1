//! One HTTP exchange with a grove server, body read whole: plain `http://` through
//! hyper directly, `https://` through reqwest. A CLI call is a process start and one
//! request, and reqwest's TLS stack loads the system's root certificates as it is built
//! (about 0.1 s of CPU per call on a loaded machine) even for a plain-HTTP server.
//! Neither follows a redirect: the token goes to `GROVE_URL` and nowhere else.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use reqwest::{Method, StatusCode};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// A request: its method and full URL, the headers grove's API reads, the body.
pub(crate) struct Request<'a> {
    pub method: Method,
    pub url: String,
    pub token: &'a str,
    pub content_type: Option<&'static str>,
    pub accept: Option<&'static str>,
    pub git_token: Option<(&'static str, &'a str)>,
    pub body: Option<Vec<u8>>,
}

/// What came back.
pub(crate) struct Answer {
    pub status: StatusCode,
    pub content_type: Option<String>,
    pub body: Bytes,
}

/// Why no answer came (never naming the URL or a header).
pub(crate) enum Failure {
    /// Nothing answered: connection refused, reset or timed out.
    Send(String),
    /// The answer broke off.
    Read(String),
}

/// The client of one scheme.
pub(crate) enum Wire {
    Plain(Client<HttpConnector, Full<Bytes>>),
    Tls(reqwest::Client),
}

impl Wire {
    /// A client for `scheme` (`http` or `https`).
    pub(crate) fn new(scheme: &str) -> Result<Self, String> {
        if scheme == "http" {
            let mut connector = HttpConnector::new();
            connector.set_connect_timeout(Some(CONNECT_TIMEOUT));
            connector.set_nodelay(true);
            return Ok(Self::Plain(
                Client::builder(TokioExecutor::new()).build(connector),
            ));
        }
        tls_client().map(Self::Tls)
    }

    pub(crate) async fn send(&self, req: Request<'_>) -> Result<Answer, Failure> {
        match self {
            Self::Plain(client) => plain(client, req).await,
            Self::Tls(client) => tls(client, req).await,
        }
    }
}

fn tls_client() -> Result<reqwest::Client, String> {
    reqwest::Client::builder()
        .connect_timeout(CONNECT_TIMEOUT)
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .map_err(|e| format!("HTTP client: {e}"))
}

async fn plain(
    client: &Client<HttpConnector, Full<Bytes>>,
    req: Request<'_>,
) -> Result<Answer, Failure> {
    let mut builder = hyper::Request::builder()
        .method(req.method.clone())
        .uri(&req.url)
        .header(
            hyper::header::AUTHORIZATION,
            format!("Bearer {}", req.token),
        );
    for (name, value) in headers(&req) {
        builder = builder.header(name, value);
    }
    let request = builder
        .body(Full::new(Bytes::from(req.body.unwrap_or_default())))
        .map_err(|e| Failure::Send(format!("a request could not be built: {e}")))?;
    let resp = client
        .request(request)
        .await
        .map_err(|e| Failure::Send(cause_of(&e)))?;
    let status = resp.status();
    let content_type = content_type(resp.headers());
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| Failure::Read(e.to_string()))?
        .to_bytes();
    Ok(Answer {
        status,
        content_type,
        body,
    })
}

async fn tls(client: &reqwest::Client, req: Request<'_>) -> Result<Answer, Failure> {
    let mut builder = client
        .request(req.method.clone(), &req.url)
        .bearer_auth(req.token);
    for (name, value) in headers(&req) {
        builder = builder.header(name, value);
    }
    if let Some(body) = req.body {
        builder = builder.body(body);
    }
    let resp = builder
        .send()
        .await
        .map_err(|e| Failure::Send(e.without_url().to_string()))?;
    let status = resp.status();
    let content_type = content_type(resp.headers());
    let body = resp
        .bytes()
        .await
        .map_err(|e| Failure::Read(e.without_url().to_string()))?;
    Ok(Answer {
        status,
        content_type,
        body,
    })
}

/// The request's headers besides the token.
fn headers<'a>(req: &'a Request<'_>) -> Vec<(&'a str, &'a str)> {
    let mut out = Vec::with_capacity(3);
    if let Some(ct) = req.content_type {
        out.push(("content-type", ct));
    }
    if let Some(accept) = req.accept {
        out.push(("accept", accept));
    }
    if let Some((name, value)) = req.git_token {
        out.push((name, value));
    }
    out
}

fn content_type(headers: &hyper::HeaderMap) -> Option<String> {
    headers
        .get(hyper::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

/// The innermost cause of a failed exchange (hyper-util's outer message says only
/// "client error (Connect)").
fn cause_of(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cause = e;
    while let Some(next) = cause.source() {
        cause = next;
    }
    cause.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    /// A server that answers every request with a redirect to `to`, and one at `to`
    /// that counts the connections it gets.
    async fn redirecting() -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
        let target = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let to = format!("http://{}/v1/elsewhere", target.local_addr().unwrap());
        let reached = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = reached.clone();
        tokio::spawn(async move {
            while let Ok((_sock, _)) = target.accept().await {
                counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
        });
        let front = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let from = format!("http://{}/v1/workspaces", front.local_addr().unwrap());
        tokio::spawn(async move {
            while let Ok((mut sock, _)) = front.accept().await {
                let mut buf = [0u8; 4096];
                let _ = sock.read(&mut buf).await;
                let answer = format!(
                    "HTTP/1.1 307 Temporary Redirect\r\nLocation: {to}\r\nContent-Length: 0\r\n\r\n"
                );
                let _ = sock.write_all(answer.as_bytes()).await;
            }
        });
        (from, reached)
    }

    fn request(url: &str) -> Request<'static> {
        Request {
            method: Method::GET,
            url: url.to_string(),
            token: "token-that-must-stay-home",
            content_type: None,
            accept: None,
            git_token: Some(("X-Grove-Git-Token", "git-token-too")),
            body: None,
        }
    }

    #[tokio::test]
    async fn neither_client_follows_a_redirect_with_the_token() {
        for wire in [Wire::new("http").unwrap(), Wire::Tls(tls_client().unwrap())] {
            let (from, reached) = redirecting().await;
            let Ok(answer) = wire.send(request(&from)).await else {
                panic!("the redirecting server answered nothing");
            };
            assert_eq!(answer.status, StatusCode::TEMPORARY_REDIRECT);
            tokio::time::sleep(Duration::from_millis(100)).await;
            assert_eq!(reached.load(std::sync::atomic::Ordering::SeqCst), 0);
        }
    }

    #[tokio::test]
    async fn a_refused_connection_is_a_send_failure_naming_the_cause_not_the_url() {
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let url = format!("http://127.0.0.1:{port}/v1/workspaces");
        match Wire::new("http").unwrap().send(request(&url)).await {
            Err(Failure::Send(why)) => {
                assert!(why.to_lowercase().contains("refused"), "{why}");
                assert!(!why.contains(&port.to_string()), "{why}");
            }
            _ => panic!("expected a send failure"),
        }
    }
}
