//! OCI runtime specs (`config.json`) for pause sandboxes and containers, written as JSON (the
//! form libcontainer reads from a bundle).

use serde_json::{Value, json};

use crate::cgroups;
use crate::image::store::ImageConfig;
use crate::seccomp::Profile;
use runtime_api::{ContainerConfig, HostNamespaces, Mount, Resources};

/// containerd's default capability set minus CAP_NET_RAW and CAP_MKNOD. NET_RAW (raw and packet
/// sockets: spoofing, ARP poisoning on the pod bridge) is what most container escapes and
/// lateral attacks start from; pings through ICMP datagram sockets work without it
/// (`net.ipv4.ping_group_range` is open in every sandbox), and a pod whose tool needs a raw
/// socket (Debian's busybox 1.35 `ping` has no datagram fallback) adds it. MKNOD:
/// device access is not restricted by a device cgroup here (libcgroups' v2 device controller
/// needs eBPF through a C library we do not link), so containers may not create device nodes
/// at all, not even when they ask.
pub const DEFAULT_CAPS: &[&str] = &[
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FSETID",
    "CAP_FOWNER",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETFCAP",
    "CAP_SETPCAP",
    "CAP_NET_BIND_SERVICE",
    "CAP_SYS_CHROOT",
    "CAP_KILL",
    "CAP_AUDIT_WRITE",
];

/// Every capability of Linux 6.x, in number order (`ALL` in an add list means these, less
/// CAP_MKNOD).
const ALL_CAPS: &[&str] = &[
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_DAC_READ_SEARCH",
    "CAP_FOWNER",
    "CAP_FSETID",
    "CAP_KILL",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETPCAP",
    "CAP_LINUX_IMMUTABLE",
    "CAP_NET_BIND_SERVICE",
    "CAP_NET_BROADCAST",
    "CAP_NET_ADMIN",
    "CAP_NET_RAW",
    "CAP_IPC_LOCK",
    "CAP_IPC_OWNER",
    "CAP_SYS_MODULE",
    "CAP_SYS_RAWIO",
    "CAP_SYS_CHROOT",
    "CAP_SYS_PTRACE",
    "CAP_SYS_PACCT",
    "CAP_SYS_ADMIN",
    "CAP_SYS_BOOT",
    "CAP_SYS_NICE",
    "CAP_SYS_RESOURCE",
    "CAP_SYS_TIME",
    "CAP_SYS_TTY_CONFIG",
    "CAP_MKNOD",
    "CAP_LEASE",
    "CAP_AUDIT_WRITE",
    "CAP_AUDIT_CONTROL",
    "CAP_SETFCAP",
    "CAP_MAC_OVERRIDE",
    "CAP_MAC_ADMIN",
    "CAP_SYSLOG",
    "CAP_WAKE_ALARM",
    "CAP_BLOCK_SUSPEND",
    "CAP_AUDIT_READ",
    "CAP_PERFMON",
    "CAP_BPF",
    "CAP_CHECKPOINT_RESTORE",
];

/// A capability list [`capabilities`] refuses.
#[derive(Debug, thiserror::Error)]
pub enum CapabilityError {
    #[error("unknown capability {0:?}")]
    Unknown(String),
    #[error(
        "capability \"MKNOD\" cannot be granted on this node (device nodes are not confined by a device cgroup)"
    )]
    Mknod,
}

/// A privileged container's capability set: every capability, MKNOD included (a privileged
/// container is the node's root by definition; nothing confines it anyway).
pub fn privileged_capabilities() -> Vec<String> {
    ALL_CAPS.iter().map(|c| c.to_string()).collect()
}

/// A seccomp profile the runtime cannot apply.
#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    #[error("seccomp profile type Localhost is not supported on this node (it loads no profile files)")]
    Localhost,
}

