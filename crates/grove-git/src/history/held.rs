//! The private index a tracked workspace keeps in memory between its points (ADR 35),
//! with the tree it makes: a tracked point applies its changes to it and edits that
//! tree, neither reading the index file nor writing it (together about 4 ms for a
//! 5,000-file tree). The file is written only by the points that walk the whole tree:
//! with the store as its owner, libgit2 re-checks at that write the entries whose files
//! may have changed within the clock tick of their stat, which a held index written
//! later without its store could not. A walk that starts from an older file hashes
//! again what changed since.

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
// mutex, or moved out of it by the one point that uses it. Its index has no owning
// repository while it is held or moved: a walk's index is owned by the point's store
// (`set_index`), and `point` drops that store (whose cleanup clears the owner) before
// `settle` hands the index to the registry; the tracked path never sets an owner.
// Calls on a held index (`add`, `remove_path`, `remove_dir`, `get_path`, `len`,
// `write_tree_to` with an explicit repository) do not need one.
unsafe impl Send for Held {}
