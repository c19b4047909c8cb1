//! A scratch workspace directory next to a scratch "outside" directory.

use std::path::{Path, PathBuf};

use grove_tools::Workspace;

pub struct Scratch {
    _dir: tempfile::TempDir,
    pub root: PathBuf,
    pub outside: PathBuf,
}

impl Scratch {
    pub fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("ws");
        let outside = dir.path().join("outside");
        std::fs::create_dir_all(&root).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(outside.join("secret.txt"), "top secret\n").unwrap();
        Self {
            _dir: dir,
            root,
            outside,
        }
    }

    pub fn write(&self, rel: &str, content: &str) {
        let p = self.root.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, content).unwrap();
    }

    pub fn read(&self, rel: &str) -> String {
        std::fs::read_to_string(self.root.join(rel)).unwrap()
    }

    pub fn ws(&self) -> Workspace {
        Workspace::open(&self.root, true).unwrap()
    }

    pub fn read_only(&self) -> Workspace {
        Workspace::open(&self.root, false).unwrap()
    }

    pub fn symlink(&self, target: impl AsRef<Path>, rel: &str) {
        let link = self.root.join(rel);
        std::fs::create_dir_all(link.parent().unwrap()).unwrap();
        std::os::unix::fs::symlink(target, link).unwrap();
    }
}
