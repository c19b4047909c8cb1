//! Sandbox images built offline from this machine's own Debian packages; no registry
//! is ever asked for an image.
//!
//! - [`build_minimal`]: a static busybox (Debian package `busybox-static`) with its
//!   applet links, `/tmp`, and `/etc/passwd` with root, nobody (65534) and the
//!   sandbox identity (`sandbox`, default 60100). About 2 MB;
//!   for tests and shell-only work. Tag `grove-sandbox:minimal-<hash of the rootfs>`.
//! - [`build_debian`]: `debootstrap --variant=minbase --include=git,ca-certificates`
//!   of this machine's suite (`VERSION_CODENAME` of `/etc/os-release`) from the first
//!   mirror in its apt sources that serves that suite. Needs root and the Debian
//!   package `debootstrap`. Tag `grove-sandbox:debian-<suite>`. Its `/etc/gitconfig`
//!   sets `safe.directory=*`: inside a one-workspace sandbox, git's ownership check
//!   only gets in the way of a workspace written by another uid.
//!
//! Both import a tar stream of the rootfs through the engine's image import
//! (`POST /images/create?fromSrc=-`) and return the tag. The tag of the most recent
//! build is recorded with [`record_default_image`] and read back by [`default_image`]
//! (after `GROVE_DOCKER_IMAGE`).

use std::path::{Path, PathBuf};
use std::process::Stdio;

use bollard::query_parameters::CreateImageOptions;
use bollard::Docker;
use bytes::Bytes;
use futures::StreamExt;
use sha2::{Digest, Sha256};
use tokio::io::AsyncReadExt;

/// Repository of every image built here.
pub const IMAGE_REPO: &str = "grove-sandbox";
/// Environment variable naming the default image, before the recorded one.
pub const IMAGE_ENV: &str = "GROVE_DOCKER_IMAGE";
/// File (under the caller's directory, e.g. `$GROVE_HOME`) holding the last built tag.
pub const IMAGE_FILE: &str = "docker-image";
/// Environment variable naming a static busybox to use instead of `/bin/busybox`.
pub const BUSYBOX_ENV: &str = "GROVE_BUSYBOX";

