//! Fuzz target: every parser and validator of untrusted input, on arbitrary bytes.
//! Each accepted value must keep the promise its validator makes (no traversal, no
//! option-like or credential-bearing URL, paths under the root); nothing may panic.
#![no_main]

use grove_core::commands::Command;
use grove_core::idempotency;
use grove_core::layout::Layout;
use grove_core::model::{branch_for, WorkspaceKey, WorkspaceMode};
use grove_core::validate::{
    validate_branch_scope_id, validate_command, validate_env, validate_owner_id, validate_ref,
    RepoName, RepoUrl,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // JSON first: arbitrary bodies decoded as commands must validate without panicking.
    if let Ok(cmd) = serde_json::from_slice::<Command>(data) {
        let _ = cmd.validate();
    }
    let text = String::from_utf8_lossy(data);
    // Several fields from one input, split on 0x01.
    let fields: Vec<&str> = text.split('\u{1}').collect();
    let f = |i: usize| fields.get(i).copied().unwrap_or("");

    if let Ok(name) = RepoName::parse(f(0)) {
        let (owner, repo) = name.as_str().split_once('/').expect("OWNER/NAME");
        for seg in [owner, repo] {
            assert!(!seg.is_empty() && !seg.starts_with('-') && !seg.starts_with('.'));
            assert!(!seg.contains("..") && !seg.contains('/'));
        }
    }
    if let Ok(url) = RepoUrl::parse(f(1)) {
        let s = url.as_str();
        assert!(!s.starts_with('-') && !s.contains("::"));
        assert!(!s.chars().any(|c| c.is_control() || c.is_whitespace()));
        if let Some(rest) = s.strip_prefix("https://").or_else(|| s.strip_prefix("http://")) {
            assert!(!rest.split('/').next().unwrap_or("").contains('@'));
        }
        let dir = Layout::new("/root-of-grove").repo_cache_dir(url.identity());
        assert!(dir.starts_with("/root-of-grove/repos") && dir.components().count() == 4);
    }
    if validate_ref(f(2)).is_ok() {
        let r = f(2);
        assert!(!r.starts_with('-') && !r.contains("..") && !r.contains("@{"));
        assert!(!r.chars().any(|c| c.is_control() || " ~^:?*[\\".contains(c)));
    }
    let key = WorkspaceKey {
        node: f(3).to_string(),
        user_id: f(3).to_string(),
        project_id: f(4).to_string(),
        mode: WorkspaceMode::Task,
        scope: f(5).to_string(),
    };
    let dir = Layout::new("/root-of-grove").workspace_dir(&key);
    assert!(dir.starts_with("/root-of-grove/workspaces") && dir.components().count() == 6);
    if validate_owner_id("user", f(3)).is_ok() && validate_branch_scope_id("task", f(5)).is_ok() {
        let branch = branch_for(WorkspaceMode::Task, f(5)).expect("a task has a branch");
        assert!(validate_ref(&branch).is_ok(), "{branch:?}");
    }
    let argv: Vec<String> = fields.iter().skip(6).map(|s| s.to_string()).collect();
    if validate_command(&argv).is_ok() {
        assert!(!argv.is_empty() && argv.iter().all(|a| !a.contains('\0')));
    }
    if validate_env(f(6), f(7)).is_ok() {
        assert!(f(6).chars().all(|c| c.is_ascii_alphanumeric() || c == '_'));
    }
    if idempotency::validate_key(f(8)).is_ok() {
        assert!(!f(8).chars().any(char::is_control));
    }
    if let Ok(p) = grove_tools::RelPath::parse(f(9)) {
        assert!(!p.as_str().starts_with('/'));
        assert!(!p.as_str().split('/').any(|s| s == ".." || s.is_empty() && !p.is_root()));
        assert!(!p.as_str().contains('\0'));
    }
});
