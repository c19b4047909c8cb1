//! The bubblewrap command line: what a sandboxed command can see of the host.
//!
//! The shape is "an empty root with an allow-list of system directories read-only,
//! the few `/etc` files a build needs, private `/tmp`, `/var/tmp` and `/run`, fresh
//! `/dev` and `/proc`, no `/sys`, plus exactly the mounts of the spec". Building it is
//! pure (apart from `exists` checks on host paths) so the argv can be inspected and
//! tested on its own. Who runs it, under which seccomp filter and limits, is
//! `jail.rs`.

use std::ffi::OsString;
use std::path::{Component, Path, PathBuf};

use grove_core::ports::{Mount, NetworkPolicy};

/// System directories bound read-only (or re-created as the same symlink, on hosts
/// where they are links into `/usr`). Nothing else of the host's root is visible.
const SYSTEM_DIRS: &[&str] = &[
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32",
];

/// The only files of `/etc` a command sees: name services, the dynamic linker, TLS
/// roots, time zone, and the alternatives links. No `shadow`, `gshadow`, `sudoers`,
/// ssh host keys or any other credential: they are simply not there.
const ETC_FILES: &[&str] = &[
    "passwd",
    "group",
    "hosts",
    "host.conf",
    "nsswitch.conf",
    "gai.conf",
    "services",
    "protocols",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "ssl",
    "ca-certificates",
    "ca-certificates.conf",
    "pki",
    "crypto-policies",
    "alternatives",
    "localtime",
    "timezone",
    "mime.types",
    "os-release",
    "debian_version",
    "profile",
    "bash.bashrc",
    "inputrc",
];

/// Empty, private, writable directories of every sandbox.
const PRIVATE_DIRS: &[&str] = &["/tmp", "/var/tmp", "/run"];

/// Namespace and process flags shared by every invocation (and by the probe, so the
/// probe fails exactly when a real invocation would). bwrap runs unprivileged (see
/// `jail.rs`), so the user namespace is what lets it build the sandbox at all;
/// `--disable-userns` keeps the command from making another one, and
/// `--cap-drop ALL` leaves it no capability even inside its own namespace.
const PROCESS_FLAGS: &[&str] = &[
    "--unshare-user",
    "--disable-userns",
    "--unshare-pid",
    "--unshare-ipc",
    "--unshare-uts",
    "--unshare-cgroup-try",
    "--die-with-parent",
    "--new-session",
    "--cap-drop",
    "ALL",
    "--clearenv",
];

/// The environment every command starts from, in both modes.
pub(crate) const BASE_ENV: &[(&str, &str)] = &[
    (
        "PATH",
        "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    ),
    ("HOME", "/tmp"),
    ("LANG", "C.UTF-8"),
];

/// The argv (after the bwrap program itself) that `detect` runs to see whether bwrap
/// works here: the same filesystem and namespace setup as a real command, with the
/// network unshared too (the most demanding variant).
pub(crate) fn probe_args() -> Vec<OsString> {
    let mut args = filesystem_base(&[]);
    args.extend(PROCESS_FLAGS.iter().map(OsString::from));
    args.push("--unshare-net".into());
    push_env(&mut args, BASE_ENV.iter().map(|(k, v)| (*k, *v)));
    args.extend(["--", "true"].map(OsString::from));
    args
}

/// The part of the argv fixed for the lifetime of one runtime: filesystem view,
/// namespaces, and `--clearenv`. Per-command `--setenv`, `--chdir` and argv follow.
/// `hidden` dirs that lie inside a bound system dir are covered with an empty tmpfs.
pub(crate) fn runtime_prefix(
    hidden: &[PathBuf],
    mounts: &[Mount],
    network: NetworkPolicy,
) -> Vec<OsString> {
    let mut args = filesystem_base(hidden);

    // With network access the resolver config must be readable; on systemd hosts
    // /etc/resolv.conf points into /run. Bind the file it resolves to, read-only.
    if network != NetworkPolicy::None {
        if let Ok(resolv) = std::fs::canonicalize("/etc/resolv.conf") {
            args.push("--ro-bind-try".into());
            args.push(resolv.into());
            args.push("/etc/resolv.conf".into());
        }
    }

    // Parents before children so a child mount is not hidden by its parent's bind.
    let mut mounts: Vec<&Mount> = mounts.iter().collect();
    mounts.sort_by_key(|m| depth(&m.target));
    for m in mounts {
        // `--ro-bind` is the kernel-enforced read-only the workspace capabilities
        // promise; bwrap creates the target inside its tmpfs root when it is missing.
        args.push(if m.writable { "--bind" } else { "--ro-bind" }.into());
        args.push(m.source.clone().into());
        args.push(m.target.clone().into());
    }

    args.extend(PROCESS_FLAGS.iter().map(OsString::from));
    if network == NetworkPolicy::None {
        args.push("--unshare-net".into());
    }
    args
}

/// Appends `--setenv KEY VALUE` for each variable.
pub(crate) fn push_env<'a>(
    args: &mut Vec<OsString>,
    env: impl IntoIterator<Item = (&'a str, &'a str)>,
) {
    for (k, v) in env {
        args.push("--setenv".into());
        args.push(k.into());
        args.push(v.into());
    }
}

