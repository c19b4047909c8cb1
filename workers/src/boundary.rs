//! The worker's side of the data boundary: the check that a command's repository URL
//! is one its submitter may use (the operator's grant or the allow-list, never
//! `$GROVE_HOME`), and keyed token fingerprints. ADR 22.

use grove_core::commands::Command;
use grove_core::error::{CommandError, ErrorKind};
use grove_core::local_repo::{command_repo_url, RepoLocation, Requester};
use grove_core::ports::GitToken;
use grove_postgres::boundary;
use uuid::Uuid;

use crate::context::{store_error, JobContext};

impl JobContext {
    /// Refuses, as `rejected` and before anything is cloned, a command whose repository
    /// URL is local unless the operator granted it (the host's CLI) or it lies under
    /// the allow-list; a path inside `$GROVE_HOME` is refused to everyone.
    pub(crate) async fn check_repo_source(
        &self,
        command: &Command,
        command_id: Uuid,
    ) -> Result<(), CommandError> {
        let Some(url) = command_repo_url(command) else {
            return Ok(());
        };
        let requester = match grove_core::local_repo::classify(url) {
            RepoLocation::Remote => return Ok(()),
            RepoLocation::Refused(_) => Requester::Caller,
            RepoLocation::Local(_) => {
                let mut conn = self
                    .pool
                    .acquire()
                    .await
                    .map_err(|e| store_error(e.into()))?;
                if boundary::operator_granted(&mut conn, command_id, url)
                    .await
                    .map_err(store_error)?
                {
                    Requester::Operator
                } else {
                    Requester::Caller
                }
            }
        };
        self.config
            .local_repos
            .check(url, requester, |p| std::fs::canonicalize(p))
            .map_err(|e| CommandError::new(ErrorKind::Rejected, e.to_string()))
    }

    /// The keyed fingerprint (`auth_scope_hash`) of `token`, under the deployment's
    /// secret (read once per process).
    pub(crate) async fn auth_scope(
        &self,
        token: Option<&GitToken>,
    ) -> Result<Option<String>, CommandError> {
        let Some(token) = token else {
            return Ok(None);
        };
        let fp = self
            .fingerprint
            .get_or_try_init(|| boundary::fingerprinter(&self.pool))
            .await
            .map_err(store_error)?;
        Ok(Some(fp.auth_scope(token.expose())))
    }
}
