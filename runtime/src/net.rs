//! Pod networking: a bridge on the node, one veth pair per pod (the pod end is `eth0` in the
//! sandbox's network namespace), addresses from the node's pod CIDR, and a default route via the
//! bridge. Spoken over rtnetlink directly (no `ip` binary on the node).
//!
//! The pod end is configured through a netlink socket opened inside the pod's namespace: the
//! runtime process enters it with `setns`, opens the socket and returns. That is safe only
//! because the runtime process has a single thread (see `server`).

use std::fs::File;
use std::io;
use std::net::Ipv4Addr;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};

use nix::sched::{CloneFlags, setns};
use nix::sys::socket::{
    AddressFamily, MsgFlags, NetlinkAddr, SockFlag, SockProtocol, SockType, bind, recv, send, socket,
};

/// The bridge pods attach to.
pub const BRIDGE: &str = "nodeos0";

const NLMSG_ERROR: u16 = 2;
const NLM_F_REQUEST: u16 = 1;
const NLM_F_ACK: u16 = 4;
const NLM_F_EXCL: u16 = 0x200;
const NLM_F_CREATE: u16 = 0x400;
const RTM_NEWLINK: u16 = 16;
const RTM_DELLINK: u16 = 17;
const RTM_NEWADDR: u16 = 20;
const RTM_NEWROUTE: u16 = 24;
const IFLA_IFNAME: u16 = 3;
const IFLA_MASTER: u16 = 10;
const IFLA_LINKINFO: u16 = 18;
const IFLA_NET_NS_PID: u16 = 19;
const IFLA_INFO_KIND: u16 = 1;
const IFLA_INFO_DATA: u16 = 2;
const VETH_INFO_PEER: u16 = 1;
const IFA_ADDRESS: u16 = 1;
const IFA_LOCAL: u16 = 2;
const RTA_GATEWAY: u16 = 5;
const RTA_OIF: u16 = 4;
const NLA_F_NESTED: u16 = 0x8000;

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
        (prefix <= 30).then_some(())?;
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

/// One rtnetlink request being built.
struct Msg {
    buf: Vec<u8>,
    nests: Vec<usize>,
}

fn pad4(n: usize) -> usize {
    (n + 3) & !3
}

impl Msg {
    fn new(kind: u16, flags: u16) -> Self {
        let mut buf = vec![0u8; 16];
        buf[4..6].copy_from_slice(&kind.to_ne_bytes());
        buf[6..8].copy_from_slice(&(flags | NLM_F_REQUEST | NLM_F_ACK).to_ne_bytes());
        Msg {
            buf,
            nests: Vec::new(),
        }
    }

    fn bytes(&mut self, b: &[u8]) -> &mut Self {
        self.buf.extend_from_slice(b);
        while !self.buf.len().is_multiple_of(4) {
            self.buf.push(0);
        }
        self
    }

    /// `struct ifinfomsg`: family, type, index, flags, change.
    fn ifinfo(&mut self, index: i32, flags: u32, change: u32) -> &mut Self {
        let mut b = vec![0u8; 16];
        b[4..8].copy_from_slice(&index.to_ne_bytes());
        b[8..12].copy_from_slice(&flags.to_ne_bytes());
        b[12..16].copy_from_slice(&change.to_ne_bytes());
        self.bytes(&b)
    }

    fn attr(&mut self, kind: u16, data: &[u8]) -> &mut Self {
        let len = (4 + data.len()) as u16;
        self.buf.extend_from_slice(&len.to_ne_bytes());
        self.buf.extend_from_slice(&kind.to_ne_bytes());
        self.bytes(data)
    }

    fn attr_str(&mut self, kind: u16, s: &str) -> &mut Self {
        let mut d = s.as_bytes().to_vec();
        d.push(0);
        self.attr(kind, &d)
    }

    fn begin(&mut self, kind: u16) -> &mut Self {
        self.nests.push(self.buf.len());
        self.buf.extend_from_slice(&[0, 0]);
        self.buf.extend_from_slice(&(kind | NLA_F_NESTED).to_ne_bytes());
        self
    }

    fn end(&mut self) -> &mut Self {
        if let Some(start) = self.nests.pop() {
            let len = (self.buf.len() - start) as u16;
            self.buf[start..start + 2].copy_from_slice(&len.to_ne_bytes());
        }
        self
    }

    fn finish(&mut self, seq: u32) -> &[u8] {
        let len = self.buf.len() as u32;
        self.buf[0..4].copy_from_slice(&len.to_ne_bytes());
        self.buf[8..12].copy_from_slice(&seq.to_ne_bytes());
        &self.buf
    }
}

/// An rtnetlink socket (of the namespace it was opened in).
pub struct Netlink {
    fd: OwnedFd,
    seq: u32,
}

