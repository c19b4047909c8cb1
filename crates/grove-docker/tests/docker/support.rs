//! Test support: engine check, the images, per-test scope and cleanup.

use std::path::{Path, PathBuf};

use grove_core::ports::{NetworkPolicy, RuntimeProvider, RuntimeSpec};
use grove_docker::bollard::query_parameters::{
    InspectContainerOptions, ListContainersOptionsBuilder, ListImagesOptionsBuilder,
    RemoveContainerOptionsBuilder, RemoveImageOptionsBuilder,
};
use grove_docker::bollard::Docker;
use grove_docker::image::{self, ImageError};
use grove_docker::{ContainerInfo, DockerRuntimeProvider, LABEL_RUNTIME, LABEL_WORKSPACE};
use grove_runtime_contract::{default_spec, unique_token, Harness};
use tokio::sync::OnceCell;

/// The uid (and gid) the harness gives every workspace it makes.
pub const TEST_UID: u32 = 4242;

/// The scope label of test containers.
pub const TEST_LABEL: &str = "grove.test";

static MINIMAL: OnceCell<String> = OnceCell::const_new();
static DEBIAN: OnceCell<Result<String, String>> = OnceCell::const_new();
static STATIC_AGENT: OnceCell<PathBuf> = OnceCell::const_new();

