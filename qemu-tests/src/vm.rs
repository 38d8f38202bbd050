//! QEMU guests for tests, benchmarks and `./build.sh run`.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};

/// Guest architecture.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    X86_64,
    Aarch64,
}

impl Arch {
    /// Both architectures.
    pub const ALL: [Arch; 2] = [Arch::X86_64, Arch::Aarch64];

    /// The name used in `out/<arch>/`.
    pub fn name(self) -> &'static str {
        match self {
            Arch::X86_64 => "x86_64",
            Arch::Aarch64 => "aarch64",
        }
    }

    /// Parses `x86_64` or `aarch64`.
    pub fn parse(s: &str) -> Result<Self> {
        match s {
            "x86_64" => Ok(Arch::X86_64),
            "aarch64" => Ok(Arch::Aarch64),
            other => bail!("unknown arch {other:?} (x86_64 or aarch64)"),
        }
    }

    /// The QEMU system emulator of this arch.
    pub fn qemu(self) -> &'static str {
        match self {
            Arch::X86_64 => "qemu-system-x86_64",
            Arch::Aarch64 => "qemu-system-aarch64",
        }
    }

    fn machine_args(self) -> Vec<String> {
        let v: &[&str] = match self {
            Arch::X86_64 => &["-M", "q35", "-cpu", "max"],
            // pauth-impdef: the architected pointer-auth algorithm is very slow under TCG.
            Arch::Aarch64 => &["-M", "virt", "-cpu", "max,pauth-impdef=on"],
        };
        v.iter().map(|s| s.to_string()).collect()
    }

    /// UEFI firmware code and variable-store template.
    fn firmware(self) -> (&'static str, &'static str) {
        match self {
            Arch::X86_64 => (
                "/usr/share/OVMF/OVMF_CODE_4M.fd",
                "/usr/share/OVMF/OVMF_VARS_4M.fd",
            ),
            Arch::Aarch64 => ("/usr/share/AAVMF/AAVMF_CODE.fd", "/usr/share/AAVMF/AAVMF_VARS.fd"),
        }
    }
}

/// How the guest boots.
#[derive(Debug, Clone)]
pub enum Boot {
    /// QEMU loads kernel and initramfs directly (`-kernel`, `-initrd`, `-append`).
    Direct {
        kernel: PathBuf,
        initrd: PathBuf,
        cmdline: String,
    },
    /// UEFI firmware boots the disk image (the ESP fallback path, slot A).
    Uefi { disk: PathBuf },
}

/// A NIC on QEMU user networking (always `restrict=on`), with host port forwards to the guest.
#[derive(Debug, Clone, Default)]
pub struct Nic {
    /// The NIC's MAC address (QEMU picks one when None).
    pub mac: Option<String>,
    /// (host port on 127.0.0.1, guest port)
    pub forwards: Vec<(u16, u16)>,
    /// Guest-side services reaching the host: (guest IP, guest port, host port on 127.0.0.1).
    /// Each guest connection runs `nodeos-vm relay 127.0.0.1:<host port>`.
    pub guest_forwards: Vec<(String, u16, u16)>,
}

/// A NIC on a LAN shared by several VMs: UDP datagrams on 127.0.0.1 to and from a
/// `nodeos-vm switch` (QEMU's `dgram` netdev), so VM-to-VM traffic never leaves the host's
/// loopback.
#[derive(Debug, Clone)]
pub struct Lan {
    pub mac: String,
    /// The VM's own UDP port.
    pub local_port: u16,
    /// The switch's UDP port.
    pub switch_port: u16,
}

/// What to build.
#[derive(Debug, Clone)]
pub struct VmConfig {
    pub arch: Arch,
    pub boot: Boot,
    pub memory_mib: u32,
    pub cpus: u32,
    /// JSON machine config, passed as fw_cfg `opt/nodeos/config`.
    pub fw_cfg: Option<String>,
    pub extra_disks: Vec<PathBuf>,
    pub nics: Vec<Nic>,
    /// A NIC on a shared LAN, after the user-networking NICs.
    pub lan: Option<Lan>,
}

