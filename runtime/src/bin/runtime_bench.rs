//! The runtime benchmark, run inside a node VM as the machine config's test command.
//!
//! Same guest, same busybox root file system, payload `true`:
//! - `ours`: CreateContainer → StartContainer → WaitContainer → RemoveContainer through the
//!   node's runtime process, in an existing sandbox;
//! - `runc`, `crun` (Debian's packages, appended to the initramfs with their libraries):
//!   `create` → `start` → wait for the exit → `delete`, on an OCI bundle over the same layer;
//! - `pod`: RunSandbox → CreateContainer → StartContainer (running) → RemoveSandbox;
//! - the runtime process's RSS idle and with 30 pods (a sleeping container each).
//!
//! Prints `BENCH {json}` per measurement and `BENCH done`.
//! Usage: `runtime-bench --registry HOST:PORT [--runs N]`

#![forbid(unsafe_code)]

use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use runtime::image::http;
use runtime::image::store::{ImageStore, PullOptions};
use runtime_api::{Client, ContainerConfig, SandboxConfig};

type R<T = ()> = Result<T, String>;

const BENCH_ROOT: &str = "/usr/lib/nodeos-test/bench/root";
const WORK: &str = "/run/bench";

fn err<E: std::fmt::Display>(ctx: &str) -> impl FnOnce(E) -> String + '_ {
    move |e| format!("{ctx}: {e}")
}

fn stats(name: &str, mut ms: Vec<f64>) -> serde_json::Value {
    ms.sort_by(f64::total_cmp);
    let pct = |p: f64| ms[((ms.len() as f64 - 1.0) * p).round() as usize];
    let v = serde_json::json!({
        "name": name, "runs": ms.len(), "median_ms": pct(0.5), "p90_ms": pct(0.9),
        "min_ms": ms[0], "max_ms": ms[ms.len() - 1],
    });
    println!("BENCH {v}");
    v
}

/// Makes the Debian binaries' loader and libraries visible at their usual paths.
fn link_debian_root() -> R {
    let root = Path::new(BENCH_ROOT);
    for (link, target) in [("/lib", "lib"), ("/lib64", "lib64")] {
        if root.join(target).exists() && !Path::new(link).exists() {
            symlink(root.join(target), link).map_err(err(link))?;
        }
    }
    for e in fs::read_dir(root.join("usr/lib"))
        .map_err(err("bench usr/lib"))?
        .flatten()
    {
        let dst = Path::new("/usr/lib").join(e.file_name());
        if !dst.exists() {
            symlink(e.path(), &dst).map_err(err("usr/lib link"))?;
        }
    }
    Ok(())
}

/// An OCI bundle for runc/crun: an overlay over the busybox layer, the same spec shape as ours.
fn bundle(lower: &Path) -> R<PathBuf> {
    let b = Path::new(WORK).join("bundle");
    for d in ["rootfs", "upper", "work"] {
        fs::create_dir_all(b.join(d)).map_err(err("bundle dirs"))?;
    }
    let opts = format!(
        "lowerdir={},upperdir={},workdir={}",
        lower.display(),
        b.join("upper").display(),
        b.join("work").display()
    );
    nix::mount::mount(
        Some("overlay"),
        &b.join("rootfs"),
        Some("overlay"),
        nix::mount::MsFlags::empty(),
        Some(opts.as_str()),
    )
    .map_err(err("bundle overlay"))?;
    for d in ["proc", "dev", "sys"] {
        fs::create_dir_all(b.join("rootfs").join(d)).map_err(err("rootfs dirs"))?;
    }
    let spec = serde_json::json!({
        "ociVersion": "1.0.2",
        "process": {
            "terminal": false, "user": {"uid": 0, "gid": 0}, "args": ["true"],
            "env": ["PATH=/bin"], "cwd": "/",
            "capabilities": {"bounding": runtime::spec::DEFAULT_CAPS, "effective": runtime::spec::DEFAULT_CAPS,
                             "permitted": runtime::spec::DEFAULT_CAPS},
            "noNewPrivileges": true,
        },
        "root": {"path": "rootfs", "readonly": true},
        "hostname": "bench",
        "mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc", "options": ["nosuid", "noexec", "nodev"]},
            {"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]},
        ],
        "linux": {
            "namespaces": [{"type": "pid"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"}, {"type": "network"}],
            "cgroupsPath": "/nodeos-bench/ctr",
            "maskedPaths": runtime::spec::MASKED_PATHS,
            "readonlyPaths": runtime::spec::READONLY_PATHS,
        },
    });
    fs::write(b.join("config.json"), spec.to_string()).map_err(err("config.json"))?;
    Ok(b)
}

/// Runs a runtime CLI command. Its stdio is not a pipe: `create` hands its stdio to the
/// container, which would hold a pipe open until it exits.
fn run_ok(cmd: &mut Command, what: &str) -> R {
    let errfile = format!("{WORK}/stderr");
    let stderr = fs::File::create(&errfile).map_err(err("stderr file"))?;
    let status = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr)
        .status()
        .map_err(err(what))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!(
            "{what}: {status} {}",
            fs::read_to_string(&errfile).unwrap_or_default().trim()
        ))
    }
}

