//! The inputs of the eviction plan: a node's records read into an `Inventory`
//! (read-only; shared with the CLI: `grove evict --dry-run`, `workspace list`), and the
//! human text of a planner reason.

use std::collections::{HashMap, HashSet};
use std::path::Path;

use chrono::{DateTime, Utc};
use grove_core::eviction::{Inventory, Reason, RepoCacheItem, RuntimeItem, WorkspaceItem};
use grove_core::model::{RepoCacheRow, RuntimeRow, WorkspaceRow};
use grove_core::state::{RepoCacheState, WorkspaceState};
use grove_postgres::{rows, StoreError};
use sqlx::PgPool;
use uuid::Uuid;

/// Total bytes of the filesystem holding `path` (`statvfs`), 0 when unknown.
pub fn filesystem_bytes(path: &Path) -> u64 {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
        return 0;
    };
    // SAFETY: statvfs writes into the zeroed struct we own; `c` is a valid C string.
    unsafe {
        let mut st: libc::statvfs = std::mem::zeroed();
        if libc::statvfs(c.as_ptr(), &mut st) != 0 {
            return 0;
        }
        (st.f_blocks as u64).saturating_mul(st.f_frsize as u64)
    }
}

pub(crate) fn size(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

pub(crate) fn is_live(state: WorkspaceState) -> bool {
    match state {
        WorkspaceState::Ready | WorkspaceState::Released | WorkspaceState::Evicting => true,
        WorkspaceState::Evicted => false,
    }
}

/// A node's records and the inventory built from them.
#[derive(Debug, Clone)]
pub struct NodeState {
    pub inventory: Inventory,
    pub workspaces: HashMap<Uuid, WorkspaceRow>,
    pub runtimes: HashMap<Uuid, RuntimeRow>,
    pub caches: HashMap<Uuid, RepoCacheRow>,
}

/// Reads everything the planner needs for one node. `except` is the sweep's own command
/// (not "in flight" for anything); `unhealthy` lists runtimes whose health check failed.
pub async fn load_node(
    pool: &PgPool,
    node: &str,
    home: &Path,
    now: DateTime<Utc>,
    except: Option<Uuid>,
    unhealthy: &HashSet<Uuid>,
) -> Result<NodeState, StoreError> {
    let mut conn = pool.acquire().await?;
    let workspaces = rows::workspaces_of_node(&mut conn, node).await?;
    let runtimes = rows::runtimes_of_node(&mut conn, node).await?;
    let caches = rows::repo_caches_of_node(&mut conn, node).await?;
    let in_flight: HashSet<Uuid> = rows::workspaces_with_open_commands(&mut conn, except)
        .await?
        .into_iter()
        .collect();
    drop(conn);
    let saved_in: HashSet<Uuid> = workspaces
        .iter()
        .filter(|w| !w.state.has_files())
        .filter(|w| w.saved.is_some())
        .map(|w| w.repo_cache_id)
        .collect();
    // Saved work and workspace history (ADR 28) are used space no eviction frees.
    let saved_bytes = ["saved", "history"]
        .iter()
        .map(|d| grove_git::tree::tree_size(&home.join(d)).unwrap_or(0))
        .map(|n| i64::try_from(n).unwrap_or(i64::MAX))
        .fold(0i64, i64::saturating_add);
    let used_bytes = workspaces
        .iter()
        .filter(|w| is_live(w.state))
        .map(|w| size(w.size_bytes))
        .chain(
            caches
                .iter()
                .filter(|c| c.state != RepoCacheState::Evicted)
                .map(|c| size(c.size_bytes)),
        )
        .sum::<u64>()
        + size(saved_bytes);
    let inventory = Inventory {
        now,
        used_bytes,
        filesystem_bytes: filesystem_bytes(home),
        workspaces: workspaces
            .iter()
            .map(|w| WorkspaceItem::from_row(w, in_flight.contains(&w.id)))
            .collect(),
        runtimes: runtimes
            .iter()
            .map(|r| RuntimeItem::from_row(r, !unhealthy.contains(&r.id)))
            .collect(),
        repo_caches: caches
            .iter()
            .filter(|c| c.state != RepoCacheState::Evicted)
            .map(|c| RepoCacheItem::from_row(c, saved_in.contains(&c.id)))
            .collect(),
    };
    Ok(NodeState {
        inventory,
        workspaces: workspaces.into_iter().map(|w| (w.id, w)).collect(),
        runtimes: runtimes.into_iter().map(|r| (r.id, r)).collect(),
        caches: caches.into_iter().map(|c| (c.id, c)).collect(),
    })
}

/// Human text for a planner reason, with its values (for `runtime.*` reasons and logs).
pub fn describe(reason: &Reason) -> String {
    match *reason {
        Reason::IdleRuntime {
            idle_secs,
            threshold_secs,
        } => format!("idle for {idle_secs} s (threshold {threshold_secs} s)"),
        Reason::StoppedRuntime {
            stopped_secs,
            threshold_secs,
        } => format!("stopped for {stopped_secs} s (threshold {threshold_secs} s)"),
        Reason::UnhealthyRuntime => "health check failed".into(),
        Reason::OrphanRuntime => "its workspace is gone or evicted".into(),
        Reason::WorkspaceEvicted { workspace_id } => {
            format!("its workspace {workspace_id} is evicted next")
        }
        Reason::TtlExpired {
            tier,
            idle_secs,
            ttl_secs,
        } => format!("{tier:?} unused for {idle_secs} s (ttl {ttl_secs} s)"),
        Reason::DiskPressure {
            tier,
            idle_secs,
            pressure,
            ..
        } => format!(
            "disk pressure: {} bytes used > low water {} (high water {}, budget {}); {tier:?} unused for {idle_secs} s",
            pressure.used_bytes, pressure.low_water_bytes, pressure.high_water_bytes, pressure.budget_bytes
        ),
        Reason::RepoCachePressure {
            idle_secs,
            pressure,
        } => format!(
            "disk pressure: {} bytes used > low water {} (budget {}); unused for {idle_secs} s",
            pressure.used_bytes, pressure.low_water_bytes, pressure.budget_bytes
        ),
    }
}
