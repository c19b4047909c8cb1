//! `grove evict`, `grove workspace restore|pin`, `grove release`, and the eviction order
//! `grove workspace list` shows.
//!
//! A dry run never writes: it reads the node's records and the ledger, plans with the
//! policy this process's environment gives (the same variables the worker reads), and
//! prints the plan. It uses the cached sizes as they are (a real sweep re-measures
//! workspaces used since their last measurement first).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::process::ExitCode;

use anyhow::{Context, Result};
use chrono::{DateTime, Utc};
use grove_core::commands::{Command, CommandResult, EvictSweep, ReleaseReport, ReleaseScope};
use grove_core::error::{CommandError, ErrorKind};
use grove_core::eviction::{plan, workspace_queue, Action, ActionKind, Plan, QueueEntry};
use grove_core::model::WorkspaceRow;
use grove_core::placement::Placement;
use grove_core::sweep::{SweepReport, SweepTrigger};
use grove_workers::config::EvictionSettings;
use grove_workers::sweep::{describe, load_node};
use uuid::Uuid;

use crate::{client, connect, grove_home, invalid, parse_id, print_result, read_token};

fn settings() -> Result<EvictionSettings> {
    EvictionSettings::from_env().map_err(invalid)
}

fn parse_time(flag: &str, raw: &str) -> Result<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(raw)
        .map(|t| t.with_timezone(&Utc))
        .map_err(|_| {
            invalid(format!(
                "{flag} {raw:?}: expected an RFC 3339 time such as 2030-01-01T00:00:00Z"
            ))
        })
}

fn node_or_default(node: Option<String>) -> Result<String> {
    let node = node
        .or_else(|| std::env::var("GROVE_NODE").ok().filter(|n| !n.is_empty()))
        .unwrap_or_else(|| "local".into());
    grove_core::validate::validate_owner_id("node", &node)?;
    if Placement::of_node(&node).is_remote() {
        return Err(crate::invalid(format!(
            "{node} is a remote runtime, not a node: its workspaces are not swept"
        )));
    }
    Ok(node)
}

fn kind_name(a: &Action) -> &'static str {
    match a.kind {
        ActionKind::StopRuntime => "stop_runtime",
        ActionKind::DestroyRuntime => "destroy_runtime",
        ActionKind::EvictWorkspace {
            preserve_dirty: false,
        } => "evict_workspace",
        ActionKind::EvictWorkspace {
            preserve_dirty: true,
        } => "evict_workspace+save",
        ActionKind::EvictRepoCache => "evict_repo_cache",
    }
}

/// `grove evict [--node N] [--dry-run] [--json]`.
pub async fn evict(
    node: Option<String>,
    dry_run: bool,
    json: bool,
    now: Option<String>,
    command_id: Option<Uuid>,
) -> Result<ExitCode> {
    let node = node_or_default(node)?;
    let now = now.map(|t| parse_time("--now", &t)).transpose()?;
    if dry_run {
        let settings = settings()?;
        let pool = connect(2).await?;
        let at = now.unwrap_or_else(Utc::now);
        let state = load_node(&pool, &node, &grove_home(), at, None, &HashSet::new())
            .await
            .context("reading the node's records")?;
        let p = plan(&settings.policy, &state.inventory);
        print_plan(&node, at, &p, json)?;
        return Ok(ExitCode::SUCCESS);
    }
    let command = Command::EvictSweep(EvictSweep {
        node,
        tick: None,
        now,
        trigger: SweepTrigger::Manual,
    });
    command.validate()?;
    let pool = connect(4).await?;
    let result = client::submit(&pool, &command, command_id, None).await?;
    print_result(&result, json)
}

fn print_plan(node: &str, at: DateTime<Utc>, p: &Plan, json: bool) -> Result<()> {
    if json {
        let out = serde_json::json!({
            "dry_run": true,
            "node": node,
            "now": at,
            "plan": p,
            "bytes_freed": p.bytes_freed(),
        });
        println!("{out}");
        return Ok(());
    }
    let m = p.marks;
    println!(
        "dry run for node {node} at {}: {} bytes used; budget {} (high water {}, low water {}){}",
        at.to_rfc3339(),
        p.used_bytes,
        m.budget_bytes,
        m.high_water_bytes,
        m.low_water_bytes,
        if p.under_pressure {
            ": under pressure"
        } else {
            ""
        }
    );
    if p.actions.is_empty() {
        println!("nothing to do");
    }
    for (i, a) in p.actions.iter().enumerate() {
        println!(
            "{:>3}. {:<21} {}  {}; frees {} bytes",
            i + 1,
            kind_name(a),
            a.id,
            describe(&a.reason),
            a.bytes_freed
        );
    }
    for b in &p.blocked {
        println!(
            "     kept {:?} {}: {}",
            b.target,
            b.id,
            serde_json::to_string(&b.protection)?
        );
    }
    println!(
        "would free {} bytes: {} bytes used after{}",
        p.bytes_freed(),
        p.projected_used_bytes,
        if p.budget_met {
            String::new()
        } else {
            format!("; {} bytes above low water remain", p.shortfall_bytes)
        }
    );
    Ok(())
}

