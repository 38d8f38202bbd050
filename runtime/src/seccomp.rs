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
//! `RuntimeDefault` is containerd's default profile, an allow list, built the way containerd
//! builds it: from the process's bounding capability set. Every call not allowed fails with
//! EPERM. Allowed to every container: the ordinary calls ([`ALWAYS`] plus the x86_64 legacy
//! ones), `ptrace` and `process_vm_readv/writev` (containerd allows them on kernels from 4.8),
//! `socket` for every family but AF_VSOCK, `personality` only with the five values containerd
//! allows (query, PER_LINUX, PER_LINUX32, UNAME26 and both), and `clone` without namespace
//! flags. Further calls come with capabilities ([`by_capability`]: CAP_SYS_ADMIN gives mount,
//! unshare, setns, namespace clones and `clone3`; CAP_SYS_PTRACE kcmp and pidfd_getfd;
//! CAP_SYS_TIME clock setting; and so on). Where we differ from containerd, on purpose:
//! - io_uring's three calls are not allowed (containerd 2 dropped them too; most container
//!   escapes through the kernel of the last years went through io_uring).
//! - x32 ABI calls (numbers with `__X32_SYSCALL_BIT`, which containerd's x86_64 profile lets in
//!   as a sub-architecture) fail with EPERM, and i386 calls fail seccompiler's architecture
//!   check, which kills the process: 32-bit x86 programs do not run in our containers.
//! - Calls newer than this table (numbers from [`FIRST_UNKNOWN`]) fail with ENOSYS, not EPERM,
//!   as runc does, so a libc probing a new call falls back to the old one; `clone3` without
//!   CAP_SYS_ADMIN fails with ENOSYS too (its flags are in memory a filter cannot read; libcs
//!   fall back to `clone`), as in containerd.
//! - A few unprivileged calls added to Linux after containerd's list was written are allowed
//!   (cachestat, fchmodat2, map_shadow_stack, the futex2 calls, mseal): denying them with EPERM
//!   breaks libcs that only fall back on ENOSYS.

use std::collections::BTreeMap;

use libcontainer::oci_spec::runtime::{Capabilities, Capability, Spec};
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
const ENOSYS: u32 = libc::ENOSYS as u32;

/// Calls numbered in the table every architecture shares since Linux 5.1 (the libc crate lacks
/// some of them for musl targets).
mod unified {
    pub const PIDFD_SEND_SIGNAL: i64 = 424;
    pub const IO_URING_SETUP: i64 = 425;
    pub const IO_URING_ENTER: i64 = 426;
    pub const IO_URING_REGISTER: i64 = 427;
    pub const OPEN_TREE: i64 = 428;
    pub const MOVE_MOUNT: i64 = 429;
    pub const FSOPEN: i64 = 430;
    pub const FSCONFIG: i64 = 431;
    pub const FSMOUNT: i64 = 432;
    pub const FSPICK: i64 = 433;
    pub const PIDFD_OPEN: i64 = 434;
    pub const CLONE3: i64 = 435;
    pub const CLOSE_RANGE: i64 = 436;
    pub const OPENAT2: i64 = 437;
    pub const PIDFD_GETFD: i64 = 438;
    pub const FACCESSAT2: i64 = 439;
    pub const PROCESS_MADVISE: i64 = 440;
    pub const EPOLL_PWAIT2: i64 = 441;
    pub const MOUNT_SETATTR: i64 = 442;
    pub const QUOTACTL_FD: i64 = 443;
    pub const LANDLOCK_CREATE_RULESET: i64 = 444;
    pub const LANDLOCK_ADD_RULE: i64 = 445;
    pub const LANDLOCK_RESTRICT_SELF: i64 = 446;
    pub const MEMFD_SECRET: i64 = 447;
    pub const PROCESS_MRELEASE: i64 = 448;
    pub const FUTEX_WAITV: i64 = 449;
    pub const SET_MEMPOLICY_HOME_NODE: i64 = 450;
    pub const CACHESTAT: i64 = 451;
    pub const FCHMODAT2: i64 = 452;
    pub const MAP_SHADOW_STACK: i64 = 453;
    pub const FUTEX_WAKE: i64 = 454;
    pub const FUTEX_WAIT: i64 = 455;
    pub const FUTEX_REQUEUE: i64 = 456;
    pub const MSEAL: i64 = 462;
}
use unified::*;

