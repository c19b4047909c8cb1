//! The bubblewrap command line: what a sandboxed command can see of the host.
//!
//! The shape is "the host root, read-only, minus everything that could hold secrets,
//! plus exactly the mounts of the spec". Building it is pure (apart from `exists`
//! checks on host paths) so the argv can be inspected and tested on its own.

use std::ffi::OsString;
use std::path::{Component, Path, PathBuf};

use grove_core::ports::{Mount, NetworkPolicy};

/// Host directories that are always covered with an empty tmpfs: `/tmp` is shared
/// scratch of every host process, `/root` and `/home` hold users' credentials (ssh
/// keys, cloud configs, git credentials), `/run` holds sockets such as Docker's.
const ALWAYS_COVERED: &[&str] = &["/tmp", "/root", "/home", "/run"];

/// Namespace and process flags shared by every invocation (and by the probe, so the
/// probe fails exactly when a real invocation would).
///
/// `--cap-drop ALL` matters when the worker runs as root: without a user namespace
/// bwrap keeps the caller's capabilities, and with CAP_SYS_ADMIN the command could
/// simply `mount -o remount,rw` a read-only workspace (verified on this host).
const PROCESS_FLAGS: &[&str] = &[
    "--unshare-pid",
    "--unshare-ipc",
    "--unshare-uts",
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
    let mut args = filesystem_base();
    args.extend(PROCESS_FLAGS.iter().map(OsString::from));
    args.push("--unshare-net".into());
    push_env(&mut args, BASE_ENV.iter().map(|(k, v)| (*k, *v)));
    args.extend(["--", "true"].map(OsString::from));
    args
}

/// The part of the argv fixed for the lifetime of one runtime: filesystem view,
/// namespaces, and `--clearenv`. Per-command `--setenv`, `--chdir` and argv follow.
pub(crate) fn runtime_prefix(
    hidden: &[PathBuf],
    mounts: &[Mount],
    network: NetworkPolicy,
) -> Vec<OsString> {
    let mut args = filesystem_base();

    // Covered parents first, so that nested hidden dirs and the mounts below land on
    // top of them rather than being shadowed by them.
    let mut covered: Vec<PathBuf> = ALWAYS_COVERED.iter().map(PathBuf::from).collect();
    let mut hidden: Vec<&PathBuf> = hidden.iter().filter(|p| p.is_dir()).collect();
    hidden.sort_by_key(|p| depth(p));
    for dir in hidden {
        args.push("--tmpfs".into());
        args.push(dir.into());
        covered.push(dir.clone());
    }

    // With network access the resolver config must stay readable; on systemd hosts
    // /etc/resolv.conf points into /run, which was just covered. Bind back only that
    // one file, read-only.
    if network != NetworkPolicy::None {
        if let Ok(resolv) = std::fs::canonicalize("/etc/resolv.conf") {
            if covered.iter().any(|c| resolv.starts_with(c)) {
                args.push("--ro-bind-try".into());
                args.push(resolv.clone().into());
                args.push(resolv.into());
            }
        }
    }

    // Parents before children so a child mount is not hidden by its parent's bind.
    let mut mounts: Vec<&Mount> = mounts.iter().collect();
    mounts.sort_by_key(|m| depth(&m.target));
    for m in mounts {
        // `--ro-bind` is the kernel-enforced read-only the workspace capabilities
        // promise; bwrap creates the target inside a tmpfs when it is missing.
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

/// The host root read-only, fresh /dev and /proc, and the always-covered dirs that
/// exist here (a tmpfs over a missing dir would need a mkdir on the read-only root).
fn filesystem_base() -> Vec<OsString> {
    let mut args: Vec<OsString> = ["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
        .map(OsString::from)
        .to_vec();
    for dir in ALWAYS_COVERED {
        if Path::new(dir).is_dir() {
            args.push("--tmpfs".into());
            args.push(dir.into());
        }
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
    fn hidden_dirs_are_covered_before_mounts_and_missing_ones_are_skipped() {
        let home = std::env::temp_dir();
        let args = strs(&runtime_prefix(
            &[home.clone(), "/definitely/not/here".into()],
            &[Mount {
                source: home.join("ws"),
                target: home.join("ws"),
                writable: false,
            }],
            NetworkPolicy::None,
        ));
        let home = home.to_string_lossy().into_owned();
        let tmpfs = args
            .windows(2)
            .position(|w| w[0] == "--tmpfs" && w[1] == home)
            .unwrap();
        let bind = args.iter().rposition(|a| a == "--ro-bind").unwrap();
        assert!(tmpfs < bind);
        assert!(!args.iter().any(|a| a == "/definitely/not/here"));
    }
}
