//! A real OCI distribution registry (Debian's `docker-registry`) on loopback, filled with the
//! project's test images through `skopeo` from an OCI layout the project writes itself.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use runtime::image::layout::{self, Entry, LayoutWriter, RawEntry};
use runtime::image::store::ImageConfig;

/// A running registry (killed on drop).
#[derive(Debug)]
pub struct TestRegistry {
    child: Child,
    pub port: u16,
    dir: tempfile::TempDir,
}

/// Starts `docker-registry` on a free port of 127.0.0.1 with its config, data and log in `dir`
/// (`htpasswd`, a line `user:bcrypt-hash`, turns on basic auth); waits until it listens.
/// `detached` puts it in its own process group so it outlives its parent's terminal.
pub fn spawn_registry(dir: &Path, htpasswd: Option<&str>, detached: bool) -> Result<(Child, u16)> {
    let port = crate::vm::free_port()?;
    let mut cfg = format!(
        "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: 127.0.0.1:{port}\n",
        dir.join("data").display()
    );
    if let Some(h) = htpasswd {
        std::fs::write(dir.join("htpasswd"), format!("{h}\n"))?;
        cfg.push_str(&format!(
            "auth:\n  htpasswd:\n    realm: nodeos-test\n    path: {}\n",
            dir.join("htpasswd").display()
        ));
    }
    std::fs::write(dir.join("config.yml"), cfg)?;
    let log = std::fs::File::create(dir.join("registry.log"))?;
    let mut cmd = Command::new("docker-registry");
    cmd.arg("serve")
        .arg(dir.join("config.yml"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log);
    if detached {
        use std::os::unix::process::CommandExt;
        cmd.process_group(0);
    }
    let mut child = cmd
        .spawn()
        .context("starting docker-registry (./build.sh setup installs it)")?;
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            bail!(
                "registry did not listen: {}",
                std::fs::read_to_string(dir.join("registry.log")).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok((child, port))
}

/// Copies `name` (all platforms) from an OCI layout into `repo:tag` of the registry at `host`.
pub fn push_image(
    host: &str,
    layout_dir: &Path,
    name: &str,
    target: &str,
    creds: Option<&str>,
) -> Result<()> {
    let mut cmd = Command::new("skopeo");
    cmd.args([
        "copy",
        "--quiet",
        "--all",
        "--dest-tls-verify=false",
        "--preserve-digests",
    ]);
    if let Some(c) = creds {
        cmd.arg(format!("--dest-creds={c}"));
    }
    let out = cmd
        .arg(format!("oci:{}:{name}", layout_dir.display()))
        .arg(format!("docker://{host}/{target}"))
        .output()
        .context("running skopeo (./build.sh setup installs it)")?;
    if !out.status.success() {
        bail!(
            "skopeo copy {name} -> {target}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

impl TestRegistry {
    /// Starts a registry on 127.0.0.1; `htpasswd` (a line `user:bcrypt-hash`) turns on basic auth.
    pub fn start(htpasswd: Option<&str>) -> Result<Self> {
        let dir = tempfile::tempdir()?;
        let (child, port) = spawn_registry(dir.path(), htpasswd, false)?;
        Ok(TestRegistry { child, port, dir })
    }

    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("registry.log")).unwrap_or_default()
    }

    /// Where the registry keeps a blob (tests corrupt it to check verification).
    pub fn blob_path(&self, digest: &str) -> PathBuf {
        let hex = digest.trim_start_matches("sha256:");
        self.dir
            .path()
            .join("data/docker/registry/v2/blobs/sha256")
            .join(&hex[..2])
            .join(hex)
            .join("data")
    }

    /// Copies `name` (all platforms) from an OCI layout into `repo:tag` here.
    pub fn push(&self, layout_dir: &Path, name: &str, target: &str, creds: Option<&str>) -> Result<()> {
        push_image(&self.host(), layout_dir, name, target, creds)
    }
}

impl Drop for TestRegistry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Debian's static busybox for an OCI architecture, fetched by `./build.sh setup` into
/// `$NODEOS_CACHE/busybox/<arch>/busybox`.
pub fn busybox_for(arch: &str) -> Result<PathBuf> {
    let cache = std::env::var_os("NODEOS_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| crate::vm::target_dir().join("cache"));
    let p = cache.join("busybox").join(arch).join("busybox");
    ensure!(
        p.exists(),
        "{} missing (./build.sh setup fetches busybox-static for both arches)",
        p.display()
    );
    Ok(p)
}

fn file(path: &str, data: &[u8]) -> Entry {
    Entry::File {
        path: path.into(),
        mode: 0o644,
        data: data.to_vec(),
    }
}

/// Writes the test images into an OCI layout at `dir`:
/// - `busybox:1`: an index over amd64 and arm64 (each the real static busybox of that arch),
///   `Cmd ["sh"]`, `PATH` in `Env`;
/// - `layered:1`: busybox plus a layer that deletes a file (whiteout) and one that replaces a
///   directory (opaque);
/// - `hostile/<case>:1`: busybox plus one hostile layer per case, see [`HOSTILE`];
///
/// every one an index over `arches`.
pub fn write_test_images(dir: &Path, arches: &[&str]) -> Result<()> {
    let mut w = LayoutWriter::new(dir)?;
    let config = ImageConfig {
        env: vec![runtime::spec::DEFAULT_PATH.into()],
        cmd: vec!["sh".into()],
        ..ImageConfig::default()
    };
    let add = layout::layer(&[
        Entry::Dir("data".into()),
        file("data/keep", b"lower"),
        file("data/gone", b"lower"),
        Entry::Dir("opaque".into()),
        file("opaque/old", b"lower"),
    ])?;
    let change = layout::layer(&[
        Entry::Dir("data".into()),
        file("data/.wh.gone", b""),
        Entry::Dir("opaque".into()),
        file("opaque/.wh..wh..opq", b""),
        file("opaque/new", b"upper"),
    ])?;
    let (mut plain, mut layered, mut hostile) = (Vec::new(), Vec::new(), vec![Vec::new(); HOSTILE.len()]);
    for arch in arches {
        let bb = layout::busybox_layer(&std::fs::read(busybox_for(arch)?)?)?;
        plain.push(w.image(arch, std::slice::from_ref(&bb), &config)?);
        layered.push(w.image(arch, &[bb.clone(), add.clone(), change.clone()], &config)?);
        for (i, (_, entries)) in HOSTILE.iter().enumerate() {
            hostile[i].push(w.image(arch, &[bb.clone(), hostile_layer(entries)?], &config)?);
        }
    }
    let d = w.multi_arch(&plain)?;
    w.tag("busybox:1", &d);
    let d = w.multi_arch(&layered)?;
    w.tag("layered:1", &d);
    for (i, (case, _)) in HOSTILE.iter().enumerate() {
        let d = w.multi_arch(&hostile[i])?;
        w.tag(&format!("hostile/{case}:1"), &d);
    }
    w.finish()?;
    Ok(())
}

/// Hostile layer cases: (name, entries as (path, kind, data/target)); kinds 'f' file, 'l'
/// symlink, 'h' hard link, 'c' character device.
pub const HOSTILE: &[(&str, &[RawEntry<'static>])] = &[
    ("dotdot", &[("../../../../tmp/escaped", 'f', "pwned")]),
    ("absolute", &[("/tmp/escaped", 'f', "pwned")]),
    (
        "symlink-escape",
        &[("evil", 'l', "/tmp"), ("evil/escaped", 'f', "pwned")],
    ),
    ("hardlink-escape", &[("pw", 'h', "../../../../etc/passwd")]),
    ("device-node", &[("dev-mem", 'c', "")]),
];

/// A gzip'd hostile layer.
pub fn hostile_layer(entries: &[RawEntry<'_>]) -> Result<(Vec<u8>, String)> {
    Ok(layout::gzip_layer(&layout::raw_tar(entries)?)?)
}