/// The first call number this table does not know (after `lsm_list_modules` 461 and `mseal`
/// 462): from here on a call fails with ENOSYS.
pub const FIRST_UNKNOWN: u32 = 463;

/// io_uring's three calls (the same numbers on every architecture). Never allowed.
pub const SYS_IO_URING: [i64; 3] = [IO_URING_SETUP, IO_URING_ENTER, IO_URING_REGISTER];

/// `io_pgetevents`, missing from the libc crate.
#[cfg(target_arch = "x86_64")]
const SYS_IO_PGETEVENTS: i64 = 333;
#[cfg(not(target_arch = "x86_64"))]
const SYS_IO_PGETEVENTS: i64 = 292;

/// Allowed to every container, on both architectures (the generic table's names).
const ALWAYS: &[i64] = &[
    libc::SYS_accept,
    libc::SYS_accept4,
    libc::SYS_adjtimex,
    libc::SYS_bind,
    libc::SYS_brk,
    libc::SYS_capget,
    libc::SYS_capset,
    libc::SYS_chdir,
    libc::SYS_clock_adjtime,
    libc::SYS_clock_getres,
    libc::SYS_clock_gettime,
    libc::SYS_clock_nanosleep,
    libc::SYS_close,
    CLOSE_RANGE,
    libc::SYS_connect,
    libc::SYS_copy_file_range,
    libc::SYS_dup,
    libc::SYS_dup3,
    libc::SYS_epoll_create1,
    libc::SYS_epoll_ctl,
    libc::SYS_epoll_pwait,
    EPOLL_PWAIT2,
    libc::SYS_eventfd2,
    libc::SYS_execve,
    libc::SYS_execveat,
    libc::SYS_exit,
    libc::SYS_exit_group,
    libc::SYS_faccessat,
    FACCESSAT2,
    libc::SYS_fadvise64,
    libc::SYS_fallocate,
    libc::SYS_fanotify_mark,
    libc::SYS_fchdir,
    libc::SYS_fchmod,
    libc::SYS_fchmodat,
    libc::SYS_fchown,
    libc::SYS_fchownat,
    libc::SYS_fcntl,
    libc::SYS_fdatasync,
    libc::SYS_fgetxattr,
    libc::SYS_flistxattr,
    libc::SYS_flock,
    libc::SYS_fremovexattr,
    libc::SYS_fsetxattr,
    libc::SYS_fstat,
    libc::SYS_fstatfs,
    libc::SYS_fsync,
    libc::SYS_ftruncate,
    libc::SYS_futex,
    FUTEX_WAITV,
    libc::SYS_getcpu,
    libc::SYS_getcwd,
    libc::SYS_getdents64,
    libc::SYS_getegid,
    libc::SYS_geteuid,
    libc::SYS_getgid,
    libc::SYS_getgroups,
    libc::SYS_getitimer,
    libc::SYS_getpeername,
    libc::SYS_getpgid,
    libc::SYS_getpid,
    libc::SYS_getppid,
    libc::SYS_getpriority,
    libc::SYS_getrandom,
    libc::SYS_getresgid,
    libc::SYS_getresuid,
    libc::SYS_getrlimit,
    libc::SYS_get_robust_list,
    libc::SYS_getrusage,
    libc::SYS_getsid,
    libc::SYS_getsockname,
    libc::SYS_getsockopt,
    libc::SYS_gettid,
    libc::SYS_gettimeofday,
    libc::SYS_getuid,
    libc::SYS_getxattr,
    libc::SYS_inotify_add_watch,
    libc::SYS_inotify_init1,
    libc::SYS_inotify_rm_watch,
    libc::SYS_io_cancel,
    libc::SYS_ioctl,
    libc::SYS_io_destroy,
    libc::SYS_io_getevents,
    SYS_IO_PGETEVENTS,
    libc::SYS_ioprio_get,
    libc::SYS_ioprio_set,
    libc::SYS_io_setup,
    libc::SYS_io_submit,
    libc::SYS_kill,
    LANDLOCK_ADD_RULE,
    LANDLOCK_CREATE_RULESET,
    LANDLOCK_RESTRICT_SELF,
    libc::SYS_lgetxattr,
    libc::SYS_linkat,
    libc::SYS_listen,
    libc::SYS_listxattr,
    libc::SYS_llistxattr,
    libc::SYS_lremovexattr,
    libc::SYS_lseek,
    libc::SYS_lsetxattr,
    libc::SYS_madvise,
    libc::SYS_membarrier,
    libc::SYS_memfd_create,
    MEMFD_SECRET,
    libc::SYS_mincore,
    libc::SYS_mkdirat,
    libc::SYS_mknodat,
    libc::SYS_mlock,
    libc::SYS_mlock2,
    libc::SYS_mlockall,
    libc::SYS_mmap,
    libc::SYS_mprotect,
    libc::SYS_mq_getsetattr,
    libc::SYS_mq_notify,
    libc::SYS_mq_open,
    libc::SYS_mq_timedreceive,
    libc::SYS_mq_timedsend,
    libc::SYS_mq_unlink,
    libc::SYS_mremap,
    libc::SYS_msgctl,
    libc::SYS_msgget,
    libc::SYS_msgrcv,
    libc::SYS_msgsnd,
    libc::SYS_msync,
    libc::SYS_munlock,
    libc::SYS_munlockall,
    libc::SYS_munmap,
    libc::SYS_name_to_handle_at,
    libc::SYS_nanosleep,
    libc::SYS_newfstatat,
    libc::SYS_openat,
    OPENAT2,
    PIDFD_OPEN,
    PIDFD_SEND_SIGNAL,
    libc::SYS_pipe2,
    libc::SYS_pkey_alloc,
    libc::SYS_pkey_free,
    libc::SYS_pkey_mprotect,
    libc::SYS_ppoll,
    libc::SYS_prctl,
    libc::SYS_pread64,
    libc::SYS_preadv,
    libc::SYS_preadv2,
    libc::SYS_prlimit64,
    PROCESS_MRELEASE,
    libc::SYS_process_vm_readv,
    libc::SYS_process_vm_writev,
    libc::SYS_pselect6,
    libc::SYS_ptrace,
    libc::SYS_pwrite64,
    libc::SYS_pwritev,
    libc::SYS_pwritev2,
    libc::SYS_read,
    libc::SYS_readahead,
    libc::SYS_readlinkat,
    libc::SYS_readv,
    libc::SYS_recvfrom,
    libc::SYS_recvmmsg,
    libc::SYS_recvmsg,
    libc::SYS_remap_file_pages,
    libc::SYS_removexattr,
    libc::SYS_renameat,
    libc::SYS_renameat2,
    libc::SYS_restart_syscall,
    libc::SYS_rseq,
    libc::SYS_rt_sigaction,
    libc::SYS_rt_sigpending,
    libc::SYS_rt_sigprocmask,
    libc::SYS_rt_sigqueueinfo,
    libc::SYS_rt_sigreturn,
    libc::SYS_rt_sigsuspend,
    libc::SYS_rt_sigtimedwait,
    libc::SYS_rt_tgsigqueueinfo,
    libc::SYS_sched_getaffinity,
    libc::SYS_sched_getattr,
    libc::SYS_sched_getparam,
    libc::SYS_sched_get_priority_max,
    libc::SYS_sched_get_priority_min,
    libc::SYS_sched_getscheduler,
    libc::SYS_sched_rr_get_interval,
    libc::SYS_sched_setaffinity,
    libc::SYS_sched_setattr,
    libc::SYS_sched_setparam,
    libc::SYS_sched_setscheduler,
    libc::SYS_sched_yield,
    libc::SYS_seccomp,
    libc::SYS_semctl,
    libc::SYS_semget,
    libc::SYS_semop,
    libc::SYS_semtimedop,
    libc::SYS_sendfile,
    libc::SYS_sendmmsg,
    libc::SYS_sendmsg,
    libc::SYS_sendto,
    libc::SYS_setfsgid,
    libc::SYS_setfsuid,
    libc::SYS_setgid,
    libc::SYS_setgroups,
    libc::SYS_setitimer,
    libc::SYS_setpgid,
    libc::SYS_setpriority,
    libc::SYS_setregid,
    libc::SYS_setresgid,
    libc::SYS_setresuid,
    libc::SYS_setreuid,
    libc::SYS_setrlimit,
    libc::SYS_set_robust_list,
    libc::SYS_setsid,
    libc::SYS_setsockopt,
    libc::SYS_set_tid_address,
    libc::SYS_setuid,
    libc::SYS_setxattr,
    libc::SYS_shmat,
    libc::SYS_shmctl,
    libc::SYS_shmdt,
    libc::SYS_shmget,
    libc::SYS_shutdown,
    libc::SYS_sigaltstack,
    libc::SYS_signalfd4,
    libc::SYS_socketpair,
    libc::SYS_splice,
    libc::SYS_statfs,
    libc::SYS_statx,
    libc::SYS_symlinkat,
    libc::SYS_sync,
    libc::SYS_sync_file_range,
    libc::SYS_syncfs,
    libc::SYS_sysinfo,
    libc::SYS_tee,
    libc::SYS_tgkill,
    libc::SYS_timer_create,
    libc::SYS_timer_delete,
    libc::SYS_timer_getoverrun,
    libc::SYS_timer_gettime,
    libc::SYS_timer_settime,
    libc::SYS_timerfd_create,
    libc::SYS_timerfd_gettime,
    libc::SYS_timerfd_settime,
    libc::SYS_times,
    libc::SYS_tkill,
    libc::SYS_truncate,
    libc::SYS_umask,
    libc::SYS_uname,
    libc::SYS_unlinkat,
    libc::SYS_utimensat,
    libc::SYS_vmsplice,
    libc::SYS_wait4,
    libc::SYS_waitid,
    libc::SYS_write,
    libc::SYS_writev,
    // Unprivileged calls newer than containerd's list (see the module doc).
    CACHESTAT,
    FCHMODAT2,
    MAP_SHADOW_STACK,
    FUTEX_WAKE,
    FUTEX_WAIT,
    FUTEX_REQUEUE,
    MSEAL,
];