pub fn print_report(report: &SweepReport, json: bool) -> Result<()> {
    if json {
        println!("{}", serde_json::to_string(report)?);
        return Ok(());
    }
    if let Some(why) = &report.skipped {
        println!("sweep of node {} skipped: {why}", report.node);
        return Ok(());
    }
    let m = report.marks;
    println!(
        "sweep of node {}: {} -> {} bytes used; budget {} (high water {}, low water {}); {}",
        report.node,
        report.used_bytes_before,
        report.used_bytes_after,
        m.budget_bytes,
        m.high_water_bytes,
        m.low_water_bytes,
        if report.budget_met {
            "budget met".to_string()
        } else {
            format!("{} bytes above low water remain", report.shortfall_bytes)
        }
    );
    for r in &report.reconciled {
        println!("  repaired {:?} {}: {}", r.target, r.id, r.what);
    }
    for r in &report.actions {
        println!(
            "  {:<8} {:<21} {}  {}{}",
            format!("{:?}", r.outcome).to_lowercase(),
            kind_name(&r.action),
            r.action.id,
            describe(&r.action.reason),
            r.detail
                .as_ref()
                .map(|d| format!(" ({d})"))
                .unwrap_or_default()
        );
    }
    for b in &report.blocked {
        println!(
            "  kept     {:?} {}: {}",
            b.target,
            b.id,
            serde_json::to_string(&b.protection)?
        );
    }
    if report.blocked_total > report.blocked.len() as u64 {
        println!(
            "  ... and {} more kept",
            report.blocked_total - report.blocked.len() as u64
        );
    }
    println!(
        "freed {} bytes in {} ms ({} plan(s), {} size(s) measured)",
        report.bytes_freed(),
        report.duration_ms,
        report.rounds,
        report.measured
    );
    Ok(())
}

pub fn print_released(report: &ReleaseReport, json: bool) -> Result<()> {
    if json {
        println!("{}", serde_json::to_string(report)?);
        return Ok(());
    }
    for id in &report.released {
        println!("released   {id}");
    }
    for id in &report.destroyed {
        println!("destroyed  {id}");
    }
    for id in &report.already_evicted {
        println!("evicted    {id} (kept with its saved work)");
    }
    for (id, cmd) in &report.delegated {
        println!("delegated  {id} (command {cmd} on its node)");
    }
    Ok(())
}

/// `grove workspace restore ID`.
pub async fn restore(
    id: String,
    token_env: Option<String>,
    command_id: Option<Uuid>,
    json: bool,
) -> Result<ExitCode> {
    let workspace_id = parse_id(&id)?;
    let token = read_token(&token_env)?;
    let pool = connect(4).await?;
    let command = Command::RestoreWorkspace { workspace_id };
    let result = client::submit(&pool, &command, command_id, token.as_deref()).await?;
    print_result(&result, json)
}

/// `grove workspace pin ID (--until T | --clear)`.
pub async fn pin(id: String, until: Option<String>, clear: bool, json: bool) -> Result<ExitCode> {
    let workspace_id = parse_id(&id)?;
    let until = match (until, clear) {
        (Some(t), false) => Some(parse_time("--until", &t)?),
        (None, true) => None,
        _ => return Err(invalid("pin needs exactly one of --until TIME and --clear")),
    };
    let pool = connect(4).await?;
    let command = Command::PinWorkspace {
        workspace_id,
        until,
    };
    let result = client::submit(&pool, &command, None, None).await?;
    print_result(&result, json)
}

/// `grove release --user U [--project P] (--conversation C | --task T) [--destroy-workspaces]`.
pub async fn release(
    user: String,
    project: Option<String>,
    conversation: Option<String>,
    task: Option<String>,
    destroy_workspaces: bool,
    json: bool,
) -> Result<ExitCode> {
    let command = Command::ReleaseScope(ReleaseScope {
        user_id: user,
        project_id: project,
        conversation_id: conversation,
        task_id: task,
        destroy_workspaces,
    });
    command.validate()?;
    let pool = connect(4).await?;
    let result = client::submit(&pool, &command, None, None).await?;
    if !matches!(result, CommandResult::Released(_)) {
        return Err(CommandError::new(ErrorKind::Internal, "unexpected result for release").into());
    }
    print_result(&result, json)
}

/// Where each listed workspace stands in its node's eviction order (1 = next to go).
pub async fn queue_positions(
    pool: &sqlx::PgPool,
    list: &[WorkspaceRow],
) -> Result<HashMap<Uuid, (usize, QueueEntry)>> {
    let settings = settings()?;
    // A workspace placed in a remote provider is never swept: it has no position.
    let nodes: BTreeMap<&str, ()> = list
        .iter()
        .filter(|w| !Placement::of_node(&w.node).is_remote())
        .map(|w| (w.node.as_str(), ()))
        .collect();
    let mut out = HashMap::new();
    for node in nodes.keys() {
        let state = load_node(pool, node, &grove_home(), Utc::now(), None, &HashSet::new()).await?;
        for (i, entry) in workspace_queue(&settings.policy, &state.inventory)
            .into_iter()
            .enumerate()
        {
            out.insert(entry.id, (i + 1, entry));
        }
    }
    Ok(out)
}

/// The `eviction` field of a listed workspace, and its short text form.
pub fn queue_field(entry: Option<&(usize, QueueEntry)>) -> (serde_json::Value, String) {
    match entry {
        None => (serde_json::Value::Null, "evict=-".into()),
        Some((pos, e)) => {
            let protection = e
                .protection
                .map(|p| serde_json::to_value(p).unwrap_or_default());
            let short = match &protection {
                Some(p) => format!(
                    "evict=#{pos}({})",
                    p.get("kind").and_then(|k| k.as_str()).unwrap_or("kept")
                ),
                None if e.ttl_expired => format!("evict=#{pos}(ttl)"),
                None => format!("evict=#{pos}"),
            };
            (
                serde_json::json!({
                    "position": pos,
                    "tier": e.tier,
                    "ttl_expired": e.ttl_expired,
                    "idle_secs": e.idle_secs,
                    "size_bytes": e.size_bytes,
                    "protection": protection,
                }),
                short,
            )
        }
    }
}
