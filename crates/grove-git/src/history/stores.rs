//! History stores kept open between a workspace's points (issue 18): an open store
//! caches what it read (its packed refs parsed, its packs' indexes mapped, the cache's
//! alternate added), which a store opened afresh for every point read again. Only a
//! store whose point left no index owned by it is kept (a tracked point: see `held`),
//! and one is used by one point at a time (taken out, put back). A kept store is given
//! out again only for the same workspace, store and cache directories, and while its
//! directory is the one it opened (the same device and inode): a store removed and
//! made again is opened anew. A workspace's kept store is closed with its change
//! tracker (released, evicted, destroyed: `forget`), so a removed repo cache's packs
//! are not held open by it; at most [`KEPT`] are kept, and past that one is closed to
//! make room (a store another process removed stays open until then).

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use git2::Repository;
use uuid::Uuid;

/// The most stores kept open at once (each holds a few descriptors and mappings).
const KEPT: usize = 64;

/// One kept store, the directories it opened, and the store directory's identity.
struct Kept {
    repo: Repository,
    store_dir: PathBuf,
    cache_dir: PathBuf,
    dev: u64,
    ino: u64,
}

static STORES: Mutex<Option<HashMap<Uuid, Kept>>> = Mutex::new(None);

/// Workspace `id`'s kept store of `store_dir` with `cache_dir`'s objects, taken out for
/// one point; `None` when none is kept or it does not match.
pub(super) fn take(id: Uuid, store_dir: &Path, cache_dir: &Path) -> Option<Repository> {
    let kept = STORES.lock().ok()?.as_mut()?.remove(&id)?;
    if kept.store_dir != store_dir || kept.cache_dir != cache_dir {
        return None;
    }
    let meta = std::fs::symlink_metadata(store_dir).ok()?;
    (meta.is_dir() && meta.dev() == kept.dev && meta.ino() == kept.ino).then_some(kept.repo)
}

/// Keeps `repo`, workspace `id`'s store of `store_dir` with `cache_dir`'s objects, for
/// its next point.
pub(super) fn keep(id: Uuid, store_dir: &Path, cache_dir: &Path, repo: Repository) {
    let Ok(meta) = std::fs::symlink_metadata(store_dir) else {
        return;
    };
    let kept = Kept {
        repo,
        store_dir: store_dir.to_path_buf(),
        cache_dir: cache_dir.to_path_buf(),
        dev: meta.dev(),
        ino: meta.ino(),
    };
    let Ok(mut stores) = STORES.lock() else {
        return;
    };
    let stores = stores.get_or_insert_with(HashMap::new);
    if stores.len() >= KEPT && !stores.contains_key(&id) {
        if let Some(some) = stores.keys().next().copied() {
            stores.remove(&some);
        }
    }
    stores.insert(id, kept);
}

/// Closes workspace `id`'s kept store, if any.
pub(super) fn forget(id: Uuid) {
    let dropped = STORES.lock().ok().and_then(|mut s| s.as_mut()?.remove(&id));
    drop(dropped);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kept_store_is_given_out_once_and_only_for_the_same_directories() {
        let tmp = tempfile::tempdir().unwrap();
        let (store, cache) = (tmp.path().join("store"), tmp.path().join("cache"));
        let id = Uuid::new_v4();
        Repository::init_bare(&store).unwrap();
        let open = || Repository::open_bare(&store).unwrap();

        keep(id, &store, &cache, open());
        assert!(
            take(id, &store, &cache).is_some(),
            "the kept store is given out"
        );
        assert!(
            take(id, &store, &cache).is_none(),
            "once, until it is kept again"
        );

        keep(id, &store, &cache, open());
        assert!(
            take(Uuid::new_v4(), &store, &cache).is_none(),
            "not to another workspace"
        );
        keep(id, &store, &cache, open());
        let other_cache = tmp.path().join("other");
        assert!(
            take(id, &store, &other_cache).is_none(),
            "not with another cache"
        );

        keep(id, &store, &cache, open());
        forget(id);
        assert!(
            take(id, &store, &cache).is_none(),
            "a forgotten store is closed"
        );
    }

    #[test]
    fn a_store_made_again_in_the_same_place_is_opened_anew() {
        let tmp = tempfile::tempdir().unwrap();
        let (store, cache) = (tmp.path().join("store"), tmp.path().join("cache"));
        let id = Uuid::new_v4();
        Repository::init_bare(&store).unwrap();
        keep(id, &store, &cache, Repository::open_bare(&store).unwrap());
        std::fs::rename(&store, tmp.path().join("aside")).unwrap();
        Repository::init_bare(&store).unwrap();
        assert!(
            take(id, &store, &cache).is_none(),
            "the replaced directory is not the kept one"
        );
    }
}