/// x86_64's legacy calls (the generic table of aarch64 has none of them) and its TLS calls.
#[cfg(target_arch = "x86_64")]
const ALWAYS_ARCH: &[i64] = &[
    libc::SYS_access,
    libc::SYS_alarm,
    libc::SYS_arch_prctl,
    libc::SYS_chmod,
    libc::SYS_chown,
    libc::SYS_creat,
    libc::SYS_dup2,
    libc::SYS_epoll_create,
    libc::SYS_epoll_ctl_old,
    libc::SYS_epoll_wait,
    libc::SYS_epoll_wait_old,
    libc::SYS_eventfd,
    libc::SYS_fork,
    libc::SYS_futimesat,
    libc::SYS_getdents,
    libc::SYS_getpgrp,
    libc::SYS_get_thread_area,
    libc::SYS_inotify_init,
    libc::SYS_lchown,
    libc::SYS_link,
    libc::SYS_lstat,
    libc::SYS_mkdir,
    libc::SYS_mknod,
    libc::SYS_modify_ldt,
    libc::SYS_open,
    libc::SYS_pause,
    libc::SYS_pipe,
    libc::SYS_poll,
    libc::SYS_readlink,
    libc::SYS_rename,
    libc::SYS_rmdir,
    libc::SYS_select,
    libc::SYS_set_thread_area,
    libc::SYS_signalfd,
    libc::SYS_stat,
    libc::SYS_symlink,
    libc::SYS_time,
    libc::SYS_unlink,
    libc::SYS_utime,
    libc::SYS_utimes,
    libc::SYS_vfork,
];
#[cfg(not(target_arch = "x86_64"))]
const ALWAYS_ARCH: &[i64] = &[];

