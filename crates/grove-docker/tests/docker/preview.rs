//! Preview URLs of the Docker runtime: an HTTP server in a container with network
//! `default` answers through `http://127.0.0.1:<port>`; a runtime with network `none`
//! is refused with the reason; the URL stops answering when the runtime stops.

use std::time::{Duration, Instant};

use grove_core::error::RuntimeError;
use grove_core::ports::{NetworkPolicy, PreviewRequest, RuntimeProvider, SessionRequest};

use crate::support::{chown_tree, env_or_skip, TEST_UID};

/// `GET /index.html` over HTTP/1.0 through `url` (`http://127.0.0.1:<port>`): the
/// whole answer, or the I/O error.
async fn get(url: &str) -> std::io::Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = url.strip_prefix("http://").expect("an http URL");
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    s.write_all(b"GET /index.html HTTP/1.0\r\nHost: preview\r\n\r\n")
        .await?;
    let mut out = Vec::new();
    s.read_to_end(&mut out).await?;
    Ok(String::from_utf8_lossy(&out).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_server_in_a_runtime_with_network_answers_through_its_loopback_preview_url() {
    let Some(env) = env_or_skip(
        "an_http_server_in_a_runtime_with_network_answers_through_its_loopback_preview_url",
    )
    .await
    else {
        return;
    };
    let ws = env.workspace("preview");
    let token = grove_runtime_contract::unique_token();
    std::fs::write(ws.join("index.html"), format!("preview-{token}\n")).unwrap();
    chown_tree(&ws, TEST_UID, TEST_UID);
    let spec = env.spec_for(&ws, false, NetworkPolicy::Default, "preview");
    let backend_id = env.provider.backend_id(&spec);
    let sessions = env.provider.sessions().expect("sessions");
    let server = sessions
        .start(
            spec,
            SessionRequest {
                argv: ["httpd", "-f", "-p", "8080", "-h", "."]
                    .map(String::from)
                    .to_vec(),
                ..SessionRequest::default()
            },
        )
        .await
        .expect("busybox httpd in a session");

    let previews = env.provider.preview_urls().expect("preview URLs");
    let url = previews
        .expose(PreviewRequest {
            backend_id: backend_id.clone(),
            port: 8080,
        })
        .await
        .expect("expose 8080");
    assert_eq!(url.port, 8080);
    assert!(url.url.starts_with("http://127.0.0.1:"), "{}", url.url);

    // The server may take a moment to listen.
    let deadline = Instant::now() + Duration::from_secs(20);
    let answer = loop {
        match get(&url.url).await {
            Ok(a) if a.contains(&token) => break a,
            other => {
                assert!(
                    Instant::now() < deadline,
                    "no answer through {}: {other:?}",
                    url.url
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    assert!(
        answer.starts_with("HTTP/1.") && answer.lines().next().is_some_and(|l| l.contains(" 200")),
        "{answer}"
    );
    let again = previews
        .expose(PreviewRequest {
            backend_id: backend_id.clone(),
            port: 8080,
        })
        .await
        .unwrap();
    assert_eq!(again, url, "exposing a port twice gives the same URL");

    RuntimeProvider::stop(&env.provider, &backend_id)
        .await
        .expect("stop");
    // The relay closes with the runtime: its loopback port stops accepting.
    let deadline = Instant::now() + Duration::from_secs(5);
    while get(&url.url).await.is_ok() {
        assert!(
            Instant::now() < deadline,
            "the preview outlived its runtime"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    let exit = loop {
        let out = sessions
            .poll(&server.id, Duration::from_millis(500))
            .await
            .unwrap();
        if out.exit.is_some() || Instant::now() >= deadline {
            break out.exit;
        }
    };
    assert!(
        exit.as_ref().is_some_and(|e| e.killed),
        "the server ended with its runtime: {exit:?}"
    );
    assert!(matches!(
        previews
            .expose(PreviewRequest {
                backend_id: backend_id.clone(),
                port: 8080,
            })
            .await,
        Err(RuntimeError::CommandRejected(m)) if m.contains("not running")
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_port_of_a_runtime_with_network_none_or_of_an_unknown_runtime_is_refused() {
    let Some(env) =
        env_or_skip("a_port_of_a_runtime_with_network_none_or_of_an_unknown_runtime_is_refused")
            .await
    else {
        return;
    };
    let ws = env.workspace("preview-none");
    let spec = env.spec_for(&ws, false, NetworkPolicy::None, "preview-none");
    let backend_id = env.provider.backend_id(&spec);
    env.provider.create(spec).await.expect("create");
    let previews = env.provider.preview_urls().expect("preview URLs");
    match previews
        .expose(PreviewRequest {
            backend_id: backend_id.clone(),
            port: 8080,
        })
        .await
    {
        Err(RuntimeError::CommandRejected(m)) => {
            assert!(m.contains("network none"), "the reason is named: {m}")
        }
        other => panic!("network none must be refused, got {other:?}"),
    }
    assert!(matches!(
        previews
            .expose(PreviewRequest {
                backend_id,
                port: 0
            })
            .await,
        Err(RuntimeError::CommandRejected(_))
    ));
    assert!(matches!(
        previews
            .expose(PreviewRequest {
                backend_id: format!(
                    "grove-rt-no-such-{}",
                    grove_runtime_contract::unique_token()
                ),
                port: 8080,
            })
            .await,
        Err(RuntimeError::NotFound(_))
    ));
}
