//! git as an agent tool in a workspace: status, diff, log, commit, and push to a real
//! local bare repository (fast-forward, rejection, force-with-lease, upstream, token).

use std::path::{Path, PathBuf};

use grove_core::error::GitError;
use grove_core::ports::{CheckoutRequest, CommitRequest, GitPort, GitToken, PushRequest};
use grove_core::tools::DiffAgainst;
use grove_git::Git2Adapter;

use crate::cache::{base64, RejectingServer, TOKEN};
use crate::support::{git, git_as_author, Fixture};

const BRANCH: &str = "agent/edits-c1";

/// A fixture, a bare remote cloned from it, and an edit workspace whose `origin` is
/// that bare remote.
struct Ws {
    fx: Fixture,
    remote: PathBuf,
    dir: PathBuf,
}

impl Ws {
    fn new() -> Self {
        let fx = Fixture::new();
        let remote = fx.path("remote.git");
        git(
            fx.root.path(),
            &[
                "clone",
                "-q",
                "--bare",
                fx.upstream.to_str().unwrap(),
                "remote.git",
            ],
        );
        let cache = fx.cache();
        let dir = fx.path("ws");
        let url = format!("file://{}", remote.display());
        Git2Adapter::new()
            .create_checkout(&CheckoutRequest {
                cache_dir: &cache,
                workspace_dir: &dir,
                base_ref: "main",
                branch: Some(BRANCH),
                upstream_url: &url,
            })
            .unwrap();
        Self { fx, remote, dir }
    }

    fn write(&self, rel: &str, content: &str) {
        std::fs::write(self.dir.join(rel), content).unwrap();
    }

    fn commit(
        &self,
        message: &str,
        paths: &[&str],
    ) -> Result<grove_core::tools::Committed, GitError> {
        let paths: Vec<String> = paths.iter().map(|p| p.to_string()).collect();
        Git2Adapter::new().commit(&CommitRequest {
            workspace_dir: &self.dir,
            message,
            paths: &paths,
            author: None,
        })
    }

    fn push(
        &self,
        force_with_lease: bool,
        expect: Option<&str>,
    ) -> Result<grove_core::tools::Pushed, GitError> {
        Git2Adapter::new().push(&PushRequest {
            workspace_dir: &self.dir,
            remote_url: &self.url(),
            branch: None,
            force_with_lease,
            expect,
            set_upstream: false,
            token: None,
        })
    }

    /// The push URL grove records for this workspace: the bare `remote.git`.
    fn url(&self) -> String {
        format!("file://{}", self.remote.display())
    }

    fn remote_branch(&self) -> Option<String> {
        let out = std::process::Command::new("git")
            .args([
                "--git-dir",
                self.remote.to_str().unwrap(),
                "rev-parse",
                "--verify",
                "-q",
            ])
            .arg(format!("refs/heads/{BRANCH}"))
            .output()
            .unwrap();
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
    }
}

fn entries(dir: &Path) -> Vec<(String, Option<String>, Option<String>)> {
    let mut e: Vec<_> = Git2Adapter::new()
        .status(dir)
        .unwrap()
        .entries
        .into_iter()
        .map(|e| (e.path, e.staged, e.unstaged))
        .collect();
    e.sort();
    e
}

#[test]
fn status_lists_modified_untracked_and_deleted_paths_on_the_branch() {
    let w = Ws::new();
    let st = Git2Adapter::new().status(&w.dir).unwrap();
    assert_eq!(st.branch.as_deref(), Some(BRANCH));
    assert_eq!(st.head.as_deref(), Some(w.fx.main.as_str()));
    assert!(st.entries.is_empty());
    w.write("README.md", "changed\n");
    std::fs::create_dir_all(w.dir.join("new/dir")).unwrap();
    w.write("new/dir/file.txt", "n\n");
    w.write("ignored.log", "x\n");
    std::fs::remove_file(w.dir.join("src/lib.rs")).unwrap();
    let m = |s: &str| Some(s.to_string());
    assert_eq!(
        entries(&w.dir),
        vec![
            ("README.md".into(), None, m("modified")),
            ("new/dir/file.txt".into(), None, m("untracked")),
            ("src/lib.rs".into(), None, m("deleted")),
        ]
    );
}

