//! The private index a tracked workspace keeps in memory between its points (ADR 35),
//! with the tree it makes: a tracked point applies its changes to it and edits that
//! tree, neither reading the index file nor writing it (together about 4 ms for a
//! 5,000-file tree). The file is written by the points that walk the whole tree, and
//! when the tracker is dropped at release, eviction or destroy (under the workspace's
//! lock): then the entries tracked points changed since the file was written get their
//! times zeroed first, so the next walk hashes those files again whatever their stat
//! says (a file changed twice within one clock tick keeps its stat; libgit2's own
//! racy-entry check needs the store as the index's owner, which a held index has not).
//! A walk that starts from an older file hashes again what changed since.

use std::collections::BTreeSet;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use git2::{Index, IndexTime, Oid};

/// A private index and its tree, held by one tracker.
pub(crate) struct Held {
    pub index: Index,
    /// The tree of `index` (what `git_index_write_tree` would make of it).
    pub tree: Oid,
    /// Whether `index` holds changes its file does not.
    pub unsaved: bool,
    /// The index paths tracked points changed since the file was written.
    pub touched: BTreeSet<Vec<u8>>,
}

// SAFETY: a libgit2 index has no tie to the thread that made it; it only must not be
// used by two threads at once. A `Held` is owned by one tracker under the registry's
// mutex, or moved out of it by the one point that uses it. Its index has no owning
// repository while it is held or moved: a walk's index is owned by the point's store
// (`set_index`), and `point` drops that store (whose cleanup clears the owner) before
// `settle` hands the index to the registry (a store outlives its point, kept open by
// `stores`, only after a tracked point); the tracked path never sets an owner.
// Calls on a held index (`add`, `remove_path`, `remove_dir`, `get_path`, `len`,
// `write_tree_to` with an explicit repository) do not need one.
unsafe impl Send for Held {}

impl Held {
    /// A held index as a walk left it (its file just written).
    pub fn walked(index: Index, tree: Oid) -> Self {
        Self {
            index,
            tree,
            unsaved: false,
            touched: BTreeSet::new(),
        }
    }

    /// Writes the index to its file when the file is behind it, the entries changed
    /// since with their times zeroed (see the module documentation). Only under the
    /// workspace's lock (no point of it runs meanwhile, in any process); a failure is
    /// logged (the next walk then starts from the older file).
    pub fn save(mut self) {
        if !self.unsaved {
            return;
        }
        let zero = IndexTime::new(0, 0);
        for path in &self.touched {
            let Some(mut entry) = self.index.get_path(Path::new(OsStr::from_bytes(path)), 0) else {
                continue;
            };
            (entry.ctime, entry.mtime) = (zero, zero);
            if self.index.add(&entry).is_err() {
                return;
            }
        }
        if let Err(e) = self.index.write() {
            tracing::debug!(error = %e, "a held history index was not saved");
        }
    }
}
