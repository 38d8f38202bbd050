//! Node client CSRs: who asked, and automatic approval and signing of a kubelet client CSR from
//! a bootstrapping node.

use std::time::SystemTime;

use base64::Engine;
use serde_json::{Value, json};

use crate::api::object::{self, b64_bytes};
use crate::api::request::Caller;
use crate::pki::Pki;

/// CSR admission: records who asked, and approves and signs a kubelet client CSR from a
/// bootstrapping node with `pki` (the upstream csrapproving + csrsigning controllers' job for
/// this signer).
pub(crate) fn admit_csr(pki: Option<&Pki>, csr: &mut Value, caller: Option<&Caller>) {
    if let Some(c) = caller {
        csr["spec"]["username"] = json!(c.user);
        csr["spec"]["groups"] = json!(c.groups);
    }
    let signer = csr["spec"]["signerName"].as_str().unwrap_or_default();
    // A bootstrap-token holder asks for any node's first certificate; a node renews only its
    // own (upstream's nodeclient and selfnodeclient approvals).
    let requester = caller.and_then(|c| crate::api::authz::node::node_name(&c.user, &c.groups));
    let bootstrapping =
        requester.is_some() || caller.is_some_and(|c| c.groups.iter().any(|g| g == "system:bootstrappers"));
    let Some(pki) = pki.filter(|_| signer == crate::pki::KUBELET_CLIENT_SIGNER && bootstrapping) else {
        return;
    };
    let pem = csr["spec"]["request"]
        .as_str()
        .and_then(|r| base64::engine::general_purpose::STANDARD.decode(r).ok());
    let now = object::rfc3339(SystemTime::now());
    match pem
        .map(|p| String::from_utf8_lossy(&p).into_owned())
        .map(|p| pki.sign_node_csr_for(&p, requester))
    {
        Some(Ok(cert)) => {
            csr["status"] = json!({
                "conditions": [{"type": "Approved", "status": "True", "reason": "AutoApproved",
                    "message": "Auto approving kubelet client certificate after SubjectAccessReview.",
                    "lastUpdateTime": now, "lastTransitionTime": now}],
                "certificate": b64_bytes(cert.as_bytes()),
            });
        }
        other => {
            let reason = match other {
                Some(Err(r)) => r.to_string(),
                _ => "spec.request is not a base64 PEM certificate request".into(),
            };
            tracing::warn!(reason = %reason, "CSR not approved");
            csr["status"] = json!({
                "conditions": [{"type": "Failed", "status": "True", "reason": "SigningError", "message": reason,
                    "lastUpdateTime": now, "lastTransitionTime": now}],
            });
        }
    }
}
