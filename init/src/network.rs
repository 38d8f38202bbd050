//! Host networking at boot: loopback, then each configured interface by DHCP or static address,
//! a default route, and /etc/resolv.conf. Links, addresses and routes go through the runtime's
//! rtnetlink module (`runtime::net::netlink`), the one the pod network uses.

use std::net::Ipv4Addr;
use std::path::Path;
use std::time::Duration;

use runtime::net::{Netlink, NetlinkError};

use crate::config::{InterfaceConfig, MachineConfig};
use crate::{dhcp, sys};

/// Why one interface could not be configured.
#[derive(Debug, thiserror::Error)]
pub enum NetworkError {
    #[error("{step}: {source}")]
    Netlink {
        step: &'static str,
        source: NetlinkError,
    },
    #[error("interface has no Ethernet hardware address")]
    NoHardwareAddress,
    #[error("dhcp: {0}")]
    Dhcp(#[from] dhcp::DhcpError),
}

fn step(step: &'static str) -> impl FnOnce(NetlinkError) -> NetworkError {
    move |source| NetworkError::Netlink { step, source }
}

/// The outcome for one interface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Configured {
    pub name: String,
    pub address: Ipv4Addr,
    pub prefix: u8,
    pub gateway: Option<Ipv4Addr>,
    pub dns: Vec<Ipv4Addr>,
    pub dhcp_hostname: Option<String>,
}