/// One create → start → exit → delete cycle of an OCI CLI runtime (runc, crun).
fn oci_cycle(bin: &Path, bundle: &Path, id: &str) -> R<f64> {
    let state = format!(
        "{WORK}/state-{}",
        bin.file_name().and_then(|n| n.to_str()).unwrap_or("x")
    );
    let pidfile = format!("{WORK}/{id}.pid");
    let t0 = Instant::now();
    run_ok(
        Command::new(bin)
            .args(["--root", &state, "create", "--bundle"])
            .arg(bundle)
            .args(["--pid-file", &pidfile, id]),
        "create",
    )?;
    let pid: i32 = fs::read_to_string(&pidfile)
        .map_err(err("pid file"))?
        .trim()
        .parse()
        .map_err(err("pid"))?;
    run_ok(Command::new(bin).args(["--root", &state, "start", id]), "start")?;
    // We are a subreaper: the container process is reparented to us when the runtime exits.
    nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid), None).map_err(err("waitpid"))?;
    run_ok(Command::new(bin).args(["--root", &state, "delete", id]), "delete")?;
    Ok(t0.elapsed().as_secs_f64() * 1000.0)
}

fn runtime_rss() -> R<u64> {
    for e in fs::read_dir("/proc").map_err(err("proc"))?.flatten() {
        let cmdline = fs::read(e.path().join("cmdline")).unwrap_or_default();
        if cmdline.split(|b| *b == 0).nth(1) == Some(b"runtime") {
            let status = fs::read_to_string(e.path().join("status")).map_err(err("status"))?;
            let kb = status
                .lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
                .ok_or("VmRSS")?;
            return Ok(kb * 1024);
        }
    }
    Err("runtime process not found".into())
}

fn sandbox(name: &str, n: u32) -> SandboxConfig {
    SandboxConfig {
        name: name.into(),
        namespace: "bench".into(),
        uid: format!("00000000-0000-4000-9000-{n:012}"),
        log_directory: Some(PathBuf::from(format!("/var/log/pods/bench_{name}"))),
        ..Default::default()
    }
}

