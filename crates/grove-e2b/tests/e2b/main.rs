//! The E2B runtime against a fake E2B on loopback (`fake.rs`): the runtime contract,
//! recovery by metadata after a restart, resume of a paused sandbox and re-creation
//! of a killed one, the persistence semantics of pause, timeout and kill, files,
//! error mapping and capability reporting. Each test starts its own fake.

mod fake;

use std::path::Path;

use fake::FakeE2b;
use grove_core::error::RuntimeError;
use grove_core::ports::GitToken;
use grove_core::ports::{NetworkPolicy, PreviewRequest, RuntimeProvider};
use grove_e2b::{E2bConfig, E2bRuntimeProvider, SandboxKey, Secret, WorkspacePlacement};
use grove_runtime_contract::remote::{
    assert_all_run_in, create_racing, echo, fixture_repo, spec_for,
};
use grove_runtime_contract::{default_spec, request, Harness};

struct Env {
    fake: FakeE2b,
    provider: E2bRuntimeProvider,
    scratch: tempfile::TempDir,
}

fn config(fake: &FakeE2b) -> E2bConfig {
    let mut c = E2bConfig::new(fake.url.clone(), Secret::new(fake.key.clone()));
    c.envd_url_template = fake.envd_template();
    c
}

impl Env {
    async fn new() -> Self {
        let fake = FakeE2b::start().await;
        let provider = E2bRuntimeProvider::new(config(&fake)).unwrap();
        Self::with(fake, provider)
    }

    fn with(fake: FakeE2b, provider: E2bRuntimeProvider) -> Self {
        let scratch = tempfile::Builder::new()
            .prefix("e2b-scratch-")
            .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
            .unwrap();
        Self {
            fake,
            provider,
            scratch,
        }
    }

    fn restarted(&self) -> E2bRuntimeProvider {
        E2bRuntimeProvider::new(config(&self.fake)).unwrap()
    }

    fn workspace(&self) -> tempfile::TempDir {
        tempfile::Builder::new()
            .prefix("ws-")
            .tempdir_in(self.scratch.path())
            .unwrap()
    }

    fn only_sandbox(&self) -> String {
        let all = self.fake.sandboxes();
        assert_eq!(all.len(), 1, "expected exactly one sandbox: {all:?}");
        all[0].0.clone()
    }
}

impl Harness for Env {
    fn provider(&self) -> &dyn RuntimeProvider {
        &self.provider
    }
    fn scratch_root(&self) -> &Path {
        self.scratch.path()
    }
}

/// The runtime contract, one test per check, each against its own fake.
mod contract {
    use super::*;

