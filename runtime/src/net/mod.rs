//! Pod networking: a bridge on the node, one veth pair per pod (the pod end is `eth0` in the
//! sandbox's network namespace), addresses from the node's pod CIDR, and a default route via the
//! bridge. Spoken over rtnetlink (`netlink`, on `netlink-packet-route`; no `ip` binary on the node).
//!
//! The pod end is configured through a netlink socket opened inside the pod's namespace: the
//! runtime process enters it with `setns`, opens the socket and returns. That is safe only
//! because the runtime process has a single thread (see `server`).

use std::fs::File;
use std::io;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::os::fd::{AsFd, OwnedFd};

use nix::sched::{CloneFlags, setns};

pub mod netlink;
pub mod nft;

pub use netlink::{Interface, Netlink, NetlinkError};

/// The bridge pods attach to.
pub const BRIDGE: &str = "nodeos0";

/// An IPv4 network (address and prefix length).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Cidr {
    pub addr: Ipv4Addr,
    pub prefix: u8,
}

impl Cidr {
    pub fn parse(s: &str) -> Option<Self> {
        let (a, p) = s.split_once('/')?;
        let prefix: u8 = p.parse().ok()?;
        (1..=30).contains(&prefix).then_some(())?;
        let addr: Ipv4Addr = a.parse().ok()?;
        let mask = u32::MAX << (32 - prefix);
        Some(Cidr {
            addr: Ipv4Addr::from(u32::from(addr) & mask),
            prefix,
        })
    }

    /// The n-th address of the network (1 = the gateway).
    pub fn host(&self, n: u32) -> Option<Ipv4Addr> {
        let size = 1u32 << (32 - self.prefix);
        (n >= 1 && n < size - 1).then(|| Ipv4Addr::from(u32::from(self.addr) + n))
    }

    pub fn gateway(&self) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(self.addr) + 1)
    }

    /// Whether `ip` is in this network.
    pub fn contains(&self, ip: Ipv4Addr) -> bool {
        let mask = u32::MAX << (32 - self.prefix);
        u32::from(ip) & mask == u32::from(self.addr)
    }

    /// The lowest host address from .2 on that is not in `used`.
    pub fn allocate(&self, used: &[Ipv4Addr]) -> Option<Ipv4Addr> {
        (2..).map_while(|n| self.host(n)).find(|ip| !used.contains(ip))
    }
}

impl std::fmt::Display for Cidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

/// The host-side veth name of a sandbox (15 characters at most).
pub fn veth_name(sandbox_id: &str) -> String {
    format!("veth{}", &sandbox_id[..sandbox_id.len().min(11)])
}

/// Wires a sandbox: loopback up, veth pair, pod end `eth0` with `ip`, default route via the
/// bridge. On failure the pair is removed again.
pub fn attach(
    bridge: u32,
    cidr: &Cidr,
    sandbox_id: &str,
    pause_pid: i32,
    ip: Ipv4Addr,
) -> Result<(), NetlinkError> {
    let mut host = Netlink::open()?;
    let veth = veth_name(sandbox_id);
    host.create_veth(&veth, "eth0", pause_pid)?;
    let idx = host.index(&veth)?;
    let wired = (|| {
        host.set_controller(idx, bridge)?;
        // Hairpin: a pod's connection to its own host port is DNATed back to it while still
        // being bridged (br_netfilter), so the frame leaves through the port it came in by
        // (the kubelet's default `hairpin-veth` mode does the same).
        host.set_hairpin(idx)?;
        // Pods are IPv4 only: link-local IPv6 on both ends of every veth only costs the node
        // the kernel's address configuration work as each comes up (measured under TCG: 6-33
        // ms of kernel worker CPU per pod, in two bursts of 30 pods; a pod's start takes ~240).
        host.set_no_ipv6_link_local(idx)?;
        host.set_up(idx)?;
        let mut pod = Netlink::open_in(pause_pid)?;
        let lo = pod.index("lo")?;
        let eth0 = pod.index("eth0")?;
        pod.set_up(lo)?;
        pod.set_no_ipv6_link_local(eth0)?;
        pod.add_address(eth0, ip, cidr.prefix)?;
        pod.set_up(eth0)?;
        pod.add_default_route(cidr.gateway(), eth0)
    })();
    if wired.is_err() {
        let _ = host.delete_link(idx);
    }
    wired
}

/// Writes network sysctls (`net.*`: those belong to a network namespace) in the network
/// namespace of `pid`, through the node's `/proc`: the pause's mount namespace has no `/proc`.
pub fn set_sysctls(pid: i32, sysctls: &[(&str, &str)]) -> Result<(), NetlinkError> {
    in_netns(pid, || {
        for (key, value) in sysctls {
            let refused = |source| NetlinkError::Sysctl {
                key: key.to_string(),
                source,
            };
            if !key.starts_with("net.") || key.contains('/') || key.contains("..") {
                return Err(refused(io::Error::from(io::ErrorKind::InvalidInput)));
            }
            std::fs::write(format!("/proc/sys/{}", key.replace('.', "/")), value).map_err(refused)?;
        }
        Ok(())
    })
}