impl std::fmt::Debug for Netlink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Netlink")
            .field("fd", &self.fd.as_raw_fd())
            .finish()
    }
}

fn name_index(name: &str) -> io::Result<i32> {
    nix::net::if_::if_nametoindex(name)
        .map(|i| i as i32)
        .map_err(io::Error::from)
}

impl Netlink {
    /// A socket in the current network namespace.
    pub fn open() -> io::Result<Self> {
        let fd = socket(
            AddressFamily::Netlink,
            SockType::Raw,
            SockFlag::SOCK_CLOEXEC,
            SockProtocol::NetlinkRoute,
        )?;
        bind(fd.as_raw_fd(), &NetlinkAddr::new(0, 0))?;
        Ok(Netlink { fd, seq: 0 })
    }

    /// A socket in the network namespace of process `pid` (the runtime's own namespace is
    /// restored before returning).
    pub fn open_in(pid: i32) -> io::Result<Self> {
        in_netns(pid, Self::open)
    }

    fn call(&mut self, msg: &mut Msg, what: &str) -> io::Result<()> {
        self.seq += 1;
        let seq = self.seq;
        send(self.fd.as_raw_fd(), msg.finish(seq), MsgFlags::empty())?;
        let mut buf = vec![0u8; 8192];
        loop {
            let n = recv(self.fd.as_raw_fd(), &mut buf, MsgFlags::empty())?;
            let mut off = 0;
            while off + 16 <= n {
                let len = u32::from_ne_bytes([buf[off], buf[off + 1], buf[off + 2], buf[off + 3]]) as usize;
                let kind = u16::from_ne_bytes([buf[off + 4], buf[off + 5]]);
                let rseq = u32::from_ne_bytes([buf[off + 8], buf[off + 9], buf[off + 10], buf[off + 11]]);
                if len < 16 {
                    break;
                }
                if kind == NLMSG_ERROR && rseq == seq && off + 20 <= n {
                    let code =
                        i32::from_ne_bytes([buf[off + 16], buf[off + 17], buf[off + 18], buf[off + 19]]);
                    if code == 0 {
                        return Ok(());
                    }
                    let e = io::Error::from_raw_os_error(-code);
                    return Err(io::Error::new(e.kind(), format!("{what}: {e}")));
                }
                off += pad4(len);
            }
        }
    }