/// A statically linked `grove-sandboxd` (the exec agent runs in the busybox image,
/// which has no C library): built once per process with cargo, offline, into a target
/// dir of its own (the flag must not reach the workspace's other crates).
pub async fn static_agent() -> PathBuf {
    STATIC_AGENT
        .get_or_init(|| async {
            tokio::task::spawn_blocking(|| {
                let target = Path::new(env!("CARGO_TARGET_TMPDIR")).join("sandboxd-static");
                let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../Cargo.toml");
                let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
                let t0 = std::time::Instant::now();
                let out = std::process::Command::new(cargo)
                    .args(["rustc", "--offline", "-q", "-p", "grove-sandboxd"])
                    .args(["--bin", "grove-sandboxd", "--manifest-path"])
                    .arg(&manifest)
                    .arg("--target-dir")
                    .arg(&target)
                    .args(["--", "-C", "target-feature=+crt-static"])
                    .output()
                    .expect("cargo runs");
                assert!(
                    out.status.success(),
                    "building the static agent failed: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
                let bin = target.join("debug/grove-sandboxd");
                grove_docker::agent::check_binary(&bin)
                    .unwrap_or_else(|e| panic!("the static agent build is not usable: {e}"));
                eprintln!("static agent {} ready in {:?}", bin.display(), t0.elapsed());
                bin
            })
            .await
            .expect("the build thread ends")
        })
        .await
        .clone()
}

pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// One test's provider (scoped to the test), scratch root and cleanup.
pub struct TestEnv {
    pub provider: DockerRuntimeProvider,
    root: tempfile::TempDir,
    scope: String,
}

/// The test's environment, or `None` (after printing why) when no engine answers.
pub async fn env_or_skip(test: &str) -> Option<TestEnv> {
    let provider = match DockerRuntimeProvider::connect().await {
        Ok(p) => p,
        Err(e) => {
            if std::env::var("GROVE_TEST_REQUIRE_DOCKER").is_ok_and(|v| v == "1") {
                panic!("{test}: GROVE_TEST_REQUIRE_DOCKER=1 but no Docker engine answers: {e}");
            }
            eprintln!("skipped: no Docker engine: {test}: {e}");
            return None;
        }
    };
    let minimal = MINIMAL
        .get_or_init(|| async {
            let t0 = std::time::Instant::now();
            let tag = image::build_minimal(provider.docker())
                .await
                .unwrap_or_else(|e| panic!("building the minimal test image failed: {e}"));
            eprintln!("minimal image {tag} ready in {:?}", t0.elapsed());
            tag
        })
        .await
        .clone();
    let scope = format!("t{}", unique_token());
    let base = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    std::fs::create_dir_all(&base).unwrap();
    let root = tempfile::Builder::new()
        .prefix("grove-docker-")
        .tempdir_in(base)
        .unwrap();
    let provider = provider
        .with_default_image(minimal)
        .with_scope_label(TEST_LABEL, scope.clone());
    Some(TestEnv {
        provider,
        root,
        scope,
    })
}

/// The Debian image (built once per process, minutes the first time on a machine),
/// or `None` after printing why it cannot be built here.
pub async fn debian_image(env: &TestEnv) -> Option<String> {
    let built = DEBIAN
        .get_or_init(|| async {
            let t0 = std::time::Instant::now();
            match image::build_debian(env.provider.docker()).await {
                Ok(tag) => {
                    eprintln!("debian image {tag} ready in {:?}", t0.elapsed());
                    Ok(tag)
                }
                Err(
                    e @ (ImageError::MissingPackage { .. }
                    | ImageError::Unsupported(_)
                    | ImageError::Build(_)),
                ) => Err(e.to_string()),
                Err(e) => panic!("building the debian image failed: {e}"),
            }
        })
        .await;
    match built {
        Ok(tag) => Some(tag.clone()),
        Err(why) => {
            eprintln!("skipped: the git-in-container test needs the debian image: {why}");
            None
        }
    }
}

/// The host's static busybox (what the minimal image is built from).
pub fn static_busybox() -> PathBuf {
    let path = std::env::var_os("GROVE_BUSYBOX")
        .map_or_else(|| PathBuf::from("/bin/busybox"), PathBuf::from);
    grove_docker::agent::check_binary(&path)
        .unwrap_or_else(|e| panic!("the minimal image's busybox is not usable: {e}"))
}

impl TestEnv {
    /// This test's scope (part of every runtime id it makes).
    pub fn scope(&self) -> &str {
        &self.scope
    }

    pub fn root(&self) -> &Path {
        self.root.path()
    }

    /// A new workspace dir owned by [`TEST_UID`].
    pub fn workspace(&self, tag: &str) -> PathBuf {
        let dir = self.workspace_owned_by_root(tag);
        chown_tree(&dir, TEST_UID, TEST_UID);
        dir
    }

    /// A new workspace dir owned by root (mode 0755).
    pub fn workspace_owned_by_root(&self, tag: &str) -> PathBuf {
        let dir = self.root().join(format!("{tag}-{}", unique_token()));
        std::fs::create_dir(&dir).unwrap();
        dir
    }

    /// The default spec with this test's workspace and runtime labels.
    pub fn spec_for(
        &self,
        ws: &Path,
        writable: bool,
        network: NetworkPolicy,
        tag: &str,
    ) -> RuntimeSpec {
        let mut spec = default_spec(ws, writable, network);
        spec.labels
            .insert(LABEL_WORKSPACE.into(), format!("ws-{}-{tag}", self.scope));
        spec.labels
            .insert(LABEL_RUNTIME.into(), format!("{}-{tag}", self.scope));
        spec
    }

    /// The containers of this test.
    pub async fn containers(&self) -> Vec<ContainerInfo> {
        self.provider.list_managed().await.unwrap()
    }

    /// `running`, `exited`, ... of a container.
    pub async fn state_of(&self, name: &str) -> String {
        self.provider
            .docker()
            .inspect_container(name, None::<InspectContainerOptions>)
            .await
            .unwrap()
            .state
            .and_then(|s| s.status)
            .map(|s| s.to_string())
            .unwrap_or_default()
    }
}

impl Harness for TestEnv {
    fn provider(&self) -> &dyn RuntimeProvider {
        &self.provider
    }
    fn scratch_root(&self) -> &Path {
        self.root.path()
    }
    fn spec(&self, workspace: &Path, writable: bool, network: NetworkPolicy) -> RuntimeSpec {
        // The fixture was made by root; hand it to the sandbox user, as a deployment
        // creates workspaces owned by it.
        chown_tree(workspace, TEST_UID, TEST_UID);
        self.spec_for(workspace, writable, network, &unique_token())
    }
}

impl Drop for TestEnv {
    fn drop(&mut self) {
        let scope = self.scope.clone();
        // Its own thread and runtime: drop may run inside (or outside) the test's
        // runtime, whose client must not be driven from here.
        let cleanup = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let Ok(docker) = Docker::connect_with_defaults() else {
                    return;
                };
                let Ok(docker) = docker.negotiate_version().await else {
                    return;
                };
                let filters = [("label".to_string(), vec![format!("{TEST_LABEL}={scope}")])]
                    .into_iter()
                    .collect::<std::collections::HashMap<_, _>>();
                let options = ListContainersOptionsBuilder::default()
                    .all(true)
                    .filters(&filters)
                    .build();
                for c in docker
                    .list_containers(Some(options))
                    .await
                    .unwrap_or_default()
                {
                    if let Some(id) = c.id {
                        let _ = docker
                            .remove_container(
                                &id,
                                Some(RemoveContainerOptionsBuilder::default().force(true).build()),
                            )
                            .await;
                    }
                }
                // Snapshot images carry the container's labels, the scope label too.
                let images = ListImagesOptionsBuilder::default()
                    .filters(&filters)
                    .build();
                for image in docker.list_images(Some(images)).await.unwrap_or_default() {
                    let _ = docker
                        .remove_image(
                            &image.id,
                            Some(RemoveImageOptionsBuilder::default().force(true).build()),
                            None,
                        )
                        .await;
                }
            });
        });
        let _ = cleanup.join();
    }
}

/// `chown -R uid:gid` without following symlinks.
pub fn chown_tree(path: &Path, uid: u32, gid: u32) {
    std::os::unix::fs::lchown(path, Some(uid), Some(gid)).unwrap();
    let meta = std::fs::symlink_metadata(path).unwrap();
    if meta.is_dir() {
        for e in std::fs::read_dir(path).unwrap() {
            chown_tree(&e.unwrap().path(), uid, gid);
        }
    }
}
