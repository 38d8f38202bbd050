//! Seccomp for containers, in pure Rust (seccompiler), installed by a libcontainer `Executor`.
//!
//! libcontainer built without its `libseccomp` feature silently ignores `linux.seccomp`
//! (docs/RUNTIME-NOTES.md §1.3), so our specs never carry one: the profile travels in the executor,
//! which compiles it before the container starts (`validate`: a profile that cannot be built
//! fails the create) and installs it as the last step before `execve` (`exec`: a profile that
//! cannot be installed fails the start). Nothing is ever ignored.
//!
//! The filter runs after libcontainer dropped the capabilities, so installing it needs
//! `no_new_privs`; containers with a profile always get it (see `spec.rs`).
//!
//! `RuntimeDefault` here is a deny list: the syscalls Docker's and containerd's default profile
//! exist to block (kernel modules, kexec, reboot, mount and namespace creation, keyrings, bpf,
//! perf, ptrace and cross-process memory access, clock setting, swap, quotas, personality
//! changes, userfaultfd, handle-based opens, NUMA policy, io_uring, legacy syscalls) fail with EPERM, and
//! `clone` with any namespace flag fails too; everything else is allowed. It is not the
//! upstream allow list syscall for syscall.

use std::collections::BTreeMap;

use libcontainer::oci_spec::runtime::Spec;
use libcontainer::workload::{
    Executor, ExecutorError, ExecutorSetEnvsError, ExecutorValidationError, default,
};
use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter, SeccompRule,
    TargetArch,
};

/// A container's seccomp profile (part of the runtime's API).
pub use runtime_api::SeccompProfile as Profile;

const EPERM: u32 = libc::EPERM as u32;

/// Namespace flags `clone` may not use without CAP_SYS_ADMIN.
const NS_FLAGS: [u64; 7] = [
    libc::CLONE_NEWNS as u64,
    libc::CLONE_NEWUTS as u64,
    libc::CLONE_NEWIPC as u64,
    libc::CLONE_NEWUSER as u64,
    libc::CLONE_NEWPID as u64,
    libc::CLONE_NEWNET as u64,
    libc::CLONE_NEWCGROUP as u64,
];

/// Missing from the libc crate for aarch64 musl (the generic syscall table number).
#[cfg(target_arch = "aarch64")]
const SYS_KEXEC_FILE_LOAD: i64 = 294;
#[cfg(not(target_arch = "aarch64"))]
const SYS_KEXEC_FILE_LOAD: i64 = libc::SYS_kexec_file_load;

/// io_uring's three syscalls: the same numbers on every architecture (the unified table since
/// Linux 5.1). io_uring has been the source of most kernel exploits reachable from containers;
/// containerd's profile does not allow it either.
const SYS_IO_URING: [i64; 3] = [425, 426, 427];

fn denied_syscalls() -> Vec<i64> {
    let mut v = vec![
        libc::SYS_acct,
        libc::SYS_add_key,
        libc::SYS_bpf,
        libc::SYS_clock_adjtime,
        libc::SYS_clock_settime,
        libc::SYS_delete_module,
        libc::SYS_finit_module,
        libc::SYS_fsconfig,
        libc::SYS_fsmount,
        libc::SYS_fsopen,
        libc::SYS_fspick,
        libc::SYS_get_mempolicy,
        libc::SYS_init_module,
        libc::SYS_kcmp,
        SYS_KEXEC_FILE_LOAD,
        libc::SYS_kexec_load,
        libc::SYS_keyctl,
        libc::SYS_lookup_dcookie,
        libc::SYS_mbind,
        libc::SYS_mount,
        libc::SYS_mount_setattr,
        libc::SYS_move_mount,
        libc::SYS_move_pages,
        libc::SYS_name_to_handle_at,
        libc::SYS_nfsservctl,
        libc::SYS_open_by_handle_at,
        libc::SYS_open_tree,
        libc::SYS_perf_event_open,
        libc::SYS_personality,
        libc::SYS_pivot_root,
        libc::SYS_process_vm_readv,
        libc::SYS_process_vm_writev,
        libc::SYS_ptrace,
        libc::SYS_quotactl,
        libc::SYS_reboot,
        libc::SYS_request_key,
        libc::SYS_set_mempolicy,
        libc::SYS_setns,
        libc::SYS_settimeofday,
        libc::SYS_swapoff,
        libc::SYS_swapon,
        libc::SYS_umount2,
        libc::SYS_unshare,
        libc::SYS_userfaultfd,
        libc::SYS_vhangup,
    ];
    #[cfg(target_arch = "x86_64")]
    v.extend([
        libc::SYS_ioperm,
        libc::SYS_iopl,
        libc::SYS__sysctl,
        libc::SYS_sysfs,
        libc::SYS_uselib,
        libc::SYS_ustat,
    ]);
    v.extend(SYS_IO_URING);
    v.retain(|n| *n >= 0);
    v
}