    /// Creates a bridge (EEXIST is fine) and brings it up with `gateway/prefix`.
    pub fn ensure_bridge(&mut self, name: &str, cidr: &Cidr) -> io::Result<i32> {
        let mut m = Msg::new(RTM_NEWLINK, NLM_F_CREATE | NLM_F_EXCL);
        m.ifinfo(0, 0, 0)
            .attr_str(IFLA_IFNAME, name)
            .begin(IFLA_LINKINFO)
            .attr_str(IFLA_INFO_KIND, "bridge")
            .end();
        match self.call(&mut m, "creating the pod bridge") {
            Ok(()) => {
                let idx = name_index(name)?;
                self.add_address(idx, cidr.gateway(), cidr.prefix)?;
                self.set_up(idx)?;
                Ok(idx)
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => name_index(name),
            Err(e) => Err(e),
        }
    }

    pub fn set_up(&mut self, index: i32) -> io::Result<()> {
        let up = libc::IFF_UP as u32;
        let mut m = Msg::new(RTM_NEWLINK, 0);
        m.ifinfo(index, up, up);
        self.call(&mut m, "setting a link up")
    }

    pub fn add_address(&mut self, index: i32, addr: Ipv4Addr, prefix: u8) -> io::Result<()> {
        let mut m = Msg::new(RTM_NEWADDR, NLM_F_CREATE | NLM_F_EXCL);
        let mut ifa = [0u8; 8];
        ifa[0] = libc::AF_INET as u8;
        ifa[1] = prefix;
        ifa[4..8].copy_from_slice(&(index as u32).to_ne_bytes());
        m.bytes(&ifa)
            .attr(IFA_LOCAL, &addr.octets())
            .attr(IFA_ADDRESS, &addr.octets());
        self.call(&mut m, "adding an address")
    }

    /// Creates `host` ⟷ `peer` with the peer end in the network namespace of `pid`.
    pub fn create_veth(&mut self, host: &str, peer: &str, pid: i32) -> io::Result<()> {
        let mut m = Msg::new(RTM_NEWLINK, NLM_F_CREATE | NLM_F_EXCL);
        m.ifinfo(0, 0, 0)
            .attr_str(IFLA_IFNAME, host)
            .begin(IFLA_LINKINFO)
            .attr_str(IFLA_INFO_KIND, "veth")
            .begin(IFLA_INFO_DATA)
            .begin(VETH_INFO_PEER)
            .ifinfo(0, 0, 0)
            .attr_str(IFLA_IFNAME, peer)
            .attr(IFLA_NET_NS_PID, &(pid as u32).to_ne_bytes())
            .end()
            .end()
            .end();
        self.call(&mut m, "creating the pod's veth pair")
    }

    pub fn set_master(&mut self, index: i32, master: i32) -> io::Result<()> {
        let mut m = Msg::new(RTM_NEWLINK, 0);
        m.ifinfo(index, 0, 0)
            .attr(IFLA_MASTER, &(master as u32).to_ne_bytes());
        self.call(&mut m, "attaching the veth to the bridge")
    }

    pub fn delete_link(&mut self, index: i32) -> io::Result<()> {
        let mut m = Msg::new(RTM_DELLINK, 0);
        m.ifinfo(index, 0, 0);
        self.call(&mut m, "deleting a link")
    }

    pub fn add_default_route(&mut self, gateway: Ipv4Addr, oif: i32) -> io::Result<()> {
        let mut m = Msg::new(RTM_NEWROUTE, NLM_F_CREATE | NLM_F_EXCL);
        // struct rtmsg: family, dst_len, src_len, tos, table, protocol, scope, type, flags.
        let mut rt = [0u8; 12];
        rt[0] = libc::AF_INET as u8;
        rt[4] = libc::RT_TABLE_MAIN;
        rt[5] = libc::RTPROT_BOOT;
        rt[6] = libc::RT_SCOPE_UNIVERSE;
        rt[7] = libc::RTN_UNICAST;
        m.bytes(&rt)
            .attr(RTA_GATEWAY, &gateway.octets())
            .attr(RTA_OIF, &(oif as u32).to_ne_bytes());
        self.call(&mut m, "adding the default route")
    }
}

/// The host-side veth name of a sandbox (15 characters at most).
pub fn veth_name(sandbox_id: &str) -> String {
    format!("veth{}", &sandbox_id[..sandbox_id.len().min(11)])
}

/// Wires a sandbox: loopback up, veth pair, pod end `eth0` with `ip`, default route via the
/// bridge.
pub fn attach(bridge: i32, cidr: &Cidr, sandbox_id: &str, pause_pid: i32, ip: Ipv4Addr) -> io::Result<()> {
    let mut host = Netlink::open()?;
    let veth = veth_name(sandbox_id);
    host.create_veth(&veth, "eth0", pause_pid)?;
    let idx = name_index(&veth)?;
    let wired = (|| {
        host.set_master(idx, bridge)?;
        host.set_up(idx)?;
        let mut pod = Netlink::open_in(pause_pid)?;
        let (lo, eth0) = in_netns(pause_pid, || Ok((name_index("lo")?, name_index("eth0")?)))?;
        pod.set_up(lo)?;
        pod.add_address(eth0, ip, cidr.prefix)?;
        pod.set_up(eth0)?;
        pod.add_default_route(cidr.gateway(), eth0)
    })();
    if wired.is_err() {
        let _ = host.delete_link(idx);
    }
    wired
}

/// Runs `f` in the network namespace of `pid`, then returns to the runtime's own.
fn in_netns<T>(pid: i32, f: impl FnOnce() -> io::Result<T>) -> io::Result<T> {
    let own = File::open("/proc/self/ns/net")?;
    let target = File::open(format!("/proc/{pid}/ns/net"))?;
    setns(target.as_fd(), CloneFlags::CLONE_NEWNET)?;
    let r = f();
    setns(own.as_fd(), CloneFlags::CLONE_NEWNET)?;
    r
}

/// Removes a sandbox's veth (gone already when its namespace died: not an error).
pub fn detach(sandbox_id: &str) -> io::Result<()> {
    let Ok(idx) = name_index(&veth_name(sandbox_id)) else {
        return Ok(());
    };
    match Netlink::open()?.delete_link(idx) {
        // The pod's namespace died with its pause process and took the pair along meanwhile.
        Err(_) if name_index(&veth_name(sandbox_id)).is_err() => Ok(()),
        r => r,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn nested_attributes_have_lengths() {
        let mut m = Msg::new(RTM_NEWLINK, 0);
        m.ifinfo(0, 0, 0)
            .begin(IFLA_LINKINFO)
            .attr_str(IFLA_INFO_KIND, "veth")
            .end();
        let b = m.finish(7).to_vec();
        assert_eq!(u32::from_ne_bytes([b[0], b[1], b[2], b[3]]) as usize, b.len());
        // header 16 + ifinfomsg 16, then the nest: 4 + ("veth\0" attr = 4 + 5 → padded 12).
        assert_eq!(u16::from_ne_bytes([b[32], b[33]]), 16);
        assert_eq!(&b[40..45], b"veth\0");
    }
}
