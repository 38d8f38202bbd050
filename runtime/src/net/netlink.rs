//! rtnetlink requests over `netlink-packet-route`: links (bridge, veth, up, controller, hairpin,
//! delete), IPv4 addresses and default routes. Synchronous on purpose: each request is sent with
//! `NLM_F_ACK` and its acknowledgement read before returning, on a socket of the network namespace
//! it was opened in. Used by the runtime's pod network and by init's interface setup.

use std::io;
use std::net::Ipv4Addr;

use netlink_packet_core::{
    NLM_F_ACK, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REQUEST, NetlinkBuffer, NetlinkMessage, NetlinkPayload,
};
use netlink_packet_route::address::{AddressAttribute, AddressMessage};
use netlink_packet_route::link::{
    AfSpecInet6, AfSpecUnspec, In6AddrGenMode, InfoBridgePort, InfoData, InfoKind, InfoPortData,
    InfoPortKind, InfoVeth, LinkAttribute, LinkFlags, LinkInfo, LinkMessage,
};
use netlink_packet_route::route::{
    RouteAddress, RouteAttribute, RouteHeader, RouteMessage, RouteProtocol, RouteScope, RouteType,
};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use netlink_sys::Socket;
use netlink_sys::protocols::NETLINK_ROUTE;

/// Receive buffer: large enough for any single link description the kernel sends back.
const RECV_BUFFER: usize = 64 * 1024;

/// rtnetlink failures; `op` names the request for the log.
#[derive(Debug, thiserror::Error)]
pub enum NetlinkError {
    #[error("opening an rtnetlink socket: {0}")]
    Socket(#[source] io::Error),
    #[error("{op}: {source}")]
    Io { op: &'static str, source: io::Error },
    /// The kernel refused the request (its errno is in `source`).
    #[error("{op}: {source}")]
    Refused { op: &'static str, source: io::Error },
    #[error("{op}: malformed reply: {reason}")]
    Decode { op: &'static str, reason: String },
    #[error("no network interface {0:?}")]
    NoInterface(String),
    #[error("entering the network namespace of process {pid}: {source}")]
    Netns { pid: i32, source: io::Error },
    #[error("setting sysctl {key}: {source}")]
    Sysctl { key: String, source: io::Error },
}

impl NetlinkError {
    /// The errno of a refused request.
    pub fn errno(&self) -> Option<i32> {
        match self {
            NetlinkError::Refused { source, .. } => source.raw_os_error(),
            _ => None,
        }
    }
}

type Result<T> = std::result::Result<T, NetlinkError>;

/// What the kernel reports about one interface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interface {
    pub index: u32,
    /// The hardware address, for interfaces that have an Ethernet one.
    pub mac: Option<[u8; 6]>,
}

/// An rtnetlink socket (of the network namespace it was opened in).
pub struct Netlink {
    socket: Socket,
    seq: u32,
}

impl std::fmt::Debug for Netlink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Netlink")
            .field("seq", &self.seq)
            .finish_non_exhaustive()
    }
}

impl Netlink {
    /// A socket in the current network namespace.
    pub fn open() -> Result<Self> {
        let mut socket = Socket::new(NETLINK_ROUTE).map_err(NetlinkError::Socket)?;
        socket.bind_auto().map_err(NetlinkError::Socket)?;
        Ok(Netlink { socket, seq: 0 })
    }

    /// A socket in the network namespace of process `pid` (the caller's own namespace is
    /// restored before returning).
    pub fn open_in(pid: i32) -> Result<Self> {
        super::in_netns(pid, Self::open)
    }