/// The profile a container runs under: none when privileged (containerd sets no seccomp on
/// privileged containers, whatever the pod asks), else the one asked for; `Localhost` is refused.
pub fn effective_profile(cfg: &ContainerConfig) -> Result<Profile, ProfileError> {
    match (cfg.privileged, cfg.seccomp) {
        (true, _) => Ok(Profile::Unconfined),
        (false, Profile::Localhost) => Err(ProfileError::Localhost),
        (false, p) => Ok(p),
    }
}

/// The node's device nodes under `dir` (normally `/dev`), as OCI `linux.devices` entries for a
/// privileged container, skipping what the container gets of its own (pts, shm, mqueue, the
/// console and ptmx), symlinks and hidden directories, as containerd's host-devices list does.
pub fn host_devices(dir: &std::path::Path) -> std::io::Result<Vec<Value>> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    const SKIP_DIRS: [&str; 4] = ["pts", "shm", "mqueue", "fd"];
    const SKIP_FILES: [&str; 2] = ["console", "ptmx"];
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for entry in std::fs::read_dir(&d)? {
            let entry = entry?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let ft = entry.file_type()?;
            if ft.is_dir() {
                let skipped = name.starts_with('.') || (d == dir && SKIP_DIRS.contains(&name.as_str()));
                if !skipped {
                    todo.push(entry.path());
                }
                continue;
            }
            let kind = if ft.is_char_device() {
                "c"
            } else if ft.is_block_device() {
                "b"
            } else {
                continue;
            };
            if d == dir && SKIP_FILES.contains(&name.as_str()) {
                continue;
            }
            let meta = entry.metadata()?;
            let rdev = meta.rdev();
            out.push(json!({
                "path": entry.path().to_string_lossy(),
                "type": kind,
                "major": libc::major(rdev),
                "minor": libc::minor(rdev),
                "fileMode": meta.mode() & 0o7777,
                "uid": meta.uid(),
                "gid": meta.gid(),
            }));
        }
    }
    out.sort_by(|a, b| a["path"].as_str().cmp(&b["path"].as_str()));
    Ok(out)
}

/// A container's capability set from `securityContext.capabilities` (names with or without the
/// `CAP_` prefix, any case), as containerd's CRI plugin builds it: the defaults, then `ALL`
/// added, then `ALL` dropped, then each other add, then each other drop. An unknown name, or
/// MKNOD (see [`DEFAULT_CAPS`]), is an error naming it.
pub fn capabilities(add: &[String], drop: &[String]) -> Result<Vec<String>, CapabilityError> {
    let norm = |name: &str| -> Result<Option<&'static str>, CapabilityError> {
        let upper = name.trim().to_ascii_uppercase();
        if upper == "ALL" {
            return Ok(None);
        }
        let full = if upper.starts_with("CAP_") {
            upper
        } else {
            format!("CAP_{upper}")
        };
        ALL_CAPS
            .iter()
            .find(|c| **c == full)
            .map(|c| Some(*c))
            .ok_or_else(|| CapabilityError::Unknown(name.to_string()))
    };
    let mut set: Vec<&'static str> = DEFAULT_CAPS.to_vec();
    if add.iter().any(|a| a.trim().eq_ignore_ascii_case("ALL")) {
        set = ALL_CAPS.iter().copied().filter(|c| *c != "CAP_MKNOD").collect();
    }
    if drop.iter().any(|d| d.trim().eq_ignore_ascii_case("ALL")) {
        set.clear();
    }
    for a in add {
        if let Some(c) = norm(a)? {
            if c == "CAP_MKNOD" {
                return Err(CapabilityError::Mknod);
            }
            if !set.contains(&c) {
                set.push(c);
            }
        }
    }
    for d in drop {
        if let Some(c) = norm(d)? {
            set.retain(|x| *x != c);
        }
    }
    // In number order, as the kernel lists them.
    set.sort_by_key(|c| ALL_CAPS.iter().position(|x| x == c));
    Ok(set.into_iter().map(String::from).collect())
}

