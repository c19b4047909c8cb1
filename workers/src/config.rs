//! Worker settings, with the documented defaults.

use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use grove_core::eviction::{DiskBudget, EvictionPolicy};

/// How a worker runs. Every field has a documented default (see README "Configuration").
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// The node this worker serves: it takes jobs of `grove:node:<node>` and `grove:shared`.
    pub node: String,
    /// Unique per process; recorded in `apalis.workers` and in event metadata.
    pub worker_id: String,
    /// Jobs run at once.
    pub concurrency: usize,
    /// `$GROVE_HOME`: repo caches and workspaces live under it.
    pub home: PathBuf,
    /// How often this worker proves it is alive.
    pub heartbeat_every: Duration,
    /// A worker silent this long is dead: its jobs go back to the queue.
    pub worker_lost_after: Duration,
    /// Fallback poll when no notification arrives (a lost LISTEN connection must not stall pickup).
    pub poll_every: Duration,
    /// How long a job waits for a workspace or cache lock before failing as `conflict`.
    pub lock_timeout: Duration,
    /// A repo cache older than this is fetched by the next ensure, or by the next acquire that
    /// creates a workspace from it.
    pub cache_freshness: Duration,
    /// Finished jobs and ledger rows are pruned after this long (the dedupe window).
    pub prune_after: Duration,
    /// Exec output is kept on the ledger for the console's timeline this long
    /// (`GROVE_EXEC_OUTPUT_RETENTION`, seconds); no longer than the ledger row itself.
    pub output_retention: Duration,
    /// The image `--runtime docker` execs run in (`GROVE_DOCKER_IMAGE`, else the last
    /// `grove image build`); `None` when there is none.
    pub docker_image: Option<String>,
    /// Eviction policy, schedule and measurement settings (`GROVE_DISK_BUDGET`, ...).
    pub eviction: EvictionSettings,
    /// Who may clone from local repository URLs: the operator's allow-list
    /// (`GROVE_LOCAL_REPO_ROOTS`) and this `$GROVE_HOME`, never a source.
    pub local_repos: grove_core::local_repo::LocalRepoPolicy,
    /// Workspace history (ADR 28): a point after every change. `GROVE_HISTORY=off`
    /// turns it off (no snapshot is taken; the history tools still answer).
    pub history: bool,
    /// History retention (`GROVE_HISTORY_KEEP_DAYS`, default 30): points younger than
    /// this many days are all kept, older ones thinned by the eviction sweep to one a
    /// day; 0 keeps every point.
    pub history_keep_days: u64,
    /// `GROVE_HISTORY_IGNORED_BUDGET_BYTES` (default 64 MiB): ignored files a point of a
    /// workspace acquired with `history_ignored` keeps, in total bytes; those beyond are
    /// left out and counted in its `workspace.snapshot_taken`.
    pub history_ignored_budget: u64,
}

impl WorkerConfig {
    pub fn new(home: PathBuf, node: String) -> Self {
        let worker_id = format!(
            "{}-{}-{}",
            node,
            std::process::id(),
            &uuid::Uuid::new_v4().simple().to_string()[..8]
        );
        Self {
            node,
            worker_id,
            concurrency: 8,
            heartbeat_every: Duration::from_secs(2),
            worker_lost_after: Duration::from_secs(15),
            poll_every: Duration::from_millis(500),
            lock_timeout: Duration::from_secs(120),
            cache_freshness: Duration::from_secs(600),
            prune_after: Duration::from_secs(7 * 24 * 3600),
            output_retention: Duration::from_secs(7 * 24 * 3600),
            docker_image: None,
            eviction: EvictionSettings::default(),
            local_repos: grove_core::local_repo::LocalRepoPolicy::from_value(
                std::env::var(grove_core::local_repo::ROOTS_ENV)
                    .ok()
                    .as_deref(),
                home.clone(),
            ),
            history: std::env::var("GROVE_HISTORY").map_or(true, |v| v != "off"),
            history_keep_days: std::env::var("GROVE_HISTORY_KEEP_DAYS")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(30),
            history_ignored_budget: history_ignored_budget_from_env()
                .unwrap_or(DEFAULT_IGNORED_BUDGET),
            home,
        }
    }
}

/// `GROVE_HISTORY_IGNORED_BUDGET_BYTES` from the environment (unset: 64 MiB); a value
/// that is not a byte count is an error (a worker does not start with it).
pub fn history_ignored_budget_from_env() -> Result<u64, String> {
    history_ignored_budget(|k| std::env::var(k).ok())
}

