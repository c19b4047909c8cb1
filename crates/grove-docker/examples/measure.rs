//! Measures the Docker runtime on this machine: image builds, container create+start,
//! exec round trips (through this crate, through bare bollard, and through the docker
//! CLI for comparison), and resume (stop -> start -> first exec).
//!
//! `cargo run --release -p grove-docker --example measure [-- --rebuild]`
//! (run as root: it builds images and makes workspaces; it removes what it creates).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use futures::StreamExt;
use grove_core::ports::{ExecRequest, Mount, NetworkPolicy, Runtime, RuntimeSpec};
use grove_docker::bollard::exec::{CreateExecOptions, StartExecOptions, StartExecResults};
use grove_docker::bollard::query_parameters::RemoveImageOptions;
use grove_docker::image;
use grove_docker::{DockerRuntimeProvider, LABEL_RUNTIME};

fn pct(mut v: Vec<Duration>, p: f64) -> Duration {
    v.sort();
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

fn show(what: &str, v: Vec<Duration>) {
    println!(
        "{what:<44} n={:<4} p50={:>8.2?} p90={:>8.2?} min={:>8.2?}",
        v.len(),
        pct(v.clone(), 0.5),
        pct(v.clone(), 0.9),
        pct(v, 0.0)
    );
}

#[tokio::main]
async fn main() {
    let rebuild = std::env::args().any(|a| a == "--rebuild");
    let provider = DockerRuntimeProvider::connect().await.expect("engine");
    let docker = provider.docker().clone();

    // Images.
    let t0 = Instant::now();
    let minimal = image::build_minimal(&docker).await.expect("minimal");
    let found = t0.elapsed();
    if rebuild {
        let _ = docker
            .remove_image(&minimal, None::<RemoveImageOptions>, None)
            .await;
    }
    let t0 = Instant::now();
    let minimal = image::build_minimal(&docker).await.expect("minimal");
    println!(
        "image {minimal}: build {:?} (when present: {found:?})",
        t0.elapsed()
    );
    let t0 = Instant::now();
    let debian = image::build_debian_with(
        &docker,
        &image::DebianOptions {
            force: rebuild,
            ..Default::default()
        },
    )
    .await;
    match &debian {
        Ok(tag) => println!("image {tag}: build {:?}", t0.elapsed()),
        Err(e) => println!("debian image: {e}"),
    }
    for tag in [Some(minimal.clone()), debian.ok()].into_iter().flatten() {
        if let Ok(i) = docker.inspect_image(&tag).await {
            println!(
                "image {tag}: size {:.1} MB",
                i.size.unwrap_or(0) as f64 / 1e6
            );
        }
    }

    let provider = provider
        .with_default_image(minimal)
        .with_scope_label("grove.measure", std::process::id().to_string());
    let root = std::env::temp_dir().join(format!("grove-measure-{}", std::process::id()));
    std::fs::create_dir_all(&root).unwrap();
    let spec = |n: usize| {
        let ws = root.join(format!("ws-{n}"));
        std::fs::create_dir_all(&ws).unwrap();
        std::os::unix::fs::chown(&ws, Some(4242), Some(4242)).unwrap();
        RuntimeSpec {
            image: None,
            workdir: ws.clone(),
            mounts: vec![Mount {
                source: ws.clone(),
                target: ws,
                writable: true,
            }],
            env: BTreeMap::new(),
            resources: Default::default(),
            network: NetworkPolicy::None,
            labels: [(
                LABEL_RUNTIME.to_string(),
                format!("measure-{}-{n}", std::process::id()),
            )]
            .into(),
        }
    };

    // Create + start.
    let mut create = Vec::new();
    let mut reattach = Vec::new();
    let mut runtimes = Vec::new();
    for n in 0..10 {
        let t0 = Instant::now();
        let rt = provider.create_docker(spec(n)).await.expect("create");
        create.push(t0.elapsed());
        let t0 = Instant::now();
        provider.create_docker(spec(n)).await.expect("re-attach");
        reattach.push(t0.elapsed());
        runtimes.push(rt);
    }
    show("create + start (new container)", create);
    show("create (re-attach to a running one)", reattach);

    let rt = &runtimes[0];
    let name = rt.container_name().to_string();
    let req = || ExecRequest {
        argv: vec!["true".into()],
        timeout: Some(Duration::from_secs(30)),
        ..Default::default()
    };
    for _ in 0..5 {
        rt.exec(req()).await.unwrap();
    }
    let mut ours = Vec::new();
    for _ in 0..100 {
        let t0 = Instant::now();
        let r = rt.exec(req()).await.unwrap();
        ours.push(t0.elapsed());
        assert_eq!(r.exit_code, 0);
    }
    show("exec `true` via DockerRuntime::exec", ours);

    let mut bare = Vec::new();
    for _ in 0..100 {
        let t0 = Instant::now();
        let id = docker
            .create_exec(
                rt.container_id(),
                CreateExecOptions::<String> {
                    cmd: Some(vec!["true".into()]),
                    attach_stdout: Some(true),
                    attach_stderr: Some(true),
                    ..Default::default()
                },
            )
            .await
            .unwrap()
            .id;
        if let StartExecResults::Attached { mut output, .. } = docker
            .start_exec(&id, Some(StartExecOptions::default()))
            .await
            .unwrap()
        {
            while output.next().await.is_some() {}
        }
        let code = docker.inspect_exec(&id).await.unwrap().exit_code;
        bare.push(t0.elapsed());
        assert_eq!(code, Some(0));
    }
    show("exec `true` via bare bollard (create/start/inspect)", bare);

    let mut cli = Vec::new();
    for _ in 0..100 {
        let t0 = Instant::now();
        let st = std::process::Command::new("docker")
            .args(["exec", &name, "true"])
            .status();
        match st {
            Ok(s) if s.success() => cli.push(t0.elapsed()),
            Ok(s) => panic!("docker exec: {s}"),
            Err(e) => {
                println!("docker CLI not available: {e}");
                break;
            }
        }
    }
    if !cli.is_empty() {
        show("exec `true` via `docker exec` (CLI)", cli);
    }

    let mut stop = Vec::new();
    let mut resume = Vec::new();
    for _ in 0..5 {
        let t0 = Instant::now();
        provider.stop(&name).await.unwrap();
        stop.push(t0.elapsed());
        let t0 = Instant::now();
        provider.start(&name).await.unwrap();
        rt.exec(req()).await.unwrap();
        resume.push(t0.elapsed());
    }
    show("stop", stop);
    show("start + first exec (resume)", resume);

    let mut destroy = Vec::new();
    for rt in &runtimes {
        let t0 = Instant::now();
        provider.destroy(rt.container_name()).await.unwrap();
        destroy.push(t0.elapsed());
    }
    show("destroy (remove -f)", destroy);
    let _ = std::fs::remove_dir_all(&root);
}
