//! The agent's serving certificate: issued by the cluster through a
//! `kubernetes.io/kubelet-serving` CSR for the node's name and address (the control plane
//! approves that only for the node's own name and the addresses its Node reports), kept in the
//! identity directory, and renewed when a fifth of its life is left. Until it is issued the
//! endpoint serves a self-signed certificate, which the API server refuses: the node is
//! unreachable for logs and exec rather than reachable unverified.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use transport::tls::SwappableCert;

use crate::node::{JoinError, issued_certificate, submit_csr};

/// The signer of kubelet serving certificates.
pub const SIGNER: &str = "kubernetes.io/kubelet-serving";

/// How long to wait before asking again after a failure.
const RETRY: Duration = Duration::from_secs(30);

/// The names a node's serving certificate is for: its name and, when known, its address.
pub fn names(node: &str, node_ip: Option<&str>) -> Vec<String> {
    let mut names = vec![node.to_string()];
    names.extend(
        node_ip
            .filter(|ip| ip.parse::<std::net::IpAddr>().is_ok())
            .map(str::to_string),
    );
    names
}

/// When a certificate for `cert_names` valid until `not_after` should be replaced: at once when it is for other names, else when a fifth of its life is left.
pub fn renew_at(
    cert_names: &[String],
    not_after: SystemTime,
    wanted: &[String],
    now: SystemTime,
) -> SystemTime {
    let same = cert_names.len() == wanted.len() && wanted.iter().all(|w| cert_names.contains(w));
    if !same {
        return now;
    }
    // Issued certificates live a year; renew in the last fifth of whatever this one has.
    let left = not_after.duration_since(now).unwrap_or_default();
    now + left.mul_f64(0.8)
}

/// Keeps `cert` holding a cluster-issued serving certificate for `node`, forever.
pub async fn keep(
    client: kube::Client,
    node: String,
    node_ip: Option<String>,
    dir: PathBuf,
    cert: Arc<SwappableCert>,
    partition: Option<crate::state::StateStore>,
) {
    let wanted = names(&node, node_ip.as_deref());
    let (cert_path, key_path) = (dir.join("serving.crt"), dir.join("serving.key"));
    loop {
        let stored = stored(&cert_path, &key_path);
        let due = stored
            .as_ref()
            .map_or_else(SystemTime::now, |(_, _, names, not_after)| {
                renew_at(names, *not_after, &wanted, SystemTime::now())
            });
        if let Some((c, k, _, _)) = &stored
            && due > SystemTime::now()
        {
            match cert.replace(c, k) {
                Ok(()) => tracing::info!(node = %node, "serving certificate in use"),
                Err(e) => tracing::warn!(error = %e, "stored serving certificate unusable"),
            }
            let wait = due.duration_since(SystemTime::now()).unwrap_or_default();
            tokio::time::sleep(wait.min(Duration::from_secs(86_400))).await;
            continue;
        }
        match request(&client, &node, &wanted, &cert_path, &key_path).await {
            Ok(()) => crate::node::keep_identity(partition.as_ref(), &dir),
            Err(e) => {
                tracing::warn!(node = %node, error = %e, retry_in_s = RETRY.as_secs(), "no serving certificate");
                tokio::time::sleep(RETRY).await;
            }
        }
    }
}

/// The stored certificate and key with the certificate's names and expiry.
fn stored(cert_path: &Path, key_path: &Path) -> Option<(String, String, Vec<String>, SystemTime)> {
    let c = std::fs::read_to_string(cert_path).ok()?;
    let k = std::fs::read_to_string(key_path).ok()?;
    let (names, not_after) = transport::tls::certificate_names(&c)?;
    Some((c, k, names, not_after))
}

/// Asks for a certificate for `names` and stores it with its new key (waiting for approval as
/// long as the CSR stays pending).
async fn request(
    client: &kube::Client,
    node: &str,
    names: &[String],
    cert_path: &Path,
    key_path: &Path,
) -> Result<(), JoinError> {
    let (key, csr_pem) = crate::node::node_csr(node, names).map_err(JoinError::Csr)?;
    let usages = &["digital signature", "key encipherment", "server auth"];
    let name = submit_csr(client, &format!("csr-serving-{node}-"), &csr_pem, SIGNER, usages).await?;
    tracing::info!(node = %node, csr = %name, "serving certificate requested");
    let cert_pem = issued_certificate(client, &name, None).await?;
    let dir = cert_path.parent().unwrap_or(Path::new("."));
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| JoinError::Io { path, source }
    };
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    crate::state::write_private(key_path, key.serialize_pem().as_bytes()).map_err(io(key_path))?;
    std::fs::write(cert_path, &cert_pem).map_err(io(cert_path))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_the_node_and_its_address() {
        assert_eq!(names("n1", Some("10.0.2.15")), ["n1", "10.0.2.15"]);
        assert_eq!(names("n1", None), ["n1"]);
        assert_eq!(names("n1", Some("not-an-ip")), ["n1"]);
    }

    #[test]
    fn renewal_in_the_last_fifth_or_at_once_for_other_names() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let year = Duration::from_secs(365 * 86_400);
        let wanted = names("n1", Some("10.0.0.5"));
        let mut reordered = wanted.clone();
        reordered.reverse();
        let cases = [
            (wanted.clone(), now + year, now + year.mul_f64(0.8)),
            (reordered, now + year, now + year.mul_f64(0.8)),
            (vec!["n1".to_string()], now + year, now),
            (names("n2", Some("10.0.0.5")), now + year, now),
            (wanted.clone(), now - Duration::from_secs(1), now),
        ];
        for (cert_names, not_after, want) in cases {
            assert_eq!(
                renew_at(&cert_names, not_after, &wanted, now),
                want,
                "{cert_names:?}"
            );
        }
    }
}
