//! The process's budget of held history indexes (ADR 35), in a test process of its
//! own: a point settling over the budget trims the whole process's registry, which the
//! other history tests (`tests/git`) share and assert on.

#[allow(dead_code)]
#[path = "git/support.rs"]
mod support;

use std::path::{Path, PathBuf};

use git2::{Oid, Repository};
use grove_core::history::{HistoryPaths, HistoryPort, IgnoredFiles, Snapshot};
use grove_core::ports::GitPort;
use grove_git::{Git2Adapter, WatchLimits, WatchState};
use uuid::Uuid;

use support::Fixture;

/// A checkout with tracked points, its tracker under `limits`.
struct Tracked {
    fx: Fixture,
    cache: PathBuf,
    ws: PathBuf,
    store: PathBuf,
    git2: Git2Adapter,
    id: Uuid,
    last: Snapshot,
}

fn paths<'a>(store: &'a Path, ws: &'a Path, cache: &'a Path) -> HistoryPaths<'a> {
    HistoryPaths {
        store_dir: store,
        workspace_dir: ws,
        cache_dir: cache,
    }
}

impl Tracked {
    fn new(limits: WatchLimits) -> Self {
        let fx = Fixture::new();
        let cache = fx.cache();
        let ws = fx.path("ws");
        let git2 = Git2Adapter::new().with_watch_limits(limits);
        git2.create_checkout(&fx.request(&cache, &ws, "main", Some("agent/budget")))
            .unwrap();
        let store = fx.path("history/u/ws");
        let id = Uuid::new_v4();
        let last = git2
            .first_snapshot(&paths(&store, &ws, &cache), id)
            .unwrap();
        let mut t = Self {
            fx,
            cache,
            ws,
            store,
            git2,
            id,
            last,
        };
        t.point();
        t
    }

    fn point(&mut self) -> Snapshot {
        let p = paths(&self.store, &self.ws, &self.cache);
        let snap = self
            .git2
            .tracked_snapshot(&p, self.id, Some(&self.last.id), IgnoredFiles::Excluded)
            .unwrap();
        self.last = snap.clone();
        snap
    }

    fn state(&self) -> WatchState {
        self.git2.tracker_state(self.id)
    }

    /// The last point's tree equals a full walk's of the same working tree.
    fn assert_exact(&self, what: &str) {
        let truth_store = self.fx.path(&format!("truth/{}", Uuid::new_v4()));
        let p = paths(&truth_store, &self.ws, &self.cache);
        let truth = Git2Adapter::new()
            .snapshot(&p, Uuid::new_v4(), None, IgnoredFiles::Excluded)
            .unwrap();
        assert_eq!(
            tree_of(&self.store, &self.last.id),
            tree_of(&truth_store, &truth.id),
            "{what}: the point differs from a full walk"
        );
    }
}

fn tree_of(store: &Path, snapshot: &str) -> Oid {
    let repo = Repository::open_bare(store).unwrap();
    let tree = repo
        .find_commit(Oid::from_str(snapshot).unwrap())
        .unwrap()
        .tree_id();
    tree
}

fn held(state: WatchState) -> bool {
    matches!(state, WatchState::Known { held: true, .. })
}

fn known(state: WatchState) -> bool {
    matches!(state, WatchState::Known { .. })
}

/// Held indexes past the budget are dropped least recently used first: that
/// workspace's next point walks the tree, is exact, and holds its index again; an
/// index larger than the whole budget is never held.
#[test]
fn held_indexes_over_the_budget_are_dropped_oldest_first_and_points_stay_exact() {
    let entries = 3; // README.md, .gitignore, src/lib.rs
    let two = WatchLimits {
        held_entries: 2 * entries,
        ..WatchLimits::default()
    };
    let mut a = Tracked::new(two);
    let mut b = Tracked::new(two);
    assert!(held(a.state()) && held(b.state()), "two indexes fit");
    let mut c = Tracked::new(two);
    assert!(
        !held(a.state()) && held(b.state()) && held(c.state()),
        "the third pushed out the least recently used: a"
    );
    assert!(
        known(a.state()),
        "a keeps its tracker and its pending changes"
    );
    std::fs::write(a.ws.join("README.md"), "a changed\n").unwrap();
    let snap = a.point();
    assert_eq!(snap.changes.modified, 1);
    a.assert_exact("a's point without its held index (a walk)");
    assert!(held(a.state()), "a holds its index again");
    assert!(!held(b.state()), "and b, now the oldest, went");
    std::fs::write(c.ws.join("README.md"), "c changed\n").unwrap();
    c.point();
    c.assert_exact("c's tracked point");
    b.point();
    b.assert_exact("b's point after the budget took its index");

    let small = WatchLimits {
        held_entries: entries - 1,
        ..WatchLimits::default()
    };
    let before = [a.state(), b.state(), c.state()].map(held);
    assert_eq!(
        before,
        [false, true, true],
        "b's walk pushed out a, the oldest"
    );
    let mut d = Tracked::new(small);
    assert_eq!(
        [a.state(), b.state(), c.state()].map(held),
        before,
        "an index larger than the budget pushed nothing out"
    );
    for round in 0..3 {
        std::fs::write(d.ws.join("README.md"), format!("round {round}\n")).unwrap();
        d.point();
        assert!(known(d.state()) && !held(d.state()), "too large to hold");
        d.assert_exact("a point of a workspace whose index is never held");
    }
}