impl VmConfig {
    /// Direct kernel boot of the images in `out/<arch>/`.
    pub fn direct(out: &Path, arch: Arch) -> Result<Self> {
        let dir = out.join(arch.name());
        let cmdline = std::fs::read_to_string(dir.join("cmdline"))
            .with_context(|| format!("no images in {} (run ./build.sh image)", dir.display()))?;
        Ok(Self::new(
            arch,
            Boot::Direct {
                kernel: dir.join("vmlinuz"),
                initrd: dir.join("initramfs.img"),
                cmdline,
            },
        ))
    }

    /// UEFI boot of `out/<arch>/disk.qcow2`.
    pub fn uefi(out: &Path, arch: Arch) -> Self {
        Self::new(
            arch,
            Boot::Uefi {
                disk: out.join(arch.name()).join("disk.qcow2"),
            },
        )
    }

    fn new(arch: Arch, boot: Boot) -> Self {
        Self {
            arch,
            boot,
            memory_mib: 512,
            cpus: 1,
            fw_cfg: None,
            extra_disks: Vec::new(),
            nics: vec![Nic::default()],
            lan: None,
        }
    }

    #[must_use]
    pub fn with_fw_cfg(mut self, json: impl Into<String>) -> Self {
        self.fw_cfg = Some(json.into());
        self
    }

    #[must_use]
    pub fn with_memory_mib(mut self, mib: u32) -> Self {
        self.memory_mib = mib;
        self
    }

    #[must_use]
    pub fn with_nics(mut self, nics: Vec<Nic>) -> Self {
        self.nics = nics;
        self
    }

    #[must_use]
    pub fn with_lan(mut self, lan: Lan) -> Self {
        self.lan = Some(lan);
        self
    }

    /// Attaches a raw disk (a virtio disk after the others).
    #[must_use]
    pub fn with_extra_disk(mut self, path: &Path) -> Self {
        self.extra_disks.push(path.to_path_buf());
        self
    }

    #[must_use]
    pub fn with_cpus(mut self, cpus: u32) -> Self {
        self.cpus = cpus;
        self
    }

    /// Appends files to the initramfs (direct boot only): the node's `initramfs.img` followed by
    /// an uncompressed cpio of `files` ((path in the guest, node, mode)), written to `dir`.
    /// The kernel unpacks concatenated archives in order.
    pub fn with_extra_initrd(
        mut self,
        dir: &Path,
        files: &[(String, image::cpio::Node, u32)],
    ) -> Result<Self> {
        if let Boot::Direct { initrd, .. } = &mut self.boot {
            let mut bytes =
                std::fs::read(&*initrd).with_context(|| format!("reading {}", initrd.display()))?;
            while bytes.len() % 4 != 0 {
                bytes.push(0);
            }
            let mut extra = image::cpio::Archive::new(0);
            for (path, node, mode) in files {
                extra.add(path, node.clone(), *mode);
            }
            extra.write_to(&mut bytes)?;
            let out = dir.join(format!("initramfs-{}.img", self.arch.name()));
            std::fs::write(&out, bytes)?;
            *initrd = out;
        }
        Ok(self)
    }

    /// Appends to the kernel command line (direct boot only).
    #[must_use]
    pub fn with_cmdline_extra(mut self, extra: &str) -> Self {
        if let Boot::Direct { cmdline, .. } = &mut self.boot {
            cmdline.push(' ');
            cmdline.push_str(extra);
        }
        self
    }
}

/// Builds VMs for one test and owns them: all are killed on drop; their logs (serial console,
/// QEMU arguments and stderr) stay under `<target>/qemu-tests/<name>/` until the test runs again.
#[derive(Debug)]
pub struct VmFactory {
    dir: PathBuf,
    count: usize,
}

/// The images directory: `NODEOS_OUT`, else `out/` at the workspace root.
pub fn out_dir() -> PathBuf {
    std::env::var_os("NODEOS_OUT")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../out"))
}