/// `GROVE_HISTORY_IGNORED_BUDGET_BYTES` through `get` (the environment, or a map in
/// tests).
fn history_ignored_budget(get: impl Fn(&str) -> Option<String>) -> Result<u64, String> {
    let name = "GROVE_HISTORY_IGNORED_BUDGET_BYTES";
    match get(name).filter(|v| !v.is_empty()) {
        None => Ok(DEFAULT_IGNORED_BUDGET),
        Some(v) => match parse_budget(&v)? {
            DiskBudget::Bytes(n) => Ok(n),
            _ => Err(format!(
                "{name}: expected bytes (like 67108864 or 64MiB), got {v:?}"
            )),
        },
    }
}

/// The documented default schedule: every 5 minutes, at second 0 (cron with seconds).
pub const DEFAULT_SCHEDULE: &str = "0 */5 * * * *";
/// Default for `GROVE_EVICT_MEASURE_EVERY`: a used workspace is re-measured at most this often.
pub const DEFAULT_MEASURE_EVERY: Duration = Duration::from_secs(600);

/// Eviction settings of a worker (see README "Configuration").
#[derive(Debug, Clone, PartialEq)]
pub struct EvictionSettings {
    pub policy: EvictionPolicy,
    /// Cron expression (with seconds) of the node's sweeps; `None` disables them.
    pub schedule: Option<String>,
    pub measure_every: Duration,
    /// Accept `EvictSweep.now` (a clock override, for tests).
    pub allow_clock_override: bool,
    /// Test-only (`GROVE_TEST_EVICT_PAUSE_MS`): a pause after each step of a workspace
    /// eviction, so a test can kill the worker in the middle of one.
    pub test_pause: Option<Duration>,
    /// `GROVE_EVICT_IGNORED_BUDGET_BYTES`: ignored files kept per saved workspace, in
    /// total bytes; the rest are named in the eviction's events.
    pub ignored_budget_bytes: u64,
    /// `GROVE_RECORD_USE_AFTER` (seconds, default 60): a warm acquire or ensure of
    /// something whose last use was recorded less than this long ago answers without
    /// recording another (ADR 40); 0 records every use. Capped by
    /// [`EvictionPolicy::use_staleness_bound_secs`] ([`Self::recent_use_window`]).
    pub record_use_after: Duration,
}

/// Default for `GROVE_RECORD_USE_AFTER`.
pub const DEFAULT_RECORD_USE_AFTER: Duration = Duration::from_secs(60);

/// Default for `GROVE_EVICT_IGNORED_BUDGET_BYTES` (64 MiB).
pub const DEFAULT_IGNORED_BUDGET: u64 = 64 << 20;

impl Default for EvictionSettings {
    fn default() -> Self {
        Self {
            policy: EvictionPolicy::default(),
            schedule: Some(DEFAULT_SCHEDULE.to_string()),
            measure_every: DEFAULT_MEASURE_EVERY,
            allow_clock_override: false,
            test_pause: None,
            ignored_budget_bytes: DEFAULT_IGNORED_BUDGET,
            record_use_after: DEFAULT_RECORD_USE_AFTER,
        }
    }
}

impl EvictionSettings {
    /// How recent a recorded use must be for a warm acquire or ensure to answer without
    /// recording another (ADR 40): `record_use_after`, but never more than the policy
    /// lets a last use be stale.
    pub fn recent_use_window(&self) -> Duration {
        let bound = Duration::from_secs(self.policy.use_staleness_bound_secs());
        self.record_use_after.min(bound)
    }

    /// Reads the settings from the process environment.
    pub fn from_env() -> Result<Self, String> {
        Self::from_lookup(|k| std::env::var(k).ok().filter(|v| !v.is_empty()))
    }

