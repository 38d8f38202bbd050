//! Node CSRs: who asked, automatic approval of what nodes may have without a person (a first
//! kubelet client certificate for a bootstrap-token holder, renewals by the same node, and a
//! kubelet serving certificate for the node's own name and addresses), approvals through the
//! `approval` subresource, and signing by the two node signers (the upstream csrapproving and
//! csrsigning controllers' job for these signers, done as the CSR is written).

use std::net::IpAddr;
use std::time::SystemTime;

use base64::Engine;
use serde_json::{Value, json};

use crate::api::object::{self, b64_bytes};
use crate::api::request::Caller;
use crate::pki::{KUBELET_CLIENT_SIGNER, KUBELET_SERVING_SIGNER, Pki, PkiError, ServingRequest};

/// Why a kubelet serving CSR is not approved automatically (it stays pending for someone with
/// `approve` on the signer).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum NotAutoApproved {
    #[error("not requested by a node")]
    NotANode,
    #[error("node {requester:?} asked for a certificate of node {node:?}")]
    OtherNode { requester: String, node: String },
    #[error("node {0:?} is not registered")]
    NoNode(String),
    #[error("DNS name {dns:?} is not the name of node {node:?}")]
    Dns { dns: String, node: String },
    #[error("{ip} is not an address node {node:?} reports")]
    Address { ip: IpAddr, node: String },
}

/// Whether a node's serving CSR is approved without a person: the node asks for itself, the
/// DNS names are only its own name, and every IP is an address its Node object reports (the
/// API server verifies agents by the node name, so a node can never hold a certificate valid
/// for another node's name).
pub(crate) fn serving_auto_approval(
    req: &ServingRequest,
    requester: Option<&str>,
    node: Option<&Value>,
) -> Result<(), NotAutoApproved> {
    let requester = requester.ok_or(NotAutoApproved::NotANode)?;
    if requester != req.node {
        return Err(NotAutoApproved::OtherNode {
            requester: requester.to_string(),
            node: req.node.clone(),
        });
    }
    let node_obj = node.ok_or_else(|| NotAutoApproved::NoNode(req.node.clone()))?;
    if let Some(dns) = req.dns.iter().find(|d| **d != req.node) {
        return Err(NotAutoApproved::Dns {
            dns: dns.clone(),
            node: req.node.clone(),
        });
    }
    let reported: Vec<IpAddr> = node_obj["status"]["addresses"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|a| matches!(a["type"].as_str(), Some("InternalIP" | "ExternalIP")))
        .filter_map(|a| a["address"].as_str()?.parse().ok())
        .collect();
    if let Some(ip) = req.ips.iter().find(|ip| !reported.contains(ip)) {
        return Err(NotAutoApproved::Address {
            ip: *ip,
            node: req.node.clone(),
        });
    }
    Ok(())
}

/// The PEM request of a CSR object.
fn request_pem(csr: &Value) -> Option<String> {
    let raw = csr["spec"]["request"].as_str()?;
    let pem = base64::engine::general_purpose::STANDARD.decode(raw).ok()?;
    Some(String::from_utf8_lossy(&pem).into_owned())
}

/// The node a CSR is about, when it is a kubelet serving CSR from a node (the create path reads
/// that Node for [`admit_csr`]).
pub(crate) fn serving_node(csr: &Value, caller: Option<&Caller>) -> Option<String> {
    if csr["spec"]["signerName"].as_str() != Some(KUBELET_SERVING_SIGNER) {
        return None;
    }
    caller.and_then(|c| crate::api::authz::node::node_name(&c.user, &c.groups).map(str::to_string))
}

fn condition(kind: &str, reason: &str, message: &str, now: &str) -> Value {
    json!({"type": kind, "status": "True", "reason": reason, "message": message,
        "lastUpdateTime": now, "lastTransitionTime": now})
}

