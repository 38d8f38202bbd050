//! Pods' `hostPort`s as nftables DNAT rules: the node forwards connections to its own addresses
//! on a host port to a pod's address and container port, as CNI's portmap plugin does for
//! containerd (the kubelet leaves host ports to the runtime).
//!
//! One table, `ip nodeos-hostports`, holds everything, with three NAT chains: `prerouting`
//! (connections arriving from the network and from pods) and `output` (connections the node
//! itself opens; loopback destinations are left alone, a DNAT from `127.0.0.1` to a pod address
//! would be dropped as a martian) at the `dstnat` priority, and `postrouting` at `srcnat`, which
//! masquerades a pod's connection to its own host port (hairpin: with its own address on both
//! ends the pod would answer itself directly, and the reply would miss the reverse
//! translation; the pod's veth is in hairpin mode for it, see `net::attach`). Each mapping is
//! one rule per chain:
//!
//! ```text
//! fib daddr type local tcp dport 30080 dnat to 10.244.0.5:80                          (prerouting)
//! ip daddr != 127.0.0.0/8 fib daddr type local tcp dport 30080 dnat to 10.244.0.5:80  (output)
//! ip saddr 10.244.0.5 ip daddr 10.244.0.5 tcp dport 80 masquerade                    (postrouting)
//! ```
//!
//! (`ip daddr <hostIP>` instead of `fib daddr type local` when the mapping names a host IP.)
//! [`sync`] replaces the whole table in one nftables transaction (create it if absent, delete
//! it, create it again with the current rules), so the rules are never half-written and a
//! restarted runtime re-states them from its records.
//!
//! Written here, not through a crate: the only pure-Rust nftables crate (`rustables`) is
//! GPL-3.0, and the other ones wrap libnftnl (C) or run the `nft` binary, which the node does
//! not have. The messages are the few libnftnl builds for the rules above (checked against
//! `nft --debug=netlink` and, in the tests, against `nft list` of what the kernel took).

use std::io;
use std::net::Ipv4Addr;
use std::time::Duration;

use netlink_sys::Socket;
use netlink_sys::protocols::NETLINK_NETFILTER;
use runtime_api::{PortMapping, Protocol};

/// The table the host-port rules live in.
pub const TABLE: &str = "nodeos-hostports";