/// Why a profile could not be compiled or installed.
#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    #[error("seccomp: unsupported architecture {0}")]
    Architecture(&'static str),
    #[error("seccomp: {0}")]
    Compile(#[from] seccompiler::BackendError),
    #[error("installing seccomp filter: {0}")]
    Install(#[source] seccompiler::Error),
}

fn target_arch() -> Result<TargetArch, SeccompError> {
    match std::env::consts::ARCH {
        "x86_64" => Ok(TargetArch::x86_64),
        "aarch64" => Ok(TargetArch::aarch64),
        other => Err(SeccompError::Architecture(other)),
    }
}

/// Compiles the profile to BPF programs, applied in order (the kernel runs all of them and the
/// most restrictive result wins). `Unconfined` compiles to nothing.
pub fn compile(profile: Profile) -> Result<Vec<BpfProgram>, SeccompError> {
    if profile == Profile::Unconfined {
        return Ok(Vec::new());
    }
    let arch = target_arch()?;
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> =
        denied_syscalls().into_iter().map(|n| (n, Vec::new())).collect();
    // clone(flags, ...) with a namespace flag; clone3 passes flags in memory the filter cannot
    // read, so it gets ENOSYS and libcs fall back to clone.
    let mut clone_rules = Vec::new();
    for flag in NS_FLAGS {
        let c = SeccompCondition::new(0, SeccompCmpArgLen::Qword, SeccompCmpOp::MaskedEq(flag), flag)?;
        clone_rules.push(SeccompRule::new(vec![c])?);
    }
    rules.insert(libc::SYS_clone, clone_rules);
    let deny = SeccompFilter::new(rules, SeccompAction::Allow, SeccompAction::Errno(EPERM), arch)?;
    let clone3 = SeccompFilter::new(
        BTreeMap::from([(libc::SYS_clone3, Vec::new())]),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
        arch,
    )?;
    let mut out = Vec::new();
    for f in [deny, clone3] {
        out.push(BpfProgram::try_from(f)?);
    }
    Ok(out)
}

/// The executor: libcontainer's default one, with the profile installed just before `execve`.
#[derive(Debug, Clone)]
pub struct SeccompExecutor {
    pub profile: Profile,
}

impl Executor for SeccompExecutor {
    fn exec(&self, spec: &Spec) -> Result<(), ExecutorError> {
        let other = |e: SeccompError| ExecutorError::Other(e.to_string());
        for prog in compile(self.profile).map_err(other)? {
            seccompiler::apply_filter(&prog).map_err(|e| other(SeccompError::Install(e)))?;
        }
        default::get_executor().exec(spec)
    }

    fn validate(&self, spec: &Spec) -> Result<(), ExecutorValidationError> {
        compile(self.profile).map_err(|e| ExecutorValidationError::ArgValidationError(e.to_string()))?;
        default::get_executor().validate(spec)
    }

    fn setup_envs(
        &self,
        envs: std::collections::HashMap<String, String>,
    ) -> Result<(), ExecutorSetEnvsError> {
        default::get_executor().setup_envs(envs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profiles_compile() {
        let progs = compile(Profile::RuntimeDefault).expect("compiles");
        assert_eq!(progs.len(), 2);
        assert!(progs[0].len() > 50, "one check per denied syscall");
        assert!(compile(Profile::Unconfined).expect("nothing").is_empty());
    }

    #[test]
    fn io_uring_is_denied_on_every_architecture() {
        let denied = denied_syscalls();
        for n in SYS_IO_URING {
            assert!(denied.contains(&n), "{n}");
        }
        #[cfg(target_arch = "x86_64")]
        assert_eq!(
            SYS_IO_URING,
            [
                libc::SYS_io_uring_setup,
                libc::SYS_io_uring_enter,
                libc::SYS_io_uring_register
            ]
        );
    }
}
