//! Scenario `worker_kill`: mixed load from many clients while worker processes are
//! SIGKILLed at random moments and restarted. Every command must end decided (failed
//! ones with a kind and a message), each command's events appear once, no exec runs
//! twice, replay verifies, and no directory or container is left that no record owns.

use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::load::{Load, LoadOptions};
use crate::{
    account_commands, docker_image, drain, env_or_skip, leaked_containers, leaked_dirs,
    remove_containers, replay_ok, scale, Figures, Fleet, Rng,
};

/// Kills in the default run; `GROVE_FAULTS_SCALE` multiplies it.
const KILLS: u64 = 40;
const WORKERS: usize = 3;
const CLIENTS: usize = 6;

#[tokio::test(flavor = "multi_thread")]
async fn worker_kill_loses_nothing_runs_nothing_twice_and_leaks_nothing() {
    let env = env_or_skip!("worker_kill_loses_nothing_runs_nothing_twice_and_leaks_nothing");
    let mut rng = Rng::new("worker_kill");
    let docker = docker_image(&env, "worker_kill").await.is_ok();
    let url = env.fixture_repo(
        "fixture",
        &[("README.md", "fixture\n"), ("src/a.txt", "a\n")],
    );
    // A lost worker is noticed after 6 s of silence (heartbeats every 2 s).
    let mut fleet = Fleet::new(&env, &[("GROVE_WORKER_LOST_AFTER", "6")], 4);
    for _ in 0..WORKERS {
        fleet.spawn().await;
    }
    let load = Load::default();
    let opts = LoadOptions {
        clients: CLIENTS,
        docker,
        patience: Duration::from_secs(240),
    };
    let kills = KILLS * scale();
    let clients =
        futures::future::join_all((0..opts.clients).map(|n| load.client(&env, &url, n, &opts)));
    let killer = async {
        for _ in 0..kills {
            tokio::time::sleep(Duration::from_millis(rng.range(150, 1500))).await;
            let victim = rng.next_u64() as usize;
            fleet.kill9(victim).await;
            fleet.spawn().await;
        }
        load.stop.store(true, Ordering::SeqCst);
    };
    tokio::join!(clients, killer);

    let mut figures = Figures {
        injected: kills,
        ..Default::default()
    };
    let ids = load.ids();
    drain(&env.pool, &ids, Duration::from_secs(180)).await;
    load.account(&mut figures);
    account_commands(&env.pool, &ids, &mut figures).await;
    leaked_dirs(&env, &mut figures).await;
    if docker {
        // Workers sweep orphaned containers at start and every 60 s, sparing those
        // younger than 30 s: a fresh worker after the grace runs the sweep at once.
        tokio::time::sleep(Duration::from_secs(31)).await;
        fleet.spawn().await;
        leaked_containers(&env, &mut figures, Duration::from_secs(90)).await;
        remove_containers(&env);
    }
    replay_ok(&env, &mut figures).await;
    let failed: Vec<(String, Option<String>, i64)> = sqlx::query_as(
        "SELECT kind, error->>'kind', count(*) FROM grove.commands WHERE command_id = ANY($1)
          AND status = 'failed' GROUP BY 1, 2 ORDER BY 1, 2",
    )
    .bind(&ids)
    .fetch_all(&env.pool)
    .await
    .unwrap();
    eprintln!("worker_kill: failed commands by kind and reason: {failed:?}");
    figures.finish("worker_kill");
}