const IMAGE_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Why an image could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ImageError {
    /// A tool from a Debian package is missing. Handling: install it, then retry.
    #[error("{what}: install the Debian package {package} (apt-get install -y {package})")]
    MissingPackage { package: &'static str, what: String },
    /// The build needs something this process lacks (root, an apt source).
    #[error("cannot build the image here: {0}")]
    Unsupported(String),
    /// The engine refused or failed the import.
    #[error("the Docker engine failed the image import: {0}")]
    Engine(String),
    /// debootstrap or tar failed.
    #[error("building the root filesystem failed: {0}")]
    Build(String),
    #[error("{0}")]
    Io(String),
}

/// Builds (or finds, when the same rootfs was imported before) the busybox image and
/// returns its tag.
pub async fn build_minimal(docker: &Docker) -> Result<String, ImageError> {
    let busybox = find_busybox()?;
    let tar = tokio::task::spawn_blocking(move || minimal_rootfs(&busybox))
        .await
        .map_err(|e| ImageError::Io(format!("building the rootfs panicked: {e}")))??;
    let hash = hex::encode(Sha256::digest(&tar));
    let tag = format!("minimal-{}", &hash[..12]);
    let reference = format!("{IMAGE_REPO}:{tag}");
    if image_exists(docker, &reference).await {
        return Ok(reference);
    }
    import(
        docker,
        &tag,
        Body::Full(Bytes::from(tar)),
        &[
            format!("ENV PATH={IMAGE_PATH}"),
            "ENV LANG=C.UTF-8".into(),
            "CMD [\"sh\"]".into(),
        ],
    )
    .await?;
    Ok(reference)
}

/// Options of [`build_debian_with`].
#[derive(Debug, Clone, Default)]
pub struct DebianOptions {
    /// Suite (codename); default: this machine's `VERSION_CODENAME`.
    pub suite: Option<String>,
    /// Mirror URL; default: the first of this machine's apt sources serving the suite.
    pub mirror: Option<String>,
    /// Packages beyond git and ca-certificates.
    pub include: Vec<String>,
    /// Build even if the tag exists.
    pub force: bool,
    /// Where the rootfs is assembled; default: the system temp dir.
    pub work_dir: Option<PathBuf>,
}

/// Builds the Debian image unless its tag exists, and returns the tag.
pub async fn build_debian(docker: &Docker) -> Result<String, ImageError> {
    build_debian_with(docker, &DebianOptions::default()).await
}

/// Builds the Debian image with `opts`.
pub async fn build_debian_with(
    docker: &Docker,
    opts: &DebianOptions,
) -> Result<String, ImageError> {
    let debootstrap = find_program("debootstrap", &["/usr/sbin/debootstrap"]).ok_or(
        ImageError::MissingPackage {
            package: "debootstrap",
            what: "debootstrap is not installed".into(),
        },
    )?;
    let suite = match &opts.suite {
        Some(s) => s.clone(),
        None => os_suite().ok_or_else(|| {
            ImageError::Unsupported("no VERSION_CODENAME in /etc/os-release".into())
        })?,
    };
    if suite.is_empty()
        || !suite
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-')
    {
        return Err(ImageError::Unsupported(format!("bad suite name {suite:?}")));
    }
    let tag = format!("debian-{suite}");
    let reference = format!("{IMAGE_REPO}:{tag}");
    if !opts.force && image_exists(docker, &reference).await {
        return Ok(reference);
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err(ImageError::Unsupported(
            "debootstrap needs root (run the build as root)".into(),
        ));
    }
    let mirror = match &opts.mirror {
        Some(m) => m.clone(),
        None => apt_mirror(&suite).ok_or_else(|| {
            ImageError::Unsupported(format!(
                "no apt source of this machine serves {suite}; pass a mirror"
            ))
        })?,
    };

    let base = opts.work_dir.clone().unwrap_or_else(std::env::temp_dir);
    let dir = base.join(format!(
        "grove-debootstrap-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0)
    ));
    let result =
        debootstrap_and_import(docker, &debootstrap, &suite, &mirror, opts, &dir, &tag).await;
    cleanup_rootfs(&dir);
    result.map(|()| reference)
}

async fn debootstrap_and_import(
    docker: &Docker,
    debootstrap: &Path,
    suite: &str,
    mirror: &str,
    opts: &DebianOptions,
    dir: &Path,
    tag: &str,
) -> Result<(), ImageError> {
    std::fs::create_dir_all(dir).map_err(|e| ImageError::Io(format!("{}: {e}", dir.display())))?;
    let mut include = vec!["git".to_string(), "ca-certificates".to_string()];
    include.extend(opts.include.iter().cloned());
    let out = tokio::process::Command::new(debootstrap)
        .arg("--variant=minbase")
        .arg(format!("--include={}", include.join(",")))
        .arg(suite)
        .arg(dir)
        .arg(mirror)
        .env_clear()
        .env("PATH", IMAGE_PATH)
        .env("LANG", "C.UTF-8")
        .stdin(Stdio::null())
        .output()
        .await
        .map_err(|e| ImageError::Build(format!("cannot run debootstrap: {e}")))?;
    if !out.status.success() {
        let text = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = text.lines().rev().take(3).collect();
        let log = std::fs::read_to_string(dir.join("debootstrap/debootstrap.log"))
            .ok()
            .and_then(|l| l.lines().last().map(str::to_string))
            .unwrap_or_default();
        return Err(ImageError::Build(format!(
            "debootstrap {suite} from {mirror} exited with {}: {} {log}",
            out.status,
            tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
        )));
    }
    // Smaller image, nothing of the build host's apt state.
    for sub in ["var/cache/apt/archives", "var/lib/apt/lists"] {
        if let Ok(entries) = std::fs::read_dir(dir.join(sub)) {
            for e in entries.flatten() {
                if e.file_type().map(|t| t.is_file()).unwrap_or(false) {
                    let _ = std::fs::remove_file(e.path());
                }
            }
        }
    }
    std::fs::write(dir.join("etc/gitconfig"), "[safe]\n\tdirectory = *\n")
        .map_err(|e| ImageError::Io(format!("writing etc/gitconfig: {e}")))?;

    let mut child = tokio::process::Command::new("tar")
        .args(["--numeric-owner", "--xattrs", "-C"])
        .arg(dir)
        .args([
            "--exclude=./dev/*",
            "--exclude=./proc/*",
            "--exclude=./sys/*",
            "--exclude=./debootstrap",
            "-cf",
            "-",
            ".",
        ])
        .env_clear()
        .env("PATH", IMAGE_PATH)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|_| ImageError::MissingPackage {
            package: "tar",
            what: "tar is not installed".into(),
        })?;
    let stdout = child.stdout.take().expect("piped");
    let body = futures::stream::unfold(stdout, |mut r| async move {
        let mut buf = vec![0u8; 256 * 1024];
        match r.read(&mut buf).await {
            Ok(0) => None,
            Ok(n) => {
                buf.truncate(n);
                Some((Ok(Bytes::from(buf)), r))
            }
            Err(e) => Some((Err(e), r)),
        }
    });
    let imported = import(
        docker,
        tag,
        Body::Stream(body.boxed()),
        &[
            format!("ENV PATH={IMAGE_PATH}"),
            "ENV LANG=C.UTF-8".into(),
            "CMD [\"bash\"]".into(),
        ],
    )
    .await;
    let status = child
        .wait_with_output()
        .await
        .map_err(|e| ImageError::Build(format!("waiting for tar: {e}")))?;
    if !status.status.success() {
        return Err(ImageError::Build(format!(
            "tar of the rootfs failed: {}",
            String::from_utf8_lossy(&status.stderr)
                .lines()
                .next()
                .unwrap_or("")
        )));
    }
    imported
}

