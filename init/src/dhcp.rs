//! A minimal DHCPv4 client (RFC 2131): DISCOVER, OFFER, REQUEST, ACK on one interface.
//! Message encoding and parsing are pure functions so they are unit-tested on the host.

use std::io;
use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::time::{Duration, Instant};

const MAGIC: [u8; 4] = [99, 130, 83, 99];
const OP_REQUEST: u8 = 1;
const OP_REPLY: u8 = 2;
const DHCPDISCOVER: u8 = 1;
const DHCPOFFER: u8 = 2;
const DHCPREQUEST: u8 = 3;
const DHCPACK: u8 = 5;
const DHCPNAK: u8 = 6;

/// What the server granted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub address: Ipv4Addr,
    pub prefix: u8,
    pub router: Option<Ipv4Addr>,
    pub dns: Vec<Ipv4Addr>,
    pub hostname: Option<String>,
    pub server: Ipv4Addr,
    pub lease_seconds: u32,
}

/// Builds a DISCOVER (no `requested`) or REQUEST (with `requested` address and server id).
pub fn encode(xid: u32, mac: [u8; 6], requested: Option<(Ipv4Addr, Ipv4Addr)>) -> Vec<u8> {
    let mut p = vec![0u8; 236];
    p[0] = OP_REQUEST;
    p[1] = 1; // ethernet
    p[2] = 6; // hardware address length
    p[4..8].copy_from_slice(&xid.to_be_bytes());
    p[10] = 0x80; // broadcast flag: we have no address yet
    p[28..34].copy_from_slice(&mac);
    p.extend_from_slice(&MAGIC);
    match requested {
        None => p.extend_from_slice(&[53, 1, DHCPDISCOVER]),
        Some((addr, server)) => {
            p.extend_from_slice(&[53, 1, DHCPREQUEST]);
            p.extend_from_slice(&[50, 4]);
            p.extend_from_slice(&addr.octets());
            p.extend_from_slice(&[54, 4]);
            p.extend_from_slice(&server.octets());
        }
    }
    // Parameter request list: subnet mask, router, DNS, hostname, lease time.
    p.extend_from_slice(&[55, 5, 1, 3, 6, 12, 51]);
    p.push(255);
    p
}

/// A parsed server reply: its message type and the lease it describes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub kind: u8,
    pub lease: Lease,
}

/// Parses a server reply for transaction `xid`; anything else gives `None`.
pub fn parse(xid: u32, pkt: &[u8]) -> Option<Reply> {
    if pkt.len() < 240 || pkt[0] != OP_REPLY || pkt[4..8] != xid.to_be_bytes() || pkt[236..240] != MAGIC {
        return None;
    }
    let yiaddr = Ipv4Addr::new(pkt[16], pkt[17], pkt[18], pkt[19]);
    let mut lease = Lease {
        address: yiaddr,
        prefix: 24,
        router: None,
        dns: Vec::new(),
        hostname: None,
        server: Ipv4Addr::UNSPECIFIED,
        lease_seconds: 0,
    };
    let mut kind = 0;
    let mut i = 240;
    while i < pkt.len() {
        let code = pkt[i];
        if code == 255 {
            break;
        }
        if code == 0 {
            i += 1;
            continue;
        }
        let len = *pkt.get(i + 1)? as usize;
        let val = pkt.get(i + 2..i + 2 + len)?;
        let ip = |v: &[u8]| Ipv4Addr::new(v[0], v[1], v[2], v[3]);
        match (code, len) {
            (53, 1) => kind = val[0],
            (1, 4) => lease.prefix = u32::from(ip(val)).count_ones() as u8,
            (3, l) if l >= 4 => lease.router = Some(ip(val)),
            (6, l) if l >= 4 => lease.dns = val.chunks_exact(4).map(ip).collect(),
            (12, l) if l > 0 => {
                lease.hostname = std::str::from_utf8(val)
                    .ok()
                    .map(|s| s.trim_end_matches('\0').to_string())
            }
            (51, 4) => lease.lease_seconds = u32::from_be_bytes([val[0], val[1], val[2], val[3]]),
            (54, 4) => lease.server = ip(val),
            _ => {}
        }
        i += 2 + len;
    }
    Some(Reply { kind, lease })
}