    /// Sends one request and reads up to its acknowledgement; returns the messages the kernel
    /// answered with before it (a `GetLink` reply).
    fn request(
        &mut self,
        op: &'static str,
        msg: RouteNetlinkMessage,
        flags: u16,
    ) -> Result<Vec<RouteNetlinkMessage>> {
        self.seq = self.seq.wrapping_add(1);
        let mut req = NetlinkMessage::from(msg);
        req.header.flags = NLM_F_REQUEST | NLM_F_ACK | flags;
        req.header.sequence_number = self.seq;
        req.finalize();
        let mut out = vec![0u8; req.buffer_len()];
        req.serialize(&mut out);
        self.socket
            .send(&out, 0)
            .map_err(|source| NetlinkError::Io { op, source })?;
        let mut replies = Vec::new();
        let mut buf = vec![0u8; RECV_BUFFER];
        loop {
            buf.clear();
            let n = self
                .socket
                .recv(&mut buf, libc::MSG_TRUNC)
                .map_err(|source| NetlinkError::Io { op, source })?;
            if n > RECV_BUFFER {
                return Err(NetlinkError::Decode {
                    op,
                    reason: format!("reply of {n} bytes truncated"),
                });
            }
            let mut data = &buf[..];
            while !data.is_empty() {
                let bad = |e: netlink_packet_core::DecodeError| NetlinkError::Decode {
                    op,
                    reason: e.to_string(),
                };
                let header = NetlinkBuffer::new_checked(data).map_err(bad)?;
                let (len, seq) = (header.length() as usize, header.sequence_number());
                let (this, rest) = data.split_at(len.min(data.len()));
                // Messages are 4-byte aligned; the padding of the last one may be absent.
                data = rest.get(len.next_multiple_of(4) - len..).unwrap_or_default();
                if seq != self.seq {
                    // A late answer to an earlier request that failed before its ack.
                    continue;
                }
                let reply = NetlinkMessage::<RouteNetlinkMessage>::deserialize(this).map_err(bad)?;
                match reply.payload {
                    NetlinkPayload::Error(e) => {
                        return match e.code {
                            None => Ok(replies),
                            Some(_) => Err(NetlinkError::Refused {
                                op,
                                source: e.to_io(),
                            }),
                        };
                    }
                    NetlinkPayload::InnerMessage(m) => replies.push(m),
                    _ => {}
                }
            }
        }
    }

    /// The interface called `name`.
    pub fn interface(&mut self, name: &str) -> Result<Interface> {
        let mut m = LinkMessage::default();
        m.attributes.push(LinkAttribute::IfName(name.to_string()));
        let replies = match self.request("looking up an interface", RouteNetlinkMessage::GetLink(m), 0) {
            Err(e) if e.errno() == Some(libc::ENODEV) => return Err(NetlinkError::NoInterface(name.into())),
            r => r?,
        };
        replies
            .into_iter()
            .find_map(|r| match r {
                RouteNetlinkMessage::NewLink(l) => Some(Interface {
                    index: l.header.index,
                    mac: l.attributes.iter().find_map(|a| match a {
                        LinkAttribute::Address(b) => <[u8; 6]>::try_from(b.as_slice()).ok(),
                        _ => None,
                    }),
                }),
                _ => None,
            })
            .ok_or_else(|| NetlinkError::NoInterface(name.into()))
    }

    /// The index of the interface called `name`.
    pub fn index(&mut self, name: &str) -> Result<u32> {
        Ok(self.interface(name)?.index)
    }

    /// Creates a bridge (an existing one is kept as it is) and, when new, brings it up with
    /// `address/prefix`. Returns its index.
    pub fn ensure_bridge(&mut self, name: &str, address: Ipv4Addr, prefix: u8) -> Result<u32> {
        let mut m = LinkMessage::default();
        m.attributes.push(LinkAttribute::IfName(name.to_string()));
        m.attributes
            .push(LinkAttribute::LinkInfo(vec![LinkInfo::Kind(InfoKind::Bridge)]));
        match self.request(
            "creating the pod bridge",
            RouteNetlinkMessage::NewLink(m),
            NLM_F_CREATE | NLM_F_EXCL,
        ) {
            Ok(_) => {
                let index = self.index(name)?;
                self.add_address(index, address, prefix)?;
                self.set_up(index)?;
                Ok(index)
            }
            Err(e) if e.errno() == Some(libc::EEXIST) => self.index(name),
            Err(e) => Err(e),
        }
    }