/// Removes a debootstrap dir, after detaching anything still mounted inside it (a
/// failed debootstrap can leave /proc or /dev mounted there; deleting through those
/// would touch the host).
fn cleanup_rootfs(dir: &Path) {
    let Ok(canonical) = std::fs::canonicalize(dir) else {
        return;
    };
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    let mut inside: Vec<String> = mounts
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1))
        .map(|m| m.replace("\\040", " "))
        .filter(|m| Path::new(m).starts_with(&canonical))
        .collect();
    inside.sort_by_key(|m| std::cmp::Reverse(m.len()));
    for m in &inside {
        if let Ok(c) = std::ffi::CString::new(m.as_str()) {
            // SAFETY: a valid NUL-terminated path; failure is checked below.
            unsafe {
                libc::umount2(c.as_ptr(), libc::MNT_DETACH);
            }
        }
    }
    let still = std::fs::read_to_string("/proc/self/mounts")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1))
        .any(|m| Path::new(m).starts_with(&canonical));
    if still {
        tracing::warn!(dir = %dir.display(), "mounts remain inside the build dir; not deleting it");
        return;
    }
    if let Err(e) = std::fs::remove_dir_all(&canonical) {
        tracing::warn!(dir = %dir.display(), error = %e, "could not remove the build dir");
    }
}

/// Imports a rootfs tar as `grove-sandbox:<tag>`.
async fn import(
    docker: &Docker,
    tag: &str,
    body: Body,
    changes: &[String],
) -> Result<(), ImageError> {
    let options = CreateImageOptions {
        from_src: Some("-".into()),
        repo: Some(IMAGE_REPO.into()),
        tag: Some(tag.into()),
        changes: changes.to_vec(),
        message: Some("built by grove".into()),
        ..Default::default()
    };
    // Big rootfs uploads may take longer than the client's default request timeout.
    let docker = docker
        .clone()
        .with_timeout(std::time::Duration::from_secs(1800));
    let body = match body {
        Body::Full(b) => bollard::body_full(b),
        Body::Stream(s) => bollard::body_try_stream(s),
    };
    let mut stream = docker.create_image(Some(options), Some(body), None);
    while let Some(item) = stream.next().await {
        item.map_err(|e| ImageError::Engine(crate::one_line(&e.to_string())))?;
    }
    let reference = format!("{IMAGE_REPO}:{tag}");
    if !image_exists(&docker, &reference).await {
        return Err(ImageError::Engine(format!(
            "the import finished but {reference} is not there"
        )));
    }
    Ok(())
}

