//! Service ClusterIPs, as upstream's service IP allocator hands them out (IPv4 single stack):
//! every Service but `ExternalName` and headless ones (`clusterIP: None`) gets an address of
//! `--service-cluster-ip-range` (default [`DEFAULT_RANGE`], kubeadm's): the one it asks for
//! when it is in the range and free, else a random free one, from the upper part of the range
//! first (KEP-3070: the lower part is left for addresses chosen by hand). The network and
//! broadcast addresses are never handed out; the first address is the `kubernetes` Service's.
//!
//! An address is held by a reservation key under [`RESERVATIONS`] (created if absent, so two
//! API servers on one etcd never hand out the same address) naming the Service's uid; deleting
//! the Service drops it. A reservation whose Service is gone anyway (the server stopped between
//! the two writes) is taken back when the address is wanted again, as upstream's repair loop
//! would.

use std::net::Ipv4Addr;

use serde_json::{Value, json};

use crate::api::Api;
use crate::api::registry;
use crate::api::status::ApiError;
use crate::controllers::nodeipam::reconcile::Cidr;
use crate::storage::{StoreError, Write};

/// kubeadm's service subnet.
pub const DEFAULT_RANGE: &str = "10.96.0.0/12";
/// Where reservations live, one key per address.
pub const RESERVATIONS: &str = "/registry/ranges/serviceips/";

/// An IPv4 service CIDR.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServiceRange {
    base: u32,
    prefix: u8,
}

impl std::fmt::Display for ServiceRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", Ipv4Addr::from(self.base), self.prefix)
    }
}

/// A `--service-cluster-ip-range` that is not one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not an IPv4 CIDR a.b.c.d/8..30 naming its network")]
pub struct ServiceRangeError(String);

impl std::str::FromStr for ServiceRange {
    type Err = ServiceRangeError;

    /// `a.b.c.d/n` with 8 ≤ n ≤ 30 (at least two usable addresses, at most 2^24 as upstream
    /// limits the bitmap), the address being the network's. Parsed as the node IPAM's CIDRs
    /// are; that parser drops host bits, so a range naming a host shows as a different text.
    fn from_str(s: &str) -> Result<Self, ServiceRangeError> {
        let bad = || ServiceRangeError(s.to_string());
        let cidr: Cidr = s.parse().map_err(|_| bad())?;
        if !(8..=30).contains(&cidr.prefix) || cidr.to_string() != s {
            return Err(bad());
        }
        Ok(Self {
            base: u32::from(cidr.addr),
            prefix: cidr.prefix,
        })
    }
}

fn mask(prefix: u8) -> u32 {
    u32::MAX << (32 - u32::from(prefix))
}

impl Default for ServiceRange {
    fn default() -> Self {
        DEFAULT_RANGE.parse().unwrap_or(Self {
            base: u32::from(Ipv4Addr::new(10, 96, 0, 0)),
            prefix: 12,
        })
    }
}

impl ServiceRange {
    /// Addresses that may be handed out (without the network and broadcast ones).
    pub fn usable(&self) -> u32 {
        (1u32 << (32 - u32::from(self.prefix))) - 2
    }

    /// The `i`-th usable address (0: the first after the network address).
    pub fn nth(&self, i: u32) -> Ipv4Addr {
        Ipv4Addr::from(self.base + 1 + i)
    }

    /// The index of `ip` among the usable addresses, when it is one.
    pub fn index(&self, ip: Ipv4Addr) -> Option<u32> {
        let n = u32::from(ip);
        (n & mask(self.prefix) == self.base)
            .then(|| n - self.base)
            .filter(|&o| o >= 1 && o <= self.usable())
            .map(|o| o - 1)
    }

    /// The first address: the `kubernetes` Service's.
    pub fn first(&self) -> Ipv4Addr {
        self.nth(0)
    }

    /// How many low addresses are kept for static allocation (KEP-3070): min(max(16, size/16),
    /// 256).
    pub fn static_band(&self) -> u32 {
        (self.usable() / 16).clamp(16, 256).min(self.usable())
    }

    /// The order in which to try addresses for a Service that asks for none, from `start` (a
    /// random number): the dynamic band from a random point around, then the static band.
    pub fn candidates(&self, start: u32) -> impl Iterator<Item = Ipv4Addr> + '_ {
        let band = self.static_band();
        let dynamic = self.usable() - band;
        let offset = if dynamic == 0 { 0 } else { start % dynamic };
        (0..dynamic)
            .map(move |i| self.nth(band + (offset + i) % dynamic))
            .chain((0..band).map(|i| self.nth(i)))
    }
}

