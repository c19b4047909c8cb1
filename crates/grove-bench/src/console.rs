//! The `console_pages` case: each page of the operator console (`/ui`, ADR 29) rendered
//! by `grove serve`'s router in this process, with `console_workspaces` workspace records
//! and the log topped up to `console_events` events, next to `GET /healthz` on the same
//! connection (the floor: HTTP and routing, no query, no template).
//!
//! The records are projection rows written directly (100 users, one node, sizes and last
//! uses spread out); one of them gets a timeline of 300 commands with kept output on the
//! ledger, another the same timeline with a history point after each command (ADR 28:
//! the step shows its point, its diff link and the operators' rewind and fork forms). The events are valid payloads of ids no row has, as in the replay case. Run
//! after `replay` (as `--cases` orders them), the log is already at a million events.

use std::time::Instant;

use anyhow::{bail, Context, Result};
use serde_json::json;
use uuid::Uuid;

use crate::ctx::{ms, Ctx};
use crate::http::Api;
use crate::stats::{latency, round};
use crate::Out;

/// Commands on the measured workspace's timeline.
const TIMELINE_EXECS: i64 = 300;

pub async fn console_pages(ctx: &mut Ctx, out: &mut Out) -> Result<()> {
    let t = Instant::now();
    let (ws, with_history) = seed_workspaces(ctx).await?;
    seed_timeline(ctx, ws, false).await?;
    seed_timeline(ctx, with_history, true).await?;
    top_up_events(ctx).await?;
    sqlx::query("ANALYZE").execute(&ctx.pool).await?;
    let seed_s = t.elapsed().as_secs_f64();
    let (events, workspaces): (i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM grove.events), (SELECT count(*) FROM grove.sandbox_workspaces)",
    )
    .fetch_one(&ctx.pool)
    .await?;
    let api = Api::start(ctx, false).await?;
    let pages = [
        ("console_fleet", "/ui/fleet".to_string()),
        ("console_workspaces", "/ui/workspaces".to_string()),
        (
            "console_workspaces_search",
            "/ui/workspaces?q=user-42".to_string(),
        ),
        (
            "console_workspaces_page_100",
            "/ui/workspaces?page=100".to_string(),
        ),
        ("console_workspace", format!("/ui/workspaces/{ws}")),
        (
            "console_workspace_history",
            format!("/ui/workspaces/{with_history}"),
        ),
        ("console_events", "/ui/events".to_string()),
        (
            "console_events_by_type",
            "/ui/events?type=exec.finished".to_string(),
        ),
        (
            "console_events_by_user",
            "/ui/events?user=user-7".to_string(),
        ),
    ];
    for (name, path) in pages {
        let (mut grove, mut floor) = (vec![], vec![]);
        get(&api, &path).await?; // warm-up
        for _ in 0..ctx.args.n {
            let t = Instant::now();
            get(&api, &path).await?;
            grove.push(ms(t));
            let t = Instant::now();
            get(&api, "/healthz").await?;
            floor.push(ms(t));
        }
        let mut row = latency(name, &grove, &floor);
        row.insert("floor_is".into(), json!("GET /healthz"));
        row.insert("events".into(), json!(events));
        row.insert("workspaces".into(), json!(workspaces));
        row.insert("seed_s".into(), round(seed_s));
        out.emit(row);
    }
    Ok(())
}

async fn get(api: &Api, path: &str) -> Result<String> {
    let resp = api
        .http
        .get(format!("{}{path}", api.base))
        .header("cookie", format!("grove_console={}", api.token))
        .send()
        .await?;
    let status = resp.status();
    let body = resp.text().await?;
    if !status.is_success() {
        bail!("{path}: {status}");
    }
    Ok(body)
}

/// Writes `console_workspaces` workspace rows (and their repo cache); returns the first
/// two.
async fn seed_workspaces(ctx: &Ctx) -> Result<(Uuid, Uuid)> {
    let cache = Uuid::now_v7();
    sqlx::query(
        "INSERT INTO grove.sandbox_repo_caches (id, node, identity, repo_name, repo_url, provider,
             provider_host, local_path, last_used_at, size_bytes, state, created_at, updated_at)
         VALUES ($1, 'bench-console', 'bench-console', 'o/bench', 'file:///bench', 'local', '',
             '/bench', now(), 1000000000, 'ready', now(), now())",
    )
    .bind(cache)
    .execute(&ctx.pool)
    .await
    .context("seeding the console's repo cache")?;
    let ids: Vec<Uuid> = sqlx::query_scalar(
        "INSERT INTO grove.sandbox_workspaces (id, repo_cache_id, node, project_id, user_id, mode,
             task_id, base_ref, base_commit, local_path, state, dirty, pinned_until, last_used_at,
             size_bytes, writable, isolated, persistent, created_at, updated_at)
         SELECT gen_random_uuid(), $1, 'bench-console', 'p' || (g % 7), 'user-' || (g % 100), 'task',
             'console-' || g, 'main', repeat('a', 40), '/bench/ws/' || g,
             CASE WHEN g % 10 = 0 THEN 'evicted' ELSE 'ready' END, g % 3 = 0,
             CASE WHEN g % 50 = 0 THEN now() + interval '1 day' END,
             now() - make_interval(secs => g * 37), (g % 997) * 100000, true, true, false,
             now() - make_interval(secs => g * 41), now()
         FROM generate_series(1, $2) g
         RETURNING id",
    )
    .bind(cache)
    .bind(ctx.args.console_workspaces.max(2))
    .fetch_all(&ctx.pool)
    .await
    .context("seeding the console's workspaces")?;
    Ok((ids[0], ids[1]))
}

