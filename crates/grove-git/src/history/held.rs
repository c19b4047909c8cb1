//! The private index a tracked workspace keeps in memory between its points (ADR 35),
//! with the tree it makes: a tracked point applies its changes to it and edits that
//! tree, neither reading the index file nor writing it (together about 4 ms for a
//! 5,000-file tree). The file is written by the points that walk the whole tree and
//! when the tracker is dropped; a point that walks with an older file only hashes again
//! what changed since it was written.

use git2::{Index, Oid};

/// A private index and its tree, held by one tracker.
pub(crate) struct Held {
    pub index: Index,
    /// The tree of `index` (what `git_index_write_tree` would make of it).
    pub tree: Oid,
    /// Whether `index` holds changes its file does not.
    pub unsaved: bool,
}

// SAFETY: a libgit2 index has no tie to the thread that made it; it only must not be
// used by two threads at once. A `Held` is owned by one tracker under the registry's
// mutex, or moved out of it by the one point that uses it.
unsafe impl Send for Held {}

impl Held {
    /// Writes the index to its file when the file is behind it (a failure is logged:
    /// the next full walk only hashes more).
    pub fn save(mut self) {
        if self.unsaved {
            if let Err(e) = self.index.write() {
                tracing::debug!(error = %e, "a held history index was not saved");
            }
            self.unsaved = false;
        }
    }
}
