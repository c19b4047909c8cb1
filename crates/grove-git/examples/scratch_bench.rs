use grove_core::ports::{CheckoutRequest, GitPort, GitToken};
use grove_git::Git2Adapter;
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
    assert!(
        s.status.success(),
        "{:?} {}",
        args,
        String::from_utf8_lossy(&s.stderr)
    );
}

fn main() {
    let a = Git2Adapter::new();
    let root = tempfile::tempdir().unwrap();
    let r = root.path();
    // error messages
    for url in [
        "file:///nonexistent/x",
        "http://127.0.0.1:1/x.git",
        "https://example.invalid/x.git",
    ] {
        let e = a
            .ensure_cache(
                url,
                &r.join("c.git"),
                Some(&GitToken::new("tok".into())),
                false,
            )
            .unwrap_err();
        println!("{url}: {e:?}");
    }
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
    let url = format!("file://{}", up.display());
    let cache = r.join("cache.git");
    let t = Instant::now();
    let rep = a.ensure_cache(&url, &cache, None, false).unwrap();
    println!(
        "ensure_cache clone: {:?} size {}",
        t.elapsed(),
        rep.size_bytes
    );
    git(&cache, &["gc", "-q"]); // packed like a real network clone (libgit2 local fetch also packs)
    let (mut g, mut sh, mut wt) = (vec![], vec![], vec![]);
    for i in 0..7 {
        let ws = r.join(format!("ws{i}"));
        let t = Instant::now();
        a.create_checkout(&CheckoutRequest {
            cache_dir: &cache,
            workspace_dir: &ws,
            base_ref: "main",
            branch: Some("b"),
            upstream_url: "https://x/y",
        })
        .unwrap();
        g.push(t.elapsed().as_millis());
        let t = Instant::now();
        git(
            r,
            &[
                "clone",
                "-q",
                "--shared",
                "--no-checkout",
                cache.to_str().unwrap(),
                &format!("sh{i}"),
            ],
        );
        git(
            &r.join(format!("sh{i}")),
            &["checkout", "-q", "-b", "b", "origin/main"],
        );
        sh.push(t.elapsed().as_millis());
        let t = Instant::now();
        git(
            &cache,
            &[
                "worktree",
                "add",
                "-q",
                "-b",
                &format!("wt{i}"),
                r.join(format!("wt{i}")).to_str().unwrap(),
                "main",
            ],
        );
        wt.push(t.elapsed().as_millis());
    }
    let med = |v: &mut Vec<u128>| {
        v.sort();
        v[v.len() / 2]
    };
    println!("ms grove {:?} median {}", g.clone(), med(&mut g.clone()));
    println!(
        "ms clone --shared + checkout {:?} median {}",
        sh.clone(),
        med(&mut sh.clone())
    );
    println!(
        "ms worktree add {:?} median {}",
        wt.clone(),
        med(&mut wt.clone())
    );
    let t = Instant::now();
    let d = a.is_dirty(&r.join("ws0")).unwrap();
    println!("is_dirty: {:?} {d}", t.elapsed());
}