/// The `nodeos-vm` binary (it carries the guestfwd relay).
pub fn relay_bin() -> PathBuf {
    target_dir().join("debug/nodeos-vm")
}

/// The target directory of this workspace (`CARGO_TARGET_DIR` or `target/`).
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"))
}

impl VmFactory {
    /// A factory whose logs go to `<target>/qemu-tests/<name>/`.
    pub fn new(name: &str) -> Result<Self> {
        let dir = target_dir().join("qemu-tests").join(name);
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(Self { dir, count: 0 })
    }

    /// The directory holding this factory's logs.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Starts a VM.
    pub fn start(&mut self, cfg: &VmConfig) -> Result<Vm> {
        self.count += 1;
        let vm_dir = self.dir.join(format!("vm{}-{}", self.count, cfg.arch.name()));
        std::fs::create_dir_all(&vm_dir)?;
        Vm::start(cfg, vm_dir)
    }
}

impl Drop for VmFactory {
    fn drop(&mut self) {
        // Logs stay (tests that fail by returning an error do not panic, so the factory cannot
        // tell); the next run of the same test starts by removing them.
        if std::thread::panicking() {
            eprintln!("qemu-tests: logs kept in {}", self.dir.display());
        }
    }
}

/// A running guest.
#[derive(Debug)]
pub struct Vm {
    child: Child,
    dir: PathBuf,
    serial: PathBuf,
    qmp: PathBuf,
    started: Instant,
    /// Host ports forwarded to the guest, as configured.
    pub forwards: Vec<(u16, u16)>,
}

/// Writes a blank disk holding only the node's state partition (GPT name `nodeos-state`, 2 MiB),
/// as the disk image has one: attached to a direct-booted node, it keeps the node's identity
/// across reboots. An existing file is left as it is (the node's record).
pub fn state_disk(path: &Path) -> Result<()> {
    if path.exists() {
        return Ok(());
    }
    let disk = image::disk::build_gpt(
        &path.display().to_string(),
        &[image::disk::Partition {
            name: "nodeos-state".into(),
            type_guid: image::disk::LINUX_DATA_TYPE.into(),
            size_mib: 2,
            contents: Vec::new(),
        }],
    )?;
    std::fs::write(path, disk).with_context(|| format!("writing {}", path.display()))
}

/// A free TCP port on 127.0.0.1.
pub fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Host ports forwarded to a guest: (host port on 127.0.0.1, guest port).
pub type Forwards = Vec<(u16, u16)>;