/// CSR admission on create: records who asked, and approves and signs what a node may have
/// without a person. `node` is the requesting node's Node object for a serving CSR
/// ([`serving_node`]).
pub(crate) fn admit_csr(pki: Option<&Pki>, csr: &mut Value, caller: Option<&Caller>, node: Option<&Value>) {
    if let Some(c) = caller {
        csr["spec"]["username"] = json!(c.user);
        csr["spec"]["groups"] = json!(c.groups);
    }
    let Some(pki) = pki else { return };
    let signer = csr["spec"]["signerName"].as_str().unwrap_or_default().to_string();
    let requester = caller.and_then(|c| crate::api::authz::node::node_name(&c.user, &c.groups));
    let now = object::rfc3339(SystemTime::now());
    let pem = request_pem(csr);
    match signer.as_str() {
        KUBELET_CLIENT_SIGNER => {
            // A bootstrap-token holder asks for any node's first certificate; a node renews
            // only its own (upstream's nodeclient and selfnodeclient approvals).
            let bootstrapping = requester.is_some()
                || caller.is_some_and(|c| c.groups.iter().any(|g| g == "system:bootstrappers"));
            if !bootstrapping {
                return;
            }
            let message = "Auto approving kubelet client certificate after SubjectAccessReview.";
            csr["status"] = json!({"conditions": [condition("Approved", "AutoApproved", message, &now)]});
            let signed = pem
                .ok_or(Unsigned::NotPem)
                .and_then(|p| pki.sign_node_csr_for(&p, requester).map_err(Unsigned::Refused));
            record_signing(csr, signed, &now);
        }
        KUBELET_SERVING_SIGNER => {
            let Some(req) = pem.as_deref().and_then(|p| crate::pki::serving_request(p).ok()) else {
                return;
            };
            if let Err(why) = serving_auto_approval(&req, requester, node) {
                tracing::info!(node = %req.node, reason = %why, "serving CSR left for approval");
                return;
            }
            let message = "Auto approving kubelet serving certificate for the node's own name and addresses.";
            csr["status"] = json!({"conditions": [condition("Approved", "AutoApproved", message, &now)]});
            let signed = pem
                .ok_or(Unsigned::NotPem)
                .and_then(|p| pki.sign_serving_csr(&p).map_err(Unsigned::Refused));
            record_signing(csr, signed, &now);
        }
        _ => {}
    }
}

/// Why an approved CSR got no certificate.
#[derive(Debug, thiserror::Error)]
enum Unsigned {
    #[error("spec.request is not a base64 PEM certificate request")]
    NotPem,
    #[error("{0}")]
    Refused(PkiError),
}

/// Puts the signer's answer on an approved CSR: the certificate, or a `Failed` condition.
fn record_signing(csr: &mut Value, signed: Result<String, Unsigned>, now: &str) {
    match signed {
        Ok(cert) => csr["status"]["certificate"] = json!(b64_bytes(cert.as_bytes())),
        Err(e) => {
            tracing::warn!(reason = %e, "approved CSR not signed");
            let failed = condition("Failed", "SignerValidationFailure", &e.to_string(), now);
            if let Some(c) = csr["status"]["conditions"].as_array_mut() {
                c.push(failed);
            }
        }
    }
}

/// Whether a CSR has a condition of `kind`.
fn has_condition(csr: &Value, kind: &str) -> bool {
    csr["status"]["conditions"]
        .as_array()
        .is_some_and(|c| c.iter().any(|x| x["type"] == kind))
}

/// What an update through `approval` may change and what follows from it: the conditions only
/// (Approved and Denied never together, never removed); a newly approved CSR of one of the node
/// signers is signed at once. Returns the object to store and whether it newly carries an
/// Approved or Denied decision (the caller needs `approve` on the signer for that).
pub(crate) fn approval_update(
    pki: Option<&Pki>,
    old: &Value,
    new: &Value,
) -> Result<(Value, bool), ApprovalError> {
    let mut out = old.clone();
    out["status"]["conditions"] = new["status"]["conditions"].clone();
    if out["status"]["conditions"].is_null() {
        out["status"]["conditions"] = json!([]);
    }
    for kind in ["Approved", "Denied"] {
        if has_condition(old, kind) && !has_condition(&out, kind) {
            return Err(ApprovalError::Removed(kind));
        }
    }
    if has_condition(&out, "Approved") && has_condition(&out, "Denied") {
        return Err(ApprovalError::Both);
    }
    let decided = ["Approved", "Denied"]
        .iter()
        .any(|k| has_condition(&out, k) && !has_condition(old, k));
    let newly_approved = has_condition(&out, "Approved") && !has_condition(old, "Approved");
    let unsigned = out["status"]["certificate"].as_str().is_none_or(str::is_empty);
    if let (true, true, Some(pki)) = (newly_approved, unsigned, pki) {
        let now = object::rfc3339(SystemTime::now());
        let pem = request_pem(&out).ok_or(Unsigned::NotPem);
        let signed = match out["spec"]["signerName"].as_str() {
            Some(KUBELET_SERVING_SIGNER) => {
                Some(pem.and_then(|p| pki.sign_serving_csr(&p).map_err(Unsigned::Refused)))
            }
            Some(KUBELET_CLIENT_SIGNER) => {
                Some(pem.and_then(|p| pki.sign_node_csr(&p).map_err(Unsigned::Refused)))
            }
            _ => None,
        };
        if let Some(s) = signed {
            record_signing(&mut out, s, &now);
        }
    }
    Ok((out, decided))
}