#[test]
fn diff_against_head_base_and_a_ref_includes_untracked_files_and_honours_paths() {
    let w = Ws::new();
    let g = Git2Adapter::new();
    w.write("README.md", "hello again\nmore\n");
    w.write("added.txt", "brand new\n");
    let d = g.diff(&w.dir, &DiffAgainst::Head, &[], 1 << 20).unwrap();
    assert_eq!(d.against, w.fx.main);
    assert_eq!(
        d.files,
        vec!["README.md".to_string(), "added.txt".to_string()]
    );
    assert!(d.patch.contains("+more\n"), "{}", d.patch);
    assert!(d.patch.contains("+brand new\n"), "{}", d.patch);
    assert!(!d.truncated);
    let only = g
        .diff(
            &w.dir,
            &DiffAgainst::Head,
            &["added.txt".to_string()],
            1 << 20,
        )
        .unwrap();
    assert_eq!(only.files, vec!["added.txt".to_string()]);
    // Committed changes disappear from a diff against HEAD but not against the base.
    w.commit("work", &[]).unwrap();
    let d = g.diff(&w.dir, &DiffAgainst::Head, &[], 1 << 20).unwrap();
    assert!(d.files.is_empty());
    let d = g
        .diff(&w.dir, &DiffAgainst::Ref(w.fx.main.clone()), &[], 1 << 20)
        .unwrap();
    assert_eq!(d.files.len(), 2);
    // `main` names the upstream's branch (origin/main in the workspace); `v1` is older.
    let d = g
        .diff(&w.dir, &DiffAgainst::Ref("main".into()), &[], 1 << 20)
        .unwrap();
    assert_eq!(d.against, w.fx.main);
    let cut = g
        .diff(&w.dir, &DiffAgainst::Ref("main".into()), &[], 40)
        .unwrap();
    assert!(cut.truncated && cut.patch.len() <= 40);
    assert!(matches!(
        g.diff(&w.dir, &DiffAgainst::Ref("nope".into()), &[], 100),
        Err(GitError::RefNotFound(_))
    ));
}

#[test]
fn log_lists_commits_newest_first() {
    let w = Ws::new();
    w.write("a.txt", "a\n");
    let c = w.commit("add a\n\nbody", &[]).unwrap();
    let log = Git2Adapter::new().log(&w.dir, 2).unwrap();
    assert_eq!(log.len(), 2);
    assert_eq!(log[0].commit, c.commit);
    assert_eq!(log[0].summary, "add a");
    assert_eq!(log[0].author_name, "grove agent");
    assert_eq!(log[1].commit, w.fx.main);
    assert_eq!(Git2Adapter::new().log(&w.dir, 100).unwrap().len(), 3);
}

#[test]
fn commit_of_everything_of_given_paths_and_of_nothing() {
    let w = Ws::new();
    let g = Git2Adapter::new();
    assert_eq!(
        w.commit("empty", &[]).unwrap_err(),
        GitError::NothingToCommit
    );
    w.write("one.txt", "1\n");
    w.write("two.txt", "2\n");
    let c = w.commit("only one", &["one.txt"]).unwrap();
    assert_eq!(c.files, vec!["one.txt".to_string()]);
    assert_eq!(c.branch.as_deref(), Some(BRANCH));
    assert_eq!(git(&w.dir, &["rev-parse", "HEAD"]), c.commit);
    assert_eq!(
        entries(&w.dir),
        vec![("two.txt".into(), None, Some("untracked".into()))]
    );
    // A deletion and a directory.
    std::fs::remove_file(w.dir.join("src/lib.rs")).unwrap();
    std::fs::create_dir_all(w.dir.join("pkg/inner")).unwrap();
    w.write("pkg/inner/x.rs", "x\n");
    let c = w.commit("rm and pkg", &["src/lib.rs", "pkg"]).unwrap();
    assert_eq!(
        c.files,
        vec!["pkg/inner/x.rs".to_string(), "src/lib.rs".to_string()]
    );
    assert!(matches!(
        w.commit("ghost", &["never-existed.txt"]),
        Err(GitError::InvalidInput(_))
    ));
    // Everything, with an author of the request's choosing.
    let c = g
        .commit(&CommitRequest {
            workspace_dir: &w.dir,
            message: "rest",
            paths: &[],
            author: Some(("Ada", "ada@example.invalid")),
        })
        .unwrap();
    assert_eq!(c.files, vec!["two.txt".to_string()]);
    assert_eq!(
        git(&w.dir, &["log", "-1", "--format=%an <%ae>"]),
        "Ada <ada@example.invalid>"
    );
    assert!(entries(&w.dir).is_empty());
}

#[test]
fn push_creates_fast_forwards_and_refuses_a_rewrite_without_lease() {
    let w = Ws::new();
    w.write("a.txt", "a\n");
    let c1 = w.commit("a", &[]).unwrap();
    let p = w.push(false, None).unwrap();
    assert_eq!(p.branch, BRANCH);
    assert_eq!(p.previous, None);
    assert_eq!(w.remote_branch().as_deref(), Some(c1.commit.as_str()));
    assert_eq!(
        git(&w.dir, &["rev-parse", &format!("origin/{BRANCH}")]),
        c1.commit
    );
    w.write("b.txt", "b\n");
    let c2 = w.commit("b", &[]).unwrap();
    let p = w.push(false, None).unwrap();
    assert_eq!(p.previous.as_deref(), Some(c1.commit.as_str()));
    assert!(!p.forced);
    assert_eq!(w.remote_branch().as_deref(), Some(c2.commit.as_str()));
    // Rewrite: drop c2 and commit something else on c1.
    git(&w.dir, &["reset", "-q", "--hard", &c1.commit]);
    w.write("c.txt", "c\n");
    let c3 = w.commit("c", &[]).unwrap();
    assert!(matches!(w.push(false, None), Err(GitError::Rejected(_))));
    assert_eq!(w.remote_branch().as_deref(), Some(c2.commit.as_str()));
    // With a lease that holds (the remote is where we last pushed it), it goes through.
    let p = w.push(true, None).unwrap();
    assert!(p.forced);
    assert_eq!(p.previous.as_deref(), Some(c2.commit.as_str()));
    assert_eq!(w.remote_branch().as_deref(), Some(c3.commit.as_str()));
}