/// The sandbox's network sysctls (containerd's `enable_unprivileged_icmp`): any group may open
/// ICMP datagram sockets, so `ping` works without CAP_NET_RAW.
pub const SANDBOX_SYSCTLS: &[(&str, &str)] = &[("net.ipv4.ping_group_range", "0 2147483647")];

/// containerd's masked and read-only paths, and `/proc/cmdline`: the node's kernel command line
/// may carry a join token, and no pod needs it.
pub const MASKED_PATHS: &[&str] = &[
    "/proc/acpi",
    "/proc/asound",
    "/proc/cmdline",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
    "/sys/devices/virtual/powercap",
];
pub const READONLY_PATHS: &[&str] = &[
    "/proc/bus",
    "/proc/fs",
    "/proc/irq",
    "/proc/sys",
    "/proc/sysrq-trigger",
];

/// The PATH a container gets when its image sets none.
pub const DEFAULT_PATH: &str = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

fn base_mounts() -> Vec<Value> {
    vec![
        json!({"destination": "/proc", "type": "proc", "source": "proc", "options": ["nosuid", "noexec", "nodev"]}),
        json!({"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]}),
        json!({"destination": "/dev/pts", "type": "devpts", "source": "devpts",
               "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"]}),
        json!({"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue", "options": ["nosuid", "noexec", "nodev"]}),
        json!({"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": ["nosuid", "noexec", "nodev", "ro"]}),
        json!({"destination": "/sys/fs/cgroup", "type": "cgroup", "source": "cgroup", "options": ["nosuid", "noexec", "nodev", "relatime", "ro"]}),
    ]
}

fn bind(source: &str, destination: &str, read_only: bool) -> Value {
    let mut options = vec!["rbind", "rprivate"];
    if read_only {
        options.push("ro");
    }
    json!({"destination": destination, "type": "bind", "source": source, "options": options})
}

/// The pause process's user and group (the pause image's `65535:65535`): it needs no
/// privilege, and a process of another user needs `CAP_SYS_PTRACE` to reach its `/proc` entries.
pub const PAUSE_ID: u32 = 65535;

/// The pause sandbox, run as [`PAUSE_ID`] without capabilities: new pid, ipc, uts, network and
/// mount namespaces, except those of the node it shares (`host`; the node's network brings its
/// UTS namespace, and then the hostname is not the sandbox's to set); the pause root holds the
/// pause program (`crate::pause`) as `/pause`.
///
/// The pause's mount namespace has the read-only pause root and a `/dev` (libcontainer makes
/// the default devices there), and no `/proc`: no workload runs in it, but `/proc/<pause>/root`
/// leads into it from every process that sees the pause (a shared or the node's pid namespace),
/// and an empty directory shows nothing, where a mounted `/proc` needed containerd's masked and
/// read-only paths (17 more mounts per pod). The network sysctls ([`SANDBOX_SYSCTLS`]), which
/// libcontainer writes through the container's `/proc`, are written by the runtime in the pod's
/// network namespace once the pause runs (`net::set_sysctls`).
pub fn sandbox(hostname: &str, cgroup: &str, host: HostNamespaces) -> Value {
    let mut namespaces = Vec::new();
    namespaces.extend((!host.pid).then(|| json!({"type": "pid"})));
    namespaces.extend((!host.ipc).then(|| json!({"type": "ipc"})));
    if !host.network {
        namespaces.extend([json!({"type": "uts"}), json!({"type": "network"})]);
    }
    namespaces.push(json!({"type": "mount"}));
    let mut spec = json!({
        "ociVersion": "1.0.2",
        "process": {
            "terminal": false,
            "user": {"uid": PAUSE_ID, "gid": PAUSE_ID},
            "args": ["/pause", "pause"],
            "env": [DEFAULT_PATH],
            "cwd": "/",
            "capabilities": {"bounding": [], "effective": [], "permitted": []},
            "noNewPrivileges": true,
            "oomScoreAdj": cgroups::PAUSE_OOM_SCORE_ADJ,
        },
        "root": {"path": "rootfs", "readonly": true},
        "hostname": hostname,
        "mounts": [
            {"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "noexec", "mode=755", "size=64k"]},
        ],
        "linux": {
            "namespaces": namespaces,
            "cgroupsPath": cgroup,
            "resources": {"cpu": {"shares": 2}},
        },
    });
    if host.network
        && let Some(o) = spec.as_object_mut()
    {
        o.remove("hostname");
    }
    spec
}

/// Where a container's pod-level files live, and the sandbox's namespaces.
#[derive(Debug, Clone)]
pub struct SandboxPaths {
    pub pause_pid: i32,
    pub share_pid: bool,
    /// The node's namespaces the pod shares: the container stays in the runtime's (the
    /// node's) for those.
    pub host: HostNamespaces,
    /// A process whose pid namespace the container joins (an ephemeral container's target),
    /// whatever `share_pid` says.
    pub target_pid: Option<i32>,
    pub hosts: String,
    pub hostname: String,
    pub resolv_conf: String,
    pub shm: String,
}

/// The process args: Kubernetes' command/args rules over the image's entrypoint/cmd.
pub fn process_args(cfg: &ContainerConfig, image: &ImageConfig) -> Vec<String> {
    match (cfg.command.is_empty(), cfg.args.is_empty()) {
        (false, false) => cfg.command.iter().chain(&cfg.args).cloned().collect(),
        (false, true) => cfg.command.clone(),
        (true, false) => image.entrypoint.iter().chain(&cfg.args).cloned().collect(),
        (true, true) => image.entrypoint.iter().chain(&image.cmd).cloned().collect(),
    }
}

/// Image env, then the container's (a later NAME replaces an earlier one); PATH guaranteed.
pub fn environment(cfg: &ContainerConfig, image: &ImageConfig) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for e in image.env.iter().chain(&cfg.env) {
        let name = e.split('=').next().unwrap_or("");
        out.retain(|x| x.split('=').next() != Some(name));
        out.push(e.clone());
    }
    if !out.iter().any(|e| e.starts_with("PATH=")) {
        out.insert(0, DEFAULT_PATH.to_string());
    }
    out
}

/// The image's `User` when it is numeric (`uid` or `uid:gid`); names need the image's
/// /etc/passwd and are resolved by the caller.
pub fn numeric_user(user: &str) -> Option<(u32, Option<u32>)> {
    let (u, g) = user.split_once(':').map_or((user, None), |(u, g)| (u, Some(g)));
    let uid = u.parse().ok()?;
    let gid = match g {
        Some(g) => Some(g.parse().ok()?),
        None => None,
    };
    Some((uid, gid))
}

/// Who a container's process is and what it may touch, as the caller resolved it.
#[derive(Debug, Clone, Copy)]
pub struct Privileges<'a> {
    /// uid and gid.
    pub user: (u32, u32),
    /// [`capabilities`] or [`privileged_capabilities`].
    pub caps: &'a [String],
    /// [`host_devices`] for a privileged container, else none.
    pub devices: &'a [Value],
    /// [`effective_profile`]: any profile but Unconfined implies no_new_privs.
    pub profile: Profile,
}