/// An update through `approval` that is not allowed (422 on `status.conditions`, upstream's
/// validation texts).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ApprovalError {
    #[error("Forbidden: updates may not remove a condition of type {0:?}")]
    Removed(&'static str),
    #[error("Invalid value: \"Denied\": Approved and Denied conditions are mutually exclusive")]
    Both,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(addresses: &[(&str, &str)]) -> Value {
        let a: Vec<Value> = addresses
            .iter()
            .map(|(t, a)| json!({"type": t, "address": a}))
            .collect();
        json!({"metadata": {"name": "n1"}, "status": {"addresses": a}})
    }

    fn req(node: &str, dns: &[&str], ips: &[&str]) -> ServingRequest {
        ServingRequest {
            node: node.into(),
            dns: dns.iter().map(|d| d.to_string()).collect(),
            ips: ips.iter().map(|i| i.parse().expect("ip")).collect(),
        }
    }

    #[test]
    fn serving_auto_approval_only_for_the_nodes_own_name_and_addresses() {
        let n1 = node(&[
            ("InternalIP", "10.0.0.5"),
            ("Hostname", "n1"),
            ("ExternalIP", "192.0.2.7"),
        ]);
        let other = |r: &str, n: &str| NotAutoApproved::OtherNode {
            requester: r.into(),
            node: n.into(),
        };
        type Case<'a> = (
            ServingRequest,
            Option<&'a str>,
            Option<&'a Value>,
            Result<(), NotAutoApproved>,
        );
        let cases: Vec<Case> = vec![
            (req("n1", &["n1"], &["10.0.0.5"]), Some("n1"), Some(&n1), Ok(())),
            (
                req("n1", &[], &["10.0.0.5", "192.0.2.7"]),
                Some("n1"),
                Some(&n1),
                Ok(()),
            ),
            (req("n1", &["n1"], &[]), Some("n1"), Some(&n1), Ok(())),
            (
                req("n1", &["n1"], &[]),
                None,
                Some(&n1),
                Err(NotAutoApproved::NotANode),
            ),
            (
                req("n2", &["n2"], &[]),
                Some("n1"),
                Some(&n1),
                Err(other("n1", "n2")),
            ),
            (
                req("n1", &["n1"], &[]),
                Some("n1"),
                None,
                Err(NotAutoApproved::NoNode("n1".into())),
            ),
            (
                req("n1", &["n1", "n2"], &[]),
                Some("n1"),
                Some(&n1),
                Err(NotAutoApproved::Dns {
                    dns: "n2".into(),
                    node: "n1".into(),
                }),
            ),
            (
                req("n1", &["n1"], &["127.0.0.1"]),
                Some("n1"),
                Some(&n1),
                Err(NotAutoApproved::Address {
                    ip: "127.0.0.1".parse().expect("ip"),
                    node: "n1".into(),
                }),
            ),
        ];
        for (r, requester, n, want) in cases {
            assert_eq!(
                serving_auto_approval(&r, requester, n),
                want,
                "{r:?} by {requester:?}"
            );
        }
    }

    #[test]
    fn approval_keeps_decisions_and_changes_only_conditions() {
        let approved = json!({"type": "Approved", "status": "True"});
        let denied = json!({"type": "Denied", "status": "True"});
        let pending =
            json!({"metadata": {"name": "c"}, "spec": {"signerName": "example.com/x", "request": "eA=="}});
        let mut asked = pending.clone();
        asked["spec"]["signerName"] = json!("changed");
        asked["status"] = json!({"conditions": [approved.clone()]});
        let (out, decided) = approval_update(None, &pending, &asked).expect("approved");
        assert!(decided);
        assert_eq!(
            out["spec"]["signerName"], "example.com/x",
            "only conditions change"
        );
        assert_eq!(out["status"]["conditions"], json!([approved.clone()]));
        // Removing or contradicting a decision is refused; a repeat decides nothing new.
        assert_eq!(
            approval_update(None, &out, &pending).map(|_| ()),
            Err(ApprovalError::Removed("Approved"))
        );
        let mut both = out.clone();
        both["status"]["conditions"] = json!([approved.clone(), denied]);
        assert_eq!(
            approval_update(None, &out, &both).map(|_| ()),
            Err(ApprovalError::Both)
        );
        assert_eq!(approval_update(None, &out, &out).map(|(_, d)| d), Ok(false));
    }
}