/// Errors of a DHCP exchange.
#[derive(Debug, thiserror::Error)]
pub enum DhcpError {
    #[error("socket: {0}")]
    Socket(#[from] io::Error),
    #[error("bind to device: {0}")]
    BindDevice(nix::Error),
    #[error("no {0} within {1:?}")]
    Timeout(&'static str, Duration),
    #[error("server refused the request (DHCPNAK)")]
    Nak,
}

fn wait_for(
    sock: &UdpSocket,
    xid: u32,
    want: u8,
    deadline: Instant,
    what: &'static str,
) -> Result<Lease, DhcpError> {
    let mut buf = [0u8; 1500];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(DhcpError::Timeout(what, Duration::ZERO));
        }
        sock.set_read_timeout(Some(left))?;
        match sock.recv(&mut buf) {
            Ok(n) => match parse(xid, &buf[..n]) {
                Some(r) if r.kind == want => return Ok(r.lease),
                Some(r) if r.kind == DHCPNAK => return Err(DhcpError::Nak),
                _ => continue,
            },
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                return Err(DhcpError::Timeout(what, Duration::ZERO));
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// Runs one DHCP exchange on `ifname` (which must be up), retrying `attempts` times with
/// `per_try` to wait for each answer.
pub fn acquire(ifname: &str, mac: [u8; 6], attempts: u32, per_try: Duration) -> Result<Lease, DhcpError> {
    let sock = UdpSocket::bind(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 68))?;
    nix::sys::socket::setsockopt(
        &sock,
        nix::sys::socket::sockopt::BindToDevice,
        &std::ffi::OsString::from(ifname),
    )
    .map_err(DhcpError::BindDevice)?;
    sock.set_broadcast(true)?;
    let server = SocketAddrV4::new(Ipv4Addr::BROADCAST, 67);
    let mut last = DhcpError::Timeout("DHCPOFFER", per_try);
    for attempt in 0..attempts {
        let xid = u32::from_be_bytes([mac[2], mac[3], mac[4], mac[5]]) ^ (std::process::id() << 8) ^ attempt;
        sock.send_to(&encode(xid, mac, None), server)?;
        let offer = match wait_for(&sock, xid, DHCPOFFER, Instant::now() + per_try, "DHCPOFFER") {
            Ok(o) => o,
            Err(DhcpError::Timeout(w, _)) => {
                last = DhcpError::Timeout(w, per_try * attempts);
                continue;
            }
            Err(e) => return Err(e),
        };
        sock.send_to(&encode(xid, mac, Some((offer.address, offer.server))), server)?;
        match wait_for(&sock, xid, DHCPACK, Instant::now() + per_try, "DHCPACK") {
            Ok(ack) => return Ok(ack),
            Err(DhcpError::Timeout(w, _)) => last = DhcpError::Timeout(w, per_try * attempts),
            Err(e) => return Err(e),
        }
    }
    Err(last)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(xid: u32, kind: u8) -> Vec<u8> {
        let mut p = vec![0u8; 236];
        p[0] = OP_REPLY;
        p[4..8].copy_from_slice(&xid.to_be_bytes());
        p[16..20].copy_from_slice(&[10, 0, 2, 15]);
        p.extend_from_slice(&MAGIC);
        p.extend_from_slice(&[
            53, 1, kind, 1, 4, 255, 255, 255, 0, 3, 4, 10, 0, 2, 2, 6, 8, 10, 0, 2, 3, 1, 1, 1, 1,
        ]);
        p.extend_from_slice(&[
            54, 4, 10, 0, 2, 2, 51, 4, 0, 1, 81, 128, 12, 3, b'v', b'm', b'1', 0, 255,
        ]);
        p
    }

    #[test]
    fn parses_an_offer() {
        let r = parse(7, &reply(7, DHCPOFFER)).expect("valid offer");
        assert_eq!(r.kind, DHCPOFFER);
        assert_eq!(r.lease.address, Ipv4Addr::new(10, 0, 2, 15));
        assert_eq!(r.lease.prefix, 24);
        assert_eq!(r.lease.router, Some(Ipv4Addr::new(10, 0, 2, 2)));
        assert_eq!(
            r.lease.dns,
            vec![Ipv4Addr::new(10, 0, 2, 3), Ipv4Addr::new(1, 1, 1, 1)]
        );
        assert_eq!(r.lease.server, Ipv4Addr::new(10, 0, 2, 2));
        assert_eq!(r.lease.lease_seconds, 86400);
        assert_eq!(r.lease.hostname.as_deref(), Some("vm1"));
    }

    #[test]
    fn ignores_other_transactions_and_garbage() {
        assert!(parse(8, &reply(7, DHCPOFFER)).is_none());
        assert!(parse(7, &[0u8; 100]).is_none());
        let mut truncated = reply(7, DHCPOFFER);
        truncated.truncate(245);
        // A truncated option list parses what is complete, never reads past the end.
        let _ = parse(7, &truncated);
    }

    #[test]
    fn request_carries_address_and_server() {
        let p = encode(
            1,
            [2, 0, 0, 0, 0, 1],
            Some((Ipv4Addr::new(10, 0, 2, 15), Ipv4Addr::new(10, 0, 2, 2))),
        );
        assert_eq!(&p[236..240], &MAGIC);
        assert_eq!(&p[240..243], &[53, 1, DHCPREQUEST]);
        assert_eq!(&p[243..249], &[50, 4, 10, 0, 2, 15]);
        assert_eq!(&p[28..34], &[2, 0, 0, 0, 0, 1]);
    }
}
