//! The trash protocol of eviction.

use grove_core::ports::GitPort;
use grove_git::Git2Adapter;

use crate::support::Fixture;

#[test]
fn remove_trash_refuses_a_path_outside_a_trash_directory() {
    let fx = Fixture::new();
    let cache = fx.cache();
    assert!(Git2Adapter::new().remove_trash(&cache).is_err());
    assert!(cache.is_dir());
    let trash = fx.path("trash/cache-1");
    std::fs::create_dir_all(fx.path("trash")).unwrap();
    std::fs::rename(&cache, &trash).unwrap();
    Git2Adapter::new().remove_trash(&trash).unwrap();
    assert!(!trash.exists());
}