    grove_runtime_contract::remote_contract_tests!(Env::new().await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capabilities_and_persistence_are_reported_truthfully() {
    let env = Env::new().await;
    let p: &dyn RuntimeProvider = &env.provider;
    let caps = p.capabilities();
    assert_eq!(p.kind(), "e2b");
    assert!(caps.writable && caps.network_none && caps.network_default);
    assert!(!caps.isolated && !caps.network_limited);
    assert!(caps.preview_url && p.preview_urls().is_some());
    assert!(
        !caps.snapshot && p.snapshotter().is_none(),
        "no snapshots: None"
    );
    assert!(
        caps.interactive_session && p.sessions().is_some(),
        "envd processes take stdin: sessions are offered"
    );
    assert_eq!(
        caps.network_policies(),
        vec![NetworkPolicy::None, NetworkPolicy::Default]
    );
    let persistence = env.provider.persistence();
    assert!(persistence.survives_pause && persistence.survives_timeout);
    assert!(!persistence.survives_kill);

    let mut c = config(&env.fake);
    c.auto_pause = false;
    let persistence = E2bRuntimeProvider::new(c).unwrap().persistence();
    assert!(persistence.survives_pause && !persistence.survives_timeout);
    assert!(!persistence.survives_kill);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_port_preview_url_names_the_port_and_the_sandbox() {
    let env = Env::new().await;
    let ws = env.workspace();
    let spec = spec_for(ws.path(), "alice", "p1");
    echo(&env.provider, spec.clone(), "x").await;
    let id = env.only_sandbox();
    let previews = env.provider.preview_urls().unwrap();
    let url = previews
        .expose(PreviewRequest {
            backend_id: env.provider.backend_id(&spec),
            port: 8080,
        })
        .await
        .unwrap();
    assert_eq!(url.url, format!("https://8080-{id}.e2b.app"));
    assert!(matches!(
        previews
            .expose(PreviewRequest {
                backend_id: env.provider.backend_id(&spec),
                port: 49983,
            })
            .await,
        Err(RuntimeError::CommandRejected(_))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_sandbox_serves_a_user_and_project_and_carries_its_metadata() {
    let env = Env::new().await;
    let (a, b) = (env.workspace(), env.workspace());
    echo(&env.provider, spec_for(a.path(), "alice", "p1"), "one").await;
    echo(&env.provider, spec_for(b.path(), "alice", "p1"), "two").await;
    let id = env.only_sandbox();
    let body = env.fake.create_body(&id);
    assert_eq!(body["metadata"]["grove.managed"], "true");
    assert_eq!(body["metadata"]["grove.user"], "alice");
    assert_eq!(body["metadata"]["grove.network"], "none");
    assert_eq!(body["timeout"], 900);
    assert_eq!(body["autoPause"], true);
    assert_eq!(body["allow_internet_access"], false);
    assert_eq!(body["templateID"], "base");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_provider_finds_its_sandbox_by_metadata() {
    let env = Env::new().await;
    let ws = env.workspace();
    echo(&env.provider, spec_for(ws.path(), "bob", "p1"), "x").await;
    echo(&env.provider, spec_for(ws.path(), "alice", "p1"), "before").await;
    echo(
        &env.restarted(),
        spec_for(ws.path(), "alice", "p1"),
        "after",
    )
    .await;
    assert_eq!(env.fake.creates(), 2, "the restart created another sandbox");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listing_by_metadata_follows_the_next_token_across_pages() {
    let fake = FakeE2b::start().await;
    let mut c = config(&fake);
    c.list_page_size = 2;
    let env = Env::with(fake, E2bRuntimeProvider::new(c).unwrap());
    let ws = env.workspace();
    for i in 0..5 {
        echo(
            &env.provider,
            spec_for(ws.path(), &format!("u{i}"), "p1"),
            "x",
        )
        .await;
    }
    let managed =
        std::collections::BTreeMap::from([("grove.managed".to_string(), "true".to_string())]);
    let all = env.provider.client().list(&managed).await.unwrap();
    assert_eq!(all.len(), 5, "five sandboxes over three pages of two");
    let alice = std::collections::BTreeMap::from([("grove.user".to_string(), "u3".to_string())]);
    let one = env.provider.client().list(&alice).await.unwrap();
    assert_eq!(one.len(), 1);
    assert_eq!(one[0].metadata["grove.user"], "u3");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_sandbox_is_resumed_with_its_files_and_the_command_retried() {
    let env = Env::new().await;
    let ws = env.workspace();
    let rt = env
        .provider
        .create(spec_for(ws.path(), "alice", "p1"))
        .await
        .unwrap();
    let mut req = request(&["sh", "-c", "echo kept > kept.txt"]);
    req.mutating = true;
    assert_eq!(rt.exec(req).await.unwrap().exit_code, 0);
    let id = env.only_sandbox();
    env.fake.pause_behind_the_back(&id);

    let r = rt
        .exec(request(&["cat", "kept.txt"]))
        .await
        .expect("exec after pause");
    assert_eq!(String::from_utf8_lossy(&r.stdout), "kept\n");
    assert_eq!(env.fake.sandboxes()[0].1, "running");
    assert_eq!(env.fake.creates(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_sandbox_is_created_again_and_the_command_retried() {
    let env = Env::new().await;
    let ws = env.workspace();
    let rt = env
        .provider
        .create(spec_for(ws.path(), "alice", "p1"))
        .await
        .unwrap();
    rt.exec(request(&["true"])).await.unwrap();
    let id = env.only_sandbox();
    env.fake.kill_behind_the_back(&id);

    let r = rt
        .exec(request(&["echo", "again"]))
        .await
        .expect("exec after kill");
    assert_eq!(String::from_utf8_lossy(&r.stdout), "again\n");
    assert_eq!(env.fake.creates(), 2);
    assert_ne!(env.only_sandbox(), id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_survive_a_timeout_with_auto_pause_and_not_a_kill() {
    let env = Env::new().await;
    let key = SandboxKey {
        user: "alice".into(),
        project: "p1".into(),
    };
    let ws = env.workspace();
    echo(&env.provider, spec_for(ws.path(), "alice", "p1"), "x").await;
    let id = env.only_sandbox();
    let file = env.fake.home(&id).join("notes.txt");
    let path = file.to_str().unwrap().to_string();
    env.provider
        .write_file(&key, NetworkPolicy::None, &path, b"survives a pause")
        .await
        .unwrap();

    env.fake.expire(&id);
    assert_eq!(env.fake.sandboxes()[0].1, "paused", "auto-pause at timeout");
    let back = env
        .provider
        .read_file(&key, NetworkPolicy::None, &path)
        .await
        .unwrap();
    assert_eq!(back, b"survives a pause");

    env.provider.kill_sandbox(&key).await.unwrap();
    assert!(env.fake.sandboxes().is_empty());
    match env
        .provider
        .read_file(&key, NetworkPolicy::None, &path)
        .await
    {
        Err(RuntimeError::NotFound(_)) => {}
        other => panic!("a killed sandbox's file must be gone, got {other:?}"),
    }
    assert_eq!(
        env.fake.creates(),
        2,
        "the read after the kill ran in a new sandbox"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_auto_pause_a_timeout_loses_the_sandbox() {
    let fake = FakeE2b::start().await;
    let mut c = config(&fake);
    c.auto_pause = false;
    let env = Env::with(fake, E2bRuntimeProvider::new(c).unwrap());
    let ws = env.workspace();
    echo(&env.provider, spec_for(ws.path(), "alice", "p1"), "x").await;
    let id = env.only_sandbox();
    assert_eq!(env.fake.create_body(&id)["autoPause"], false);
    env.fake.expire(&id);
    assert!(env.fake.sandboxes().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn destroying_a_runtime_pauses_the_sandbox_and_keeps_its_files() {
    let env = Env::new().await;
    let ws = env.workspace();
    let spec = spec_for(ws.path(), "alice", "p1");
    let backend = env.provider.backend_id(&spec);
    assert_eq!(backend, "e2b:alice/p1");
    let rt = env.provider.create(spec).await.unwrap();
    let mut req = request(&["sh", "-c", "echo kept > kept.txt"]);
    req.mutating = true;
    rt.exec(req).await.unwrap();
    env.provider.destroy(&backend).await.unwrap();
    assert_eq!(env.fake.sandboxes()[0].1, "paused");
    // A second destroy finds it paused already (E2B answers 409 to a second pause).
    env.provider.destroy(&backend).await.unwrap();
    assert!(env.provider.healthy(&backend).await.unwrap());
    let r = rt.exec(request(&["cat", "kept.txt"])).await.unwrap();
    assert_eq!(String::from_utf8_lossy(&r.stdout), "kept\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_api_key_is_unauthorized_and_never_shown() {
    let fake = FakeE2b::start().await;
    let wrong = "e2b_wrong_key_that_must_not_leak";
    let mut c = config(&fake);
    c.api_key = Secret::new(wrong);
    assert_eq!(format!("{:?}", c.api_key), "Secret(***)");
    let env = Env::with(fake, E2bRuntimeProvider::new(c).unwrap());
    let ws = env.workspace();
    match env.provider.create(spec_for(ws.path(), "a", "p")).await {
        Err(RuntimeError::Unauthorized(msg)) => assert!(!msg.contains(wrong), "{msg}"),
        Err(e) => panic!("expected Unauthorized, got {e}"),
        Ok(_) => panic!("a wrong key was accepted"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_concurrent_sandbox_limit_is_a_resource_limit() {
    let fake = FakeE2b::start_with_limit(1).await;
    let provider = E2bRuntimeProvider::new(config(&fake)).unwrap();
    let env = Env::with(fake, provider);
    let ws = env.workspace();
    echo(&env.provider, spec_for(ws.path(), "a", "p"), "x").await;
    match env.provider.create(spec_for(ws.path(), "b", "p")).await {
        Err(RuntimeError::ResourceLimit(msg)) => assert!(msg.contains("429"), "{msg}"),
        Err(e) => panic!("expected ResourceLimit, got {e}"),
        Ok(_) => panic!("a sandbox past the limit was created"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limited_network_is_refused_and_another_network_is_a_conflict() {
    let env = Env::new().await;
    let ws = env.workspace();
    let mut spec = spec_for(ws.path(), "a", "p");
    spec.network = NetworkPolicy::Limited;
    assert!(matches!(
        env.provider.create(spec).await,
        Err(RuntimeError::CommandRejected(_))
    ));
    echo(&env.provider, spec_for(ws.path(), "a", "p"), "x").await;
    let mut spec = spec_for(ws.path(), "a", "p");
    spec.network = NetworkPolicy::Default;
    assert!(matches!(
        env.restarted().create(spec).await,
        Err(RuntimeError::Conflict(_))
    ));
}

fn placement(url: &str, scope: &str, branch: &str) -> WorkspacePlacement {
    WorkspacePlacement {
        user: "alice".into(),
        project: "p1".into(),
        scope: scope.into(),
        repo_name: "acme/widgets".into(),
        repo_url: url.into(),
        base_ref: "main".into(),
        branch: Some(branch.into()),
        network: NetworkPolicy::Default,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_conversations_on_one_branch_get_two_workspaces_from_one_clone() {
    let env = Env::new().await;
    let url = fixture_repo(env.scratch.path());
    let token = GitToken::new("ghp_e2b_token_value".into());
    let a = env
        .provider
        .ensure_workspace(&placement(&url, "conv-1", "feature"), Some(&token))
        .await
        .unwrap();
    let b = env
        .provider
        .ensure_workspace(&placement(&url, "conv-2", "feature"), None)
        .await
        .unwrap();
    assert_eq!(
        a.sandbox_id, b.sandbox_id,
        "one sandbox per (user, project)"
    );
    assert_ne!(a.path, b.path, "two conversations share a directory");
    assert!(
        a.cloned_cache && !b.cloned_cache,
        "the repository was cloned twice"
    );
    assert_eq!(env.fake.creates(), 1);
    let head = std::fs::read_to_string(format!("{}/.git/HEAD", a.path)).unwrap();
    assert_eq!(head.trim(), "ref: refs/heads/feature");
    let config = std::fs::read_to_string(format!("{}/.git/config", a.cache_path)).unwrap();
    assert!(
        !config.contains("ghp_e2b_token_value"),
        "the token landed in git config"
    );
    let again = env
        .provider
        .ensure_workspace(&placement(&url, "conv-1", "feature"), None)
        .await
        .unwrap();
    assert_eq!(
        (again.path.as_str(), again.cloned_cache),
        (a.path.as_str(), false)
    );

    let mut spec = default_spec(Path::new(&a.path), true, NetworkPolicy::Default);
    spec.labels.insert("grove.user".into(), "alice".into());
    spec.labels.insert("grove.project".into(), "p1".into());
    let rt = env.provider.create(spec).await.unwrap();
    let r = rt.exec(request(&["cat", "README.md"])).await.unwrap();
    assert_eq!(String::from_utf8_lossy(&r.stdout), "hello\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_base_ref_is_a_rejected_workspace_and_hostile_refs_touch_nothing() {
    let env = Env::new().await;
    let url = fixture_repo(env.scratch.path());
    let mut p = placement(&url, "conv-1", "feature");
    p.base_ref = "no-such-branch".into();
    match env.provider.ensure_workspace(&p, None).await {
        Err(RuntimeError::CommandRejected(msg)) => {
            assert!(msg.contains("making the workspace"), "{msg}")
        }
        other => panic!("expected CommandRejected, got {other:?}"),
    }
    let before = env.fake.creates();
    // Another user: reaching the provider at all would create a sandbox.
    let mut p = placement(&url, "conv-2", "feature");
    p.user = "mallory".into();
    p.branch = Some("--upload-pack=evil".into());
    assert!(matches!(
        env.provider.ensure_workspace(&p, None).await,
        Err(RuntimeError::CommandRejected(_))
    ));
    assert_eq!(env.fake.creates(), before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopping_a_runtime_kills_its_sessions_and_leaves_other_sandboxes_sessions_running() {
    use grove_core::ports::{SessionInput, SessionRequest};
    let env = Env::new().await;
    let (a, b) = (env.workspace(), env.workspace());
    let sessions = env.provider.sessions().expect("sessions");
    let start = |ws: &Path, user: &str| {
        let spec = spec_for(ws, user, "p1");
        sessions.start(
            spec,
            SessionRequest {
                argv: vec!["sh".into()],
                ..SessionRequest::default()
            },
        )
    };
    let alice = start(a.path(), "alice").await.expect("alice's session");
    let bob = start(b.path(), "bob").await.expect("bob's session");
    assert_eq!(alice.backend_id, "e2b:alice/p1");
    for id in [&alice.id, &bob.id] {
        sessions
            .write(
                id,
                SessionInput {
                    data: b"echo ready\n".to_vec(),
                    close: false,
                },
            )
            .await
            .unwrap();
        let out = sessions
            .poll(id, std::time::Duration::from_secs(10))
            .await
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&out.data), "ready\n");
    }

    env.provider.stop("e2b:alice/p1").await.unwrap();
    let out = sessions
        .poll(&alice.id, std::time::Duration::from_secs(10))
        .await
        .unwrap();
    let exit = out.exit.expect("alice's session ended with her runtime");
    assert!(exit.killed, "{exit:?}");
    assert!(
        sessions.info(&bob.id).unwrap().exit.is_none(),
        "another sandbox's session is untouched"
    );
    sessions.kill(&bob.id).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn workers_racing_to_create_one_users_sandbox_end_with_one_sandbox_they_all_use() {
    let env = Env::new().await;
    // Every create takes a while, so all workers find nothing and all create.
    env.fake
        .set_create_delay(std::time::Duration::from_millis(400));
    let ws = env.workspace();
    let workers: Vec<E2bRuntimeProvider> = (0..4).map(|_| env.restarted()).collect();
    let workers: Vec<&dyn RuntimeProvider> = workers.iter().map(|w| w as _).collect();
    let runtimes = create_racing(&workers, &spec_for(ws.path(), "alice", "p1")).await;
    assert_eq!(env.fake.creates(), 4, "the race did happen: four creates");
    let kept = env.only_sandbox();
    assert_all_run_in(&runtimes, &env.fake.home(&kept).display().to_string()).await;
    assert_eq!(env.only_sandbox(), kept);
    assert_eq!(
        env.fake.creates(),
        4,
        "no runtime was left on a killed sandbox and made another"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_session_renews_its_sandboxes_timeout_and_stops_when_it_ends() {
    use grove_core::ports::SessionRequest;
    let fake = FakeE2b::start().await;
    let mut c = config(&fake);
    c.timeout_secs = 3; // renewed every second while a session runs
    let env = Env::with(fake, E2bRuntimeProvider::new(c).unwrap());
    let ws = env.workspace();
    let sessions = env.provider.sessions().unwrap();
    let s = sessions
        .start(
            spec_for(ws.path(), "alice", "p1"),
            SessionRequest {
                argv: vec!["cat".into()],
                ..SessionRequest::default()
            },
        )
        .await
        .unwrap();
    let id = env.only_sandbox();
    tokio::time::sleep(std::time::Duration::from_millis(2500)).await;
    let renewed = env.fake.timeouts();
    assert!(
        renewed.len() >= 2 && renewed.iter().all(|t| *t == (id.clone(), 3)),
        "the session kept its sandbox alive: {renewed:?}"
    );

    sessions.kill(&s.id).await.unwrap();
    let out = sessions
        .poll(&s.id, std::time::Duration::from_secs(5))
        .await
        .unwrap();
    assert!(out.exit.is_some(), "{out:?}");
    // A renewal already on the wire when the session ended may still land.
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let after_kill = env.fake.timeouts().len();
    tokio::time::sleep(std::time::Duration::from_millis(2500)).await;
    assert_eq!(
        env.fake.timeouts().len(),
        after_kill,
        "an ended session no longer renews the timeout"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removing_a_remote_workspace_touches_only_workspace_paths_and_never_creates_a_sandbox() {
    let fake = FakeE2b::start().await;
    let provider = E2bRuntimeProvider::new(config(&fake)).unwrap();
    let remote = provider.workspaces().expect("e2b holds workspaces");
    // No sandbox yet: nothing to remove, and none is made to remove nothing.
    remote
        .remove_workspace("u", "p", "/home/user/grove/workspaces/u_c_b")
        .await
        .unwrap();
    assert_eq!(fake.creates(), 0);
    for bad in [
        "/etc",
        "/home/user/grove/repos/o_r",
        "/home/user/grove/workspaces/..",
        "/home/user/grove/workspaces/a/b",
        "grove/workspaces/a",
    ] {
        let err = remote.remove_workspace("u", "p", bad).await.unwrap_err();
        assert!(
            matches!(err, RuntimeError::CommandRejected(_)),
            "{bad}: {err:?}"
        );
    }
    assert_eq!(fake.creates(), 0);
}