/// The QEMU command line of `cfg` with its logs (serial console, QMP socket, machine config) in
/// `dir`, and the host ports forwarded to the guest.
pub fn qemu_args(cfg: &VmConfig, dir: &Path) -> Result<(Vec<String>, Forwards)> {
    {
        let serial = dir.join("serial.log");
        let qmp = dir.join("qmp.sock");
        let mut args: Vec<String> = cfg.arch.machine_args();
        args.extend(
            [
                "-accel",
                "tcg",
                "-nodefaults",
                "-no-reboot",
                "-display",
                "none",
                "-m",
            ]
            .iter()
            .map(|s| s.to_string()),
        );
        args.push(cfg.memory_mib.to_string());
        args.extend(["-smp".into(), cfg.cpus.to_string()]);
        args.extend(["-serial".into(), format!("file:{}", serial.display())]);
        args.extend([
            "-qmp".into(),
            format!("unix:{},server=on,wait=off", qmp.display()),
        ]);
        match &cfg.boot {
            Boot::Direct {
                kernel,
                initrd,
                cmdline,
            } => {
                for (flag, p) in [("-kernel", kernel), ("-initrd", initrd)] {
                    if !p.exists() {
                        bail!("{} not found (run ./build.sh image)", p.display());
                    }
                    args.extend([flag.into(), p.display().to_string()]);
                }
                args.extend(["-append".into(), cmdline.trim().to_string()]);
            }
            Boot::Uefi { disk } => {
                if !disk.exists() {
                    bail!("{} not found (run ./build.sh image)", disk.display());
                }
                let (code, vars) = cfg.arch.firmware();
                let vars_copy = dir.join("efivars.fd");
                std::fs::copy(vars, &vars_copy)
                    .with_context(|| format!("copying {vars} (run ./build.sh setup)"))?;
                args.extend([
                    "-drive".into(),
                    format!("if=pflash,format=raw,unit=0,readonly=on,file={code}"),
                ]);
                args.extend([
                    "-drive".into(),
                    format!("if=pflash,format=raw,unit=1,file={}", vars_copy.display()),
                ]);
                args.extend([
                    "-drive".into(),
                    format!("if=virtio,format=qcow2,snapshot=on,file={}", disk.display()),
                ]);
            }
        }
        for (i, d) in cfg.extra_disks.iter().enumerate() {
            args.extend([
                "-drive".into(),
                format!("if=virtio,format=raw,id=extra{i},file={}", d.display()),
            ]);
        }
        let mut forwards = Vec::new();
        for (i, nic) in cfg.nics.iter().enumerate() {
            // restrict=on: the guest can reach nothing through the host; forwards still work.
            let mut netdev = format!("user,id=n{i},restrict=on");
            for (host, guest) in &nic.forwards {
                netdev.push_str(&format!(",hostfwd=tcp:127.0.0.1:{host}-:{guest}"));
                forwards.push((*host, *guest));
            }
            for (ip, port, host) in &nic.guest_forwards {
                netdev.push_str(&format!(
                    ",guestfwd=tcp:{ip}:{port}-cmd:{} relay 127.0.0.1:{host}",
                    relay_bin().display()
                ));
            }
            let mac = nic.mac.as_ref().map(|m| format!(",mac={m}")).unwrap_or_default();
            args.extend([
                "-netdev".into(),
                netdev,
                "-device".into(),
                format!("virtio-net-pci,netdev=n{i}{mac}"),
            ]);
        }
        if let Some(lan) = &cfg.lan {
            args.extend([
                "-netdev".into(),
                format!(
                    "dgram,id=lan,local.type=inet,local.host=127.0.0.1,local.port={},remote.type=inet,remote.host=127.0.0.1,remote.port={}",
                    lan.local_port, lan.switch_port
                ),
                "-device".into(),
                format!("virtio-net-pci,netdev=lan,mac={}", lan.mac),
            ]);
        }
        if let Some(json) = &cfg.fw_cfg {
            let path = dir.join("machine-config.json");
            std::fs::write(&path, json)?;
            args.extend([
                "-fw_cfg".into(),
                format!("name=opt/nodeos/config,file={}", path.display()),
            ]);
        }
        Ok((args, forwards))
    }
}

