//! A git smart-HTTP server on loopback that demands a token: HTTP Basic auth with user
//! `x-access-token` and the token as password (as GitHub takes it), in front of git's
//! own `git http-backend` CGI. Clones, fetches and pushes through it are real git
//! protocol exchanges; only the HTTP framing is written here.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Counts of what the server saw.
#[derive(Default)]
pub struct Seen {
    pub authorized: AtomicU64,
    pub refused: AtomicU64,
}

pub struct GitServer {
    pub base: String,
    pub seen: Arc<Seen>,
}

fn base64(input: &[u8]) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in input.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(T[(n >> (18 - 6 * i)) as usize & 63] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// The `git http-backend` program.
fn http_backend() -> Option<PathBuf> {
    let out = Command::new("git").arg("--exec-path").output().ok()?;
    let p = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()).join("git-http-backend");
    p.is_file().then_some(p)
}

impl GitServer {
    /// Serves the bare repositories under `root` to whoever presents `token`.
    pub fn start(root: &Path, token: &str) -> Result<Self, String> {
        let backend = http_backend().ok_or("git-http-backend not found")?;
        let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
        let base = format!("http://{}", listener.local_addr().unwrap());
        let expected = format!(
            "Basic {}",
            base64(format!("x-access-token:{token}").as_bytes())
        );
        let seen = Arc::new(Seen::default());
        let root = root.to_path_buf();
        let seen2 = seen.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let (root, backend, expected, seen) = (
                    root.clone(),
                    backend.clone(),
                    expected.clone(),
                    seen2.clone(),
                );
                std::thread::spawn(move || {
                    let _ = serve(stream, &root, &backend, &expected, &seen);
                });
            }
        });
        Ok(Self { base, seen })
    }
}

fn serve(
    stream: TcpStream,
    root: &Path,
    backend: &Path,
    expected: &str,
    seen: &Seen,
) -> std::io::Result<()> {
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut out = stream;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 {
            return Ok(());
        }
        let mut parts = line.split_whitespace();
        let method = parts.next().unwrap_or_default().to_string();
        let target = parts.next().unwrap_or_default().to_string();
        let mut headers = Vec::new();
        loop {
            let mut h = String::new();
            reader.read_line(&mut h)?;
            let h = h.trim_end().to_string();
            if h.is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':') {
                headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
            }
        }
        let header = |name: &str| {
            headers
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
        };
        let mut body = Vec::new();
        if header("transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked")) {
            loop {
                let mut size = String::new();
                reader.read_line(&mut size)?;
                let n = usize::from_str_radix(size.trim().split(';').next().unwrap_or("0"), 16)
                    .unwrap_or(0);
                let mut chunk = vec![0; n + 2];
                reader.read_exact(&mut chunk)?;
                if n == 0 {
                    break;
                }
                body.extend_from_slice(&chunk[..n]);
            }
        } else if let Some(len) = header("content-length").and_then(|v| v.parse::<usize>().ok()) {
            body.resize(len, 0);
            reader.read_exact(&mut body)?;
        }
        if header("authorization").as_deref() != Some(expected) {
            seen.refused.fetch_add(1, Ordering::SeqCst);
            out.write_all(
                b"HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Basic realm=\"grove-faults\"\r\nContent-Length: 0\r\n\r\n",
            )?;
            continue;
        }
        seen.authorized.fetch_add(1, Ordering::SeqCst);
        let (path, query) = target.split_once('?').unwrap_or((&target, ""));
        let mut cmd = Command::new(backend);
        cmd.env_clear()
            .env("GIT_PROJECT_ROOT", root)
            .env("GIT_HTTP_EXPORT_ALL", "1")
            .env("REQUEST_METHOD", &method)
            .env("PATH_INFO", path)
            .env("QUERY_STRING", query)
            .env("REMOTE_USER", "x-access-token")
            .env("REMOTE_ADDR", "127.0.0.1")
            .env("CONTENT_LENGTH", body.len().to_string())
            .env("PATH", std::env::var_os("PATH").unwrap_or_default());
        if let Some(ct) = header("content-type") {
            cmd.env("CONTENT_TYPE", ct);
        }
        if let Some(enc) = header("content-encoding") {
            cmd.env("HTTP_CONTENT_ENCODING", enc);
        }
        if let Some(p) = header("git-protocol") {
            cmd.env("GIT_PROTOCOL", p);
        }
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()?;
        let mut stdin = child.stdin.take().unwrap();
        let writer = std::thread::spawn(move || {
            let _ = stdin.write_all(&body);
        });
        let output = child.wait_with_output()?;
        let _ = writer.join();
        let raw = output.stdout;
        let split = raw
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .map(|i| (i, 4))
            .or_else(|| raw.windows(2).position(|w| w == b"\n\n").map(|i| (i, 2)));
        let (head, content) = match split {
            Some((i, n)) => (
                String::from_utf8_lossy(&raw[..i]).into_owned(),
                &raw[i + n..],
            ),
            None => (String::new(), &raw[..]),
        };
        let mut status = "200 OK".to_string();
        let mut response = Vec::new();
        for h in head.lines() {
            if let Some(s) = h.strip_prefix("Status:") {
                status = s.trim().to_string();
            } else if !h.trim().is_empty() {
                response.extend_from_slice(h.trim_end().as_bytes());
                response.extend_from_slice(b"\r\n");
            }
        }
        out.write_all(format!("HTTP/1.1 {status}\r\n").as_bytes())?;
        out.write_all(&response)?;
        out.write_all(format!("Content-Length: {}\r\n\r\n", content.len()).as_bytes())?;
        out.write_all(content)?;
        out.flush()?;
    }
}