#[test]
fn force_with_lease_refuses_when_someone_else_moved_the_remote_branch() {
    let w = Ws::new();
    w.write("a.txt", "a\n");
    let c1 = w.commit("a", &[]).unwrap();
    w.push(false, None).unwrap();
    // Someone else pushes to the branch from their own clone.
    let other = w.fx.path("other");
    git(
        w.fx.root.path(),
        &[
            "clone",
            "-q",
            "--branch",
            BRANCH,
            w.remote.to_str().unwrap(),
            "other",
        ],
    );
    std::fs::write(other.join("theirs.txt"), "theirs\n").unwrap();
    git(&other, &["add", "-A"]);
    git_as_author(&other, &["commit", "-q", "-m", "theirs"]);
    git(&other, &["push", "-q", "origin", BRANCH]);
    let theirs = git(&other, &["rev-parse", "HEAD"]);
    // We rewrite ours and force with a lease that no longer holds.
    git(&w.dir, &["reset", "-q", "--hard", &w.fx.main]);
    w.write("mine.txt", "mine\n");
    w.commit("mine", &[]).unwrap();
    match w.push(true, None) {
        Err(GitError::Rejected(msg)) => assert!(msg.contains("stale lease"), "{msg}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(w.remote_branch().as_deref(), Some(theirs.as_str()));
    // A lease naming a wrong commit fails too; naming theirs (seen and accepted) succeeds.
    assert!(matches!(
        w.push(true, Some(&c1.commit)),
        Err(GitError::Rejected(_))
    ));
    let p = w.push(true, Some(&theirs)).unwrap();
    assert_eq!(p.previous.as_deref(), Some(theirs.as_str()));
    assert!(p.forced);
}

#[test]
fn a_push_to_a_repository_with_a_work_tree_is_rejected_and_changes_nothing() {
    let w = Ws::new();
    w.write("a.txt", "a\n");
    w.commit("a", &[]).unwrap();
    let upstream = w.fx.upstream.clone();
    let refs_before = git(&upstream, &["for-each-ref"]);
    let err = Git2Adapter::new()
        .push(&PushRequest {
            workspace_dir: &w.dir,
            remote_url: &format!("file://{}", upstream.display()),
            branch: None,
            force_with_lease: false,
            expect: None,
            set_upstream: false,
            token: None,
        })
        .unwrap_err();
    assert!(
        matches!(&err, GitError::Rejected(m) if m.contains("bare")),
        "{err:?}"
    );
    assert_eq!(git(&upstream, &["for-each-ref"]), refs_before);
}

#[test]
fn push_sets_the_upstream_when_asked_and_refuses_an_unknown_branch() {
    let w = Ws::new();
    w.write("a.txt", "a\n");
    w.commit("a", &[]).unwrap();
    Git2Adapter::new()
        .push(&PushRequest {
            workspace_dir: &w.dir,
            remote_url: &w.url(),
            branch: Some(BRANCH),
            force_with_lease: false,
            expect: None,
            set_upstream: true,
            token: None,
        })
        .unwrap();
    assert_eq!(
        git(&w.dir, &["config", &format!("branch.{BRANCH}.remote")]),
        "origin"
    );
    assert_eq!(
        git(&w.dir, &["config", &format!("branch.{BRANCH}.merge")]),
        format!("refs/heads/{BRANCH}")
    );
    let err = Git2Adapter::new()
        .push(&PushRequest {
            workspace_dir: &w.dir,
            remote_url: &w.url(),
            branch: Some("no-such-branch"),
            force_with_lease: false,
            expect: None,
            set_upstream: false,
            token: None,
        })
        .unwrap_err();
    assert!(matches!(err, GitError::RefNotFound(_)));
}

#[test]
fn a_push_token_goes_only_through_the_credentials_callback() {
    let w = Ws::new();
    let server = RejectingServer::start();
    w.write("a.txt", "a\n");
    w.commit("a", &[]).unwrap();
    let token = GitToken::new(TOKEN.to_string());
    let err = Git2Adapter::new()
        .push(&PushRequest {
            workspace_dir: &w.dir,
            remote_url: &server.url,
            branch: None,
            force_with_lease: false,
            expect: None,
            set_upstream: true,
            token: Some(&token),
        })
        .unwrap_err();
    assert_eq!(err, GitError::AuthFailed);
    assert!(!err.to_string().contains(TOKEN));
    let expected = format!("Basic {}", base64(&format!("x-access-token:{TOKEN}")));
    assert!(server.authorizations().iter().any(|a| a == &expected));
    let config = std::fs::read_to_string(w.dir.join(".git/config")).unwrap();
    assert!(!config.contains(TOKEN), "{config}");
    assert_eq!(git(&w.dir, &["remote", "get-url", "origin"]), w.url());
}
