//! `PUT certificatesigningrequests/<name>/approval` (`kubectl certificate approve|deny`): the
//! conditions change, the caller needs `approve` on the CSR's signer to decide it (upstream's
//! CertificateApproval admission), and an approved CSR of a node signer is signed at once.

use serde_json::Value;

use crate::api::Api;
use crate::api::admission;
use crate::api::authz::Attributes;
use crate::api::object::name_of;
use crate::api::request::{Caller, Query, Target};
use crate::api::status::ApiError;

impl Api {
    /// Applies an approval update (see the module doc).
    pub(crate) async fn approve_csr(
        &self,
        t: &Target,
        new: Value,
        q: &Query,
        caller: Option<&Caller>,
    ) -> Result<Value, ApiError> {
        let name = t.name.clone().unwrap_or_default();
        if name_of(&new) != name {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({}) does not match the name on the URL ({name})",
                name_of(&new)
            )));
        }
        let (old, rev) = self.read_object(t.res, None, &name).await?;
        if let Some(want) = new["metadata"]["resourceVersion"]
            .as_str()
            .filter(|s| !s.is_empty())
            && want != rev.to_string()
        {
            return Err(ApiError::conflict(t.res, &name));
        }
        let (updated, decided) = admission::approval_update(self.pki.as_deref(), &old, &new)
            .map_err(|e| ApiError::invalid(t.res, &name, "status.conditions", &e.to_string()))?;
        if decided {
            let signer = old["spec"]["signerName"].as_str().unwrap_or_default();
            if !self.may_approve(caller, signer) {
                return Err(ApiError {
                    code: 403,
                    reason: "Forbidden",
                    message: format!(
                        "{} {name:?} is forbidden: user not permitted to approve requests with signerName {signer:?}",
                        t.res.qualified()
                    ),
                    details: None,
                });
            }
        }
        if q.dry_run() {
            return Ok(updated);
        }
        self.put_at(t.res, t.res.key(None, &name), updated, rev, &name)
            .await
    }

    /// Whether `caller` may decide CSRs of `signer`: `approve` on `signers` named `signer` or
    /// `<domain>/*` (upstream's check).
    fn may_approve(&self, caller: Option<&Caller>, signer: &str) -> bool {
        let Some(c) = caller else { return false };
        let wildcard = signer
            .split_once('/')
            .map(|(domain, _)| format!("{domain}/*"))
            .unwrap_or_default();
        [signer, wildcard.as_str()]
            .iter()
            .filter(|n| !n.is_empty())
            .any(|n| {
                let a = Attributes {
                    verb: "approve",
                    api_group: "certificates.k8s.io",
                    resource: "signers",
                    name: n,
                    resource_request: true,
                    ..Default::default()
                };
                self.authz.authorize(c, &a, "").is_ok()
            })
    }

    /// The Node object `name`, when it exists.
    pub(crate) async fn read_node(&self, name: &str) -> Option<Value> {
        let nodes = crate::api::registry::find("", "v1", "nodes")?;
        self.read_object(nodes, None, name).await.ok().map(|(v, _)| v)
    }
}