    /// Reads the settings through `get` (the environment, or a map in tests):
    /// `GROVE_EVICT_POLICY` (a JSON file of `EvictionPolicy`, any subset of fields), then
    /// the single-value variables on top of it.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self, String> {
        let mut s = Self {
            policy: policy_from_lookup(&get)?,
            ..Self::default()
        };
        if let Some(v) = get("GROVE_EVICT_SCHEDULE") {
            s.schedule = match v.trim() {
                "off" | "none" | "disabled" => None,
                expr => {
                    cron::Schedule::from_str(expr)
                        .map_err(|e| format!("GROVE_EVICT_SCHEDULE {expr:?}: {e}"))?;
                    Some(expr.to_string())
                }
            };
        }
        if let Some(v) = get("GROVE_EVICT_MEASURE_EVERY") {
            s.measure_every = Duration::from_secs(secs("GROVE_EVICT_MEASURE_EVERY", v)?);
        }
        if let Some(v) = get("GROVE_EVICT_IGNORED_BUDGET_BYTES") {
            s.ignored_budget_bytes = parse_budget(&v).and_then(|b| match b {
                DiskBudget::Bytes(n) => Ok(n),
                _ => Err(format!(
                    "GROVE_EVICT_IGNORED_BUDGET_BYTES: expected bytes (like 67108864 or 64MiB), got {v:?}"
                )),
            })?;
        }
        if let Some(v) = get("GROVE_RECORD_USE_AFTER") {
            s.record_use_after = Duration::from_secs(secs("GROVE_RECORD_USE_AFTER", v)?);
        }
        s.allow_clock_override = get("GROVE_ALLOW_CLOCK_OVERRIDE").is_some_and(|v| v == "1");
        if let Some(v) = get("GROVE_TEST_EVICT_PAUSE_MS") {
            s.test_pause =
                Some(Duration::from_millis(v.trim().parse().map_err(|_| {
                    format!("GROVE_TEST_EVICT_PAUSE_MS: bad value {v:?}")
                })?));
        }
        Ok(s)
    }
}

/// The eviction policy: `GROVE_EVICT_POLICY` (a JSON file of `EvictionPolicy`, any
/// subset of fields), then the single-value variables on top of it, validated.
fn policy_from_lookup(get: &impl Fn(&str) -> Option<String>) -> Result<EvictionPolicy, String> {
    let mut policy = EvictionPolicy::default();
    if let Some(path) = get("GROVE_EVICT_POLICY") {
        let text = std::fs::read_to_string(&path)
            .map_err(|e| format!("GROVE_EVICT_POLICY {path}: {e}"))?;
        policy =
            serde_json::from_str(&text).map_err(|e| format!("GROVE_EVICT_POLICY {path}: {e}"))?;
    }
    if let Some(v) = get("GROVE_DISK_BUDGET") {
        policy.disk_budget = parse_budget(&v)?;
    }
    let fraction = |name: &str, v: String| {
        v.trim()
            .parse::<f64>()
            .map_err(|_| format!("{name}: expected a fraction like 0.85, got {v:?}"))
    };
    if let Some(v) = get("GROVE_HIGH_WATER") {
        policy.high_water = fraction("GROVE_HIGH_WATER", v)?;
    }
    if let Some(v) = get("GROVE_LOW_WATER") {
        policy.low_water = fraction("GROVE_LOW_WATER", v)?;
    }
    for (name, field) in [
        (
            "GROVE_RUNTIME_IDLE_STOP_AFTER",
            &mut policy.runtime_idle_stop_after_secs,
        ),
        (
            "GROVE_RUNTIME_DESTROY_STOPPED_AFTER",
            &mut policy.runtime_destroy_stopped_after_secs,
        ),
        (
            "GROVE_TTL_ANALYSIS",
            &mut policy.workspace_ttl.analysis_secs,
        ),
        ("GROVE_TTL_TASK", &mut policy.workspace_ttl.task_secs),
        ("GROVE_TTL_EDIT", &mut policy.workspace_ttl.edit_secs),
        ("GROVE_PRESSURE_GRACE", &mut policy.pressure_grace_secs),
    ] {
        if let Some(v) = get(name) {
            *field = secs(name, v)?;
        }
    }
    policy
        .validate()
        .map_err(|e| format!("eviction policy: {e}"))?;
    Ok(policy)
}

/// A whole number of seconds from the variable `name`.
fn secs(name: &str, v: String) -> Result<u64, String> {
    v.trim()
        .parse::<u64>()
        .map_err(|_| format!("{name}: expected whole seconds, got {v:?}"))
}

