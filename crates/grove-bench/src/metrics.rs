//! `metrics_scrape`: rendering `/metrics` (its four gauge queries and the encoder) with
//! `metrics_workspaces` workspace rows and the event log topped up to `replay_events`
//! events, next to the floor of one trivial query's round trip (issue 22: < 50 ms).

use std::time::Instant;

use anyhow::{Context, Result};
use serde_json::json;

use crate::ctx::{ms, Ctx};
use crate::stats::latency;
use crate::Out;

/// Rows are inserted straight into the projection tables and the log, as the replay
/// case does: the scrape reads only aggregates, whatever the rows say.
async fn seed(ctx: &Ctx) -> Result<(i64, i64)> {
    let n = ctx.args.metrics_workspaces;
    sqlx::query(
        "INSERT INTO grove.sandbox_repo_caches (id, node, identity, repo_name, repo_url, provider, provider_host, local_path, last_used_at, size_bytes, state, created_at, updated_at)
         SELECT gen_random_uuid(), 'bench-' || (g % 4), 'bench-metrics-' || g, 'o/r' || g, 'file:///nowhere/' || g, 'local', '', '/nowhere/' || g, now(), 1000000, 'ready', now(), now()
         FROM generate_series(1, 100) g",
    )
    .execute(&ctx.pool)
    .await
    .context("seeding repo caches")?;
    sqlx::query(
        "INSERT INTO grove.sandbox_workspaces (id, repo_cache_id, node, project_id, user_id, mode, task_id, base_ref, base_commit, local_path, state, dirty, last_used_at, size_bytes, writable, isolated, persistent, created_at, updated_at)
         SELECT gen_random_uuid(), gen_random_uuid(), 'bench-' || (g % 4), 'p', 'u' || (g % 500), 'task', 'bench-metrics-' || g, 'main', repeat('0', 40), '/nowhere/' || g,
                (ARRAY['ready', 'released', 'evicted'])[1 + g % 3], false, now(), 100000, true, true, true, now(), now()
         FROM generate_series(1, $1) g",
    )
    .bind(n)
    .execute(&ctx.pool)
    .await
    .context("seeding workspaces")?;
    let events: i64 = sqlx::query_scalar("SELECT count(*) FROM grove.events")
        .fetch_one(&ctx.pool)
        .await?;
    let missing = (ctx.args.replay_events - events).max(0);
    sqlx::query(
        "INSERT INTO grove.events (stream_id, stream_version, event_type, event_version, payload, metadata, command_id, recorded_at)
         SELECT 'workspace:' || u::text, 1, 'workspace.acquired', 1, jsonb_build_object('workspace_id', u),
                jsonb_build_object('command_id', u, 'correlation', '{}'::jsonb, 'worker_id', 'grove-bench', 'node', 'bench'), u, now()
         FROM (SELECT gen_random_uuid() AS u FROM generate_series(1, $1) g) s",
    )
    .bind(missing)
    .execute(&ctx.pool)
    .await
    .context("topping up the log")?;
    sqlx::query("ANALYZE grove.sandbox_workspaces, grove.sandbox_repo_caches, grove.events")
        .execute(&ctx.pool)
        .await?;
    let workspaces: i64 = sqlx::query_scalar("SELECT count(*) FROM grove.sandbox_workspaces")
        .fetch_one(&ctx.pool)
        .await?;
    Ok((workspaces, events + missing))
}

pub async fn metrics_scrape(ctx: &mut Ctx, out: &mut Out) -> Result<()> {
    let t = Instant::now();
    let (workspaces, events) = seed(ctx).await?;
    let seed_s = t.elapsed().as_secs_f64();
    let (mut grove, mut floor) = (vec![], vec![]);
    let mut bytes = 0;
    for _ in 0..ctx.args.n.max(1) {
        let t = Instant::now();
        bytes = grove_api::metrics::render(&ctx.pool).await?.len();
        grove.push(ms(t));
        let t = Instant::now();
        sqlx::query("SELECT 1").execute(&ctx.pool).await?;
        floor.push(ms(t));
    }
    let mut row = latency("metrics_scrape", &grove, &floor);
    row.insert("workspaces".into(), json!(workspaces));
    row.insert("events".into(), json!(events));
    row.insert("body_bytes".into(), json!(bytes));
    row.insert("seed_s".into(), crate::stats::round(seed_s));
    row.insert("floor_is".into(), json!("one SELECT 1 round trip"));
    out.emit(row);
    Ok(())
}