/// A request body for [`import`].
enum Body {
    Full(Bytes),
    Stream(futures::stream::BoxStream<'static, Result<Bytes, std::io::Error>>),
}

/// Whether the engine has an image with this reference.
pub async fn image_exists(docker: &Docker, reference: &str) -> bool {
    docker.inspect_image(reference).await.is_ok()
}

/// The default image: `GROVE_DOCKER_IMAGE` if set and not empty, else the tag recorded
/// in `<dir>/docker-image`.
pub fn default_image(dir: &Path) -> Option<String> {
    if let Some(v) = std::env::var(IMAGE_ENV)
        .ok()
        .filter(|v| !v.trim().is_empty())
    {
        return Some(v.trim().to_string());
    }
    std::fs::read_to_string(dir.join(IMAGE_FILE))
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

/// Records `tag` as the most recently built image in `<dir>/docker-image`.
pub fn record_default_image(dir: &Path, tag: &str) -> Result<(), ImageError> {
    std::fs::create_dir_all(dir).map_err(|e| ImageError::Io(format!("{}: {e}", dir.display())))?;
    let tmp = dir.join(format!(".{IMAGE_FILE}.{}", std::process::id()));
    std::fs::write(&tmp, format!("{tag}\n"))
        .and_then(|()| std::fs::rename(&tmp, dir.join(IMAGE_FILE)))
        .map_err(|e| ImageError::Io(format!("recording the image in {}: {e}", dir.display())))
}

/// `VERSION_CODENAME` of `/etc/os-release`.
pub fn os_suite() -> Option<String> {
    let text = std::fs::read_to_string("/etc/os-release").ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("VERSION_CODENAME="))
        .map(|v| v.trim().trim_matches('"').to_string())
        .filter(|v| !v.is_empty())
}

/// The first mirror in this machine's apt sources (`sources.list`, `*.list`, deb822
/// `*.sources`) that serves `suite` with `deb` entries.
pub fn apt_mirror(suite: &str) -> Option<String> {
    let mut files = vec![PathBuf::from("/etc/apt/sources.list")];
    if let Ok(entries) = std::fs::read_dir("/etc/apt/sources.list.d") {
        let mut more: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
        more.sort();
        files.extend(more);
    }
    for f in files {
        let Ok(text) = std::fs::read_to_string(&f) else {
            continue;
        };
        let name = f.to_string_lossy();
        let found = if name.ends_with(".sources") {
            mirror_in_deb822(&text, suite)
        } else if name.ends_with(".list") {
            mirror_in_list(&text, suite)
        } else {
            None
        };
        if found.is_some() {
            return found;
        }
    }
    None
}

fn mirror_in_list(text: &str, suite: &str) -> Option<String> {
    for line in text.lines() {
        let line = line.split('#').next().unwrap_or("").trim();
        let mut words = line.split_whitespace().peekable();
        if words.next() != Some("deb") {
            continue;
        }
        if words.peek().is_some_and(|w| w.starts_with('[')) {
            for w in words.by_ref() {
                if w.ends_with(']') {
                    break;
                }
            }
        }
        let (Some(uri), Some(s)) = (words.next(), words.next()) else {
            continue;
        };
        if s == suite && is_http(uri) {
            return Some(uri.to_string());
        }
    }
    None
}

fn mirror_in_deb822(text: &str, suite: &str) -> Option<String> {
    for stanza in text.split("\n\n") {
        let mut types = "";
        let mut uris = "";
        let mut suites = "";
        let mut enabled = true;
        for line in stanza.lines() {
            if line.trim_start().starts_with('#') {
                continue;
            }
            if let Some((k, v)) = line.split_once(':') {
                match k.trim().to_ascii_lowercase().as_str() {
                    "types" => types = v.trim(),
                    "uris" => uris = v.trim(),
                    "suites" => suites = v.trim(),
                    "enabled" => enabled = v.trim() != "no",
                    _ => {}
                }
            }
        }
        if !enabled || !types.split_whitespace().any(|t| t == "deb") {
            continue;
        }
        if suites.split_whitespace().any(|s| s == suite) {
            if let Some(uri) = uris.split_whitespace().find(|u| is_http(u)) {
                return Some(uri.to_string());
            }
        }
    }
    None
}

fn is_http(uri: &str) -> bool {
    uri.starts_with("http://") || uri.starts_with("https://")
}

fn find_program(name: &str, fallbacks: &[&str]) -> Option<PathBuf> {
    let from_path = std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|d| d.join(name))
            .find(|p| p.is_file())
    });
    from_path.or_else(|| fallbacks.iter().map(PathBuf::from).find(|p| p.is_file()))
}