impl Vm {
    fn start(cfg: &VmConfig, dir: PathBuf) -> Result<Self> {
        let serial = dir.join("serial.log");
        let qmp = dir.join("qmp.sock");
        let (args, forwards) = qemu_args(cfg, &dir)?;
        std::fs::write(dir.join("qemu.args"), args.join("\n"))?;
        let stderr = std::fs::File::create(dir.join("qemu.stderr"))?;
        let child = Command::new(cfg.arch.qemu())
            .args(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .with_context(|| format!("starting {} (run ./build.sh setup)", cfg.arch.qemu()))?;
        Ok(Self {
            child,
            dir,
            serial,
            qmp,
            started: Instant::now(),
            forwards,
        })
    }

    /// Seconds since QEMU was started.
    pub fn uptime(&self) -> Duration {
        self.started.elapsed()
    }

    /// The serial console so far.
    pub fn console(&self) -> String {
        let mut s = String::new();
        if let Ok(mut f) = std::fs::File::open(&self.serial) {
            let mut bytes = Vec::new();
            let _ = f.read_to_end(&mut bytes);
            s = String::from_utf8_lossy(&bytes).into_owned();
        }
        s
    }

    /// Waits until a console line contains `needle`; returns that line. Fails early if QEMU exits
    /// or the kernel panics.
    pub fn wait_for_line(&mut self, needle: &str, timeout: Duration) -> Result<String> {
        self.wait_for_lines(needle, 1, timeout).map(|mut v| v.remove(0))
    }

    /// Waits until `n` console lines contain `needle`; returns them.
    pub fn wait_for_lines(&mut self, needle: &str, n: usize, timeout: Duration) -> Result<Vec<String>> {
        let deadline = Instant::now() + timeout;
        loop {
            let text = self.console();
            let hits: Vec<String> = text
                .lines()
                .filter(|l| l.contains(needle))
                .map(|l| l.trim_end().to_string())
                .collect();
            if hits.len() >= n {
                return Ok(hits.into_iter().take(n).collect());
            }
            if text.contains("Kernel panic") {
                bail!(
                    "kernel panic while waiting for {needle:?}; console:\n{}",
                    tail(&text, 40)
                );
            }
            if let Some(status) = self.child.try_wait()? {
                bail!(
                    "QEMU exited ({status}) while waiting for {needle:?}; console:\n{}",
                    tail(&text, 40)
                );
            }
            if Instant::now() > deadline {
                bail!(
                    "timed out after {timeout:?} waiting for {n} x {needle:?}; console:\n{}",
                    tail(&text, 40)
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Sends one QMP command (e.g. `system_powerdown`) and returns the reply.
    pub fn qmp(&self, command: &str, arguments: Option<serde_json::Value>) -> Result<serde_json::Value> {
        qmp_command(&self.qmp, command, arguments)
    }

    /// Waits for QEMU to exit on its own.
    pub fn wait_exit(&mut self, timeout: Duration) -> Result<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(s) = self.child.try_wait()? {
                return Ok(s);
            }
            if Instant::now() > deadline {
                return Err(anyhow!(
                    "QEMU still running after {timeout:?}; console:\n{}",
                    tail(&self.console(), 40)
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The VM's log directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for Vm {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Sends one QMP command to the QMP socket at `socket` and returns the reply.
pub fn qmp_command(
    socket: &Path,
    command: &str,
    arguments: Option<serde_json::Value>,
) -> Result<serde_json::Value> {
    let mut stream =
        UnixStream::connect(socket).with_context(|| format!("connecting to {}", socket.display()))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut line = String::new();
    reader.read_line(&mut line)?; // greeting
    stream.write_all(b"{\"execute\":\"qmp_capabilities\"}\n")?;
    line.clear();
    reader.read_line(&mut line)?;
    let mut cmd = serde_json::json!({ "execute": command });
    if let Some(a) = arguments {
        cmd["arguments"] = a;
    }
    stream.write_all(format!("{cmd}\n").as_bytes())?;
    loop {
        line.clear();
        if reader.read_line(&mut line)? == 0 {
            bail!("QMP closed before replying to {command}");
        }
        let v: serde_json::Value = serde_json::from_str(&line)?;
        if let Some(e) = v.get("error") {
            bail!("QMP {command}: {e}");
        }
        if v.get("return").is_some() {
            return Ok(v);
        }
    }
}

/// The last `n` lines of `text`.
pub fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Parses `key=<number>` out of a console line.
pub fn field_u64(line: &str, key: &str) -> Option<u64> {
    let pat = format!("{key}=");
    let start = line.find(&pat)? + pat.len();
    line[start..]
        .split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_parse() {
        assert_eq!(
            field_u64("init: ready boot_ms=1234 power_buttons=1", "boot_ms"),
            Some(1234)
        );
        assert_eq!(field_u64("x restart_in_ms=800", "restart_in_ms"), Some(800));
        assert_eq!(field_u64("nothing", "boot_ms"), None);
    }

    #[test]
    fn tail_keeps_last_lines() {
        assert_eq!(tail("a\nb\nc", 2), "b\nc");
    }
}
