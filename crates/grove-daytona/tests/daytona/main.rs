//! The Daytona runtime against a fake Daytona on loopback (`fake.rs`): the runtime
//! contract, sandbox recovery by label after a restart, the not-started and not-found
//! recoveries, convergence of a create race between workers, Daytona's
//! succeeded-but-errored quirk, error mapping, workspaces inside
//! the sandbox, and capability reporting. Each test starts its own fake.

mod fake;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use fake::FakeDaytona;
use grove_core::error::RuntimeError;
use grove_core::ports::{GitToken, Mount, NetworkPolicy, PreviewRequest, RuntimeProvider};
use grove_daytona::{ApiKey, DaytonaConfig, DaytonaRuntimeProvider, WorkspacePlacement};
use grove_runtime_contract::remote::{
    assert_all_run_in, create_racing, echo, fixture_repo, head_of, spec_for,
};
use grove_runtime_contract::{default_spec, request, Harness};

struct Env {
    fake: FakeDaytona,
    provider: DaytonaRuntimeProvider,
    scratch: tempfile::TempDir,
}

fn config(fake: &FakeDaytona) -> DaytonaConfig {
    let mut c = DaytonaConfig::new(fake.url.clone(), ApiKey::new(fake.key.clone()));
    c.poll_interval = Duration::from_millis(50);
    c.start_timeout = Duration::from_secs(30);
    c.cpu = Some(1);
    c
}

impl Env {
    async fn new() -> Self {
        let fake = FakeDaytona::start().await;
        let provider = DaytonaRuntimeProvider::new(config(&fake)).unwrap();
        Self::with(fake, provider)
    }

    fn with(fake: FakeDaytona, provider: DaytonaRuntimeProvider) -> Self {
        let scratch = tempfile::Builder::new()
            .prefix("daytona-scratch-")
            .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
            .unwrap();
        Self {
            fake,
            provider,
            scratch,
        }
    }