/// nftables failures.
#[derive(Debug, thiserror::Error)]
pub enum NftError {
    #[error("opening a netfilter netlink socket: {0}")]
    Socket(#[source] io::Error),
    #[error("nftables: {0}")]
    Io(#[source] io::Error),
    /// The kernel refused the transaction (nothing of it was applied).
    #[error("nftables refused the host port rules: {0}")]
    Refused(#[source] io::Error),
    #[error("nftables: malformed reply: {0}")]
    Decode(String),
}

/// A host port forwarded to a pod.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct HostPort {
    pub mapping: PortMapping,
    pub pod_ip: Ipv4Addr,
}

// linux/netlink.h, linux/netfilter/nfnetlink.h, linux/netfilter/nf_tables.h
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_ACK: u16 = 0x4;
const NLM_F_CREATE: u16 = 0x400;
const NLM_F_APPEND: u16 = 0x800;
const NLMSG_ERROR: u16 = 0x2;
const NLA_F_NESTED: u16 = 0x8000;
const NFNL_MSG_BATCH_BEGIN: u16 = 0x10;
const NFNL_MSG_BATCH_END: u16 = 0x11;
const NFNL_SUBSYS_NFTABLES: u16 = 10;
const NFT_MSG_NEWTABLE: u16 = 0;
const NFT_MSG_DELTABLE: u16 = 2;
const NFT_MSG_NEWCHAIN: u16 = 3;
const NFT_MSG_NEWRULE: u16 = 6;
const NFPROTO_IPV4: u8 = 2;
const NFTA_TABLE_NAME: u16 = 1;
const NFTA_CHAIN_TABLE: u16 = 1;
const NFTA_CHAIN_NAME: u16 = 3;
const NFTA_CHAIN_HOOK: u16 = 4;
const NFTA_CHAIN_POLICY: u16 = 5;
const NFTA_CHAIN_TYPE: u16 = 7;
const NFTA_HOOK_HOOKNUM: u16 = 1;
const NFTA_HOOK_PRIORITY: u16 = 2;
const NF_INET_PRE_ROUTING: u32 = 0;
const NF_INET_LOCAL_OUT: u32 = 3;
const NF_INET_POST_ROUTING: u32 = 4;
const NF_IP_PRI_NAT_DST: i32 = -100;
const NF_IP_PRI_NAT_SRC: i32 = 100;
const NF_ACCEPT: u32 = 1;
const NFTA_RULE_TABLE: u16 = 1;
const NFTA_RULE_CHAIN: u16 = 2;
const NFTA_RULE_EXPRESSIONS: u16 = 4;
const NFTA_LIST_ELEM: u16 = 1;
const NFTA_EXPR_NAME: u16 = 1;
const NFTA_EXPR_DATA: u16 = 2;
const NFTA_DATA_VALUE: u16 = 1;
const NFT_REG_1: u32 = 1;
const NFT_REG_2: u32 = 2;
const NFTA_META_DREG: u16 = 1;
const NFTA_META_KEY: u16 = 2;
const NFT_META_L4PROTO: u32 = 16;
const NFTA_CMP_SREG: u16 = 1;
const NFTA_CMP_OP: u16 = 2;
const NFTA_CMP_DATA: u16 = 3;
const NFT_CMP_EQ: u32 = 0;
const NFT_CMP_NEQ: u32 = 1;
const NFTA_PAYLOAD_DREG: u16 = 1;
const NFTA_PAYLOAD_BASE: u16 = 2;
const NFTA_PAYLOAD_OFFSET: u16 = 3;
const NFTA_PAYLOAD_LEN: u16 = 4;
const NFT_PAYLOAD_NETWORK_HEADER: u32 = 1;
const NFT_PAYLOAD_TRANSPORT_HEADER: u32 = 2;
const NFTA_FIB_DREG: u16 = 1;
const NFTA_FIB_RESULT: u16 = 2;
const NFTA_FIB_FLAGS: u16 = 3;
const NFT_FIB_RESULT_ADDRTYPE: u32 = 3;
const NFTA_FIB_F_DADDR: u32 = 1 << 1;
const RTN_LOCAL: u32 = 2;
const NFTA_IMMEDIATE_DREG: u16 = 1;
const NFTA_IMMEDIATE_DATA: u16 = 2;
const NFTA_NAT_TYPE: u16 = 1;
const NFTA_NAT_FAMILY: u16 = 2;
const NFTA_NAT_REG_ADDR_MIN: u16 = 3;
const NFTA_NAT_REG_ADDR_MAX: u16 = 4;
const NFTA_NAT_REG_PROTO_MIN: u16 = 5;
const NFTA_NAT_REG_PROTO_MAX: u16 = 6;
const NFT_NAT_DNAT: u32 = 1;

/// How long [`sync`] waits for the kernel's answers.
const REPLY_WAIT: Duration = Duration::from_secs(5);

/// Replaces the host-port rules of the current network namespace with `ports` (none: the table
/// is removed). Atomic: on an error nothing changed.
pub fn sync(ports: &[HostPort]) -> Result<(), NftError> {
    let batch = batch(ports, 1);
    let mut socket = Socket::new(NETLINK_NETFILTER).map_err(NftError::Socket)?;
    socket.bind_auto().map_err(NftError::Socket)?;
    socket
        .set_rx_buf_sz(1 << 20)
        .and_then(|()| set_recv_timeout(&socket, REPLY_WAIT))
        .map_err(NftError::Socket)?;
    socket.send(&batch.bytes, 0).map_err(NftError::Io)?;
    let mut buf = vec![0u8; 64 * 1024];
    let (mut answered, mut refused) = (0, None);
    while answered < batch.acked {
        buf.clear();
        let n = match socket.recv(&mut buf, 0) {
            Ok(n) => n,
            // A failed transaction may leave some requests unanswered: its error is the answer.
            Err(e) if e.kind() == io::ErrorKind::WouldBlock && refused.is_some() => break,
            Err(e) => return Err(NftError::Io(e)),
        };
        let mut data = &buf[..n.min(buf.len())];
        while data.len() >= 16 {
            let len = u32::from_ne_bytes([data[0], data[1], data[2], data[3]]) as usize;
            let ty = u16::from_ne_bytes([data[4], data[5]]);
            if len < 16 || len > data.len() {
                return Err(NftError::Decode(format!(
                    "message of {len} bytes in {}",
                    data.len()
                )));
            }
            if ty == NLMSG_ERROR {
                let code = data
                    .get(16..20)
                    .map(|b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
                    .ok_or_else(|| NftError::Decode("short error message".into()))?;
                answered += 1;
                if code != 0 && refused.is_none() {
                    refused = Some(io::Error::from_raw_os_error(-code));
                }
            }
            data = data.get(len.next_multiple_of(4)..).unwrap_or_default();
        }
    }
    match refused {
        Some(e) => Err(NftError::Refused(e)),
        None => Ok(()),
    }
}

fn set_recv_timeout(socket: &Socket, wait: Duration) -> io::Result<()> {
    use nix::sys::socket::{setsockopt, sockopt};
    use nix::sys::time::TimeVal;
    let tv = TimeVal::new(wait.as_secs() as _, wait.subsec_micros() as _);
    setsockopt(socket, sockopt::ReceiveTimeout, &tv).map_err(io::Error::from)
}

/// The transaction's bytes and how many of its requests ask for an answer.
struct Batch {
    bytes: Vec<u8>,
    acked: usize,
    seq: u32,
}

/// The transaction that replaces the table with `ports`' rules.
fn batch(ports: &[HostPort], first_seq: u32) -> Batch {
    let mut b = Batch {
        bytes: Vec::new(),
        acked: 0,
        seq: first_seq,
    };
    b.message(NFNL_MSG_BATCH_BEGIN, 0, 0, NFNL_SUBSYS_NFTABLES, |_| {});
    // Created first so that deleting it cannot fail on a node that has none yet.
    b.request(NFT_MSG_NEWTABLE, NLM_F_CREATE, |b| b.str(NFTA_TABLE_NAME, TABLE));
    b.request(NFT_MSG_DELTABLE, 0, |b| b.str(NFTA_TABLE_NAME, TABLE));
    if !ports.is_empty() {
        b.request(NFT_MSG_NEWTABLE, NLM_F_CREATE, |b| b.str(NFTA_TABLE_NAME, TABLE));
        let chains = [
            ("prerouting", NF_INET_PRE_ROUTING, NF_IP_PRI_NAT_DST),
            ("output", NF_INET_LOCAL_OUT, NF_IP_PRI_NAT_DST),
            ("postrouting", NF_INET_POST_ROUTING, NF_IP_PRI_NAT_SRC),
        ];
        for (chain, hook, priority) in chains {
            b.request(NFT_MSG_NEWCHAIN, NLM_F_CREATE, |b| {
                b.str(NFTA_CHAIN_TABLE, TABLE);
                b.str(NFTA_CHAIN_NAME, chain);
                b.nest(NFTA_CHAIN_HOOK, |b| {
                    b.u32(NFTA_HOOK_HOOKNUM, hook);
                    b.u32(NFTA_HOOK_PRIORITY, priority as u32);
                });
                b.u32(NFTA_CHAIN_POLICY, NF_ACCEPT);
                b.str(NFTA_CHAIN_TYPE, "nat");
            });
            for port in ports {
                b.request(NFT_MSG_NEWRULE, NLM_F_CREATE | NLM_F_APPEND, |b| {
                    b.str(NFTA_RULE_TABLE, TABLE);
                    b.str(NFTA_RULE_CHAIN, chain);
                    b.nest(NFTA_RULE_EXPRESSIONS, |b| match hook {
                        NF_INET_POST_ROUTING => hairpin_rule(b, port),
                        _ => dnat_rule(b, port, hook == NF_INET_LOCAL_OUT),
                    });
                });
            }
        }
    }
    b.message(NFNL_MSG_BATCH_END, 0, 0, NFNL_SUBSYS_NFTABLES, |_| {});
    b
}

/// The expressions of one mapping's rule (see the module doc).
fn dnat_rule(b: &mut Batch, port: &HostPort, local_out: bool) {
    let m = &port.mapping;
    if local_out {
        // ip daddr != 127.0.0.0/8 (its first byte)
        b.payload(NFT_PAYLOAD_NETWORK_HEADER, 16, 1);
        b.cmp(NFT_CMP_NEQ, &[127]);
    }
    match m.host_ip {
        Some(ip) => {
            b.payload(NFT_PAYLOAD_NETWORK_HEADER, 16, 4);
            b.cmp(NFT_CMP_EQ, &ip.octets());
        }
        None => {
            b.expr("fib", |b| {
                b.u32(NFTA_FIB_DREG, NFT_REG_1);
                b.u32(NFTA_FIB_RESULT, NFT_FIB_RESULT_ADDRTYPE);
                b.u32(NFTA_FIB_FLAGS, NFTA_FIB_F_DADDR);
            });
            // The address type is a host-order u32 in the register.
            b.cmp(NFT_CMP_EQ, &RTN_LOCAL.to_ne_bytes());
        }
    }
    b.l4_port(m.protocol, m.host_port);
    b.immediate(NFT_REG_1, &port.pod_ip.octets());
    b.immediate(NFT_REG_2, &m.container_port.to_be_bytes());
    b.expr("nat", |b| {
        b.u32(NFTA_NAT_TYPE, NFT_NAT_DNAT);
        b.u32(NFTA_NAT_FAMILY, u32::from(NFPROTO_IPV4));
        b.u32(NFTA_NAT_REG_ADDR_MIN, NFT_REG_1);
        b.u32(NFTA_NAT_REG_ADDR_MAX, NFT_REG_1);
        b.u32(NFTA_NAT_REG_PROTO_MIN, NFT_REG_2);
        b.u32(NFTA_NAT_REG_PROTO_MAX, NFT_REG_2);
    });
}

/// The expressions of one mapping's hairpin rule (see the module doc): the pod's own connection
/// comes from the node's bridge address.
fn hairpin_rule(b: &mut Batch, port: &HostPort) {
    let ip = port.pod_ip.octets();
    b.payload(NFT_PAYLOAD_NETWORK_HEADER, 12, 4);
    b.cmp(NFT_CMP_EQ, &ip);
    b.payload(NFT_PAYLOAD_NETWORK_HEADER, 16, 4);
    b.cmp(NFT_CMP_EQ, &ip);
    b.l4_port(port.mapping.protocol, port.mapping.container_port);
    b.expr("masq", |_| {});
}

fn ip_protocol(p: Protocol) -> u8 {
    match p {
        Protocol::Tcp => 6,
        Protocol::Udp => 17,
        Protocol::Sctp => 132,
    }
}

impl Batch {
    /// One netlink message: header, nfgenmsg, then what `body` adds.
    fn message(&mut self, ty: u16, flags: u16, family: u8, res_id: u16, body: impl FnOnce(&mut Self)) {
        let start = self.bytes.len();
        self.bytes.extend_from_slice(&[0; 4]); // length, set below
        self.bytes.extend_from_slice(&ty.to_ne_bytes());
        self.bytes
            .extend_from_slice(&(NLM_F_REQUEST | flags).to_ne_bytes());
        self.bytes.extend_from_slice(&self.seq.to_ne_bytes());
        self.bytes.extend_from_slice(&0u32.to_ne_bytes()); // port id: the kernel's
        self.bytes.extend_from_slice(&[family, 0]);
        self.bytes.extend_from_slice(&res_id.to_be_bytes());
        body(self);
        let len = (self.bytes.len() - start) as u32;
        self.bytes[start..start + 4].copy_from_slice(&len.to_ne_bytes());
        self.seq = self.seq.wrapping_add(1);
    }

    /// An nftables request of the IPv4 family that the kernel answers (ack or error).
    fn request(&mut self, msg: u16, flags: u16, body: impl FnOnce(&mut Self)) {
        self.acked += 1;
        self.message(
            (NFNL_SUBSYS_NFTABLES << 8) | msg,
            NLM_F_ACK | flags,
            NFPROTO_IPV4,
            0,
            body,
        );
    }

    fn attr(&mut self, ty: u16, data: &[u8]) {
        self.bytes
            .extend_from_slice(&((4 + data.len()) as u16).to_ne_bytes());
        self.bytes.extend_from_slice(&ty.to_ne_bytes());
        self.bytes.extend_from_slice(data);
        self.pad();
    }

    fn pad(&mut self) {
        let padded = self.bytes.len().next_multiple_of(4);
        self.bytes.resize(padded, 0);
    }

    fn nest(&mut self, ty: u16, body: impl FnOnce(&mut Self)) {
        let start = self.bytes.len();
        self.bytes.extend_from_slice(&[0, 0]);
        self.bytes.extend_from_slice(&(ty | NLA_F_NESTED).to_ne_bytes());
        body(self);
        let len = (self.bytes.len() - start) as u16;
        self.bytes[start..start + 2].copy_from_slice(&len.to_ne_bytes());
    }

    fn str(&mut self, ty: u16, s: &str) {
        let mut data = s.as_bytes().to_vec();
        data.push(0);
        self.attr(ty, &data);
    }

    /// nftables' integers are big-endian.
    fn u32(&mut self, ty: u16, v: u32) {
        self.attr(ty, &v.to_be_bytes());
    }

    fn expr(&mut self, name: &str, data: impl FnOnce(&mut Self)) {
        self.nest(NFTA_LIST_ELEM, |b| {
            b.str(NFTA_EXPR_NAME, name);
            b.nest(NFTA_EXPR_DATA, data);
        });
    }

    fn payload(&mut self, base: u32, offset: u32, len: u32) {
        self.expr("payload", |b| {
            b.u32(NFTA_PAYLOAD_DREG, NFT_REG_1);
            b.u32(NFTA_PAYLOAD_BASE, base);
            b.u32(NFTA_PAYLOAD_OFFSET, offset);
            b.u32(NFTA_PAYLOAD_LEN, len);
        });
    }

    /// `<protocol> dport <port>` (`meta l4proto`, then the transport header's bytes 2-3).
    fn l4_port(&mut self, protocol: Protocol, port: u16) {
        self.expr("meta", |b| {
            b.u32(NFTA_META_KEY, NFT_META_L4PROTO);
            b.u32(NFTA_META_DREG, NFT_REG_1);
        });
        self.cmp(NFT_CMP_EQ, &[ip_protocol(protocol)]);
        self.payload(NFT_PAYLOAD_TRANSPORT_HEADER, 2, 2);
        self.cmp(NFT_CMP_EQ, &port.to_be_bytes());
    }

    fn cmp(&mut self, op: u32, value: &[u8]) {
        self.expr("cmp", |b| {
            b.u32(NFTA_CMP_SREG, NFT_REG_1);
            b.u32(NFTA_CMP_OP, op);
            b.nest(NFTA_CMP_DATA, |b| b.attr(NFTA_DATA_VALUE, value));
        });
    }

    fn immediate(&mut self, reg: u32, value: &[u8]) {
        self.expr("immediate", |b| {
            b.u32(NFTA_IMMEDIATE_DREG, reg);
            b.nest(NFTA_IMMEDIATE_DATA, |b| b.attr(NFTA_DATA_VALUE, value));
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn port(protocol: Protocol, host_port: u16, container_port: u16, host_ip: Option<Ipv4Addr>) -> HostPort {
        HostPort {
            mapping: PortMapping {
                protocol,
                container_port,
                host_port,
                host_ip,
            },
            pod_ip: Ipv4Addr::new(10, 244, 0, 5),
        }
    }

    /// The messages of a batch: (type, flags, total length); checks that every length adds up.
    fn messages(b: &Batch) -> Vec<(u16, u16, usize)> {
        let mut out = Vec::new();
        let mut data = &b.bytes[..];
        while !data.is_empty() {
            let len = u32::from_ne_bytes(data[0..4].try_into().expect("4 bytes")) as usize;
            let ty = u16::from_ne_bytes([data[4], data[5]]);
            let flags = u16::from_ne_bytes([data[6], data[7]]);
            assert!(
                len >= 20 && len.is_multiple_of(4) && len <= data.len(),
                "length {len}"
            );
            out.push((ty, flags, len));
            data = &data[len..];
        }
        out
    }

    #[test]
    fn an_empty_set_removes_the_table() {
        let b = batch(&[], 7);
        let types: Vec<u16> = messages(&b).iter().map(|m| m.0).collect();
        let nft = |m: u16| (NFNL_SUBSYS_NFTABLES << 8) | m;
        assert_eq!(
            types,
            [
                NFNL_MSG_BATCH_BEGIN,
                nft(NFT_MSG_NEWTABLE),
                nft(NFT_MSG_DELTABLE),
                NFNL_MSG_BATCH_END
            ]
        );
        assert_eq!(b.acked, 2);
        assert_eq!(b.seq, 11, "one sequence number per message");
    }

    #[test]
    fn each_port_is_a_rule_in_every_chain() {
        let ports = [
            port(Protocol::Tcp, 30080, 80, None),
            port(Protocol::Udp, 5353, 53, Some(Ipv4Addr::new(10, 0, 2, 15))),
        ];
        let b = batch(&ports, 1);
        let m = messages(&b);
        let nft = |m: u16| (NFNL_SUBSYS_NFTABLES << 8) | m;
        let count = |t: u16| m.iter().filter(|x| x.0 == nft(t)).count();
        assert_eq!((count(NFT_MSG_NEWCHAIN), count(NFT_MSG_NEWRULE)), (3, 6));
        assert_eq!(
            b.acked,
            m.len() - 2,
            "every request but the batch markers is answered"
        );
        assert!(m.iter().all(|x| x.1 & NLM_F_REQUEST != 0));
    }

    /// Applies rules in a new network namespace of a thread of its own, reads them back with the
    /// `nft` tool and connects through one. Needs root and the `nft` binary (`.ci/run` installs
    /// nftables).
    #[test]
    fn the_kernel_takes_the_rules_and_nft_reads_them_back() {
        type TestResult<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;
        let run = || -> TestResult<[String; 3]> {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET)?;
            let list = || -> TestResult<String> {
                let out = std::process::Command::new("nft")
                    .args(["list", "ruleset"])
                    .output()?;
                Ok(String::from_utf8_lossy(&out.stdout).into_owned())
            };
            let ports = [
                port(Protocol::Tcp, 30080, 80, None),
                port(Protocol::Udp, 5353, 53, Some(Ipv4Addr::new(10, 0, 2, 15))),
                port(Protocol::Sctp, 9000, 9000, None),
            ];
            sync(&ports)?;
            let first = list()?;
            // The same again replaces, not adds.
            sync(&ports)?;
            if list()? != first {
                return Err("a second sync changed the rules".into());
            }
            sync(&ports[..1])?;
            let one = list()?;
            // Forwarding, for real: a node address and a pod address on this namespace's
            // loopback, a listener on the pod's port; the node's own connection is rewritten.
            let mut nl = crate::net::Netlink::open()?;
            let lo = nl.index("lo")?;
            nl.set_up(lo)?;
            for ip in [Ipv4Addr::new(10, 0, 2, 15), Ipv4Addr::new(10, 244, 0, 5)] {
                nl.add_address(lo, ip, 32)?;
            }
            let pod = std::net::TcpListener::bind("10.244.0.5:80")?;
            let refused = |addr: &str| {
                std::net::TcpStream::connect(addr)
                    .err()
                    .is_some_and(|e| e.kind() == io::ErrorKind::ConnectionRefused)
            };
            let mut c = std::net::TcpStream::connect("10.0.2.15:30080")?;
            let (mut accepted, peer) = pod.accept()?;
            io::Write::write_all(&mut accepted, b"pong")?;
            let mut got = [0u8; 4];
            io::Read::read_exact(&mut c, &mut got)?;
            if &got != b"pong" || !peer.ip().is_ipv4() {
                return Err(format!("through the host port: {got:?} from {peer}").into());
            }
            if !refused("127.0.0.1:30080") || !refused("10.0.2.15:30081") {
                return Err("loopback or another port was forwarded".into());
            }
            sync(&[])?;
            let none = list()?;
            if !refused("10.0.2.15:30080") {
                return Err("still forwarded without rules".into());
            }
            Ok([first, one, none])
        };
        let [all, one, none] = std::thread::spawn(run)
            .join()
            .expect("thread")
            .expect("nftables in a netns");
        let (all, one, none) = (all.as_str(), one.as_str(), none.as_str());
        let expected = "table ip nodeos-hostports {
\tchain prerouting {
\t\ttype nat hook prerouting priority dstnat; policy accept;
\t\tfib daddr type local tcp dport 30080 dnat to 10.244.0.5:80
\t\tip daddr 10.0.2.15 udp dport 5353 dnat to 10.244.0.5:53
\t\tfib daddr type local sctp dport 9000 dnat to 10.244.0.5:9000
\t}

\tchain output {
\t\ttype nat hook output priority -100; policy accept;
\t\tip daddr != 127.0.0.0/8 fib daddr type local tcp dport 30080 dnat to 10.244.0.5:80
\t\tip daddr != 127.0.0.0/8 ip daddr 10.0.2.15 udp dport 5353 dnat to 10.244.0.5:53
\t\tip daddr != 127.0.0.0/8 fib daddr type local sctp dport 9000 dnat to 10.244.0.5:9000
\t}

\tchain postrouting {
\t\ttype nat hook postrouting priority srcnat; policy accept;
\t\tip saddr 10.244.0.5 ip daddr 10.244.0.5 tcp dport 80 masquerade
\t\tip saddr 10.244.0.5 ip daddr 10.244.0.5 udp dport 53 masquerade
\t\tip saddr 10.244.0.5 ip daddr 10.244.0.5 sctp dport 9000 masquerade
\t}
}
";
        assert_eq!(all, expected);
        let dnat = one
            .lines()
            .filter(|l| l.contains("dnat") || l.contains("masquerade"))
            .map(str::trim)
            .collect::<Vec<_>>();
        assert_eq!(
            dnat,
            [
                "fib daddr type local tcp dport 30080 dnat to 10.244.0.5:80",
                "ip daddr != 127.0.0.0/8 fib daddr type local tcp dport 30080 dnat to 10.244.0.5:80",
                "ip saddr 10.244.0.5 ip daddr 10.244.0.5 tcp dport 80 masquerade"
            ],
            "{one}"
        );
        assert_eq!(none.trim(), "", "no table left: {none}");
    }
}