    /// Sets a link administratively up.
    pub fn set_up(&mut self, index: u32) -> Result<()> {
        let mut m = LinkMessage::default();
        m.header.index = index;
        m.header.flags = LinkFlags::Up;
        m.header.change_mask = LinkFlags::Up;
        self.request("setting a link up", RouteNetlinkMessage::SetLink(m), 0)
            .map(drop)
    }

    /// Gives a link no IPv6 address of its own making (`ip link set ... addrgenmode none`): no
    /// link-local address, so no duplicate-address detection, router solicitations or MLD
    /// reports when it comes up. Set before the link is up. A kernel without IPv6 has nothing
    /// to turn off (`EAFNOSUPPORT` is not an error); any other refusal is logged and the link
    /// keeps the kernel's default (it only costs work, it is not wrong).
    pub fn set_no_ipv6_link_local(&mut self, index: u32) -> Result<()> {
        let mut m = LinkMessage::default();
        m.header.index = index;
        m.attributes
            .push(LinkAttribute::AfSpecUnspec(vec![AfSpecUnspec::Inet6(vec![
                AfSpecInet6::AddrGenMode(In6AddrGenMode::None),
            ])]));
        match self.request(
            "turning off IPv6 address generation",
            RouteNetlinkMessage::SetLink(m),
            0,
        ) {
            Err(e) if e.errno() == Some(libc::EAFNOSUPPORT) => Ok(()),
            Err(e @ NetlinkError::Refused { .. }) => {
                tracing::warn!(index, error = %e, "IPv6 address generation stays on");
                Ok(())
            }
            r => r.map(drop),
        }
    }

    /// Adds `address/prefix` to a link, with the subnet's broadcast address (as `ip addr add
    /// ... brd +` and DHCP clients do).
    pub fn add_address(&mut self, index: u32, address: Ipv4Addr, prefix: u8) -> Result<()> {
        let mut m = AddressMessage::default();
        m.header.family = AddressFamily::Inet;
        m.header.prefix_len = prefix;
        m.header.index = index;
        m.attributes.push(AddressAttribute::Local(address.into()));
        m.attributes.push(AddressAttribute::Address(address.into()));
        if let Some(brd) = broadcast(address, prefix) {
            m.attributes.push(AddressAttribute::Broadcast(brd));
        }
        self.request(
            "adding an address",
            RouteNetlinkMessage::NewAddress(m),
            NLM_F_CREATE | NLM_F_EXCL,
        )
        .map(drop)
    }

    /// Creates `host` ⟷ `peer` with the peer end in the network namespace of `pid`.
    pub fn create_veth(&mut self, host: &str, peer: &str, pid: i32) -> Result<()> {
        let mut p = LinkMessage::default();
        p.attributes.push(LinkAttribute::IfName(peer.to_string()));
        p.attributes.push(LinkAttribute::NetNsPid(pid.unsigned_abs()));
        let mut m = LinkMessage::default();
        m.attributes.push(LinkAttribute::IfName(host.to_string()));
        m.attributes.push(LinkAttribute::LinkInfo(vec![
            LinkInfo::Kind(InfoKind::Veth),
            LinkInfo::Data(InfoData::Veth(InfoVeth::Peer(p))),
        ]));
        self.request(
            "creating the pod's veth pair",
            RouteNetlinkMessage::NewLink(m),
            NLM_F_CREATE | NLM_F_EXCL,
        )
        .map(drop)
    }

    /// Attaches a link to a bridge.
    pub fn set_controller(&mut self, index: u32, controller: u32) -> Result<()> {
        let mut m = LinkMessage::default();
        m.header.index = index;
        m.attributes.push(LinkAttribute::Controller(controller));
        self.request(
            "attaching the veth to the bridge",
            RouteNetlinkMessage::SetLink(m),
            0,
        )
        .map(drop)
    }

