//! `$GROVE_HOME` is private: the data root and the directories grove keeps in it
//! (repo caches, workspaces, saved work, trash, staging) are mode 0700, created so or
//! fixed so at start (an installation made before this rule had them 0755). Sandboxes
//! reach their workspace through bind mounts made by the privileged side of the
//! runtime (bubblewrap started by the worker, the Docker daemon), which resolves the
//! source path as the owner; nothing needs the sandbox user to walk these parents.
//! The private Postgres cluster's directory is the one exception, kept by `grove db`
//! (ADR 22).

use std::io;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::Path;

/// The directories grove keeps under `$GROVE_HOME`, all private to its owner.
pub const PRIVATE_DIRS: &[&str] = &["repos", "workspaces", "saved", "trash", "staging"];

/// Mode of the data root and of every directory in [`PRIVATE_DIRS`].
pub const PRIVATE_MODE: u32 = 0o700;

/// Creates `root` and its private directories with mode 0700, and takes every access
/// by group and others away from those that exist. Idempotent; run at every start.
/// When the private cluster lives in `root/postgres`, the root keeps the group's
/// search bit `grove db start` gave the cluster's user (0710), so a running cluster is
/// never cut off from its directory.
pub fn secure_home(root: &Path) -> io::Result<()> {
    secure_dir_keeping(root, true, root.join("postgres").is_dir())?;
    for name in PRIVATE_DIRS {
        secure_dir(&root.join(name), false)?;
    }
    Ok(())
}

/// Creates `dir` (with its parents when `parents`) as 0700, or narrows it to 0700.
/// Only the permission bits of grove's own directories change, never their contents.
pub fn secure_dir(dir: &Path, parents: bool) -> io::Result<()> {
    secure_dir_keeping(dir, parents, false)
}

/// [`secure_dir`], keeping the group's search bit (and nothing else of group or others)
/// when `group_search` and it is set.
pub fn secure_dir_keeping(dir: &Path, parents: bool, group_search: bool) -> io::Result<()> {
    if !dir.exists() {
        if parents {
            if let Some(parent) = dir.parent() {
                std::fs::create_dir_all(parent)?;
            }
        }
        match std::fs::DirBuilder::new().mode(PRIVATE_MODE).create(dir) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
    }
    let mode = std::fs::metadata(dir)?.permissions().mode() & 0o7777;
    let keep = if group_search { mode & 0o010 } else { 0 };
    if mode != PRIVATE_MODE | keep {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(PRIVATE_MODE | keep))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(p: &Path) -> u32 {
        std::fs::metadata(p).unwrap().permissions().mode() & 0o7777
    }

    #[test]
    fn a_new_home_is_private() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("a/b/home");
        secure_home(&root).unwrap();
        assert_eq!(mode(&root), 0o700);
        for d in PRIVATE_DIRS {
            assert_eq!(mode(&root.join(d)), 0o700, "{d}");
        }
    }

    #[test]
    fn an_existing_open_home_is_narrowed_and_its_contents_kept() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("home");
        std::fs::create_dir_all(root.join("workspaces/u/p")).unwrap();
        std::fs::write(root.join("workspaces/u/p/f"), "kept").unwrap();
        for d in [&root, &root.join("workspaces")] {
            std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        secure_home(&root).unwrap();
        assert_eq!(mode(&root), 0o700);
        assert_eq!(mode(&root.join("workspaces")), 0o700);
        assert_eq!(
            std::fs::read_to_string(root.join("workspaces/u/p/f")).unwrap(),
            "kept"
        );
        // Run again: nothing changes.
        secure_home(&root).unwrap();
        assert_eq!(mode(&root), 0o700);
    }

    #[test]
    fn the_private_clusters_group_keeps_only_its_search_bit() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("home");
        std::fs::create_dir_all(root.join("postgres")).unwrap();
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o775)).unwrap();
        secure_home(&root).unwrap();
        assert_eq!(mode(&root), 0o710);
        std::fs::remove_dir(root.join("postgres")).unwrap();
        secure_home(&root).unwrap();
        assert_eq!(mode(&root), 0o700);
    }
}