fn bench(registry: &str, runs: usize) -> R {
    fs::create_dir_all(WORK).map_err(err("work dir"))?;
    nix::sys::prctl::set_child_subreaper(true).map_err(err("subreaper"))?;
    let store = ImageStore::open(
        Path::new(runtime::IMAGE_ROOT),
        http::Client::new(b"").map_err(err("client"))?,
        vec![registry.into()],
    )
    .map_err(err("store"))?;
    let image = format!("{registry}/busybox:1");
    let rec = store.pull(&image, &PullOptions::default()).map_err(err("pull"))?;
    let mut client = Client::connect_wait(Path::new(runtime_api::SOCKET), Duration::from_secs(60))
        .map_err(err("connect"))?;
    let idle = runtime_rss()?;
    println!(
        "BENCH {}",
        serde_json::json!({"name": "runtime_rss_idle", "bytes": idle})
    );

    let ctr = |name: String| ContainerConfig {
        name,
        image: image.clone(),
        command: vec!["true".into()],
        ..Default::default()
    };
    // Ours: a container cycle in an existing sandbox.
    let sb = client
        .run_sandbox(sandbox("bench-ours", 0))
        .map_err(err("sandbox"))?;
    let mut ours = Vec::new();
    for i in 0..runs + 2 {
        let t0 = Instant::now();
        let c = client
            .create_container(&sb.id, ctr(format!("c{i}")))
            .map_err(err("create"))?;
        client.start_container(&c.id).map_err(err("start"))?;
        let st = client.wait_container(&c.id).map_err(err("wait"))?;
        client.remove_container(&c.id).map_err(err("remove"))?;
        if st.exit_code != Some(0) {
            return Err(format!("ours: exit {:?}", st.exit_code));
        }
        if i >= 2 {
            ours.push(t0.elapsed().as_secs_f64() * 1000.0);
        }
    }
    client.remove_sandbox(&sb.id).map_err(err("remove sandbox"))?;
    let ours = stats("ours_container_cycle", ours);

    link_debian_root()?;
    let b = bundle(&store.lower_dirs(&rec)[0])?;
    let mut cli = serde_json::Map::new();
    for bin in ["usr/sbin/runc", "usr/bin/crun"] {
        let path = Path::new(BENCH_ROOT).join(bin);
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("x")
            .to_string();
        let version = Command::new(&path)
            .arg("--version")
            .output()
            .map_err(err(&name))?;
        let version = String::from_utf8_lossy(&version.stdout)
            .lines()
            .next()
            .unwrap_or("")
            .to_string();
        let mut ms = Vec::new();
        for i in 0..runs + 2 {
            let t = oci_cycle(&path, &b, &format!("{name}-{i}")).map_err(|e| format!("{name}: {e}"))?;
            if i >= 2 {
                ms.push(t);
            }
        }
        let mut v = stats(&format!("{name}_container_cycle"), ms);
        v["version"] = serde_json::json!(version);
        cli.insert(name, v);
    }
    let ratio =
        |k: &str| ours["median_ms"].as_f64().unwrap_or(0.0) / cli[k]["median_ms"].as_f64().unwrap_or(1.0);
    println!(
        "BENCH {}",
        serde_json::json!({"name": "ratios", "ours_vs_runc": ratio("runc"), "ours_vs_crun": ratio("crun"),
            "target_vs_runc": 0.5, "target_vs_crun": 1.2})
    );

    // Full pods.
    let mut pods = Vec::new();
    for i in 0..runs + 2 {
        let t0 = Instant::now();
        let sb = client
            .run_sandbox(sandbox(&format!("pod-{i}"), 100 + i as u32))
            .map_err(err("pod sandbox"))?;
        let mut cfg = ctr("app".into());
        cfg.command = vec!["sleep".into(), "1000".into()];
        let c = client.create_container(&sb.id, cfg).map_err(err("pod create"))?;
        client.start_container(&c.id).map_err(err("pod start"))?;
        client.remove_sandbox(&sb.id).map_err(err("pod remove"))?;
        if i >= 2 {
            pods.push(t0.elapsed().as_secs_f64() * 1000.0);
        }
    }
    stats("pod_create_running_deleted", pods);

    // RSS with 30 pods.
    let mut ids = Vec::new();
    for i in 0..30 {
        let sb = client
            .run_sandbox(sandbox(&format!("rss-{i}"), 1000 + i))
            .map_err(err("rss sandbox"))?;
        let mut cfg = ctr("app".into());
        cfg.command = vec!["sleep".into(), "1000".into()];
        let c = client.create_container(&sb.id, cfg).map_err(err("rss create"))?;
        client.start_container(&c.id).map_err(err("rss start"))?;
        ids.push(sb.id);
    }
    let loaded = runtime_rss()?;
    println!(
        "BENCH {}",
        serde_json::json!({"name": "runtime_rss_30_pods", "bytes": loaded})
    );
    for id in ids {
        client.remove_sandbox(&id).map_err(err("rss remove"))?;
    }
    Ok(())
}

fn main() {
    let _ = nix::sys::signal::SigSet::empty().thread_set_mask();
    let args: Vec<String> = std::env::args().collect();
    let arg = |k: &str| {
        args.iter()
            .position(|a| a == k)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let registry = arg("--registry").unwrap_or_default();
    let runs = arg("--runs").and_then(|r| r.parse().ok()).unwrap_or(20);
    match bench(&registry, runs) {
        Ok(()) => println!("BENCH done"),
        Err(e) => {
            println!("BENCH error: {e}");
            println!("BENCH done");
            std::process::exit(1);
        }
    }
}
