//! Where things live under `$GROVE_HOME`: deterministic, collision-free, hostile-safe paths.
//!
//! Every path segment that comes from a caller is reduced to a short readable prefix of
//! safe characters plus a hash of the full value, so `../`, NUL, Unicode look-alikes or
//! very long ids can never escape the layout or make two keys share a directory.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::model::WorkspaceKey;

/// The first `n` hex digits of the SHA-256 of `value`.
pub fn short_hash(value: &str, n: usize) -> String {
    let digest = Sha256::digest(value.as_bytes());
    hex::encode(digest)[..n].to_string()
}

/// A path segment for an untrusted value: `<safe prefix>-<hash>`.
pub fn segment(value: &str) -> String {
    let prefix: String = value
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c.to_ascii_lowercase()
            } else {
                '_'
            }
        })
        .take(32)
        .collect();
    let prefix = prefix.trim_start_matches(['-', '_']);
    let prefix = if prefix.is_empty() { "x" } else { prefix };
    format!("{prefix}-{}", short_hash(value, 12))
}

/// The paths grove uses under one data root.
#[derive(Debug, Clone)]
pub struct Layout {
    root: PathBuf,
}

impl Layout {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }
    pub fn root(&self) -> &Path {
        &self.root
    }
    /// The bare mirror for a repository identity.
    pub fn repo_cache_dir(&self, identity: &str) -> PathBuf {
        let last = identity.rsplit(['/', ':']).next().unwrap_or(identity);
        self.root
            .join("repos")
            .join(format!("{}.git", segment_with(last, identity)))
    }
    /// The private saved-work store of one workspace (never mounted into a sandbox).
    pub fn saved_dir(&self, user_id: &str, workspace_id: uuid::Uuid) -> PathBuf {
        self.root
            .join("saved")
            .join(segment(user_id))
            .join(workspace_id.to_string())
    }
    /// The private history store of one workspace (never mounted into a sandbox).
    pub fn history_dir(&self, user_id: &str, workspace_id: uuid::Uuid) -> PathBuf {
        self.root
            .join("history")
            .join(segment(user_id))
            .join(workspace_id.to_string())
    }
    /// The checkout of one workspace.
    pub fn workspace_dir(&self, key: &WorkspaceKey) -> PathBuf {
        self.root
            .join("workspaces")
            .join(segment(&key.user_id))
            .join(segment(&key.project_id))
            .join(format!(
                "{}-{}",
                key.mode.as_str(),
                segment_with(&key.scope, &key.lock_string())
            ))
    }
}

/// Like [`segment`], but the hash covers `hashed` (a fuller identity) rather than `shown`.
fn segment_with(shown: &str, hashed: &str) -> String {
    let s = segment(shown);
    let prefix = s.rsplit_once('-').map(|x| x.0).unwrap_or("x");
    format!("{prefix}-{}", short_hash(hashed, 12))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::WorkspaceMode;

    fn key(user: &str, scope: &str) -> WorkspaceKey {
        WorkspaceKey {
            node: "local".into(),
            user_id: user.into(),
            project_id: "p".into(),
            mode: WorkspaceMode::Edit,
            scope: scope.into(),
        }
    }

    #[test]
    fn hostile_ids_stay_inside_the_root() {
        let layout = Layout::new("/g");
        for hostile in ["../../etc", "/abs", "a\0b", "..", "ℬ𝒶𝒹", &"x".repeat(500)] {
            let dir = layout.workspace_dir(&key(hostile, hostile));
            assert!(dir.starts_with("/g/workspaces"));
            assert!(dir.components().all(|c| c.as_os_str() != ".."), "{dir:?}");
            assert!(dir.to_str().unwrap().len() < 200);
        }
    }

    #[test]
    fn distinct_keys_get_distinct_directories() {
        let layout = Layout::new("/g");
        assert_ne!(
            layout.workspace_dir(&key("a", "c1")),
            layout.workspace_dir(&key("a", "c2"))
        );
        // Values that sanitize to the same prefix still differ by hash.
        assert_ne!(
            layout.workspace_dir(&key("a.b", "c")),
            layout.workspace_dir(&key("a_b", "c"))
        );
        assert_ne!(
            layout.repo_cache_dir("github.com/o/r"),
            layout.repo_cache_dir("gitlab.com/o/r")
        );
    }
}