/// The calls a capability in the bounding set adds (containerd's table).
fn by_capability(cap: Capability) -> Vec<i64> {
    use Capability as C;
    match cap {
        C::DacReadSearch => vec![libc::SYS_open_by_handle_at],
        C::SysAdmin => vec![
            libc::SYS_bpf,
            libc::SYS_clone,
            CLONE3,
            libc::SYS_fanotify_init,
            FSCONFIG,
            FSMOUNT,
            FSOPEN,
            FSPICK,
            libc::SYS_lookup_dcookie,
            libc::SYS_mount,
            MOUNT_SETATTR,
            MOVE_MOUNT,
            OPEN_TREE,
            libc::SYS_perf_event_open,
            libc::SYS_quotactl,
            QUOTACTL_FD,
            libc::SYS_setdomainname,
            libc::SYS_sethostname,
            libc::SYS_setns,
            libc::SYS_syslog,
            libc::SYS_umount2,
            libc::SYS_unshare,
        ],
        C::SysBoot => vec![libc::SYS_reboot],
        C::SysChroot => vec![libc::SYS_chroot],
        C::SysModule => vec![
            libc::SYS_delete_module,
            libc::SYS_init_module,
            libc::SYS_finit_module,
        ],
        C::SysPacct => vec![libc::SYS_acct],
        C::SysPtrace => vec![libc::SYS_kcmp, PIDFD_GETFD, PROCESS_MADVISE],
        #[cfg(target_arch = "x86_64")]
        C::SysRawio => vec![libc::SYS_iopl, libc::SYS_ioperm],
        C::SysTime => vec![libc::SYS_settimeofday, libc::SYS_clock_settime],
        C::SysTtyConfig => vec![libc::SYS_vhangup],
        C::SysNice => vec![
            libc::SYS_get_mempolicy,
            libc::SYS_mbind,
            libc::SYS_set_mempolicy,
            SET_MEMPOLICY_HOME_NODE,
        ],
        C::Syslog => vec![libc::SYS_syslog],
        C::Bpf => vec![libc::SYS_bpf],
        C::Perfmon => vec![libc::SYS_perf_event_open],
        _ => Vec::new(),
    }
}

