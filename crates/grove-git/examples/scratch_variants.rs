use git2::{build::CheckoutBuilder, Repository};
use std::path::Path;
use std::process::Command;
use std::time::Instant;

fn git(dir: &Path, args: &[&str]) {
    let s = Command::new("git")
        .current_dir(dir)
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .args(["-c", "user.name=a", "-c", "user.email=a@b"])
        .args(args)
        .output()
        .unwrap();
    assert!(s.status.success());
}
fn prep(ws: &Path, cache: &Path) -> Repository {
    let repo = Repository::init(ws).unwrap();
    std::fs::write(
        ws.join(".git/objects/info/alternates"),
        format!("{}\n", cache.join("objects").display()),
    )
    .unwrap();
    drop(repo);
    Repository::open(ws).unwrap()
}
fn main() {
    let root = tempfile::tempdir().unwrap();
    let r = root.path();
    let up = r.join("up");
    std::fs::create_dir(&up).unwrap();
    git(&up, &["-c", "init.defaultBranch=main", "init", "-q"]);
    for d in 0..100 {
        let dir = up.join(format!("dir{d:03}"));
        std::fs::create_dir(&dir).unwrap();
        for f in 0..50 {
            let body: String = (0..40)
                .map(|i| format!("line {i} of file {f} in {d}: lorem ipsum dolor sit amet\n"))
                .collect();
            std::fs::write(dir.join(format!("f{f:02}.rs")), body).unwrap();
        }
    }
    git(&up, &["add", "-A"]);
    git(&up, &["commit", "-q", "-m", "many"]);
    let cache = r.join("cache.git");
    git(
        r,
        &[
            "clone",
            "-q",
            "--bare",
            up.to_str().unwrap(),
            cache.to_str().unwrap(),
        ],
    );
    let c = Repository::open_bare(&cache).unwrap();
    let oid = c.refname_to_id("refs/heads/main").unwrap();
    drop(c);
    for round in 0..3 {
        // A: set head then checkout_head force
        let ws = r.join(format!("a{round}"));
        let repo = prep(&ws, &cache);
        let commit = repo.find_commit(oid).unwrap();
        repo.branch("b", &commit, true).unwrap();
        repo.set_head("refs/heads/b").unwrap();
        let t = Instant::now();
        repo.checkout_head(Some(CheckoutBuilder::new().force()))
            .unwrap();
        let a = t.elapsed();
        // B: checkout_tree on unborn head (baseline empty), then set head
        let ws = r.join(format!("b{round}"));
        let repo = prep(&ws, &cache);
        let commit = repo.find_commit(oid).unwrap();
        let t = Instant::now();
        repo.checkout_tree(commit.as_object(), Some(CheckoutBuilder::new().force()))
            .unwrap();
        let b = t.elapsed();
        repo.branch("b", &commit, true).unwrap();
        repo.set_head("refs/heads/b").unwrap();
        // C: safe (not force) checkout_tree into empty dir
        let ws = r.join(format!("c{round}"));
        let repo = prep(&ws, &cache);
        let commit = repo.find_commit(oid).unwrap();
        let t = Instant::now();
        repo.checkout_tree(
            commit.as_object(),
            Some(CheckoutBuilder::new().recreate_missing(true)),
        )
        .unwrap();
        let cc = t.elapsed();
        let t = Instant::now();
        let n = grove_git::dir_size_bytes(&ws).unwrap();
        let ds = t.elapsed();
        println!(
            "A head+force {a:?}  B tree-on-unborn force {b:?}  C safe {cc:?}  dirsize {ds:?} {n}"
        );
    }
}
