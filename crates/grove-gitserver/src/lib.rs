//! A git smart-HTTP server on loopback for tests and benchmarks: git's own
//! `git http-backend` CGI behind a small HTTP/1.1 front written here (std only), so
//! clones and fetches through it are real protocol exchanges over a real socket.
//!
//! Knobs for what tests need from a remote: a token demanded as HTTP Basic auth
//! (`x-access-token`, as GitHub takes it), a throttle on response bytes (a slow clone
//! whose progress can be watched), a cut after N body bytes (a connection that dies
//! mid-pack), and a redirect of every request to another URL.
//!
//! Not for production: one thread per connection, no TLS, no limits on request size
//! beyond what the tests send.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How the server behaves.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Demand `Authorization: Basic base64(x-access-token:<token>)`.
    pub token: Option<String>,
    /// At most this many response body bytes per second, per connection.
    pub throttle_bytes_per_sec: Option<u64>,
    /// Close the connection after this many body bytes of a POST (the pack), without
    /// finishing the response.
    pub cut_after_bytes: Option<u64>,
    /// Answer every request with `301 Moved Permanently` to this base URL.
    pub redirect_to: Option<String>,
}

/// Counts of what the server saw.
#[derive(Debug, Default)]
pub struct Seen {
    pub requests: AtomicU64,
    pub authorized: AtomicU64,
    pub refused: AtomicU64,
}

impl Seen {
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::SeqCst)
    }
}

/// A running server; its threads live until the process exits.
pub struct GitServer {
    /// `http://127.0.0.1:<port>`; a repository `<root>/a/b.git` is `<base>/a/b.git`.
    pub base: String,
    pub seen: Arc<Seen>,
}

/// The `git http-backend` program of the git on `PATH`, if there is one.
pub fn http_backend() -> Option<PathBuf> {
    let out = Command::new("git").arg("--exec-path").output().ok()?;
    let p = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()).join("git-http-backend");
    p.is_file().then_some(p)
}

impl GitServer {
    /// Serves the bare repositories under `root`.
    pub fn start(root: &Path, options: Options) -> Result<Self, String> {
        let backend = http_backend().ok_or("git-http-backend not found (is git installed?)")?;
        let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
        let base = format!(
            "http://{}",
            listener.local_addr().map_err(|e| e.to_string())?
        );
        let seen = Arc::new(Seen::default());
        let site = Arc::new(Site {
            root: root.to_path_buf(),
            backend,
            expected: options
                .token
                .as_ref()
                .map(|t| format!("Basic {}", base64(format!("x-access-token:{t}").as_bytes()))),
            options,
            seen: seen.clone(),
        });
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let site = site.clone();
                std::thread::spawn(move || {
                    let _ = site.serve(stream);
                });
            }
        });
        Ok(Self { base, seen })
    }
}

struct Site {
    root: PathBuf,
    backend: PathBuf,
    expected: Option<String>,
    options: Options,
    seen: Arc<Seen>,
}