/// A static busybox: `$GROVE_BUSYBOX`, else `/bin/busybox` or `/usr/bin/busybox`.
fn find_busybox() -> Result<PathBuf, ImageError> {
    let candidates: Vec<PathBuf> = match std::env::var_os(BUSYBOX_ENV).filter(|v| !v.is_empty()) {
        Some(p) => vec![PathBuf::from(p)],
        None => vec!["/bin/busybox".into(), "/usr/bin/busybox".into()],
    };
    let Some(path) = candidates.into_iter().find(|p| p.is_file()) else {
        return Err(ImageError::MissingPackage {
            package: "busybox-static",
            what: "no busybox found".into(),
        });
    };
    let bytes =
        std::fs::read(&path).map_err(|e| ImageError::Io(format!("{}: {e}", path.display())))?;
    match is_static_elf(&bytes) {
        Some(true) => Ok(path),
        _ => Err(ImageError::MissingPackage {
            package: "busybox-static",
            what: format!("{} is not a statically linked busybox", path.display()),
        }),
    }
}

/// Whether an ELF64 file has no program interpreter (`PT_INTERP`); `None` if it is not
/// a little-endian ELF64.
pub(crate) fn is_static_elf(b: &[u8]) -> Option<bool> {
    if b.len() < 64 || &b[..4] != b"\x7fELF" || b[4] != 2 || b[5] != 1 {
        return None;
    }
    let u16_at = |o: usize| Some(u16::from_le_bytes(b.get(o..o + 2)?.try_into().ok()?));
    let u64_at = |o: usize| Some(u64::from_le_bytes(b.get(o..o + 8)?.try_into().ok()?));
    let phoff = u64_at(0x20)? as usize;
    let phentsize = u16_at(0x36)? as usize;
    let phnum = u16_at(0x38)? as usize;
    for i in 0..phnum {
        let off = phoff + i * phentsize;
        let p_type = u32::from_le_bytes(b.get(off..off + 4)?.try_into().ok()?);
        if p_type == 3 {
            return Some(false);
        }
    }
    Some(true)
}