/// `GROVE_DISK_BUDGET`: bytes (`500000000`, `20G`, `512MiB`), a fraction of the
/// filesystem (`0.5`), or a percentage (`50%`).
pub fn parse_budget(raw: &str) -> Result<DiskBudget, String> {
    let v = raw.trim();
    let bad = || {
        format!("GROVE_DISK_BUDGET: expected bytes (e.g. 20G), a fraction (0.5) or a percentage (50%), got {raw:?}")
    };
    if let Some(p) = v.strip_suffix('%') {
        let p: f64 = p.trim().parse().map_err(|_| bad())?;
        return Ok(DiskBudget::Fraction(p / 100.0));
    }
    if v.contains('.') {
        return Ok(DiskBudget::Fraction(v.parse().map_err(|_| bad())?));
    }
    let split = v.find(|c: char| !c.is_ascii_digit()).unwrap_or(v.len());
    let (digits, unit) = v.split_at(split);
    let n: u64 = digits.parse().map_err(|_| bad())?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" => 1_000,
        "m" | "mb" => 1_000_000,
        "g" | "gb" => 1_000_000_000,
        "t" | "tb" => 1_000_000_000_000,
        "ki" | "kib" => 1 << 10,
        "mi" | "mib" => 1 << 20,
        "gi" | "gib" => 1 << 30,
        "ti" | "tib" => 1 << 40,
        _ => return Err(bad()),
    };
    n.checked_mul(mult).map(DiskBudget::Bytes).ok_or_else(bad)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn settings(vars: &[(&str, &str)]) -> Result<EvictionSettings, String> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        EvictionSettings::from_lookup(|k| map.get(k).cloned())
    }

    #[test]
    fn the_history_ignored_budget_is_bytes_or_an_error() {
        let budget = |v: Option<&str>| {
            history_ignored_budget(|k| {
                assert_eq!(k, "GROVE_HISTORY_IGNORED_BUDGET_BYTES");
                v.map(String::from)
            })
        };
        assert_eq!(budget(None), Ok(64 << 20));
        assert_eq!(budget(Some("")), Ok(64 << 20));
        assert_eq!(budget(Some("1000")), Ok(1000));
        assert_eq!(budget(Some("512MiB")), Ok(512 << 20));
        for bad in ["25%", "0.5", "lots"] {
            assert!(budget(Some(bad)).is_err(), "{bad}");
        }
    }

    #[test]
    fn budgets_parse_as_bytes_fractions_and_percentages() {
        assert_eq!(parse_budget("1000"), Ok(DiskBudget::Bytes(1000)));
        assert_eq!(parse_budget("20G"), Ok(DiskBudget::Bytes(20_000_000_000)));
        assert_eq!(parse_budget("512MiB"), Ok(DiskBudget::Bytes(512 << 20)));
        assert_eq!(parse_budget("0.5"), Ok(DiskBudget::Fraction(0.5)));
        assert_eq!(parse_budget("25%"), Ok(DiskBudget::Fraction(0.25)));
        assert!(parse_budget("lots").is_err());
        assert!(parse_budget("12parsecs").is_err());
    }

    #[test]
    fn settings_default_to_the_documented_values_and_env_overrides_them() {
        let d = settings(&[]).unwrap();
        assert_eq!(d, EvictionSettings::default());
        assert_eq!(d.schedule.as_deref(), Some("0 */5 * * * *"));
        assert_eq!(d.measure_every, Duration::from_secs(600));
        let s = settings(&[
            ("GROVE_DISK_BUDGET", "10M"),
            ("GROVE_HIGH_WATER", "0.9"),
            ("GROVE_LOW_WATER", "0.5"),
            ("GROVE_PRESSURE_GRACE", "0"),
            ("GROVE_TTL_EDIT", "60"),
            ("GROVE_EVICT_SCHEDULE", "off"),
            ("GROVE_ALLOW_CLOCK_OVERRIDE", "1"),
        ])
        .unwrap();
        assert_eq!(s.policy.disk_budget, DiskBudget::Bytes(10_000_000));
        assert_eq!((s.policy.high_water, s.policy.low_water), (0.9, 0.5));
        assert_eq!(s.policy.pressure_grace_secs, 0);
        assert_eq!(s.policy.workspace_ttl.edit_secs, 60);
        assert_eq!(s.schedule, None);
        assert!(s.allow_clock_override);
        assert!(
            settings(&[("GROVE_LOW_WATER", "0.95")]).is_err(),
            "low above high"
        );
        assert!(settings(&[("GROVE_EVICT_SCHEDULE", "every tuesday")]).is_err());
        assert!(settings(&[("GROVE_TTL_TASK", "0")]).is_err());
    }

    #[test]
    fn the_recent_use_window_is_the_setting_capped_by_the_policy() {
        let window = |env: &[(&str, &str)]| settings(env).unwrap().recent_use_window();
        assert_eq!(window(&[]), Duration::from_secs(60));
        assert_eq!(window(&[("GROVE_RECORD_USE_AFTER", "0")]), Duration::ZERO);
        assert_eq!(
            window(&[("GROVE_RECORD_USE_AFTER", "3600")]),
            Duration::from_secs(150),
            "a quarter of the 600 s grace"
        );
        assert_eq!(
            window(&[("GROVE_PRESSURE_GRACE", "0")]),
            Duration::ZERO,
            "no grace: every use recorded"
        );
        assert!(settings(&[("GROVE_RECORD_USE_AFTER", "a minute")]).is_err());
    }
}