/// One parsed request.
struct Request {
    method: String,
    target: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Request {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

impl Site {
    fn serve(&self, stream: TcpStream) -> std::io::Result<()> {
        let mut reader = BufReader::new(stream.try_clone()?);
        let mut out = stream;
        while let Some(req) = read_request(&mut reader)? {
            self.seen.requests.fetch_add(1, Ordering::SeqCst);
            if let Some(to) = &self.options.redirect_to {
                let head = format!(
                    "HTTP/1.1 301 Moved Permanently\r\nLocation: {to}{}\r\nContent-Length: 0\r\n\r\n",
                    req.target
                );
                out.write_all(head.as_bytes())?;
                continue;
            }
            if self.expected.is_some() && req.header("authorization") != self.expected.as_deref() {
                self.seen.refused.fetch_add(1, Ordering::SeqCst);
                out.write_all(
                    b"HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Basic realm=\"grove\"\r\nContent-Length: 0\r\n\r\n",
                )?;
                continue;
            }
            self.seen.authorized.fetch_add(1, Ordering::SeqCst);
            if !self.backend_response(req, &mut out)? {
                return Ok(());
            }
        }
        Ok(())
    }

    /// Runs the CGI for `req` and streams its answer (chunked); false when the
    /// connection was cut on purpose.
    fn backend_response(&self, req: Request, out: &mut TcpStream) -> std::io::Result<bool> {
        let (path, query) = req.target.split_once('?').unwrap_or((&req.target, ""));
        let mut cmd = Command::new(&self.backend);
        cmd.env_clear()
            .env("GIT_PROJECT_ROOT", &self.root)
            .env("GIT_HTTP_EXPORT_ALL", "1")
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .env("REQUEST_METHOD", &req.method)
            .env("PATH_INFO", path)
            .env("QUERY_STRING", query)
            .env("REMOTE_USER", "x-access-token")
            .env("REMOTE_ADDR", "127.0.0.1")
            .env("CONTENT_LENGTH", req.body.len().to_string())
            .env("PATH", std::env::var_os("PATH").unwrap_or_default());
        for (header, var) in [
            ("content-type", "CONTENT_TYPE"),
            ("content-encoding", "HTTP_CONTENT_ENCODING"),
            ("git-protocol", "GIT_PROTOCOL"),
        ] {
            if let Some(v) = req.header(header) {
                cmd.env(var, v);
            }
        }
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()?;
        let mut stdin = child.stdin.take().expect("piped stdin");
        let body = req.body;
        let writer = std::thread::spawn(move || {
            let _ = stdin.write_all(&body);
        });
        let mut cgi = BufReader::new(child.stdout.take().expect("piped stdout"));
        let (status, headers) = read_cgi_head(&mut cgi)?;
        out.write_all(
            format!("HTTP/1.1 {status}\r\n{headers}Transfer-Encoding: chunked\r\n\r\n").as_bytes(),
        )?;
        let cut = (req.method == "POST")
            .then_some(self.options.cut_after_bytes)
            .flatten();
        let finished = self.stream_body(&mut cgi, out, cut);
        let _ = writer.join();
        if !matches!(finished, Ok(true)) {
            let _ = child.kill();
            let _ = child.wait();
            let _ = out.shutdown(std::net::Shutdown::Both);
            return finished.map(|_| false);
        }
        child.wait()?;
        out.write_all(b"0\r\n\r\n")?;
        out.flush()?;
        Ok(true)
    }

    /// Copies the CGI's body as chunks, throttled; false when cut.
    fn stream_body(
        &self,
        cgi: &mut impl Read,
        out: &mut TcpStream,
        cut: Option<u64>,
    ) -> std::io::Result<bool> {
        let rate = self.options.throttle_bytes_per_sec;
        let mut buf = vec![0u8; rate.map_or(64 << 10, |r| (r / 20).clamp(64, 64 << 10) as usize)];
        let started = Instant::now();
        let mut sent: u64 = 0;
        loop {
            let n = cgi.read(&mut buf)?;
            if n == 0 {
                return Ok(true);
            }
            let mut chunk = &buf[..n];
            if let Some(limit) = cut {
                let room = limit.saturating_sub(sent) as usize;
                if room < chunk.len() {
                    chunk = &chunk[..room];
                    write_chunk(out, chunk)?;
                    return Ok(false);
                }
            }
            write_chunk(out, chunk)?;
            sent += chunk.len() as u64;
            if let Some(rate) = rate.filter(|r| *r > 0) {
                let due = Duration::from_secs_f64(sent as f64 / rate as f64);
                if let Some(wait) = due.checked_sub(started.elapsed()) {
                    std::thread::sleep(wait);
                }
            }
        }
    }
}

fn write_chunk(out: &mut TcpStream, chunk: &[u8]) -> std::io::Result<()> {
    if chunk.is_empty() {
        return Ok(());
    }
    out.write_all(format!("{:x}\r\n", chunk.len()).as_bytes())?;
    out.write_all(chunk)?;
    out.write_all(b"\r\n")?;
    out.flush()
}

/// The request line, headers and body (by length or chunked); `None` at EOF.
fn read_request(reader: &mut impl BufRead) -> std::io::Result<Option<Request>> {
    let mut line = String::new();
    if reader.read_line(&mut line)? == 0 {
        return Ok(None);
    }
    let mut parts = line.split_whitespace();
    let method = parts.next().unwrap_or_default().to_string();
    let target = parts.next().unwrap_or_default().to_string();
    let mut headers = Vec::new();
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h)? == 0 {
            break;
        }
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
        }
    }
    let mut req = Request {
        method,
        target,
        headers,
        body: Vec::new(),
    };
    if req
        .header("transfer-encoding")
        .is_some_and(|v| v.eq_ignore_ascii_case("chunked"))
    {
        req.body = read_chunked(reader)?;
    } else if let Some(len) = req.header("content-length").and_then(|v| v.parse().ok()) {
        req.body = vec![0; len];
        reader.read_exact(&mut req.body)?;
    }
    Ok(Some(req))
}

fn read_chunked(reader: &mut impl BufRead) -> std::io::Result<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let mut size = String::new();
        reader.read_line(&mut size)?;
        let n = usize::from_str_radix(size.trim().split(';').next().unwrap_or("0"), 16)
            .map_err(|_| std::io::Error::other("bad chunk size"))?;
        let mut chunk = vec![0; n + 2];
        reader.read_exact(&mut chunk)?;
        if n == 0 {
            return Ok(body);
        }
        body.extend_from_slice(&chunk[..n]);
    }
}

/// The CGI's status and its other headers (as HTTP header lines).
fn read_cgi_head(cgi: &mut impl BufRead) -> std::io::Result<(String, String)> {
    let mut status = "200 OK".to_string();
    let mut headers = String::new();
    loop {
        let mut h = String::new();
        if cgi.read_line(&mut h)? == 0 {
            break;
        }
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        match h.strip_prefix("Status:") {
            Some(s) => status = s.trim().to_string(),
            None => {
                headers.push_str(h);
                headers.push_str("\r\n");
            }
        }
    }
    Ok((status, headers))
}

/// Standard base64 with padding (for the Basic credentials this server expects).
pub fn base64(input: &[u8]) -> String {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_pads_like_the_standard_alphabet() {
        assert_eq!(base64(b"x-access-token:t"), "eC1hY2Nlc3MtdG9rZW46dA==");
        assert_eq!(base64(b"abc"), "YWJj");
    }

    #[test]
    fn a_cgi_head_gives_the_status_and_the_other_headers() {
        let mut cgi =
            BufReader::new(&b"Status: 404 Not Found\r\nContent-Type: text/plain\r\n\r\nbody"[..]);
        let (status, headers) = read_cgi_head(&mut cgi).unwrap();
        assert_eq!(status, "404 Not Found");
        assert_eq!(headers, "Content-Type: text/plain\r\n");
    }
}