/// Whether a Service of this spec gets a ClusterIP.
pub fn wants_cluster_ip(spec: &Value) -> bool {
    spec["type"] != "ExternalName" && spec["clusterIP"] != "None"
}

/// On update: a Service keeps its ClusterIP. A body without one gets the stored one (upstream's
/// `patchAllocatedValues`, so `kubectl replace` of a manifest without it works); another one is
/// the 422 `spec.clusterIP: Invalid value: "<ip>": field is immutable`.
pub fn keep_cluster_ip(old: &Value, new: &mut Value, name: &str) -> Result<(), ApiError> {
    let Some(old_ip) = old["spec"]["clusterIP"]
        .as_str()
        .filter(|ip| !ip.is_empty() && *ip != "None")
    else {
        return Ok(());
    };
    if !new["spec"].is_object() || new["spec"]["type"] == "ExternalName" {
        return Ok(());
    }
    match new["spec"]["clusterIP"].as_str().filter(|ip| !ip.is_empty()) {
        Some(ip) if ip != old_ip => {
            let res = registry::find("", "v1", "services")
                .ok_or_else(|| ApiError::internal("services not served"))?;
            Err(ApiError::invalid(
                res,
                name,
                "spec.clusterIP",
                &format!("Invalid value: {ip:?}: field is immutable"),
            ))
        }
        _ => {
            for k in ["clusterIP", "clusterIPs", "ipFamilies", "ipFamilyPolicy"] {
                if new["spec"].get(k).is_none_or(Value::is_null) && !old["spec"][k].is_null() {
                    new["spec"][k] = old["spec"][k].clone();
                }
            }
            Ok(())
        }
    }
}

/// The 422 of a ClusterIP that cannot be had, worded as upstream's.
fn invalid(name: &str, ip: &str, why: &str) -> ApiError {
    let res = registry::find("", "v1", "services");
    let field = "spec.clusterIPs";
    let message = format!("Invalid value: []string{{{ip:?}}}: failed to allocate IP {ip}: {why}");
    match res {
        Some(res) => ApiError::invalid(res, name, field, &message),
        None => ApiError::internal(message),
    }
}

impl Api {
    /// Gives the new Service `svc` (namespace `ns`, its uid already set) its ClusterIP, reserved
    /// for it; returns the reservation key (to drop if the create then fails).
    pub(crate) async fn allocate_cluster_ip(
        &self,
        ns: &str,
        svc: &mut Value,
    ) -> Result<Option<String>, ApiError> {
        if !wants_cluster_ip(&svc["spec"]) {
            return Ok(None);
        }
        let range = self.service_range;
        let name = svc["metadata"]["name"].as_str().unwrap_or_default().to_string();
        let holder = json!({"namespace": ns, "name": name, "uid": svc["metadata"]["uid"]});
        let asked = svc["spec"]["clusterIP"]
            .as_str()
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .or_else(|| svc["spec"]["clusterIPs"][0].as_str().map(str::to_string));
        let ip = match asked {
            Some(text) => {
                let ip: Ipv4Addr = text.parse().map_err(|_| {
                    invalid(
                        &name,
                        &text,
                        "not a valid IPv4 address (this cluster is IPv4 only)",
                    )
                })?;
                if range.index(ip).is_none() {
                    return Err(invalid(
                        &name,
                        &text,
                        &format!(
                            "the provided IP ({text}) is not in the valid range. The range of valid IPs is {range}"
                        ),
                    ));
                }
                if !self.reserve(ip, &holder).await? {
                    return Err(invalid(&name, &text, "provided IP is already allocated"));
                }
                ip
            }
            None => {
                let mut start = [0u8; 4];
                let _ = getrandom::fill(&mut start);
                let mut found = None;
                for ip in range.candidates(u32::from_le_bytes(start)) {
                    if self.reserve(ip, &holder).await? {
                        found = Some(ip);
                        break;
                    }
                }
                found.ok_or_else(|| {
                    ApiError::internal(format!("failed to allocate a serviceIP: range is full ({range})"))
                })?
            }
        };
        let spec = &mut svc["spec"];
        spec["clusterIP"] = json!(ip.to_string());
        spec["clusterIPs"] = json!([ip.to_string()]);
        spec["ipFamilies"] = json!(["IPv4"]);
        spec["ipFamilyPolicy"] = json!("SingleStack");
        Ok(Some(format!("{RESERVATIONS}{ip}")))
    }