/// Namespace flags `clone` may not use without CAP_SYS_ADMIN (containerd's mask, 0x7E020000).
pub const CLONE_NS_MASK: u64 = (libc::CLONE_NEWNS
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUSER
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET
    | libc::CLONE_NEWCGROUP) as u64;

/// The `personality` values every container may set: query (0xffffffff), PER_LINUX,
/// PER_LINUX32, UNAME26 and UNAME26|PER_LINUX32. Anything else (ADDR_NO_RANDOMIZE,
/// READ_IMPLIES_EXEC...) weakens the kernel's defences and fails.
pub const PERSONALITIES: [u64; 5] = [0x0, 0x8, 0x2_0000, 0x2_0008, 0xffff_ffff];

/// AF_VSOCK: the one socket family every container is refused (it reaches the host's
/// hypervisor services).
pub const AF_VSOCK: u64 = 40;

/// Missing from the libc crate for aarch64 musl (the generic table's number).
#[cfg(target_arch = "aarch64")]
const SYS_KEXEC_FILE_LOAD: i64 = 294;
#[cfg(not(target_arch = "aarch64"))]
const SYS_KEXEC_FILE_LOAD: i64 = libc::SYS_kexec_file_load;

/// Calls no capability allows in a RuntimeDefault container.
fn never_allowed() -> Vec<i64> {
    let mut v = vec![
        libc::SYS_add_key,
        libc::SYS_keyctl,
        libc::SYS_request_key,
        libc::SYS_kexec_load,
        SYS_KEXEC_FILE_LOAD,
        libc::SYS_userfaultfd,
        libc::SYS_swapon,
        libc::SYS_swapoff,
        libc::SYS_pivot_root,
        libc::SYS_move_pages,
        libc::SYS_nfsservctl,
    ];
    v.extend(SYS_IO_URING);
    v
}

/// A call to try under RuntimeDefault, with two integer arguments chosen so the kernel refuses
/// it without side effects when the filter lets it through, and the errno expected (0: it
/// succeeded) with the default capabilities and with [`PROBE_ADMIN_CAPS`] added. EPERM is the
/// filter's refusal; another errno is the kernel's own answer. The unit tests run them under
/// filters installed in a forked child, the runtime suite inside real containers.
#[derive(Debug, Clone, Copy)]
pub struct Probe {
    pub name: &'static str,
    pub nr: i64,
    pub args: [u64; 2],
    pub default: i32,
    pub admin: i32,
}

/// The capabilities the second column of [`probes`] adds to the defaults.
pub const PROBE_ADMIN_CAPS: [&str; 2] = ["SYS_ADMIN", "SYS_PTRACE"];