/// The busybox rootfs as a reproducible tar (fixed owners and times).
fn minimal_rootfs(busybox: &Path) -> Result<Vec<u8>, ImageError> {
    let binary = std::fs::read(busybox)
        .map_err(|e| ImageError::Io(format!("{}: {e}", busybox.display())))?;
    let out = std::process::Command::new(busybox)
        .arg("--list-full")
        .env_clear()
        .output()
        .map_err(|e| {
            ImageError::Build(format!("running {} --list-full: {e}", busybox.display()))
        })?;
    if !out.status.success() {
        return Err(ImageError::Build(format!(
            "{} --list-full failed",
            busybox.display()
        )));
    }
    let mut applets: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.trim().trim_start_matches('/').to_string())
        .filter(|l| !l.is_empty() && !l.contains("..") && l != "bin/busybox")
        .collect();
    applets.sort();
    applets.dedup();

    let mut tar = tar::Builder::new(Vec::new());
    let dir = |tar: &mut tar::Builder<Vec<u8>>, path: &str, mode: u32| -> std::io::Result<()> {
        let mut h = header(tar::EntryType::Directory, mode);
        tar.append_data(&mut h, format!("{path}/"), std::io::empty())
    };
    let io = |e: std::io::Error| ImageError::Io(format!("building the rootfs tar: {e}"));
    for (path, mode) in [
        ("bin", 0o755),
        ("sbin", 0o755),
        ("usr", 0o755),
        ("usr/bin", 0o755),
        ("usr/sbin", 0o755),
        ("etc", 0o755),
        ("dev", 0o755),
        ("proc", 0o755),
        ("sys", 0o755),
        ("run", 0o755),
        ("home", 0o755),
        ("root", 0o700),
        ("tmp", 0o1777),
        ("var", 0o755),
        ("var/tmp", 0o1777),
    ] {
        dir(&mut tar, path, mode).map_err(io)?;
    }
    let mut h = header(tar::EntryType::Regular, 0o755);
    h.set_size(binary.len() as u64);
    tar.append_data(&mut h, "bin/busybox", binary.as_slice())
        .map_err(io)?;
    for applet in &applets {
        let mut h = header(tar::EntryType::Symlink, 0o777);
        tar.append_link(&mut h, applet, "/bin/busybox")
            .map_err(io)?;
    }
    let id = crate::sandbox_identity();
    let passwd = format!(
        "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/tmp:/bin/sh\n\
         sandbox:x:{}:{}:sandbox:/tmp:/bin/sh\n",
        id.uid, id.gid
    );
    let group = format!("root:x:0:\nnogroup:x:65534:\nsandbox:x:{}:\n", id.gid);
    for (path, content) in [
        ("etc/passwd", passwd.as_str()),
        ("etc/group", group.as_str()),
        (
            "etc/os-release",
            "NAME=\"grove minimal (busybox)\"\nID=grove-minimal\n",
        ),
    ] {
        let mut h = header(tar::EntryType::Regular, 0o644);
        h.set_size(content.len() as u64);
        tar.append_data(&mut h, path, content.as_bytes())
            .map_err(io)?;
    }
    tar.into_inner().map_err(io)
}

fn header(kind: tar::EntryType, mode: u32) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(kind);
    h.set_mode(mode);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(0);
    h.set_size(0);
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mirrors_are_read_from_one_line_and_deb822_sources() {
        let list =
            "# comment\ndeb [arch=amd64 signed-by=/k.gpg] http://m.example/debian bookworm main\n\
                    deb http://security.example/debian-security bookworm-security main\n";
        assert_eq!(
            mirror_in_list(list, "bookworm").as_deref(),
            Some("http://m.example/debian")
        );
        assert_eq!(mirror_in_list(list, "trixie"), None);
        let deb822 =
            "Types: deb\nURIs: http://deb.example/debian\nSuites: bookworm bookworm-updates\n\
                      Components: main\n\nTypes: deb\nURIs: http://sec.example/debian-security\n\
                      Suites: bookworm-security\n";
        assert_eq!(
            mirror_in_deb822(deb822, "bookworm").as_deref(),
            Some("http://deb.example/debian")
        );
        assert_eq!(
            mirror_in_deb822(deb822, "bookworm-security").as_deref(),
            Some("http://sec.example/debian-security")
        );
        let disabled = "Enabled: no\nTypes: deb\nURIs: http://x.example\nSuites: bookworm\n";
        assert_eq!(mirror_in_deb822(disabled, "bookworm"), None);
    }

    #[test]
    fn the_recorded_image_is_read_back() {
        let dir =
            std::env::temp_dir().join(format!("grove-docker-image-test-{}", std::process::id()));
        record_default_image(&dir, "grove-sandbox:minimal-abc").unwrap();
        if std::env::var(IMAGE_ENV).is_err() {
            assert_eq!(
                default_image(&dir).as_deref(),
                Some("grove-sandbox:minimal-abc")
            );
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn static_elf_detection_reads_program_headers() {
        assert_eq!(is_static_elf(b"not an elf"), None);
        if let Ok(sh) = std::fs::read("/bin/sh") {
            // A distribution's /bin/sh is dynamically linked.
            if let Some(s) = is_static_elf(&sh) {
                assert!(!s);
            }
        }
    }
}