    /// Reserves `ip` for `holder`: true when it was free, or held by a Service that is gone
    /// (that reservation is taken back).
    async fn reserve(&self, ip: Ipv4Addr, holder: &Value) -> Result<bool, ApiError> {
        let key = format!("{RESERVATIONS}{ip}");
        let mut holder = holder.clone();
        holder["ip"] = json!(ip.to_string());
        let value = bytes::Bytes::from(holder.to_string());
        for _ in 0..2 {
            let err = match self
                .store
                .write(Write::Create {
                    key: key.clone(),
                    value: value.clone(),
                })
                .await
            {
                Ok(_) => return Ok(true),
                Err(e) => e,
            };
            if !matches!(err, StoreError::AlreadyExists { .. }) {
                return Err(ApiError::internal(err.to_string()));
            }
            let Some(current) = self
                .store
                .get(&key)
                .await
                .map_err(|e| ApiError::internal(e.to_string()))?
            else {
                continue;
            };
            if self.reservation_in_use(&current.value).await? {
                return Ok(false);
            }
            // Stale: take it back (unless someone else just did) and try again.
            let _ = self
                .store
                .write(Write::Delete {
                    key: key.clone(),
                    expected: Some(current.mod_revision),
                })
                .await;
        }
        Ok(false)
    }

    /// Whether the Service a reservation names still exists with that uid.
    async fn reservation_in_use(&self, reservation: &[u8]) -> Result<bool, ApiError> {
        let Ok(r) = serde_json::from_slice::<Value>(reservation) else {
            return Ok(false);
        };
        let res =
            registry::find("", "v1", "services").ok_or_else(|| ApiError::internal("services not served"))?;
        let (Some(ns), Some(name)) = (r["namespace"].as_str(), r["name"].as_str()) else {
            return Ok(false);
        };
        match self.read_object(res, Some(ns), name).await {
            // Same Service (uid) still holding the address (not turned headless/ExternalName).
            Ok((svc, _)) => Ok(svc["metadata"]["uid"] == r["uid"]
                && r["ip"].as_str().is_some_and(|ip| svc["spec"]["clusterIP"] == ip)),
            Err(e) if e.code == 404 => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Creates the `kubernetes` Service of `default` (the API server's, at the range's first
    /// address; port 443 `https` to `target_port`) unless it exists.
    pub async fn ensure_kubernetes_service(&self, target_port: u16) -> Result<(), ApiError> {
        let res =
            registry::find("", "v1", "services").ok_or_else(|| ApiError::internal("services not served"))?;
        match self.read_object(res, Some("default"), "kubernetes").await {
            Ok(_) => return Ok(()),
            Err(e) if e.code == 404 => {}
            Err(e) => return Err(e),
        }
        let t = crate::api::request::Target {
            res,
            namespace: Some("default".into()),
            name: None,
            sub: None,
        };
        let svc = json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "kubernetes", "labels": {"component": "apiserver", "provider": "kubernetes"}},
            "spec": {"clusterIP": self.service_range.first().to_string(), "type": "ClusterIP",
                "sessionAffinity": "None",
                "ports": [{"name": "https", "port": 443, "protocol": "TCP", "targetPort": target_port}]}});
        match self
            .create(&t, svc, &crate::api::request::Query::default(), None)
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if e.code == 409 => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Drops the reservation of a deleted Service's address (when it still names that Service;
    /// a failure leaves a stale reservation, taken back when the address is wanted again).
    pub(crate) async fn release_address_of(&self, svc: &Value) {
        let Some(ip) = svc["spec"]["clusterIP"]
            .as_str()
            .filter(|ip| !ip.is_empty() && *ip != "None")
        else {
            return;
        };
        let key = format!("{RESERVATIONS}{ip}");
        let Ok(Some(current)) = self.store.get(&key).await else {
            return;
        };
        let held_by_it =
            serde_json::from_slice::<Value>(&current.value).is_ok_and(|r| r["uid"] == svc["metadata"]["uid"]);
        if held_by_it {
            let _ = self
                .store
                .write(Write::Delete {
                    key,
                    expected: Some(current.mod_revision),
                })
                .await;
        }
    }

    /// Drops a reservation made for a Service whose create then failed.
    pub(crate) async fn release_cluster_ip(&self, key: &str) {
        let _ = self
            .store
            .write(Write::Delete {
                key: key.to_string(),
                expected: None,
            })
            .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_parse_and_count_as_upstreams() {
        let r: ServiceRange = "10.96.0.0/12".parse().expect("valid");
        assert_eq!(r, ServiceRange::default());
        assert_eq!(r.to_string(), "10.96.0.0/12");
        assert_eq!(r.usable(), (1 << 20) - 2);
        assert_eq!(r.first(), Ipv4Addr::new(10, 96, 0, 1));
        assert_eq!(r.static_band(), 256);
        assert_eq!(r.index(Ipv4Addr::new(10, 96, 0, 10)), Some(9));
        assert_eq!(r.index(Ipv4Addr::new(10, 96, 0, 0)), None, "network address");
        assert_eq!(
            r.index(Ipv4Addr::new(10, 111, 255, 255)),
            None,
            "broadcast address"
        );
        assert_eq!(r.index(Ipv4Addr::new(10, 111, 255, 254)), Some(r.usable() - 1));
        assert_eq!(r.index(Ipv4Addr::new(10, 112, 0, 1)), None, "outside");
        for bad in [
            "10.96.0.1/12",
            "10.96.0.0",
            "10.96.0.0/31",
            "10.96.0.0/4",
            "fd00::/108",
            "x/12",
        ] {
            assert!(bad.parse::<ServiceRange>().is_err(), "{bad}");
        }
        let small: ServiceRange = "10.0.0.0/28".parse().expect("valid");
        assert_eq!((small.usable(), small.static_band()), (14, 14));
    }

    #[test]
    fn dynamic_addresses_come_from_the_upper_band_first_then_the_static_one() {
        let r: ServiceRange = "10.0.0.0/24".parse().expect("valid");
        assert_eq!(r.static_band(), 16);
        let all: Vec<Ipv4Addr> = r.candidates(7).collect();
        assert_eq!(all.len() as u32, r.usable(), "every usable address once");
        let mut sorted = all.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), all.len());
        assert_eq!(
            all[0],
            Ipv4Addr::new(10, 0, 0, 24),
            "band 16 + 7, after the network address"
        );
        assert!(all[..238].iter().all(|ip| r.index(*ip).is_some_and(|i| i >= 16)));
        assert_eq!(all[238], Ipv4Addr::new(10, 0, 0, 1), "then the static band");
        let tiny: ServiceRange = "10.0.0.0/28".parse().expect("valid");
        assert_eq!(tiny.candidates(3).count(), 14, "all static: still every address");
    }

