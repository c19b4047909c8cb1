//! The sandbox identity: the unprivileged host uid/gid that every sandboxed command runs
//! as, shared by the local and Docker runtimes so one workspace tree serves both.

use crate::validate::ValidationError;

/// Environment variable naming the sandbox uid.
pub const UID_VAR: &str = "GROVE_SANDBOX_UID";
/// Environment variable naming the sandbox gid.
pub const GID_VAR: &str = "GROVE_SANDBOX_GID";

/// The unprivileged identity commands run as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SandboxIdentity {
    pub uid: u32,
    pub gid: u32,
}

impl SandboxIdentity {
    /// The default: a high, otherwise unused id (no host account owns files with it).
    pub const DEFAULT: SandboxIdentity = SandboxIdentity {
        uid: 60100,
        gid: 60100,
    };

    /// Reads [`UID_VAR`] and [`GID_VAR`] through `lookup` (unset means the default).
    /// Root (0) is refused: a sandbox identity is never privileged.
    pub fn from_lookup(
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<SandboxIdentity, ValidationError> {
        let uid = parse_id(UID_VAR, lookup(UID_VAR), Self::DEFAULT.uid)?;
        let gid = parse_id(GID_VAR, lookup(GID_VAR), Self::DEFAULT.gid)?;
        Ok(SandboxIdentity { uid, gid })
    }

    /// [`SandboxIdentity::from_lookup`] over the process environment.
    pub fn from_env() -> Result<SandboxIdentity, ValidationError> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// `uid:gid`, the form container engines take.
    pub fn user_spec(&self) -> String {
        format!("{}:{}", self.uid, self.gid)
    }
}

fn parse_id(var: &str, value: Option<String>, default: u32) -> Result<u32, ValidationError> {
    let Some(raw) = value.filter(|v| !v.trim().is_empty()) else {
        return Ok(default);
    };
    match raw.trim().parse::<u32>() {
        Ok(0) => Err(ValidationError::Env(format!(
            "{var} must not be 0: commands never run as root"
        ))),
        Ok(u32::MAX) | Err(_) => Err(ValidationError::Env(format!(
            "{var} must be a numeric id between 1 and 4294967294"
        ))),
        Ok(id) => Ok(id),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lookup<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| {
            pairs
                .iter()
                .find(|(name, _)| *name == k)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn unset_means_the_default() {
        let id = SandboxIdentity::from_lookup(lookup(&[])).unwrap();
        assert_eq!(id, SandboxIdentity::DEFAULT);
        assert_eq!(id.user_spec(), "60100:60100");
    }

    #[test]
    fn configured_ids_are_taken() {
        let id =
            SandboxIdentity::from_lookup(lookup(&[(UID_VAR, "1234"), (GID_VAR, " 99 ")])).unwrap();
        assert_eq!((id.uid, id.gid), (1234, 99));
    }

    #[test]
    fn root_and_garbage_are_refused() {
        for bad in ["0", "-1", "x", "4294967295", "1e3"] {
            let err = SandboxIdentity::from_lookup(lookup(&[(UID_VAR, bad)])).unwrap_err();
            assert!(err.to_string().contains(UID_VAR), "{bad}: {err}");
            let err = SandboxIdentity::from_lookup(lookup(&[(GID_VAR, bad)])).unwrap_err();
            assert!(err.to_string().contains(GID_VAR), "{bad}: {err}");
        }
    }
}
