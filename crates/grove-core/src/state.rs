//! The lifecycle states of grove's records as types: a repo cache, a workspace, a
//! runtime and a ledger entry each have a closed set of states, stored as lowercase
//! text in Postgres and in events, parsed once at the store's boundary.
//!
//! Code matches on these enums, so a state added later is a compile error wherever it
//! is not decided, instead of a string comparison that silently falls through.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A stored state string that is none of its type's states: the store holds a value
/// this build of grove does not know (a corrupt row, or one written by a newer release).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {kind} state {value:?}")]
pub struct UnknownState {
    /// The type the value was parsed as (`workspace`, `runtime`, …).
    pub kind: &'static str,
    /// The value, as stored.
    pub value: String,
}

/// Defines a state enum with its text form: serde, `Display` (padding honoured, so
/// `{:<9}` lines up tables), `FromStr` and `as_str`.
macro_rules! states {
    (
        $(#[$meta:meta])*
        $name:ident ($kind:literal) {
            $( $(#[$vmeta:meta])* $variant:ident = $text:literal, )+
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
        pub enum $name {
            $( $(#[$vmeta])* #[serde(rename = $text)] $variant, )+
        }

        impl $name {
            /// Every state, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            /// The stored text of this state.
            pub fn as_str(self) -> &'static str {
                match self {
                    $( $name::$variant => $text, )+
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.pad(self.as_str())
            }
        }

        impl FromStr for $name {
            type Err = UnknownState;
            fn from_str(s: &str) -> Result<Self, UnknownState> {
                match s {
                    $( $text => Ok($name::$variant), )+
                    other => Err(UnknownState { kind: $kind, value: other.to_owned() }),
                }
            }
        }
    };
}

states! {
    /// Where a repo cache is in its life.
    RepoCacheState ("repo cache") {
        /// Cloned and usable (also after a re-clone of an evicted cache).
        Ready = "ready",
        /// Its directory was deleted by a sweep; the record stays so it can be re-cloned.
        Evicted = "evicted",
    }
}

states! {
    /// Where a workspace is in its life.
    WorkspaceState ("workspace") {
        /// Checked out and in use (created, reacquired or restored).
        Ready = "ready",
        /// Its owner released it; the files stay until eviction or a new acquire.
        Released = "released",
        /// An eviction has saved its work and is deleting its files.
        Evicting = "evicting",
        /// Its files are gone; its work is saved for a restore.
        Evicted = "evicted",
    }
}

impl WorkspaceState {
    /// Whether the workspace's files are on disk and usable (`ready` or `released`).
    pub fn has_files(self) -> bool {
        match self {
            WorkspaceState::Ready | WorkspaceState::Released => true,
            WorkspaceState::Evicting | WorkspaceState::Evicted => false,
        }
    }
}

states! {
    /// Whether a runtime runs.
    RuntimeState ("runtime") {
        /// Started and not known to be stopped.
        Running = "running",
        /// Stopped (by a release, a sweep or an error); it may be started again.
        Stopped = "stopped",
    }
}

states! {
    /// Where a job is in the ledger.
    LedgerStatus ("job") {
        /// Waiting for a worker.
        Queued = "queued",
        /// Claimed by a worker that has not recorded an outcome.
        Running = "running",
        /// Finished with a result.
        Succeeded = "succeeded",
        /// Finished with a typed error.
        Failed = "failed",
    }
}

impl LedgerStatus {
    /// Whether the job has an outcome (succeeded or failed).
    pub fn is_finished(self) -> bool {
        match self {
            LedgerStatus::Succeeded | LedgerStatus::Failed => true,
            LedgerStatus::Queued | LedgerStatus::Running => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trips<T>(all: &[T])
    where
        T: Copy + fmt::Display + FromStr<Err = UnknownState> + Serialize + PartialEq + fmt::Debug,
        T: for<'de> Deserialize<'de>,
    {
        for &state in all {
            let text = state.to_string();
            assert_eq!(text.parse::<T>().unwrap(), state);
            let json = serde_json::to_string(&state).unwrap();
            assert_eq!(json, format!("\"{text}\""));
            assert_eq!(serde_json::from_str::<T>(&json).unwrap(), state);
        }
    }

    #[test]
    fn every_state_round_trips_through_text_and_json() {
        round_trips(RepoCacheState::ALL);
        round_trips(WorkspaceState::ALL);
        round_trips(RuntimeState::ALL);
        round_trips(LedgerStatus::ALL);
    }

    #[test]
    fn the_stored_texts_are_the_ones_the_schema_and_old_events_hold() {
        let texts: Vec<_> = WorkspaceState::ALL.iter().map(|s| s.as_str()).collect();
        assert_eq!(texts, ["ready", "released", "evicting", "evicted"]);
        let texts: Vec<_> = LedgerStatus::ALL.iter().map(|s| s.as_str()).collect();
        assert_eq!(texts, ["queued", "running", "succeeded", "failed"]);
        assert_eq!(RuntimeState::Stopped.as_str(), "stopped");
        assert_eq!(RepoCacheState::Evicted.as_str(), "evicted");
    }

    #[test]
    fn an_unknown_or_differently_cased_state_is_refused_with_its_kind() {
        let err = "Ready".parse::<WorkspaceState>().unwrap_err();
        assert_eq!(err.kind, "workspace");
        assert_eq!(err.to_string(), "unknown workspace state \"Ready\"");
        assert!("creating".parse::<RuntimeState>().is_err());
        assert!("".parse::<LedgerStatus>().is_err());
        assert!(serde_json::from_str::<RepoCacheState>("\"gone\"").is_err());
    }

    #[test]
    fn display_honours_padding_for_tables() {
        assert_eq!(format!("{:<9}|", WorkspaceState::Ready), "ready    |");
    }

    #[test]
    fn only_ready_and_released_workspaces_have_files_and_only_outcomes_finish() {
        let with_files: Vec<_> = WorkspaceState::ALL
            .iter()
            .filter(|s| s.has_files())
            .collect();
        assert_eq!(
            with_files,
            [&WorkspaceState::Ready, &WorkspaceState::Released]
        );
        let finished: Vec<_> = LedgerStatus::ALL
            .iter()
            .filter(|s| s.is_finished())
            .collect();
        assert_eq!(finished, [&LedgerStatus::Succeeded, &LedgerStatus::Failed]);
    }
}