    #[test]
    fn updates_keep_the_address() {
        let old = json!({"spec": {"clusterIP": "10.96.0.9", "clusterIPs": ["10.96.0.9"],
            "ipFamilies": ["IPv4"], "ipFamilyPolicy": "SingleStack", "ports": [{"port": 80}]}});
        let mut without = json!({"spec": {"ports": [{"port": 81}]}});
        keep_cluster_ip(&old, &mut without, "s").expect("kept");
        assert_eq!(without["spec"]["clusterIPs"], json!(["10.96.0.9"]));
        assert_eq!(without["spec"]["clusterIP"], "10.96.0.9");
        let mut same = json!({"spec": {"clusterIP": "10.96.0.9"}});
        keep_cluster_ip(&old, &mut same, "s").expect("same address");
        let mut other = json!({"spec": {"clusterIP": "10.96.0.10"}});
        let err = keep_cluster_ip(&old, &mut other, "s").expect_err("immutable");
        assert_eq!(
            (err.code, err.message.as_str()),
            (
                422,
                "Service \"s\" is invalid: spec.clusterIP: Invalid value: \"10.96.0.10\": field is immutable"
            )
        );
        let mut external = json!({"spec": {"type": "ExternalName", "externalName": "x.example"}});
        keep_cluster_ip(&old, &mut external, "s").expect("ExternalName drops the address");
        assert!(external["spec"]["clusterIP"].is_null());
    }

    #[test]
    fn which_services_get_an_address() {
        assert!(wants_cluster_ip(&json!({"type": "ClusterIP"})));
        assert!(wants_cluster_ip(&json!({"type": "NodePort"})));
        assert!(wants_cluster_ip(&json!({})));
        assert!(!wants_cluster_ip(&json!({"type": "ExternalName"})));
        assert!(!wants_cluster_ip(&json!({"clusterIP": "None"})));
    }
}
