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
//! upstream allow list syscall for syscall. On x86_64 every x32 ABI call (numbers with
//! `__X32_SYSCALL_BIT`, which a deny list keyed by x86_64 numbers would let through) fails with
//! EPERM, as it does under containerd's allow list; i386 calls fail seccompiler's architecture
//! check.

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
    if cfg!(target_arch = "x86_64") {
        out.push(deny_x32());
    }
    Ok(out)
}

/// `__X32_SYSCALL_BIT`: x32 ABI calls enter the x86_64 table with this bit set and the same
/// `AUDIT_ARCH_X86_64`, so seccompiler's architecture check does not catch them.
const X32_SYSCALL_BIT: u32 = 0x4000_0000;

/// A filter failing every x32 call with EPERM (seccompiler matches exact numbers only, so this
/// one is written as BPF: load the architecture, then the number, and compare).
fn deny_x32() -> BpfProgram {
    const LD_W_ABS: u16 = (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16;
    const JEQ_K: u16 = (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16;
    const JGE_K: u16 = (libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K) as u16;
    const RET_K: u16 = (libc::BPF_RET | libc::BPF_K) as u16;
    const AUDIT_ARCH_X86_64: u32 = 0xC000_003E;
    // struct seccomp_data { int nr; __u32 arch; ... }
    const NR: u32 = 0;
    const ARCH: u32 = 4;
    let op = |code, jt, jf, k| seccompiler::sock_filter { code, jt, jf, k };
    vec![
        op(LD_W_ABS, 0, 0, ARCH),
        op(JEQ_K, 0, 3, AUDIT_ARCH_X86_64),
        op(LD_W_ABS, 0, 0, NR),
        op(JGE_K, 0, 1, X32_SYSCALL_BIT),
        op(RET_K, 0, 0, libc::SECCOMP_RET_ERRNO | EPERM),
        op(RET_K, 0, 0, libc::SECCOMP_RET_ALLOW),
    ]
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

    /// Installs the RuntimeDefault filters in a forked child and reports each call's errno
    /// (0 when it succeeded): the filters' real effect in this kernel, not their shape. The
    /// child only makes raw system calls on memory allocated before the fork (seccompiler's
    /// `apply_filter` is prctl + seccomp) and `_exit`s, so the test harness's other threads
    /// cannot leave it holding a lock.
    fn errnos_under_runtime_default(calls: &[(i64, [u64; 2])]) -> Vec<i32> {
        use nix::unistd::ForkResult;
        let progs = compile(Profile::RuntimeDefault).expect("compiles");
        let (r, w) = nix::unistd::pipe().expect("pipe");
        let mut answers = [0u8; 64];
        assert!(calls.len() * 4 <= answers.len());
        match crate::sys::fork().expect("fork") {
            ForkResult::Child => {
                drop(r);
                for p in &progs {
                    if seccompiler::apply_filter(p).is_err() {
                        crate::sys::exit_child(2);
                    }
                }
                for (i, (nr, [a, b])) in calls.iter().enumerate() {
                    let errno = crate::sys::syscall_errno(*nr, *a, *b);
                    answers[i * 4..i * 4 + 4].copy_from_slice(&errno.to_ne_bytes());
                }
                let _ = nix::unistd::write(&w, &answers[..calls.len() * 4]);
                crate::sys::exit_child(0);
            }
            ForkResult::Parent { child } => {
                drop(w);
                let mut got = Vec::new();
                let mut buf = [0u8; 4];
                for _ in calls {
                    let mut filled = 0;
                    while filled < 4 {
                        let n = nix::unistd::read(std::os::fd::AsRawFd::as_raw_fd(&r), &mut buf[filled..])
                            .expect("read");
                        assert!(n > 0, "the child ended early");
                        filled += n;
                    }
                    got.push(i32::from_ne_bytes(buf));
                }
                nix::sys::wait::waitpid(child, None).expect("wait");
                got
            }
        }
    }

    #[test]
    fn denied_calls_fail_with_eperm_in_this_kernel() {
        let mut calls = vec![
            (libc::SYS_getpid, [0, 0]),
            (libc::SYS_unshare, [libc::CLONE_NEWUTS as u64, 0]),
            (SYS_IO_URING[0], [1, 0]),
        ];
        let mut want = vec![0, libc::EPERM, libc::EPERM];
        if cfg!(target_arch = "x86_64") {
            // x32 getpid: ENOSYS or a pid on a kernel with x32, EPERM under the filter.
            calls.push((i64::from(X32_SYSCALL_BIT) | libc::SYS_getpid, [0, 0]));
            want.push(libc::EPERM);
        }
        assert_eq!(errnos_under_runtime_default(&calls), want);
    }

    #[test]
    fn profiles_compile() {
        let progs = compile(Profile::RuntimeDefault).expect("compiles");
        assert_eq!(progs.len(), if cfg!(target_arch = "x86_64") { 3 } else { 2 });
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