/// The probes of RuntimeDefault (see [`Probe`]).
pub fn probes() -> Vec<Probe> {
    const ADDR_NO_RANDOMIZE: u64 = 0x0040000;
    let (ok, eperm, einval, esrch, enosys) = (0, libc::EPERM, libc::EINVAL, libc::ESRCH, libc::ENOSYS);
    let clone_thread = libc::CLONE_THREAD as u64;
    let p = |name, nr, args, default, admin| Probe {
        name,
        nr,
        args,
        default,
        admin,
    };
    let mut v = vec![
        p("getpid", libc::SYS_getpid, [0, 0], ok, ok),
        p(
            "personality-query",
            libc::SYS_personality,
            [0xffff_ffff, 0],
            ok,
            ok,
        ),
        p(
            "personality-no-randomize",
            libc::SYS_personality,
            [ADDR_NO_RANDOMIZE, 0],
            eperm,
            eperm,
        ),
        p(
            "socket-unix",
            libc::SYS_socket,
            [libc::AF_UNIX as u64, libc::SOCK_STREAM as u64],
            ok,
            ok,
        ),
        p(
            "socket-vsock",
            libc::SYS_socket,
            [AF_VSOCK, libc::SOCK_STREAM as u64],
            eperm,
            eperm,
        ),
        // Flag 0x1 is not an unshare flag: EINVAL once the call reaches the kernel.
        p("unshare", libc::SYS_unshare, [0x1, 0], eperm, einval),
        // CLONE_THREAD without CLONE_SIGHAND is EINVAL before anything is created.
        p("clone", libc::SYS_clone, [clone_thread, 0], einval, einval),
        p(
            "clone-newuts",
            libc::SYS_clone,
            [clone_thread | libc::CLONE_NEWUTS as u64, 0],
            eperm,
            einval,
        ),
        p(
            "clone-newuser",
            libc::SYS_clone,
            [clone_thread | libc::CLONE_NEWUSER as u64, 0],
            eperm,
            einval,
        ),
        // clone3(NULL, 0): size 0 is EINVAL.
        p("clone3", CLONE3, [0, 0], enosys, einval),
        // pid 0 names no process.
        p("ptrace", libc::SYS_ptrace, [0x4299, 0], esrch, esrch),
        p("kcmp", libc::SYS_kcmp, [0, 0], eperm, esrch),
        p(
            "newer-than-the-table",
            i64::from(FIRST_UNKNOWN),
            [0, 0],
            enosys,
            enosys,
        ),
    ];
    for nr in never_allowed() {
        v.push(p("never-allowed", nr, [u64::MAX, u64::MAX], eperm, eperm));
    }
    if cfg!(target_arch = "x86_64") {
        // x32 getpid: ENOSYS or a pid on a kernel with x32, EPERM under the filter.
        v.push(p(
            "x32-getpid",
            i64::from(X32_SYSCALL_BIT) | libc::SYS_getpid,
            [0, 0],
            eperm,
            eperm,
        ));
    }
    v
}