/// A timeline of `TIMELINE_EXECS` commands on `ws`, each with its ledger row, and with
/// `points` a history point after each (its `workspace.snapshot_taken` in the command's
/// transaction).
async fn seed_timeline(ctx: &Ctx, ws: Uuid, points: bool) -> Result<()> {
    let per_exec: i64 = if points { 3 } else { 2 };
    sqlx::query(
        "WITH e AS (SELECT g, gen_random_uuid() AS id FROM generate_series(1, $2) g),
         ledger AS (
             INSERT INTO grove.commands (command_id, kind, payload, queue, job_id, status,
                 max_attempts, result, finished_at)
             SELECT id, 'exec', jsonb_build_object('command', 'exec', 'workspace_id', $1::uuid,
                     'argv', jsonb_build_array('cargo', 'test', '--', 'case_' || g)),
                 'grove:node:bench-console', 'bench-' || id, 'succeeded', 1,
                 jsonb_build_object('type', 'exec', 'exit_code', g % 2, 'stdout',
                     repeat('test output line ' || g || E'\\n', 40), 'stderr', '',
                     'timed_out', false, 'truncated', false, 'duration_ms', g),
                 now()
             FROM e)
         INSERT INTO grove.events (stream_id, stream_version, event_type, event_version, payload,
             metadata, command_id, recorded_at)
         SELECT 'workspace:' || $1::text, $3 * (g - 1) + 1 + k, t, 1,
             CASE WHEN k = 2 THEN jsonb_build_object('workspace_id', $1::uuid,
                     'snapshot', md5('s' || g) || substr(md5('t' || g), 1, 8),
                     'head', repeat('b', 40), 'branch', 'refs/heads/agent/task-bench',
                     'operation', jsonb_build_object('kind', 'exec',
                         'argv', jsonb_build_array('cargo', 'test', '--', 'case_' || g),
                         'exit_code', g % 2, 'duration_ms', g),
                     'changes', jsonb_build_object('added', g % 3, 'modified', 2, 'deleted', 0))
                  WHEN k = 0 THEN jsonb_build_object('exec_id', id, 'workspace_id', $1::uuid,
                     'runtime_id', $1::uuid, 'kind', 'write',
                     'argv', jsonb_build_array('cargo', 'test', '--', 'case_' || g),
                     'env_keys', '[]'::jsonb, 'timeout_ms', null)
                  ELSE jsonb_build_object('exec_id', id, 'workspace_id', $1::uuid,
                     'runtime_id', $1::uuid, 'outcome', 'completed', 'exit_code', g % 2,
                     'timed_out', false, 'truncated', false, 'duration_ms', g,
                     'stdout_bytes', 100, 'stderr_bytes', 0) END,
             jsonb_build_object('command_id', id, 'correlation',
                 jsonb_build_object('user_id', 'user-1'), 'worker_id', 'grove-bench', 'node', 'bench-console'),
             id, now()
         FROM e, LATERAL (VALUES (0, 'exec.started'), (1, 'exec.finished'),
             (2, 'workspace.snapshot_taken')) AS s(k, t)
         WHERE k < $3",
    )
    .bind(ws)
    .bind(TIMELINE_EXECS)
    .bind(per_exec)
    .execute(&ctx.pool)
    .await
    .context("seeding the measured workspace's timeline")?;
    Ok(())
}

/// Inserts events until the log holds `console_events`.
async fn top_up_events(ctx: &Ctx) -> Result<()> {
    let have: i64 = sqlx::query_scalar("SELECT count(*) FROM grove.events")
        .fetch_one(&ctx.pool)
        .await?;
    let missing = ctx.args.console_events - have;
    if missing <= 0 {
        return Ok(());
    }
    crate::cases::insert_filler_events(&ctx.pool, missing, 1)
        .await
        .context("topping up the event log")?;
    Ok(())
}