    /// Puts a bridge port in hairpin mode (frames may leave by the port they came in on).
    pub fn set_hairpin(&mut self, index: u32) -> Result<()> {
        let mut m = LinkMessage::default();
        m.header.index = index;
        m.attributes.push(LinkAttribute::LinkInfo(vec![
            LinkInfo::PortKind(InfoPortKind::Bridge),
            LinkInfo::PortData(InfoPortData::BridgePort(vec![InfoBridgePort::HairpinMode(true)])),
        ]));
        self.request(
            "setting the veth's hairpin mode",
            RouteNetlinkMessage::NewLink(m),
            0,
        )
        .map(drop)
    }

    pub fn delete_link(&mut self, index: u32) -> Result<()> {
        let mut m = LinkMessage::default();
        m.header.index = index;
        self.request("deleting a link", RouteNetlinkMessage::DelLink(m), 0)
            .map(drop)
    }

    /// Adds the IPv4 default route through `gateway` on link `oif` (main table).
    pub fn add_default_route(&mut self, gateway: Ipv4Addr, oif: u32) -> Result<()> {
        let mut m = RouteMessage::default();
        m.header.address_family = AddressFamily::Inet;
        m.header.table = RouteHeader::RT_TABLE_MAIN;
        m.header.protocol = RouteProtocol::Boot;
        m.header.scope = RouteScope::Universe;
        m.header.kind = RouteType::Unicast;
        m.attributes
            .push(RouteAttribute::Gateway(RouteAddress::Inet(gateway)));
        m.attributes.push(RouteAttribute::Oif(oif));
        self.request(
            "adding the default route",
            RouteNetlinkMessage::NewRoute(m),
            NLM_F_CREATE | NLM_F_EXCL,
        )
        .map(drop)
    }
}

/// The broadcast address of `address/prefix` (none for /31 and /32 networks).
fn broadcast(address: Ipv4Addr, prefix: u8) -> Option<Ipv4Addr> {
    (prefix <= 30).then(|| Ipv4Addr::from(u32::from(address) | (u32::MAX >> prefix)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broadcast_addresses() {
        let a = Ipv4Addr::new(10, 0, 2, 15);
        assert_eq!(broadcast(a, 24), Some(Ipv4Addr::new(10, 0, 2, 255)));
        assert_eq!(broadcast(a, 0), Some(Ipv4Addr::BROADCAST));
        assert_eq!(broadcast(a, 31), None);
        assert_eq!(broadcast(a, 32), None);
    }

    /// The veth request carries the peer (name and namespace) nested in IFLA_LINKINFO /
    /// IFLA_INFO_DATA / VETH_INFO_PEER, as the kernel's veth driver reads it.
    #[test]
    fn veth_request_nests_the_peer() {
        let mut p = LinkMessage::default();
        p.attributes.push(LinkAttribute::IfName("eth0".into()));
        p.attributes.push(LinkAttribute::NetNsPid(42));
        let mut m = LinkMessage::default();
        m.attributes.push(LinkAttribute::IfName("vethabc".into()));
        m.attributes.push(LinkAttribute::LinkInfo(vec![
            LinkInfo::Kind(InfoKind::Veth),
            LinkInfo::Data(InfoData::Veth(InfoVeth::Peer(p))),
        ]));
        let mut req = NetlinkMessage::from(RouteNetlinkMessage::NewLink(m));
        req.finalize();
        let mut b = vec![0u8; req.buffer_len()];
        req.serialize(&mut b);
        assert_eq!(u32::from_ne_bytes([b[0], b[1], b[2], b[3]]) as usize, b.len());
        let back = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&b).expect("parse back");
        let NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewLink(l)) = back.payload else {
            panic!("not a NewLink: {back:?}")
        };
        let info = l
            .attributes
            .iter()
            .find_map(|a| match a {
                LinkAttribute::LinkInfo(i) => Some(i),
                _ => None,
            })
            .expect("link info");
        let Some(LinkInfo::Data(InfoData::Veth(InfoVeth::Peer(peer)))) = info.get(1) else {
            panic!("no veth peer: {info:?}")
        };
        assert!(peer.attributes.contains(&LinkAttribute::NetNsPid(42)));
        assert!(peer.attributes.contains(&LinkAttribute::IfName("eth0".into())));
    }
}