/// Runs `f` in the network namespace of `pid`, then returns to the caller's own. Only sound in
/// a single-threaded process (see `crate::server`): `setns` moves the calling thread only.
fn in_netns<T, E: From<NetlinkError>>(pid: i32, f: impl FnOnce() -> Result<T, E>) -> Result<T, E> {
    let netns = |source: io::Error| NetlinkError::Netns { pid, source };
    let own = File::open("/proc/thread-self/ns/net").map_err(netns)?;
    let target = File::open(format!("/proc/{pid}/ns/net")).map_err(netns)?;
    setns(target.as_fd(), CloneFlags::CLONE_NEWNET).map_err(|e| netns(e.into()))?;
    let r = f();
    setns(own.as_fd(), CloneFlags::CLONE_NEWNET).map_err(|e| netns(e.into()))?;
    r
}

/// How long [`dial_localhost`] waits for a loopback connection to be answered.
const CONNECT_WAIT_MS: u16 = 200;

/// Why [`dial_localhost`] found no connection.
#[derive(Debug, thiserror::Error)]
pub enum DialError {
    #[error(transparent)]
    Netns(#[from] NetlinkError),
    /// Both address families failed at once (in Go's words, as containerd reports them).
    #[error("IPv4: dial tcp4 127.0.0.1:{port}: connect: {v4} IPv6 dial tcp6 [::1]:{port}: connect: {v6}")]
    Refused { port: u16, v4: String, v6: String },
}

/// An errno as Go prints it (`connection refused`), other errors as they are.
fn go_text(e: &io::Error) -> String {
    match e.raw_os_error() {
        Some(n) => {
            let desc = nix::errno::Errno::from_raw(n).desc();
            let mut c = desc.chars();
            c.next()
                .map(|f| f.to_lowercase().chain(c).collect())
                .unwrap_or_default()
        }
        None => e.to_string(),
    }
}

/// A TCP socket connecting to `localhost:<port>` inside the network namespace of `pid`, as
/// containerd's port forward dials (IPv4 first, then IPv6). Non-blocking: the connection may
/// still be in progress (the caller waits until it is writable and reads its error); one that
/// fails at once (nothing listens) is tried on `::1` before giving up.
pub fn dial_localhost(pid: i32, port: u16) -> Result<OwnedFd, DialError> {
    use nix::sys::socket::{AddressFamily, SockFlag, SockType, SockaddrIn, SockaddrIn6, connect, socket};
    fn dial(family: AddressFamily, addr: &dyn nix::sys::socket::SockaddrLike) -> io::Result<OwnedFd> {
        use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
        let flags = SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC;
        let fd = socket(family, SockType::Stream, flags, None).map_err(io::Error::from)?;
        match connect(std::os::fd::AsRawFd::as_raw_fd(&fd), addr) {
            Ok(()) => return Ok(fd),
            Err(nix::errno::Errno::EINPROGRESS) => {}
            Err(e) => return Err(e.into()),
        }
        // On loopback the answer (accept or refusal) is there at once; a moment's wait lets a
        // refusal be told here, and a connection still pending after it (a full backlog) is
        // handed over to finish on the caller's side.
        let mut fds = [PollFd::new(fd.as_fd(), PollFlags::POLLOUT)];
        if poll(&mut fds, PollTimeout::from(CONNECT_WAIT_MS)).map_err(io::Error::from)? == 0 {
            return Ok(fd);
        }
        match nix::sys::socket::getsockopt(&fd, nix::sys::socket::sockopt::SocketError)
            .map_err(io::Error::from)?
        {
            0 => Ok(fd),
            errno => Err(io::Error::from_raw_os_error(errno)),
        }
    }
    in_netns(pid, || {
        let v4 = SockaddrIn::from(std::net::SocketAddrV4::new(Ipv4Addr::LOCALHOST, port));
        let v4 = match dial(AddressFamily::Inet, &v4) {
            Ok(fd) => return Ok(fd),
            Err(e) => e,
        };
        let v6 = SockaddrIn6::from(std::net::SocketAddrV6::new(Ipv6Addr::LOCALHOST, port, 0, 0));
        dial(AddressFamily::Inet6, &v6).map_err(|v6| DialError::Refused {
            port,
            v4: go_text(&v4),
            v6: go_text(&v6),
        })
    })
}

/// Removes a sandbox's veth (gone already when its namespace died: not an error).
pub fn detach(sandbox_id: &str) -> Result<(), NetlinkError> {
    let mut nl = Netlink::open()?;
    let veth = veth_name(sandbox_id);
    let idx = match nl.index(&veth) {
        Ok(i) => i,
        Err(NetlinkError::NoInterface(_)) => return Ok(()),
        Err(e) => return Err(e),
    };
    match nl.delete_link(idx) {
        // The pod's namespace died with its pause process and took the pair along meanwhile.
        Err(_) if matches!(nl.index(&veth), Err(NetlinkError::NoInterface(_))) => Ok(()),
        r => r,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cidr_membership_and_bad_prefixes() {
        let c = Cidr::parse("10.244.3.0/24").expect("cidr");
        assert!(c.contains(Ipv4Addr::new(10, 244, 3, 200)));
        assert!(!c.contains(Ipv4Addr::new(10, 244, 0, 2)));
        for bad in ["10.0.0.0/0", "10.0.0.0/31", "10.0.0.0/33", "10.0.0.0", "x/24"] {
            assert_eq!(Cidr::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn cidr_allocation() {
        let c = Cidr::parse("10.244.0.7/24").expect("cidr");
        assert_eq!(c.to_string(), "10.244.0.0/24");
        assert_eq!(c.gateway(), Ipv4Addr::new(10, 244, 0, 1));
        assert_eq!(c.allocate(&[]), Some(Ipv4Addr::new(10, 244, 0, 2)));
        let used = [Ipv4Addr::new(10, 244, 0, 2), Ipv4Addr::new(10, 244, 0, 4)];
        assert_eq!(c.allocate(&used), Some(Ipv4Addr::new(10, 244, 0, 3)));
        let small = Cidr::parse("10.0.0.0/30").expect("cidr");
        assert_eq!(small.allocate(&[]), Some(Ipv4Addr::new(10, 0, 0, 2)));
        assert_eq!(
            small.allocate(&[Ipv4Addr::new(10, 0, 0, 2)]),
            None,
            "pool exhausted"
        );
        assert!(Cidr::parse("10.0.0.0/31").is_none());
        assert!(Cidr::parse("x/24").is_none());
    }

    /// The whole pod wiring against the kernel, as root: a "node" and a "pod" network namespace
    /// (each a thread that unshared its own), bridge, veth into the pod, addresses, default
    /// route, then removal. Skipped without root or network namespaces.
    #[test]
    fn wires_and_unwires_a_pod_in_scratch_namespaces() {
        use std::sync::mpsc;
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: needs root");
            return;
        }
        let (tid_tx, tid_rx) = mpsc::channel();
        let (done_tx, done_rx) = mpsc::channel::<()>();
        let pod = std::thread::spawn(move || {
            let r = nix::sched::unshare(CloneFlags::CLONE_NEWNET).map(|()| nix::unistd::gettid().as_raw());
            let ok = r.is_ok();
            let _ = tid_tx.send(r);
            if ok {
                let _ = done_rx.recv();
            }
        });
        let node = std::thread::spawn(move || -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
            let Ok(pod_tid) = tid_rx.recv()? else {
                eprintln!("skipped: no network namespaces");
                return Ok(());
            };
            nix::sched::unshare(CloneFlags::CLONE_NEWNET)?;
            let cidr = Cidr::parse("10.99.0.0/24").ok_or("cidr")?;
            let mut nl = Netlink::open()?;
            let bridge = nl.ensure_bridge("nodeos-t0", cidr.gateway(), cidr.prefix)?;
            let again = nl.ensure_bridge("nodeos-t0", cidr.gateway(), cidr.prefix)?;
            assert_eq!(bridge, again, "an existing bridge is reused");
            let twice = nl
                .add_address(bridge, cidr.gateway(), cidr.prefix)
                .expect_err("EEXIST");
            assert_eq!(twice.errno(), Some(libc::EEXIST), "{twice}");
            let ip = Ipv4Addr::new(10, 99, 0, 2);
            attach(bridge, &cidr, "sandbox0123456789", pod_tid, ip)?;
            let veth = nl.interface(&veth_name("sandbox0123456789"))?;
            assert!(veth.mac.is_some(), "a veth has an Ethernet address");
            // Hairpin mode, as iproute2 reads it back (run from this thread: its namespace).
            let shown = std::process::Command::new("ip")
                .args(["-d", "link", "show", &veth_name("sandbox0123456789")])
                .output()?;
            let shown = String::from_utf8_lossy(&shown.stdout);
            assert!(shown.contains("hairpin on"), "{shown}");
            let mut in_pod = Netlink::open_in(pod_tid)?;
            let eth0 = in_pod.interface("eth0")?;
            let err = in_pod
                .add_address(eth0.index, ip, cidr.prefix)
                .expect_err("EEXIST");
            assert_eq!(err.errno(), Some(libc::EEXIST), "the pod has its address: {err}");
            let err = in_pod
                .add_default_route(cidr.gateway(), eth0.index)
                .expect_err("EEXIST");
            assert_eq!(err.errno(), Some(libc::EEXIST), "the pod has its route: {err}");
            assert!(
                matches!(in_pod.interface("nope0"), Err(NetlinkError::NoInterface(_))),
                "unknown names are NoInterface"
            );
            detach("sandbox0123456789")?;
            assert!(matches!(
                nl.interface(&veth_name("sandbox0123456789")),
                Err(NetlinkError::NoInterface(_))
            ));
            assert!(matches!(
                in_pod.interface("eth0"),
                Err(NetlinkError::NoInterface(_))
            ));
            detach("sandbox0123456789")?;
            nl.delete_link(bridge)?;
            Ok(())
        });
        let r = node.join().expect("node thread");
        let _ = done_tx.send(());
        pod.join().expect("pod thread");
        r.expect("pod wiring");
    }
}