/// Ethernet-like interfaces the kernel created (everything in /sys/class/net with a device).
pub fn physical_interfaces(sys_class_net: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(sys_class_net)
        .map(|rd| {
            rd.flatten()
                .filter(|e| e.path().join("device").exists())
                .filter_map(|e| e.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// Brings up loopback and configures the interfaces; failures are logged per interface and the
/// node carries on with what worked.
pub fn configure(cfg: &MachineConfig) -> Vec<Configured> {
    if let Err(e) = Netlink::open().and_then(|mut nl| {
        let lo = nl.index("lo")?;
        nl.set_up(lo)
    }) {
        tracing::warn!(error = %e, "loopback up failed");
    }
    let plan: Vec<InterfaceConfig> = if cfg.interfaces.is_empty() {
        physical_interfaces(Path::new("/sys/class/net"))
            .into_iter()
            .map(|name| InterfaceConfig::Dhcp { name })
            .collect()
    } else {
        cfg.interfaces.clone()
    };
    let mut done = Vec::new();
    for itf in plan {
        match configure_one(&itf) {
            Ok(c) => {
                tracing::info!(interface = %c.name, address = %format!("{}/{}", c.address, c.prefix),
                    gateway = ?c.gateway, boot_ms = sys::boot_ms(), "network up");
                done.push(c);
            }
            Err(e) => {
                let name = match &itf {
                    InterfaceConfig::Dhcp { name } | InterfaceConfig::Static { name, .. } => name,
                };
                tracing::warn!(interface = %name, error = %e, "interface not configured");
            }
        }
    }
    let mut dns: Vec<Ipv4Addr> = cfg.nameservers.clone();
    for c in &done {
        for d in &c.dns {
            if !dns.contains(d) {
                dns.push(*d);
            }
        }
    }
    if let Err(e) =
        std::fs::create_dir_all("/etc").and_then(|()| std::fs::write("/etc/resolv.conf", resolv_conf(&dns)))
    {
        tracing::warn!(error = %e, "cannot write /etc/resolv.conf");
    }
    done
}

fn configure_one(itf: &InterfaceConfig) -> Result<Configured, NetworkError> {
    let mut nl = Netlink::open().map_err(step("netlink"))?;
    match itf {
        InterfaceConfig::Static {
            name,
            address,
            prefix,
            gateway,
        } => {
            let index = nl.index(name).map_err(step("link"))?;
            nl.set_up(index).map_err(step("link up"))?;
            set_address(&mut nl, index, *address, *prefix, *gateway)?;
            Ok(Configured {
                name: name.clone(),
                address: *address,
                prefix: *prefix,
                gateway: *gateway,
                dns: Vec::new(),
                dhcp_hostname: None,
            })
        }
        InterfaceConfig::Dhcp { name } => {
            let link = nl.interface(name).map_err(step("link"))?;
            nl.set_up(link.index).map_err(step("link up"))?;
            let mac = link.mac.ok_or(NetworkError::NoHardwareAddress)?;
            let lease = dhcp::acquire(name, mac, 4, Duration::from_millis(1500))?;
            set_address(&mut nl, link.index, lease.address, lease.prefix, lease.router)?;
            Ok(Configured {
                name: name.clone(),
                address: lease.address,
                prefix: lease.prefix,
                gateway: lease.router,
                dns: lease.dns,
                dhcp_hostname: lease.hostname,
            })
        }
    }
}

/// Adds the address and the default route; either already being there is fine.
fn set_address(
    nl: &mut Netlink,
    index: u32,
    address: Ipv4Addr,
    prefix: u8,
    gateway: Option<Ipv4Addr>,
) -> Result<(), NetworkError> {
    let exists_ok = |r: Result<(), NetlinkError>| match r {
        Err(e) if e.errno() == Some(libc::EEXIST) => Ok(()),
        r => r,
    };
    exists_ok(nl.add_address(index, address, prefix)).map_err(step("set address"))?;
    if let Some(gw) = gateway {
        exists_ok(nl.add_default_route(gw, index)).map_err(step("default route"))?;
    }
    Ok(())
}

/// The hardware address of an interface.
fn hardware_address(name: &str) -> Option<[u8; 6]> {
    Netlink::open().and_then(|mut nl| nl.interface(name)).ok()?.mac
}

/// /etc/resolv.conf for the host (pods get their own from the agent).
pub fn resolv_conf(dns: &[Ipv4Addr]) -> String {
    let mut s = String::from("# written by nodeos init\n");
    for d in dns.iter().take(3) {
        s.push_str(&format!("nameserver {d}\n"));
    }
    s
}

/// The hostname: the config's, else the DHCP server's, else `node-` and the first MAC's last 3 bytes.
pub fn choose_hostname(cfg: &MachineConfig, configured: &[Configured]) -> String {
    if let Some(h) = &cfg.hostname {
        return h.clone();
    }
    if let Some(h) = configured.iter().find_map(|c| c.dhcp_hostname.clone())
        && crate::config::is_valid_hostname(&h)
    {
        return h;
    }
    let mac = physical_interfaces(Path::new("/sys/class/net"))
        .first()
        .and_then(|n| hardware_address(n));
    match mac {
        Some(m) => format!("node-{:02x}{:02x}{:02x}", m[3], m[4], m[5]),
        None => "node".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolv_conf_lists_at_most_three() {
        let dns: Vec<Ipv4Addr> = (1..=4).map(|i| Ipv4Addr::new(10, 0, 0, i)).collect();
        let text = resolv_conf(&dns);
        assert_eq!(text.matches("nameserver").count(), 3);
        assert!(text.contains("nameserver 10.0.0.1\n"));
    }

    #[test]
    fn configured_hostname_wins() {
        let cfg = MachineConfig {
            hostname: Some("n1".into()),
            ..MachineConfig::default()
        };
        assert_eq!(choose_hostname(&cfg, &[]), "n1");
    }

    /// A static interface against the kernel, as root, in a scratch network namespace (a
    /// thread that unshared its own): link up, address, default route; configuring it again
    /// is not an error. Skipped without root or network namespaces.
    #[test]
    fn configures_a_static_interface_in_a_scratch_namespace() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: needs root");
            return;
        }
        let t = std::thread::spawn(|| -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
            if nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).is_err() {
                eprintln!("skipped: no network namespaces");
                return Ok(());
            }
            let own = nix::unistd::gettid().as_raw();
            let mut nl = Netlink::open()?;
            nl.create_veth("vt0", "vt1", own)?;
            let itf = InterfaceConfig::Static {
                name: "vt0".into(),
                address: Ipv4Addr::new(10, 98, 0, 5),
                prefix: 24,
                gateway: Some(Ipv4Addr::new(10, 98, 0, 1)),
            };
            let done = configure_one(&itf)?;
            assert_eq!((done.address, done.prefix), (Ipv4Addr::new(10, 98, 0, 5), 24));
            configure_one(&itf).map_err(|e| format!("again: {e}"))?;
            let vt0 = nl.interface("vt0")?;
            assert!(vt0.mac.is_some());
            let err = nl
                .add_default_route(Ipv4Addr::new(10, 98, 0, 1), vt0.index)
                .expect_err("the route is there");
            assert_eq!(err.errno(), Some(libc::EEXIST), "{err}");
            let missing = InterfaceConfig::Static {
                name: "nope0".into(),
                address: Ipv4Addr::new(10, 97, 0, 5),
                prefix: 24,
                gateway: None,
            };
            let err = configure_one(&missing).expect_err("no such interface");
            assert!(
                err.to_string().contains("no network interface \"nope0\""),
                "{err}"
            );
            Ok(())
        });
        t.join().expect("thread").expect("static interface");
    }
}
