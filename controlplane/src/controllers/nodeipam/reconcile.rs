//! Pod CIDR allocation (docs/SEEDS-SPEC.md CTL-2, CTL-3: a CIDR per node at registration, pod
//! network 10.244.0.0/16): the cluster CIDR cut into node-sized subnets, handed out round
//! robin (a released subnet comes back only after the others were tried, as upstream's
//! `cidrset`), never to two nodes at once, released when its node is deleted.

use std::collections::HashMap;
use std::fmt;
use std::net::Ipv4Addr;
use std::str::FromStr;

/// Errors of CIDR parsing and allocation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IpamError {
    #[error("invalid CIDR {0:?}")]
    Parse(String),
    #[error("node CIDR mask /{node} does not fit the cluster CIDR {cluster}")]
    Mask { cluster: Cidr, node: u8 },
    #[error("CIDR {cidr} is not a /{prefix} subnet of the cluster CIDR {cluster}")]
    OutOfRange { cidr: Cidr, cluster: Cidr, prefix: u8 },
    #[error("CIDR {cidr} is already held by node {holder}")]
    Taken { cidr: Cidr, holder: String },
    #[error("no CIDR left in {0}")]
    Exhausted(Cidr),
}

/// An IPv4 network.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Cidr {
    pub addr: Ipv4Addr,
    pub prefix: u8,
}

impl Cidr {
    fn mask(prefix: u8) -> u32 {
        if prefix == 0 {
            0
        } else {
            u32::MAX << (32 - u32::from(prefix))
        }
    }
}

impl FromStr for Cidr {
    type Err = IpamError;

    /// `a.b.c.d/n`; the host bits are dropped.
    fn from_str(s: &str) -> Result<Self, IpamError> {
        let bad = || IpamError::Parse(s.to_string());
        let (ip, prefix) = s.split_once('/').ok_or_else(bad)?;
        let ip: Ipv4Addr = ip.parse().map_err(|_| bad())?;
        let prefix: u8 = prefix.parse().map_err(|_| bad())?;
        if prefix > 32 {
            return Err(bad());
        }
        Ok(Self {
            addr: Ipv4Addr::from(u32::from(ip) & Self::mask(prefix)),
            prefix,
        })
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

/// Node IPAM tunables (kube-controller-manager's flags).
#[derive(Debug, Clone)]
pub struct IpamConfig {
    /// `--allocate-node-cidrs`.
    pub enabled: bool,
    /// `--cluster-cidr`.
    pub cluster_cidr: Cidr,
    /// `--node-cidr-mask-size`.
    pub node_mask: u8,
}

impl Default for IpamConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            cluster_cidr: Cidr {
                addr: Ipv4Addr::new(10, 244, 0, 0),
                prefix: 16,
            },
            node_mask: 24,
        }
    }
}

/// The subnets of a cluster CIDR and who holds them (by node uid).
#[derive(Debug, Clone)]
pub struct Allocator {
    cluster: Cidr,
    node_mask: u8,
    count: usize,
    holders: HashMap<usize, String>,
    of_node: HashMap<String, usize>,
    next: usize,
}

impl Allocator {
    pub fn new(cluster: Cidr, node_mask: u8) -> Result<Self, IpamError> {
        if node_mask < cluster.prefix || node_mask > 32 || node_mask - cluster.prefix > 24 {
            return Err(IpamError::Mask {
                cluster,
                node: node_mask,
            });
        }
        Ok(Self {
            cluster,
            node_mask,
            count: 1usize << (node_mask - cluster.prefix),
            holders: HashMap::new(),
            of_node: HashMap::new(),
            next: 0,
        })
    }

    fn subnet(&self, i: usize) -> Cidr {
        let step = 1u64 << (32 - u32::from(self.node_mask));
        let base = u64::from(u32::from(self.cluster.addr)) + step * i as u64;
        Cidr {
            addr: Ipv4Addr::from(u32::try_from(base).unwrap_or(u32::MAX)),
            prefix: self.node_mask,
        }
    }

    fn index_of(&self, cidr: Cidr) -> Result<usize, IpamError> {
        let out = || IpamError::OutOfRange {
            cidr,
            cluster: self.cluster,
            prefix: self.node_mask,
        };
        if cidr.prefix != self.node_mask {
            return Err(out());
        }
        let base = u32::from(self.cluster.addr);
        let ip = u32::from(cidr.addr);
        if ip & Cidr::mask(self.cluster.prefix) != base {
            return Err(out());
        }
        Ok(((ip - base) >> (32 - u32::from(self.node_mask))) as usize)
    }

    /// Records that node `uid` holds `cidr` (its `spec.podCIDR`).
    pub fn occupy(&mut self, uid: &str, cidr: &str) -> Result<(), IpamError> {
        let cidr: Cidr = cidr.parse()?;
        let i = self.index_of(cidr)?;
        match self.holders.get(&i) {
            Some(h) if h != uid => Err(IpamError::Taken {
                cidr,
                holder: h.clone(),
            }),
            _ => {
                if let Some(old) = self.of_node.insert(uid.to_string(), i)
                    && old != i
                {
                    self.holders.remove(&old);
                }
                self.holders.insert(i, uid.to_string());
                Ok(())
            }
        }
    }

    /// The CIDR of node `uid`: the one it already holds, else the next free one.
    pub fn allocate(&mut self, uid: &str) -> Result<Cidr, IpamError> {
        if let Some(i) = self.of_node.get(uid) {
            return Ok(self.subnet(*i));
        }
        for k in 0..self.count {
            let i = (self.next + k) % self.count;
            if let std::collections::hash_map::Entry::Vacant(e) = self.holders.entry(i) {
                e.insert(uid.to_string());
                self.of_node.insert(uid.to_string(), i);
                self.next = (i + 1) % self.count;
                return Ok(self.subnet(i));
            }
        }
        Err(IpamError::Exhausted(self.cluster))
    }

    /// Node `uid` is gone: its CIDR is free again.
    pub fn release(&mut self, uid: &str) -> Option<Cidr> {
        let i = self.of_node.remove(uid)?;
        self.holders.remove(&i);
        Some(self.subnet(i))
    }

    /// CIDRs held.
    pub fn used(&self) -> usize {
        self.holders.len()
    }
}