/// The allow-listed system tree, `/etc` files, fresh `/dev` and `/proc`, and the
/// private dirs; `/sys` is not there at all. bwrap itself re-binds `/proc/sys`,
/// `/proc/sysrq-trigger`, `/proc/irq` and `/proc/bus` read-only when they are
/// writable; as the unprivileged sandbox identity they are not writable anyway.
fn filesystem_base(hidden: &[PathBuf]) -> Vec<OsString> {
    let mut args: Vec<OsString> = Vec::new();
    let mut push = |a: &[&dyn AsRef<std::ffi::OsStr>]| {
        args.extend(a.iter().map(|x| x.as_ref().to_os_string()));
    };
    for dir in SYSTEM_DIRS {
        let path = Path::new(dir);
        match std::fs::symlink_metadata(path) {
            Ok(m) if m.file_type().is_symlink() => {
                if let Ok(target) = std::fs::read_link(path) {
                    push(&[&"--symlink", &target, dir]);
                }
            }
            Ok(m) if m.is_dir() => push(&[&"--ro-bind", dir, dir]),
            _ => {}
        }
    }
    push(&[&"--dir", &"/etc"]);
    for name in ETC_FILES {
        let path = Path::new("/etc").join(name);
        if path.exists() {
            push(&[&"--ro-bind", &path, &path]);
        }
    }
    push(&[&"--dev", &"/dev", &"--proc", &"/proc"]);
    for dir in PRIVATE_DIRS {
        push(&[&"--tmpfs", dir]);
    }
    let mut covered: Vec<&PathBuf> = hidden
        .iter()
        .filter(|h| h.is_dir() && SYSTEM_DIRS.iter().any(|d| h.starts_with(d)))
        .collect();
    covered.sort_by_key(|p| depth(p));
    for dir in covered {
        push(&[&"--tmpfs", dir]);
    }
    args
}

fn depth(p: &Path) -> usize {
    p.components()
        .filter(|c| matches!(c, Component::Normal(_)))
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strs(args: &[OsString]) -> Vec<String> {
        args.iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn read_only_mounts_use_ro_bind_and_parents_come_first() {
        let mounts = vec![
            Mount {
                source: "/src/ws/objects".into(),
                target: "/src/ws/objects".into(),
                writable: false,
            },
            Mount {
                source: "/src/ws".into(),
                target: "/src/ws".into(),
                writable: true,
            },
        ];
        let args = strs(&runtime_prefix(&[], &mounts, NetworkPolicy::None));
        let bind = args.iter().position(|a| a == "--bind").unwrap();
        let ro = args.iter().rposition(|a| a == "--ro-bind").unwrap();
        assert!(
            bind < ro,
            "parent mount must precede the nested one: {args:?}"
        );
        assert_eq!(args[ro + 1], "/src/ws/objects");
        assert!(args.contains(&"--unshare-net".to_string()));
        assert!(args.windows(2).any(|w| w == ["--cap-drop", "ALL"]));
    }

    #[test]
    fn the_network_is_shared_only_when_the_policy_allows_it() {
        let args = strs(&runtime_prefix(&[], &[], NetworkPolicy::Default));
        assert!(!args.contains(&"--unshare-net".to_string()));
    }

    #[test]
    fn the_host_root_and_its_secrets_are_not_bound() {
        let args = strs(&runtime_prefix(&[], &[], NetworkPolicy::Default));
        assert!(
            !args.windows(3).any(|w| w[1] == "/" && w[2] == "/"),
            "the host root must not be bound: {args:?}"
        );
        for secret in [
            "/etc/shadow",
            "/etc/gshadow",
            "/etc/sudoers",
            "/etc/ssh",
            "/sys",
            "/root",
            "/home",
        ] {
            assert!(
                !args.iter().any(|a| a == secret),
                "{secret} is bound: {args:?}"
            );
        }
        assert!(args.windows(2).any(|w| w == ["--proc", "/proc"]));
        for flag in ["--unshare-user", "--disable-userns"] {
            assert!(args.iter().any(|a| a == flag), "{flag} missing: {args:?}");
        }
    }
}
