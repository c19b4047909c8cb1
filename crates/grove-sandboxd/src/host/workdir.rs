//! Where a workspace appears inside a host sandbox (a bubblewrap view, a container):
//! the spec's mounts checked, the workspace placed through the deepest mount that
//! contains it (read-only, and mounted at its own path, when none does), and a
//! request's cwd resolved to a directory inside the workspace.

use std::path::{Component, Path, PathBuf};

use grove_core::error::RuntimeError;
use grove_core::ports::Mount;

/// A workspace placed inside a sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placed {
    /// The workspace on the host, canonical.
    pub workdir: PathBuf,
    /// Every mount, sources canonical (the workspace's own when none reached it).
    pub mounts: Vec<Mount>,
    /// The workspace as the sandbox sees it.
    pub inside_workdir: PathBuf,
    /// Whether the mount that holds the workspace is writable.
    pub workdir_writable: bool,
}

/// Checks `mounts` (absolute targets without `..`, existing sources) and places
/// `workdir` (an existing directory) inside: through the deepest mount whose source
/// contains it; a spec that mounts no part of it gets it read-only, never more.
pub fn place(workdir: &Path, mounts: &[Mount]) -> Result<Placed, RuntimeError> {
    let host = std::fs::canonicalize(workdir).map_err(|_| {
        RuntimeError::NotFound(format!(
            "workspace directory {} does not exist",
            workdir.display()
        ))
    })?;
    if !host.is_dir() {
        return Err(RuntimeError::NotFound(format!(
            "workspace {} is not a directory",
            workdir.display()
        )));
    }
    let mut checked = Vec::with_capacity(mounts.len() + 1);
    for m in mounts {
        if !m.target.is_absolute() || m.target.components().any(|c| c == Component::ParentDir) {
            return Err(RuntimeError::CommandRejected(format!(
                "mount target {} must be an absolute path without '..'",
                m.target.display()
            )));
        }
        let source = std::fs::canonicalize(&m.source).map_err(|_| {
            RuntimeError::NotFound(format!(
                "mount source {} does not exist",
                m.source.display()
            ))
        })?;
        checked.push(Mount {
            source,
            target: m.target.clone(),
            writable: m.writable,
        });
    }
    let (inside_workdir, workdir_writable) = match checked
        .iter()
        .filter(|m| host.starts_with(&m.source))
        .max_by_key(|m| m.source.components().count())
    {
        Some(m) => (
            m.target.join(
                host.strip_prefix(&m.source)
                    .expect("checked by starts_with"),
            ),
            m.writable,
        ),
        None => {
            checked.push(Mount {
                source: host.clone(),
                target: host.clone(),
                writable: false,
            });
            (host.clone(), false)
        }
    };
    Ok(Placed {
        workdir: host,
        mounts: checked,
        inside_workdir,
        workdir_writable,
    })
}

/// Resolves a request's cwd (relative to the workspace; `None`: the workspace) to
/// (host path, path inside the sandbox), refusing anything that is not a directory
/// inside the workspace after resolving symlinks on the host.
pub fn resolve_cwd(
    workdir: &Path,
    inside_workdir: &Path,
    cwd: Option<&Path>,
) -> Result<(PathBuf, PathBuf), RuntimeError> {
    let Some(rel) = cwd else {
        return Ok((workdir.to_path_buf(), inside_workdir.to_path_buf()));
    };
    let refuse = |why: &str| RuntimeError::CommandRejected(format!("cwd {} {why}", rel.display()));
    if rel.is_absolute() {
        return Err(refuse("must be relative to the workspace root"));
    }
    if rel
        .components()
        .any(|c| !matches!(c, Component::Normal(_) | Component::CurDir))
    {
        return Err(refuse("must not contain '..'"));
    }
    let host = std::fs::canonicalize(workdir.join(rel))
        .map_err(|_| refuse("does not exist in the workspace"))?;
    let inner = host
        .strip_prefix(workdir)
        .map_err(|_| refuse("resolves outside the workspace"))?;
    if !host.is_dir() {
        return Err(refuse("is not a directory"));
    }
    let inside = inside_workdir.join(inner);
    Ok((host, inside))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mount(source: &Path, target: &str, writable: bool) -> Mount {
        Mount {
            source: source.to_path_buf(),
            target: target.into(),
            writable,
        }
    }

    #[test]
    fn the_workspace_goes_through_the_deepest_mount_or_read_only_at_its_own_path() {
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        let ws = root.join("a/ws");
        std::fs::create_dir_all(&ws).unwrap();
        let p = place(
            &ws,
            &[
                mount(&root, "/all", false),
                mount(&root.join("a"), "/a", true),
            ],
        )
        .unwrap();
        assert_eq!(
            (p.inside_workdir.as_path(), p.workdir_writable),
            (Path::new("/a/ws"), true)
        );
        let p = place(&ws, &[]).unwrap();
        assert_eq!(p.mounts, vec![mount(&ws, ws.to_str().unwrap(), false)]);
        assert_eq!((p.inside_workdir, p.workdir_writable), (ws.clone(), false));
        assert!(place(&ws, &[mount(&root, "rel", true)]).is_err());
        assert!(place(&ws, &[mount(&root, "/x/../y", true)]).is_err());
        assert!(place(&root.join("nope"), &[]).is_err());
    }

    #[test]
    fn a_cwd_must_be_a_directory_inside_the_workspace() {
        let dir = tempfile::tempdir().unwrap();
        let ws = std::fs::canonicalize(dir.path()).unwrap();
        std::fs::create_dir(ws.join("sub")).unwrap();
        std::fs::write(ws.join("file"), b"").unwrap();
        std::os::unix::fs::symlink("/", ws.join("out")).unwrap();
        let inside = Path::new("/w");
        let ok = resolve_cwd(&ws, inside, Some(Path::new("sub"))).unwrap();
        assert_eq!(ok, (ws.join("sub"), PathBuf::from("/w/sub")));
        assert_eq!(
            resolve_cwd(&ws, inside, None).unwrap(),
            (ws.clone(), inside.to_path_buf())
        );
        for bad in ["/etc", "../x", "nope", "out", "file"] {
            assert!(
                resolve_cwd(&ws, inside, Some(Path::new(bad))).is_err(),
                "{bad}"
            );
        }
    }
}
