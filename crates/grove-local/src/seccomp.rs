//! The seccomp filter every sandboxed process runs under: system calls a build never
//! needs and that widen the kernel's attack surface fail with `EPERM`.
//!
//! The filter is compiled once per process (with `seccompiler`) into a classic BPF
//! program, and bubblewrap loads it (`--seccomp FD`) right before it execs the agent
//! or the command, after setting `no_new_privs`; it is inherited by every process of
//! the sandbox. ADR 04 gives the reasons for each entry.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

/// Refused outright (the syscall number's name, for tests and the ADR).
const DENIED: &[(&str, libc::c_long)] = &[
    // Kernel keyrings: shared kernel state, a classic source of cross-container leaks.
    ("add_key", libc::SYS_add_key),
    ("keyctl", libc::SYS_keyctl),
    ("request_key", libc::SYS_request_key),
    // Loading programs into the kernel, and observing other processes through it.
    ("bpf", libc::SYS_bpf),
    ("perf_event_open", libc::SYS_perf_event_open),
    // A favourite exploitation primitive (stalling the kernel on a page fault).
    ("userfaultfd", libc::SYS_userfaultfd),
    // Replacing the kernel, loading modules.
    ("kexec_load", libc::SYS_kexec_load),
    ("kexec_file_load", libc::SYS_kexec_file_load),
    ("init_module", libc::SYS_init_module),
    ("finit_module", libc::SYS_finit_module),
    ("delete_module", libc::SYS_delete_module),
    // Changing the mount table (the sandbox's view is fixed by bubblewrap).
    ("mount", libc::SYS_mount),
    ("umount2", libc::SYS_umount2),
    ("pivot_root", libc::SYS_pivot_root),
    ("move_mount", libc::SYS_move_mount),
    ("open_tree", libc::SYS_open_tree),
    ("fsopen", libc::SYS_fsopen),
    ("fsmount", libc::SYS_fsmount),
    ("fsconfig", libc::SYS_fsconfig),
    ("fspick", libc::SYS_fspick),
    ("mount_setattr", libc::SYS_mount_setattr),
    // File handles bypass path permissions (the "shocker" escape).
    ("open_by_handle_at", libc::SYS_open_by_handle_at),
    ("name_to_handle_at", libc::SYS_name_to_handle_at),
    // Joining other namespaces; debugging other processes.
    ("setns", libc::SYS_setns),
    ("ptrace", libc::SYS_ptrace),
    ("process_vm_readv", libc::SYS_process_vm_readv),
    ("process_vm_writev", libc::SYS_process_vm_writev),
    // Host-wide administration.
    ("swapon", libc::SYS_swapon),
    ("swapoff", libc::SYS_swapoff),
    ("reboot", libc::SYS_reboot),
    ("acct", libc::SYS_acct),
    ("quotactl", libc::SYS_quotactl),
    ("syslog", libc::SYS_syslog),
    ("settimeofday", libc::SYS_settimeofday),
    ("clock_settime", libc::SYS_clock_settime),
    ("clock_adjtime", libc::SYS_clock_adjtime),
    ("adjtimex", libc::SYS_adjtimex),
    ("sethostname", libc::SYS_sethostname),
    ("setdomainname", libc::SYS_setdomainname),
    ("vhangup", libc::SYS_vhangup),
    ("lookup_dcookie", libc::SYS_lookup_dcookie),
];

/// Names of the refused system calls (besides `unshare` / `clone` with a new user
/// namespace, refused by flag).
pub fn denied_syscalls() -> Vec<&'static str> {
    DENIED.iter().map(|(name, _)| *name).collect()
}

/// The compiled program as bubblewrap reads it: `struct sock_filter` entries in the
/// host's byte order. `Err` when the filter cannot be built for this architecture.
pub(crate) fn program() -> Result<&'static [u8], String> {
    static PROGRAM: OnceLock<Result<Vec<u8>, String>> = OnceLock::new();
    PROGRAM
        .get_or_init(build)
        .as_ref()
        .map(|v| v.as_slice())
        .map_err(Clone::clone)
}

fn build() -> Result<Vec<u8>, String> {
    let arch = match std::env::consts::ARCH {
        "x86_64" => TargetArch::x86_64,
        "aarch64" => TargetArch::aarch64,
        "riscv64" => TargetArch::riscv64,
        other => return Err(format!("no seccomp filter for architecture {other}")),
    };
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = DENIED
        .iter()
        .map(|(_, nr)| (*nr as i64, Vec::new()))
        .collect();
    // New user namespaces: the one bubblewrap made is the only one (no regaining
    // capabilities in a nested namespace). `clone3` passes its flags in memory, which
    // a filter cannot read; bubblewrap's `--disable-userns` covers that path.
    let newuser = libc::CLONE_NEWUSER as u64;
    let by_flag = |arg: u8| -> Result<Vec<SeccompRule>, String> {
        let cond = SeccompCondition::new(
            arg,
            SeccompCmpArgLen::Qword,
            SeccompCmpOp::MaskedEq(newuser),
            newuser,
        )
        .map_err(|e| e.to_string())?;
        Ok(vec![
            SeccompRule::new(vec![cond]).map_err(|e| e.to_string())?
        ])
    };
    rules.insert(libc::SYS_unshare as i64, by_flag(0)?);
    rules.insert(libc::SYS_clone as i64, by_flag(0)?);
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        arch,
    )
    .map_err(|e| e.to_string())?;
    let program: BpfProgram = filter
        .try_into()
        .map_err(|e: seccompiler::BackendError| e.to_string())?;
    let mut bytes = Vec::with_capacity(program.len() * 8);
    for ins in program {
        bytes.extend_from_slice(&ins.code.to_ne_bytes());
        bytes.push(ins.jt);
        bytes.push(ins.jf);
        bytes.extend_from_slice(&ins.k.to_ne_bytes());
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_filter_builds_and_names_the_kernel_attack_surface() {
        let bytes = program().expect("the filter builds on this architecture");
        assert_eq!(bytes.len() % 8, 0);
        assert!(bytes.len() > 8 * DENIED.len());
        for name in ["keyctl", "bpf", "mount", "ptrace", "open_by_handle_at"] {
            assert!(denied_syscalls().contains(&name), "{name}");
        }
    }
}
