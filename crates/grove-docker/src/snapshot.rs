//! Snapshots of Docker runtimes: the container committed to a local image
//! (`grove-snapshot:<runtime id>-<random>`), and a runtime created again from it.
//!
//! A commit holds the container's own filesystem (installed packages, files under
//! `/tmp`), never its bind mounts: the workspace is durable on its own and is not part
//! of a snapshot. The image carries the container's labels (scope labels included) and
//! [`LABEL_SNAPSHOT_OF`]; restore accepts only images of the [`SNAPSHOT_REPO`]
//! repository, so a caller cannot name an arbitrary local image.

use bollard::models::ContainerConfig;
use bollard::query_parameters::CommitContainerOptionsBuilder;
use futures::future::BoxFuture;
use grove_core::error::RuntimeError;
use grove_core::ports::{Runtime, RuntimeSpec, SnapshotInfo, SnapshotRequest, Snapshotter};

use crate::{engine_error, status, DockerRuntimeProvider, LABEL_RUNTIME};

/// The image repository of every snapshot.
pub const SNAPSHOT_REPO: &str = "grove-snapshot";
/// Label on a snapshot image: the runtime id it was taken of.
pub const LABEL_SNAPSHOT_OF: &str = "grove.snapshot.of";
/// Label on a snapshot image: the caller's label.
pub const LABEL_SNAPSHOT_LABEL: &str = "grove.snapshot.label";

fn validate_label(label: &str) -> Result<(), RuntimeError> {
    let ok = !label.is_empty()
        && label.len() <= 128
        && label
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if ok {
        Ok(())
    } else {
        Err(RuntimeError::CommandRejected(format!(
            "snapshot label {label:?} must be 1 to 128 letters, digits, '-', '_' or '.'"
        )))
    }
}

/// `grove-snapshot:<tag>` with a tag Docker accepts, else `CommandRejected`.
fn validate_snapshot_id(id: &str) -> Result<(), RuntimeError> {
    let tag = id
        .strip_prefix(SNAPSHOT_REPO)
        .and_then(|t| t.strip_prefix(':'))
        .unwrap_or("");
    let ok = !tag.is_empty()
        && tag.len() <= 128
        && tag
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if ok {
        Ok(())
    } else {
        Err(RuntimeError::CommandRejected(format!(
            "{id:?} is not a snapshot id of this provider ({SNAPSHOT_REPO}:<tag>)"
        )))
    }
}

impl Snapshotter for DockerRuntimeProvider {
    /// Commits the container named `backend_id` (paused while committing). A
    /// container this provider does not manage, or outside its scope, is `NotFound`.
    fn snapshot(&self, req: SnapshotRequest) -> BoxFuture<'_, Result<SnapshotInfo, RuntimeError>> {
        Box::pin(async move {
            if let Some(label) = &req.label {
                validate_label(label)?;
            }
            let container = self.inspect_managed(&req.backend_id).await?;
            let labels = container.config.and_then(|c| c.labels).unwrap_or_default();
            let runtime_id = labels
                .get(LABEL_RUNTIME)
                .cloned()
                .filter(|r| !r.is_empty())
                .unwrap_or_else(|| "rt".into());
            let suffix = uuid_suffix();
            // Docker tags are at most 128 characters; the random part keeps them unique.
            let keep = 128 - suffix.len() - 1;
            let tag = format!("{}-{suffix}", &runtime_id[..runtime_id.len().min(keep)]);
            let mut image_labels = labels.clone();
            image_labels.insert(LABEL_SNAPSHOT_OF.into(), runtime_id);
            if let Some(label) = &req.label {
                image_labels.insert(LABEL_SNAPSHOT_LABEL.into(), label.clone());
            }
            let options = CommitContainerOptionsBuilder::new()
                .container(&req.backend_id)
                .repo(SNAPSHOT_REPO)
                .tag(&tag)
                .pause(true)
                .build();
            let config = ContainerConfig {
                labels: Some(image_labels),
                ..Default::default()
            };
            self.docker
                .commit_container(options, config)
                .await
                .map_err(|e| engine_error("committing the container", &e))?;
            Ok(SnapshotInfo {
                id: format!("{SNAPSHOT_REPO}:{tag}"),
                backend_id: req.backend_id,
                label: req.label,
            })
        })
    }

    /// Creates the spec's runtime from the snapshot image (replacing the container the
    /// spec names: its image differs, so its config hash does).
    fn restore<'a>(
        &'a self,
        snapshot_id: &'a str,
        mut spec: RuntimeSpec,
    ) -> BoxFuture<'a, Result<Box<dyn Runtime>, RuntimeError>> {
        Box::pin(async move {
            validate_snapshot_id(snapshot_id)?;
            match self.docker.inspect_image(snapshot_id).await {
                Ok(_) => {}
                Err(e) if status(&e) == Some(404) => {
                    return Err(RuntimeError::NotFound(format!("snapshot {snapshot_id}")))
                }
                Err(e) => return Err(engine_error("inspecting the snapshot", &e)),
            }
            spec.image = Some(snapshot_id.to_string());
            let runtime = self.create_docker(spec).await?;
            Ok(Box::new(runtime) as Box<dyn Runtime>)
        })
    }
}

/// 16 hex digits unique to this call (time, process, counter; not a secret).
fn uuid_suffix() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::{SystemTime, UNIX_EPOCH};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let n = COUNTER.fetch_add(1, Ordering::SeqCst);
    let seed = format!("{nanos}-{}-{n}", std::process::id());
    let digest = <sha2::Sha256 as sha2::Digest>::digest(seed.as_bytes());
    hex::encode(digest)[..16].to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_snapshot_images_of_this_provider_are_accepted() {
        assert!(validate_snapshot_id("grove-snapshot:rt-1-abc").is_ok());
        for bad in [
            "busybox:latest",
            "grove-snapshot:",
            "grove-snapshot",
            "grove-snapshot:a/b",
            "grove-snapshot:../x",
            "sha256:0123",
        ] {
            assert!(validate_snapshot_id(bad).is_err(), "{bad}");
        }
        assert!(validate_label("before-install.1").is_ok());
        assert!(validate_label("no spaces").is_err());
        assert!(validate_label("").is_err());
    }
}