    /// A second provider on the same deployment, as after a grove restart.
    fn restarted(&self) -> DaytonaRuntimeProvider {
        DaytonaRuntimeProvider::new(config(&self.fake)).unwrap()
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
async fn capabilities_are_truthful_and_match_the_accessors() {
    let env = Env::new().await;
    let p: &dyn RuntimeProvider = &env.provider;
    let caps = p.capabilities();
    assert_eq!(p.kind(), "daytona");
    assert!(caps.writable && caps.network_none && caps.network_default);
    assert!(
        !caps.isolated,
        "workspaces of a (user, project) share a sandbox"
    );
    assert!(!caps.network_limited, "no allow-list configured");
    assert!(caps.preview_url && p.preview_urls().is_some());
    assert!(
        !caps.snapshot && p.snapshotter().is_none(),
        "no snapshots: None"
    );
    assert!(!caps.interactive_session && p.sessions().is_none());
    assert_eq!(
        caps.network_policies(),
        vec![NetworkPolicy::None, NetworkPolicy::Default]
    );

    let mut c = config(&env.fake);
    c.network_allow_list = Some("10.0.0.0/8".into());
    let p = DaytonaRuntimeProvider::new(c).unwrap();
    assert!(p.capabilities().network_limited);
    assert!(p
        .capabilities()
        .network_policies()
        .contains(&NetworkPolicy::Limited));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_port_preview_url_comes_from_the_api_without_its_token() {
    let env = Env::new().await;
    let ws = env.workspace();
    let spec = spec_for(ws.path(), "alice", "p1");
    echo(&env.provider, spec.clone(), "x").await;
    let id = env.only_sandbox();
    let previews = env.provider.preview_urls().unwrap();
    let url = previews
        .expose(PreviewRequest {
            backend_id: env.provider.backend_id(&spec),
            port: 3000,
        })
        .await
        .unwrap();
    assert_eq!(url.port, 3000);
    assert!(
        url.url.contains(&id) && url.url.starts_with("https://3000-"),
        "{}",
        url.url
    );
    assert!(!url.url.contains("preview-token-secret"));
    assert!(matches!(
        previews
            .expose(PreviewRequest {
                backend_id: env.provider.backend_id(&spec),
                port: 22,
            })
            .await,
        Err(RuntimeError::CommandRejected(_))
    ));
    assert!(matches!(
        previews
            .expose(PreviewRequest {
                backend_id: "daytona:nobody/none".into(),
                port: 3000,
            })
            .await,
        Err(RuntimeError::NotFound(_))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_sandbox_serves_a_user_and_project_and_carries_its_labels_and_settings() {
    let env = Env::new().await;
    let (a, b) = (env.workspace(), env.workspace());
    echo(&env.provider, spec_for(a.path(), "alice", "p1"), "one").await;
    echo(&env.provider, spec_for(b.path(), "alice", "p1"), "two").await;
    let id = env.only_sandbox();
    echo(&env.provider, spec_for(a.path(), "bob", "p1"), "three").await;
    assert_eq!(
        env.fake.sandboxes().len(),
        2,
        "another user gets another sandbox"
    );

    let body = env.fake.create_body(&id);
    assert_eq!(body["labels"]["grove.managed"], "true");
    assert_eq!(body["labels"]["grove.user"], "alice");
    assert_eq!(body["labels"]["grove.project"], "p1");
    assert_eq!(body["labels"]["grove.network"], "none");
    assert_eq!(body["autoStopInterval"], 15);
    assert_eq!(body["autoArchiveInterval"], 7 * 24 * 60);
    assert_eq!(body["networkBlockAll"], true);
    assert_eq!(body["cpu"], 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_provider_finds_its_sandbox_by_label_instead_of_creating_one() {
    let env = Env::new().await;
    let ws = env.workspace();
    echo(&env.provider, spec_for(ws.path(), "alice", "p1"), "before").await;
    let id = env.only_sandbox();

    let after = env.restarted();
    echo(&after, spec_for(ws.path(), "alice", "p1"), "after").await;
    assert_eq!(
        env.fake.creates(),
        1,
        "the restart created a second sandbox"
    );
    assert_eq!(env.only_sandbox(), id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listing_by_label_follows_the_pages() {
    let fake = FakeDaytona::start().await;
    let mut c = config(&fake);
    c.list_page_size = 2;
    let env = Env::with(fake, DaytonaRuntimeProvider::new(c).unwrap());
    let ws = env.workspace();
    for i in 0..5 {
        echo(
            &env.provider,
            spec_for(ws.path(), &format!("u{i}"), "p1"),
            "x",
        )
        .await;
    }
    let managed = BTreeMap::from([("grove.managed".to_string(), "true".to_string())]);
    let all = env
        .provider
        .client()
        .list_sandboxes(&managed)
        .await
        .unwrap();
    assert_eq!(all.len(), 5, "five sandboxes over three pages of two");
    let one = BTreeMap::from([("grove.user".to_string(), "u3".to_string())]);
    let found = env.provider.client().list_sandboxes(&one).await.unwrap();
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].labels["grove.user"], "u3");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_provider_starts_the_stopped_sandbox_it_finds() {
    let env = Env::new().await;
    let ws = env.workspace();
    echo(&env.provider, spec_for(ws.path(), "alice", "p1"), "before").await;
    let id = env.only_sandbox();
    env.fake.stop_behind_the_back(&id);

    echo(
        &env.restarted(),
        spec_for(ws.path(), "alice", "p1"),
        "after",
    )
    .await;
    assert_eq!(env.fake.creates(), 1);
    assert_eq!(env.fake.sandboxes()[0].1, "started");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_stopped_behind_our_back_is_started_and_the_command_retried() {
    let env = Env::new().await;
    let ws = env.workspace();
    let rt = env
        .provider
        .create(spec_for(ws.path(), "alice", "p1"))
        .await
        .unwrap();
    rt.exec(request(&["true"])).await.unwrap();
    let id = env.only_sandbox();
    env.fake.stop_behind_the_back(&id);

    let r = rt
        .exec(request(&["echo", "again"]))
        .await
        .expect("exec after stop");
    assert_eq!(String::from_utf8_lossy(&r.stdout), "again\n");
    assert_eq!(env.fake.sandboxes()[0].1, "started");
    assert_eq!(
        env.fake.creates(),
        1,
        "a stopped sandbox is started, not replaced"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_deleted_behind_our_back_is_created_again_and_the_command_retried() {
    let env = Env::new().await;
    let ws = env.workspace();
    let rt = env
        .provider
        .create(spec_for(ws.path(), "alice", "p1"))
        .await
        .unwrap();
    rt.exec(request(&["true"])).await.unwrap();
    let id = env.only_sandbox();
    env.fake.delete_behind_the_back(&id);

    let r = rt
        .exec(request(&["echo", "again"]))
        .await
        .expect("exec after delete");
    assert_eq!(String::from_utf8_lossy(&r.stdout), "again\n");
    assert_eq!(env.fake.creates(), 2);
    let new = env.only_sandbox();
    assert_ne!(new, id);
    assert_eq!(env.fake.sandboxes()[0].2["grove.user"], "alice");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_api_key_is_unauthorized_and_the_key_is_never_shown() {
    let fake = FakeDaytona::start().await;
    let wrong = "dtn_wrong_key_that_must_not_leak";
    let mut c = config(&fake);
    c.api_key = ApiKey::new(wrong);
    assert_eq!(format!("{:?}", c.api_key), "ApiKey(***)");
    let env = Env::with(fake, DaytonaRuntimeProvider::new(c).unwrap());
    let ws = env.workspace();
    match env.provider.create(spec_for(ws.path(), "a", "p")).await {
        Err(RuntimeError::Unauthorized(msg)) => {
            assert!(
                !msg.contains(wrong) && !msg.contains(&env.fake.key),
                "{msg}"
            )
        }
        Err(e) => panic!("expected Unauthorized, got {e}"),
        Ok(_) => panic!("a wrong key was accepted"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exceeding_the_cpu_quota_is_a_resource_limit() {
    let fake = FakeDaytona::start_with_quota(2).await;
    let mut c = config(&fake);
    c.cpu = Some(4);
    let env = Env::with(fake, DaytonaRuntimeProvider::new(c).unwrap());
    let ws = env.workspace();
    match env.provider.create(spec_for(ws.path(), "a", "p")).await {
        Err(RuntimeError::ResourceLimit(msg)) => assert!(msg.contains("quota"), "{msg}"),
        Err(e) => panic!("expected ResourceLimit, got {e}"),
        Ok(_) => panic!("over-quota create succeeded"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_mounts_and_relative_workdirs_are_refused() {
    let env = Env::new().await;
    let ws = env.workspace();
    let mut spec = spec_for(ws.path(), "a", "p");
    spec.mounts.push(Mount {
        source: PathBuf::from("/etc"),
        target: PathBuf::from("/etc"),
        writable: false,
    });
    assert!(matches!(
        env.provider.create(spec).await,
        Err(RuntimeError::CommandRejected(_))
    ));
    let mut spec = spec_for(ws.path(), "a", "p");
    spec.workdir = PathBuf::from("relative");
    spec.mounts.clear();
    assert!(matches!(
        env.provider.create(spec).await,
        Err(RuntimeError::CommandRejected(_))
    ));
    assert!(
        env.fake.sandboxes().is_empty(),
        "a refused spec made a sandbox"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_network_other_than_the_sandboxes_is_a_conflict_and_limited_needs_an_allow_list() {
    let env = Env::new().await;
    let ws = env.workspace();
    echo(&env.provider, spec_for(ws.path(), "a", "p"), "x").await;
    let mut spec = spec_for(ws.path(), "a", "p");
    spec.network = NetworkPolicy::Default;
    match env.restarted().create(spec).await {
        Err(RuntimeError::Conflict(msg)) => assert!(msg.contains("network"), "{msg}"),
        Err(e) => panic!("expected Conflict, got {e}"),
        Ok(_) => panic!("a sandbox changed network silently"),
    }
    let mut spec = spec_for(ws.path(), "b", "p");
    spec.network = NetworkPolicy::Limited;
    assert!(matches!(
        env.provider.create(spec).await,
        Err(RuntimeError::CommandRejected(_))
    ));

    let mut c = config(&env.fake);
    c.network_allow_list = Some("140.82.112.0/20".into());
    let p = DaytonaRuntimeProvider::new(c).unwrap();
    let mut spec = spec_for(ws.path(), "c", "p");
    spec.network = NetworkPolicy::Limited;
    echo(&p, spec, "limited").await;
    let id = env
        .fake
        .sandboxes()
        .into_iter()
        .find(|s| s.2["grove.user"] == "c")
        .unwrap()
        .0;
    let body = env.fake.create_body(&id);
    assert_eq!(body["networkAllowList"], "140.82.112.0/20");
    assert_eq!(body["networkBlockAll"], false);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn destroying_a_runtime_stops_the_sandbox_and_keeps_its_files() {
    let env = Env::new().await;
    let ws = env.workspace();
    let spec = spec_for(ws.path(), "alice", "p1");
    let backend = env.provider.backend_id(&spec);
    assert_eq!(backend, "daytona:alice/p1");
    let rt = env.provider.create(spec.clone()).await.unwrap();
    let mut req = request(&["sh", "-c", "echo kept > kept.txt"]);
    req.mutating = true;
    assert_eq!(rt.exec(req).await.unwrap().exit_code, 0);
    env.provider.destroy(&backend).await.unwrap();
    tokio::time::sleep(fake::TRANSITION * 2).await;
    assert_eq!(env.fake.sandboxes()[0].1, "stopped");
    assert!(env.provider.healthy(&backend).await.unwrap());
    let r = rt.exec(request(&["cat", "kept.txt"])).await.unwrap();
    assert_eq!(String::from_utf8_lossy(&r.stdout), "kept\n");
    assert_eq!(env.fake.creates(), 1);
}

fn placement(url: &str, scope: &str) -> WorkspacePlacement {
    WorkspacePlacement {
        user: "alice".into(),
        project: "p1".into(),
        scope: scope.into(),
        repo_name: "acme/widgets".into(),
        repo_url: url.into(),
        base_ref: "main".into(),
        branch: Some(format!("agent/edits-{scope}")),
        network: NetworkPolicy::Default,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_conversations_on_one_branch_get_two_checkouts_from_one_clone() {
    let env = Env::new().await;
    let url = fixture_repo(env.scratch.path());
    let mut a = placement(&url, "conv-1");
    let mut b = placement(&url, "conv-2");
    a.branch = Some("feature".into());
    b.branch = Some("feature".into());
    let wa = env.provider.ensure_workspace(&a, None).await.unwrap();
    let wb = env.provider.ensure_workspace(&b, None).await.unwrap();
    assert_eq!(
        wa.sandbox_id, wb.sandbox_id,
        "one sandbox per (user, project)"
    );
    assert_ne!(wa.path, wb.path, "two conversations share a directory");
    assert!(
        wa.cloned_cache && !wb.cloned_cache,
        "the repository was cloned twice"
    );
    assert_eq!(wa.cache_path, wb.cache_path);
    assert_eq!(head_of(&wa.path), "ref: refs/heads/feature");
    let again = env.provider.ensure_workspace(&a, None).await.unwrap();
    assert_eq!(again, RemoteWorkspaceCmp::without_clone(&wa));

    // The workspace is where a runtime's commands run.
    let mut spec = default_spec(Path::new(&wa.path), true, NetworkPolicy::Default);
    spec.labels = BTreeMap::from([
        ("grove.user".to_string(), "alice".to_string()),
        ("grove.project".to_string(), "p1".to_string()),
    ]);
    let rt = env.provider.create(spec).await.unwrap();
    let r = rt.exec(request(&["cat", "README.md"])).await.unwrap();
    assert_eq!(String::from_utf8_lossy(&r.stdout), "hello\n");
}

struct RemoteWorkspaceCmp;
impl RemoteWorkspaceCmp {
    fn without_clone(w: &grove_daytona::RemoteWorkspace) -> grove_daytona::RemoteWorkspace {
        grove_daytona::RemoteWorkspace {
            cloned_cache: false,
            ..w.clone()
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_validation_error_for_git_operations_that_took_effect_counts_as_success() {
    let env = Env::new().await;
    env.fake.set_validation_quirk(true);
    let url = fixture_repo(env.scratch.path());
    let w = env
        .provider
        .ensure_workspace(&placement(&url, "conv-1"), None)
        .await
        .expect("clone, branch and checkout verified by reading state");
    assert_eq!(head_of(&w.path), "ref: refs/heads/agent/edits-conv-1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_validation_error_for_a_git_operation_that_failed_stays_an_error() {
    let env = Env::new().await;
    env.fake.set_validation_quirk(true);
    let url = fixture_repo(env.scratch.path());
    let mut p = placement(&url, "conv-1");
    p.base_ref = "no-such-branch".into();
    match env.provider.ensure_workspace(&p, None).await {
        Err(RuntimeError::CommandRejected(msg)) => assert!(msg.contains("400"), "{msg}"),
        other => panic!("a failed clone must fail, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn untrusted_refs_are_refused_before_anything_happens() {
    let env = Env::new().await;
    let url = fixture_repo(env.scratch.path());
    let mut p = placement(&url, "conv-1");
    p.branch = Some("x\n--upload-pack=evil".into());
    assert!(matches!(
        env.provider.ensure_workspace(&p, None).await,
        Err(RuntimeError::CommandRejected(_))
    ));
    assert!(env.fake.sandboxes().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_git_token_goes_only_into_the_clone_request_body() {
    let env = Env::new().await;
    let url = fixture_repo(env.scratch.path());
    let token = GitToken::new("ghp_test_token_value".into());
    let w = env
        .provider
        .ensure_workspace(&placement(&url, "conv-1"), Some(&token))
        .await
        .unwrap();
    assert_eq!(
        env.fake.clone_passwords(),
        vec!["ghp_test_token_value".to_string()]
    );
    let config = std::fs::read_to_string(format!("{}/.git/config", w.cache_path)).unwrap();
    assert!(!config.contains("ghp_test_token_value"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn workers_racing_to_create_one_users_sandbox_end_with_one_sandbox_they_all_use() {
    let env = Env::new().await;
    // Every create takes a while, so all workers find nothing and all create.
    env.fake.set_create_delay(Duration::from_millis(400));
    let ws = env.workspace();
    let workers: Vec<DaytonaRuntimeProvider> = (0..4).map(|_| env.restarted()).collect();
    let workers: Vec<&dyn RuntimeProvider> = workers.iter().map(|w| w as _).collect();
    let runtimes = create_racing(&workers, &spec_for(ws.path(), "alice", "p1")).await;
    assert_eq!(env.fake.creates(), 4, "the race did happen: four creates");
    let kept = env.only_sandbox();
    assert_all_run_in(
        &runtimes,
        &env.provider.client().home_dir(&kept).await.unwrap(),
    )
    .await;
    assert_eq!(
        env.only_sandbox(),
        kept,
        "later commands made no new sandbox"
    );
    assert_eq!(
        env.fake.creates(),
        4,
        "no runtime was left on a deleted sandbox and made another"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removing_a_remote_workspace_touches_only_workspace_paths_and_never_creates_a_sandbox() {
    let env = Env::new().await;
    let remote = env.provider.workspaces().expect("daytona holds workspaces");
    // No sandbox yet: nothing to remove, and none is made to remove nothing.
    remote
        .remove_workspace("u", "p", "/home/daytona/grove/workspaces/u_c_b")
        .await
        .unwrap();
    assert_eq!(env.fake.creates(), 0);
    for bad in [
        "/etc",
        "/home/daytona/grove/repos/o_r",
        "/home/daytona/grove/workspaces/..",
        "/home/daytona/grove/workspaces/a/b",
        "grove/workspaces/a",
    ] {
        let err = remote.remove_workspace("u", "p", bad).await.unwrap_err();
        assert!(
            matches!(err, RuntimeError::CommandRejected(_)),
            "{bad}: {err:?}"
        );
    }
    assert_eq!(env.fake.creates(), 0);
}