/// A container's spec. `oom_score_adj`, the cgroup path and the privileges are computed by the
/// caller.
pub fn container(
    cfg: &ContainerConfig,
    image: &ImageConfig,
    sb: &SandboxPaths,
    cgroup: &str,
    oom_score_adj: i32,
    privileges: Privileges<'_>,
) -> Value {
    let Privileges {
        user,
        caps,
        devices,
        profile,
    } = privileges;
    let r: &Resources = &cfg.resources;
    let mut cpu = json!({"shares": cgroups::cpu_shares(r.effective_cpu_request().unwrap_or(0)), "period": cgroups::CPU_PERIOD});
    if let Some(l) = r.cpu_limit {
        cpu["quota"] = json!(cgroups::cpu_quota(l));
    }
    let mut resources = json!({"cpu": cpu, "unified": {"memory.oom.group": "1"}});
    if let Some(m) = r.memory_limit {
        resources["memory"] = json!({"limit": m});
    }
    let ns = |kind: &str| json!({"type": kind, "path": format!("/proc/{}/ns/{kind}", sb.pause_pid)});
    let pid = if sb.host.pid {
        None
    } else if let Some(target) = sb.target_pid {
        Some(json!({"type": "pid", "path": format!("/proc/{target}/ns/pid")}))
    } else if sb.share_pid {
        Some(ns("pid"))
    } else {
        Some(json!({"type": "pid"}))
    };
    let mut namespaces: Vec<Value> = pid.into_iter().collect();
    namespaces.extend([json!({"type": "mount"}), json!({"type": "cgroup"})]);
    if !sb.host.network {
        namespaces.extend([
            json!({"type": "network", "path": format!("/proc/{}/ns/net", sb.pause_pid)}),
            ns("uts"),
        ]);
    }
    namespaces.extend((!sb.host.ipc).then(|| ns("ipc")));
    let mut mounts = base_mounts();
    if cfg.privileged {
        // Writable /sys and cgroupfs (containerd's privileged defaults).
        for m in &mut mounts {
            if let Some(opts) = m["options"].as_array_mut() {
                opts.retain(|o| o != "ro");
            }
        }
    }
    mounts.push(bind(&sb.shm, "/dev/shm", false));
    mounts.push(bind(&sb.hosts, "/etc/hosts", false));
    mounts.push(bind(&sb.hostname, "/etc/hostname", false));
    mounts.push(bind(&sb.resolv_conf, "/etc/resolv.conf", false));
    for Mount {
        host_path,
        container_path,
        read_only,
    } in &cfg.mounts
    {
        mounts.push(bind(&host_path.to_string_lossy(), container_path, *read_only));
    }
    let cwd = cfg
        .working_dir
        .clone()
        .filter(|w| !w.is_empty())
        .or_else(|| Some(image.working_dir.clone()).filter(|w| !w.is_empty()))
        .unwrap_or_else(|| "/".into());
    let seccomp = profile != Profile::Unconfined;
    let (masked, readonly): (&[&str], &[&str]) = if cfg.privileged {
        (&[], &[])
    } else {
        (MASKED_PATHS, READONLY_PATHS)
    };
    json!({
        "ociVersion": "1.0.2",
        "process": {
            "terminal": cfg.tty,
            "user": {"uid": user.0, "gid": user.1, "additionalGids": cfg.supplemental_groups},
            "args": process_args(cfg, image),
            "env": environment(cfg, image),
            "cwd": cwd,
            "capabilities": {"bounding": caps, "effective": caps, "permitted": caps},
            "noNewPrivileges": cfg.no_new_privileges || seccomp,
            "oomScoreAdj": oom_score_adj,
        },
        "root": {"path": "rootfs", "readonly": cfg.read_only_root_filesystem},
        "mounts": mounts,
        "linux": {
            "namespaces": namespaces,
            "cgroupsPath": cgroup,
            "resources": resources,
            "devices": devices,
            "maskedPaths": masked,
            "readonlyPaths": readonly,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_and_args_follow_kubernetes_rules() {
        let image = ImageConfig {
            entrypoint: vec!["/ep".into()],
            cmd: vec!["a".into()],
            ..Default::default()
        };
        let mut c = ContainerConfig::default();
        assert_eq!(process_args(&c, &image), ["/ep", "a"]);
        c.args = vec!["b".into()];
        assert_eq!(process_args(&c, &image), ["/ep", "b"]);
        c.command = vec!["/x".into()];
        assert_eq!(process_args(&c, &image), ["/x", "b"]);
        c.args.clear();
        assert_eq!(
            process_args(&c, &image),
            ["/x"],
            "command alone drops the image cmd"
        );
    }

    #[test]
    fn environment_and_users() {
        let image = ImageConfig {
            env: vec!["A=1".into(), "B=2".into()],
            ..Default::default()
        };
        let c = ContainerConfig {
            env: vec!["B=3".into()],
            ..Default::default()
        };
        assert_eq!(environment(&c, &image), [DEFAULT_PATH, "A=1", "B=3"]);
        assert_eq!(numeric_user("1000"), Some((1000, None)));
        assert_eq!(numeric_user("1000:50"), Some((1000, Some(50))));
        assert_eq!(numeric_user("nobody"), None);
    }

    /// Root with `caps`, no devices, the default seccomp profile.
    fn as_root(caps: &[String]) -> Privileges<'_> {
        Privileges {
            user: (0, 0),
            caps,
            devices: &[],
            profile: Profile::RuntimeDefault,
        }
    }

    fn sandbox_paths() -> SandboxPaths {
        SandboxPaths {
            pause_pid: 42,
            share_pid: false,
            host: HostNamespaces::default(),
            target_pid: None,
            hosts: "/h".into(),
            hostname: "/n".into(),
            resolv_conf: "/r".into(),
            shm: "/s".into(),
        }
    }

    #[test]
    fn container_spec_values() {
        let sb = sandbox_paths();
        let c = ContainerConfig {
            resources: Resources {
                cpu_request: Some(100),
                cpu_limit: Some(500),
                memory_limit: Some(64 << 20),
                ..Default::default()
            },
            ..Default::default()
        };
        let caps = capabilities(&[], &[]).expect("defaults");
        let s = container(&c, &ImageConfig::default(), &sb, "/k/p/c", 992, as_root(&caps));
        assert_eq!(
            s["linux"]["resources"]["cpu"],
            json!({"shares": 102, "quota": 50000, "period": 100000})
        );
        assert_eq!(s["linux"]["resources"]["memory"]["limit"], json!(67108864));
        assert_eq!(s["linux"]["resources"]["unified"]["memory.oom.group"], "1");
        assert_eq!(s["linux"]["namespaces"][3]["path"], "/proc/42/ns/net");
        assert_eq!(s["linux"]["namespaces"][0], json!({"type": "pid"}));
        assert_eq!(
            s["process"]["noNewPrivileges"], true,
            "seccomp implies no_new_privs"
        );
        assert_eq!(s["process"]["oomScoreAdj"], 992);
        assert!(
            !s["process"]["capabilities"]["bounding"]
                .as_array()
                .expect("caps")
                .contains(&json!("CAP_MKNOD"))
        );
    }

    /// Privileged: nothing masked, /sys and cgroupfs writable, the devices given, no seccomp
    /// (so no implied no_new_privs); unprivileged: the opposite. Localhost profiles are refused.
    #[test]
    fn privileged_containers_are_unconfined() {
        let sb = sandbox_paths();
        let dev = json!({"path": "/dev/vda", "type": "b", "major": 254, "minor": 0});
        let mount_opts = |s: &Value, dest: &str| -> Vec<Value> {
            s["mounts"]
                .as_array()
                .expect("mounts")
                .iter()
                .find(|m| m["destination"] == dest)
                .and_then(|m| m["options"].as_array().cloned())
                .expect(dest)
        };
        for privileged in [false, true] {
            let c = ContainerConfig {
                privileged,
                ..Default::default()
            };
            let caps = if privileged {
                privileged_capabilities()
            } else {
                capabilities(&[], &[]).expect("defaults")
            };
            let devices = if privileged { vec![dev.clone()] } else { Vec::new() };
            let granted = Privileges {
                user: (0, 0),
                caps: &caps,
                devices: &devices,
                profile: effective_profile(&c).expect("profile"),
            };
            let s = container(&c, &ImageConfig::default(), &sb, "/c", 0, granted);
            let ro = json!("ro");
            assert_eq!(mount_opts(&s, "/sys").contains(&ro), !privileged);
            assert_eq!(mount_opts(&s, "/sys/fs/cgroup").contains(&ro), !privileged);
            assert_eq!(
                s["linux"]["maskedPaths"].as_array().expect("masked").is_empty(),
                privileged
            );
            assert_eq!(
                s["linux"]["readonlyPaths"].as_array().expect("ro").is_empty(),
                privileged
            );
            assert_eq!(s["linux"]["devices"], json!(devices));
            assert_eq!(s["process"]["noNewPrivileges"], json!(!privileged));
            let bounding = s["process"]["capabilities"]["bounding"]
                .as_array()
                .expect("caps")
                .len();
            assert_eq!(
                bounding,
                if privileged {
                    ALL_CAPS.len()
                } else {
                    DEFAULT_CAPS.len()
                }
            );
            let profile = effective_profile(&c).expect("profile");
            assert_eq!(
                profile,
                if privileged {
                    Profile::Unconfined
                } else {
                    Profile::RuntimeDefault
                }
            );
        }
        let local = ContainerConfig {
            seccomp: Profile::Localhost,
            ..Default::default()
        };
        assert!(effective_profile(&local).is_err());
        assert_eq!(
            effective_profile(&ContainerConfig {
                privileged: true,
                ..local
            })
            .expect("privileged"),
            Profile::Unconfined
        );
    }

    /// This machine's /dev: /dev/null is there as c 1:3, nothing of pts or the console is.
    #[test]
    fn host_devices_lists_device_nodes() {
        let devs = host_devices(std::path::Path::new("/dev")).expect("lists /dev");
        let null = devs.iter().find(|d| d["path"] == "/dev/null").expect("/dev/null");
        assert_eq!(
            (null["type"].clone(), null["major"].clone(), null["minor"].clone()),
            (json!("c"), json!(1), json!(3))
        );
        assert!(devs.iter().all(|d| {
            let p = d["path"].as_str().unwrap_or("");
            !p.starts_with("/dev/pts/")
                && p != "/dev/console"
                && p != "/dev/ptmx"
                && (d["type"] == "c" || d["type"] == "b")
        }));
    }

    #[test]
    fn capabilities_follow_containerd_order() {
        let v = |xs: &[&str]| xs.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        let defaults = capabilities(&[], &[]).expect("defaults");
        assert_eq!(defaults.len(), DEFAULT_CAPS.len());
        assert!(!defaults.contains(&"CAP_NET_RAW".to_string()));
        assert!(!defaults.contains(&"CAP_MKNOD".to_string()));
        // (add, drop, what must be in, what must be out)
        type Case<'a> = (&'a [&'a str], &'a [&'a str], &'a [&'a str], &'a [&'a str]);
        let cases: &[Case] = &[
            (&["NET_RAW"], &[], &["CAP_NET_RAW", "CAP_CHOWN"], &[]),
            (
                &["net_admin", "CAP_SYS_TIME"],
                &["chown"],
                &["CAP_NET_ADMIN", "CAP_SYS_TIME"],
                &["CAP_CHOWN"],
            ),
            (
                &["NET_BIND_SERVICE"],
                &["ALL"],
                &["CAP_NET_BIND_SERVICE"],
                &["CAP_CHOWN", "CAP_KILL"],
            ),
            (
                &["ALL"],
                &["SYS_ADMIN"],
                &["CAP_BPF", "CAP_NET_RAW"],
                &["CAP_SYS_ADMIN", "CAP_MKNOD"],
            ),
        ];
        for (add, drop, has, lacks) in cases {
            let got = capabilities(&v(add), &v(drop)).expect("valid");
            for c in *has {
                assert!(
                    got.contains(&c.to_string()),
                    "{add:?} {drop:?}: {c} missing from {got:?}"
                );
            }
            for c in *lacks {
                assert!(!got.contains(&c.to_string()), "{add:?} {drop:?}: {c} in {got:?}");
            }
        }
        assert_eq!(
            capabilities(&[], &v(&["ALL"])).expect("none"),
            Vec::<String>::new()
        );
        // Kernel order, whatever the order asked.
        let got = capabilities(&v(&["SYS_TIME", "NET_ADMIN"]), &v(&["ALL"])).expect("valid");
        assert_eq!(got, ["CAP_NET_ADMIN", "CAP_SYS_TIME"]);
        let err = capabilities(&v(&["FLY"]), &[]).expect_err("unknown").to_string();
        assert!(err.contains("unknown capability \"FLY\""), "{err}");
        let err = capabilities(&v(&["MKNOD"]), &[]).expect_err("mknod").to_string();
        assert!(err.contains("cannot be granted"), "{err}");
    }

    #[test]
    fn the_pause_is_unprivileged_and_has_no_proc() {
        let s = sandbox("h", "/k/p", HostNamespaces::default());
        let dests: Vec<&str> = s["mounts"]
            .as_array()
            .expect("mounts")
            .iter()
            .filter_map(|m| m["destination"].as_str())
            .collect();
        assert_eq!(dests, ["/dev"]);
        // Set by the runtime in the pod's network namespace instead (no /proc to write them).
        assert_eq!(s["linux"].get("sysctl"), None);
        assert_eq!(s["root"]["readonly"], true);
        assert_eq!(s["process"]["user"], json!({"uid": 65535, "gid": 65535}));
        for set in ["bounding", "effective", "permitted"] {
            assert_eq!(s["process"]["capabilities"][set], json!([]), "{set}");
        }
        assert_eq!(s["process"]["noNewPrivileges"], true);
    }

    fn kinds(spec: &Value) -> Vec<String> {
        spec["linux"]["namespaces"]
            .as_array()
            .expect("namespaces")
            .iter()
            .map(|n| n["type"].as_str().expect("type").to_string())
            .collect()
    }

    #[test]
    fn pods_on_the_nodes_namespaces_keep_out_of_new_ones() {
        let own = sandbox("h", "/k/p", HostNamespaces::default());
        assert_eq!(kinds(&own), ["pid", "ipc", "uts", "network", "mount"]);
        assert_eq!(own["hostname"], "h");
        // hostNetwork: the node's network and UTS namespaces.
        let host = |network, pid, ipc| HostNamespaces { network, pid, ipc };
        let net = sandbox("h", "/k/p", host(true, false, false));
        assert_eq!(kinds(&net), ["pid", "ipc", "mount"]);
        assert!(
            net.get("hostname").is_none(),
            "no hostname without a UTS namespace"
        );
        assert_eq!(
            kinds(&sandbox("h", "/k/p", host(false, true, true))),
            ["uts", "network", "mount"]
        );
        // Containers join the pause's namespaces, or stay in the node's.
        let c = |host: HostNamespaces, share_pid| {
            let caps = capabilities(&[], &[]).expect("defaults");
            let sb = SandboxPaths {
                host,
                share_pid,
                ..sandbox_paths()
            };
            let defaults = ContainerConfig::default();
            kinds(&container(
                &defaults,
                &ImageConfig::default(),
                &sb,
                "/c",
                0,
                as_root(&caps),
            ))
        };
        let all = ["pid", "mount", "cgroup", "network", "uts", "ipc"];
        assert_eq!(c(HostNamespaces::default(), false), all);
        assert_eq!(
            c(host(true, false, false), true),
            ["pid", "mount", "cgroup", "ipc"]
        );
        assert_eq!(
            c(host(false, true, false), true),
            ["mount", "cgroup", "network", "uts", "ipc"]
        );
        assert_eq!(c(host(true, true, true), false), ["mount", "cgroup"]);
    }
}
