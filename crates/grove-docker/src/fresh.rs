//! Fresh scratch directories for read-only runtimes: before every command in the
//! container of an analysis (read-only) workspace, the sandbox user empties `/tmp`,
//! `/var/tmp`, `/dev/shm`, `/run/lock` and the command's `$HOME`, so nothing one
//! command plants there (a `$HOME/.gitconfig` alias, a file in `/tmp`) reaches the
//! next. Edit and task runtimes keep theirs for the container's life.

use std::path::Path;

use grove_core::error::RuntimeError;

use crate::inner::Inner;

/// The scratch directories every read-only runtime empties (besides `$HOME`).
pub(crate) const SCRATCH_DIRS: &[&str] = &["/tmp", "/var/tmp", "/dev/shm", "/run/lock"];

/// Empties each directory argument (not a symlink, not following any), first making
/// the user's own directories searchable so a `chmod 000` cannot keep a plant, then
/// fails (exit 3) if anything the sandbox user owns is left in one of them.
const RESET_SCRIPT: &str = "uid=$(id -u) || exit 2; \
     for d in \"$@\"; do \
       [ -d \"$d\" ] && [ ! -L \"$d\" ] || continue; \
       find \"$d\" -xdev -mindepth 1 -type d -user \"$uid\" -exec chmod u+rwx {} \\; 2>/dev/null; \
       rm -rf -- \"$d\"/* \"$d\"/.[!.]* \"$d\"/..?* 2>/dev/null; \
       left=$(find \"$d\" -xdev -mindepth 1 -user \"$uid\" 2>/dev/null | head -n 1); \
       [ -z \"$left\" ] || { echo \"$left\"; exit 3; }; \
     done; exit 0";

/// The directories to empty for a command whose environment is `env`: the fixed
/// list plus `$HOME` when it is an absolute path other than `/` and outside the
/// workspace (whose mount is read-only anyway).
pub(crate) fn dirs_for(env: &[(String, String)], inside_workdir: &Path) -> Vec<String> {
    let mut dirs: Vec<String> = SCRATCH_DIRS.iter().map(|d| d.to_string()).collect();
    let home = env.iter().rev().find(|(k, _)| k == "HOME").map(|(_, v)| v);
    if let Some(home) = home {
        let p = Path::new(home);
        let plain = p.components().all(|c| {
            matches!(
                c,
                std::path::Component::RootDir | std::path::Component::Normal(_)
            )
        });
        if p.is_absolute() && plain && p != Path::new("/") && !p.starts_with(inside_workdir) {
            let home = home.trim_end_matches('/').to_string();
            if !dirs.iter().any(|d| Path::new(d) == Path::new(&home)) {
                dirs.push(home);
            }
        }
    }
    dirs
}

/// The helper command emptying `dirs`.
pub(crate) fn reset_argv(dirs: &[String]) -> Vec<String> {
    let mut argv = vec![
        "sh".to_string(),
        "-c".into(),
        RESET_SCRIPT.into(),
        "grove-fresh".into(),
    ];
    argv.extend(dirs.iter().cloned());
    argv
}

/// Empties the scratch directories of a read-only runtime's container before a
/// command whose environment is `env`; a no-op for a writable runtime. A reset that
/// cannot finish refuses the command (`Unavailable`) rather than run it on state a
/// previous command left.
pub(crate) async fn reset(inner: &Inner, env: &[(String, String)]) -> Result<(), RuntimeError> {
    if inner.workdir_writable {
        return Ok(());
    }
    let argv = reset_argv(&dirs_for(env, &inner.inside_workdir));
    let (code, out) = match inner.capture_by_agent(argv.clone()).await {
        Some(r) => r,
        None => inner.capture(argv).await?,
    };
    if code == 0 {
        return Ok(());
    }
    let left = String::from_utf8_lossy(&out);
    Err(RuntimeError::Unavailable(format!(
        "could not empty the scratch directories of a read-only runtime (exit {code}{}); \
         the command was not run",
        if left.trim().is_empty() {
            String::new()
        } else {
            format!(", left: {}", crate::one_line(&left))
        }
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(home: &str) -> Vec<(String, String)> {
        vec![("HOME".into(), "/tmp".into()), ("HOME".into(), home.into())]
    }

    #[test]
    fn home_is_added_when_it_is_a_plain_path_outside_the_workspace() {
        let ws = Path::new("/work/ws");
        assert!(dirs_for(&env("/home/u"), ws).contains(&"/home/u".to_string()));
        assert_eq!(dirs_for(&env("/tmp/"), ws).len(), SCRATCH_DIRS.len());
        for bad in ["/", "/work/ws/h", "rel", "/x/../etc"] {
            assert_eq!(dirs_for(&env(bad), ws), SCRATCH_DIRS, "{bad}");
        }
    }

    #[test]
    fn the_reset_passes_dirs_as_arguments_not_as_script() {
        let argv = reset_argv(&["/tmp".into(), "/h; rm -rf /".into()]);
        assert_eq!(argv[2], RESET_SCRIPT);
        assert_eq!(argv.last().unwrap(), "/h; rm -rf /");
    }
}