/// Makes each probe's call in this process and returns its errno (0: it succeeded). For the
/// runtime suite's probe process inside a container; the calls have no side effects when they
/// succeed but opening a socket and querying the personality.
pub fn run_probes() -> Vec<(Probe, i32)> {
    probes()
        .into_iter()
        .map(|p| (p, crate::sys::syscall_errno(p.nr, p.args[0], p.args[1])))
        .collect()
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

fn target_arch() -> Result<(TargetArch, u32), SeccompError> {
    const AUDIT_ARCH_X86_64: u32 = 0xC000_003E;
    const AUDIT_ARCH_AARCH64: u32 = 0xC000_00B7;
    match std::env::consts::ARCH {
        "x86_64" => Ok((TargetArch::x86_64, AUDIT_ARCH_X86_64)),
        "aarch64" => Ok((TargetArch::aarch64, AUDIT_ARCH_AARCH64)),
        other => Err(SeccompError::Architecture(other)),
    }
}

/// The allow list for a process with bounding set `caps`: call number to the rules under which
/// it is allowed (no rules: always).
fn allow_list(caps: &Capabilities) -> Result<BTreeMap<i64, Vec<SeccompRule>>, SeccompError> {
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    let mut always: Vec<i64> = ALWAYS.iter().chain(ALWAYS_ARCH).copied().collect();
    for cap in caps {
        always.extend(by_capability(*cap));
    }
    let arg0 = |len, op, value| -> Result<SeccompRule, SeccompError> {
        Ok(SeccompRule::new(vec![SeccompCondition::new(0, len, op, value)?])?)
    };
    let personality = PERSONALITIES
        .iter()
        .map(|v| arg0(SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, *v))
        .collect::<Result<Vec<_>, _>>()?;
    rules.insert(libc::SYS_personality, personality);
    rules.insert(
        libc::SYS_socket,
        vec![arg0(SeccompCmpArgLen::Dword, SeccompCmpOp::Ne, AF_VSOCK)?],
    );
    if !caps.contains(&Capability::SysAdmin) {
        // clone(flags, ...) with no namespace flag: flags & mask == 0.
        rules.insert(
            libc::SYS_clone,
            vec![arg0(
                SeccompCmpArgLen::Qword,
                SeccompCmpOp::MaskedEq(CLONE_NS_MASK),
                0,
            )?],
        );
        // clone3 passes the allow list and fails with ENOSYS in the tail filter.
        always.push(CLONE3);
    }
    // An unconditional allow wins over any rule for the same call.
    for nr in always {
        rules.insert(nr, Vec::new());
    }
    Ok(rules)
}

/// Compiles the profile for a process with bounding set `caps` to BPF programs, installed in
/// order (the kernel runs all of them; the most restrictive action wins, and between two
/// errors the later program's errno). `Unconfined` compiles to nothing.
pub fn compile(profile: Profile, caps: &Capabilities) -> Result<Vec<BpfProgram>, SeccompError> {
    if profile == Profile::Unconfined {
        return Ok(Vec::new());
    }
    let (arch, audit_arch) = target_arch()?;
    let allow = SeccompFilter::new(
        allow_list(caps)?,
        SeccompAction::Errno(EPERM),
        SeccompAction::Allow,
        arch,
    )?;
    Ok(vec![
        BpfProgram::try_from(allow)?,
        tail(audit_arch, !caps.contains(&Capability::SysAdmin)),
    ])
}

/// `__X32_SYSCALL_BIT`: x32 ABI calls enter the x86_64 table with this bit set and the same
/// `AUDIT_ARCH_X86_64`, so an allow list keyed by numbers cannot tell them apart by arch.
const X32_SYSCALL_BIT: u32 = 0x4000_0000;

/// The errno overrides, installed after the allow list so their errno wins: x32 calls EPERM
/// (x86_64), `clone3` ENOSYS (without CAP_SYS_ADMIN), calls newer than the table ENOSYS.
/// Written as BPF because seccompiler matches exact numbers only.
fn tail(audit_arch: u32, clone3_enosys: bool) -> BpfProgram {
    const LD_W_ABS: u16 = (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16;
    const JEQ_K: u16 = (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16;
    const JGE_K: u16 = (libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K) as u16;
    const RET_K: u16 = (libc::BPF_RET | libc::BPF_K) as u16;
    // struct seccomp_data { int nr; __u32 arch; ... }
    const NR: u32 = 0;
    const ARCH: u32 = 4;
    let op = |code, jt, jf, k| seccompiler::sock_filter { code, jt, jf, k };
    let errno = |e: u32| op(RET_K, 0, 0, libc::SECCOMP_RET_ERRNO | e);
    // Each check: if the condition holds, the next instruction returns; else skip it.
    let mut body = vec![op(LD_W_ABS, 0, 0, NR)];
    if cfg!(target_arch = "x86_64") {
        body.extend([op(JGE_K, 0, 1, X32_SYSCALL_BIT), errno(EPERM)]);
    }
    if clone3_enosys {
        body.extend([op(JEQ_K, 0, 1, CLONE3 as u32), errno(ENOSYS)]);
    }
    body.extend([op(JGE_K, 0, 1, FIRST_UNKNOWN), errno(ENOSYS)]);
    let allow = op(RET_K, 0, 0, libc::SECCOMP_RET_ALLOW);
    // Another architecture: jump over the body to the final allow (seccompiler's filter has
    // already refused it).
    let skip = body.len() as u8; // at most 7 instructions
    let mut prog = vec![op(LD_W_ABS, 0, 0, ARCH), op(JEQ_K, 0, skip, audit_arch)];
    prog.extend(body);
    prog.push(allow);
    prog
}

/// The bounding capability set of a spec's process (empty when it names none).
fn bounding(spec: &Spec) -> Capabilities {
    spec.process()
        .as_ref()
        .and_then(|p| p.capabilities().as_ref())
        .and_then(|c| c.bounding().clone())
        .unwrap_or_default()
}

/// The executor: libcontainer's default one, with the profile installed just before `execve`.
#[derive(Debug, Clone)]
pub struct SeccompExecutor {
    pub profile: Profile,
}

impl Executor for SeccompExecutor {
    fn exec(&self, spec: &Spec) -> Result<(), ExecutorError> {
        let other = |e: SeccompError| ExecutorError::Other(e.to_string());
        for prog in compile(self.profile, &bounding(spec)).map_err(other)? {
            seccompiler::apply_filter(&prog).map_err(|e| other(SeccompError::Install(e)))?;
        }
        default::get_executor().exec(spec)
    }

    fn validate(&self, spec: &Spec) -> Result<(), ExecutorValidationError> {
        compile(self.profile, &bounding(spec))
            .map_err(|e| ExecutorValidationError::ArgValidationError(e.to_string()))?;
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

    fn caps(names: &[&str]) -> Capabilities {
        names
            .iter()
            .map(|n| n.trim_start_matches("CAP_").parse::<Capability>().expect(n))
            .collect()
    }

    /// Installs the RuntimeDefault filters for bounding set `bounding` in a forked child and
    /// reports each call's errno (0 when it succeeded): the filters' real effect in this
    /// kernel, not their shape. The child only makes raw system calls with integer arguments
    /// on memory allocated before the fork (seccompiler's `apply_filter` is prctl + seccomp)
    /// and `_exit`s, so the test harness's other threads cannot leave it holding a lock.
    fn errnos_under_runtime_default(bounding: &Capabilities, calls: &[(i64, [u64; 2])]) -> Vec<i32> {
        use nix::unistd::ForkResult;
        let progs = compile(Profile::RuntimeDefault, bounding).expect("compiles");
        let (r, w) = nix::unistd::pipe().expect("pipe");
        let mut answers = [0u8; 128];
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

    /// The probes' answers under the filters of a forked child, for both capability sets.
    #[test]
    fn runtime_default_in_this_kernel() {
        let probes = probes();
        let calls: Vec<(i64, [u64; 2])> = probes.iter().map(|p| (p.nr, p.args)).collect();
        let defaults = caps(crate::spec::DEFAULT_CAPS);
        let mut admin = defaults.clone();
        admin.extend(PROBE_ADMIN_CAPS.map(|c| c.parse::<Capability>().expect(c)));
        let got_default = errnos_under_runtime_default(&defaults, &calls);
        let got_admin = errnos_under_runtime_default(&admin, &calls);
        for (i, p) in probes.iter().enumerate() {
            assert_eq!(
                got_default[i], p.default,
                "{} ({}) with the default capabilities",
                p.name, p.nr
            );
            assert_eq!(
                got_admin[i], p.admin,
                "{} ({}) with SYS_ADMIN and SYS_PTRACE",
                p.name, p.nr
            );
        }
    }

    #[test]
    fn profiles_compile() {
        let progs = compile(Profile::RuntimeDefault, &caps(crate::spec::DEFAULT_CAPS)).expect("compiles");
        assert_eq!(progs.len(), 2);
        assert!(
            progs[0].len() > 250,
            "one check per allowed call: {}",
            progs[0].len()
        );
        assert!(
            compile(Profile::Unconfined, &Capabilities::new())
                .expect("nothing")
                .is_empty()
        );
    }

    /// No capability, not even all of them, opens io_uring, keys, kexec, swap, userfaultfd.
    #[test]
    fn never_allowed_calls_stay_out_of_every_allow_list() {
        let all: Capabilities = ALL_CAPABILITIES.iter().copied().collect();
        for set in [Capabilities::new(), caps(crate::spec::DEFAULT_CAPS), all] {
            let list = allow_list(&set).expect("builds");
            for nr in never_allowed() {
                assert!(!list.contains_key(&nr), "{nr} allowed with {set:?}");
            }
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

    /// The unified numbers written here agree with the libc crate where it has them.
    #[test]
    fn unified_numbers_match_libc() {
        assert_eq!(PIDFD_SEND_SIGNAL, libc::SYS_pidfd_send_signal);
        assert_eq!(CLONE3, libc::SYS_clone3);
        assert_eq!(OPEN_TREE, libc::SYS_open_tree);
        assert_eq!(FSPICK, libc::SYS_fspick);
        assert_eq!(PIDFD_OPEN, libc::SYS_pidfd_open);
        assert_eq!(CLOSE_RANGE, libc::SYS_close_range);
        assert_eq!(OPENAT2, libc::SYS_openat2);
        assert_eq!(FACCESSAT2, libc::SYS_faccessat2);
        assert_eq!(MOUNT_SETATTR, libc::SYS_mount_setattr);
        assert_eq!(LANDLOCK_RESTRICT_SELF, libc::SYS_landlock_restrict_self);
    }

    const ALL_CAPABILITIES: [Capability; 10] = [
        Capability::SysAdmin,
        Capability::SysPtrace,
        Capability::SysModule,
        Capability::SysBoot,
        Capability::SysTime,
        Capability::SysNice,
        Capability::SysRawio,
        Capability::Bpf,
        Capability::Perfmon,
        Capability::DacReadSearch,
    ];
}
