//! The cluster's PKI, created on first start in the data directory and reused afterwards: the
//! cluster CA, the API server's serving certificate, the admin client certificate
//! (`O=system:masters`), an admin bearer token, and `admin.kubeconfig`.

use std::net::SocketAddr;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use base64::Engine;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose,
    SanType,
};
#[cfg(test)]
use rustls::pki_types::pem::PemObject;

/// Errors creating or loading the PKI.
#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("certificate generation: {0}")]
    Gen(#[from] rcgen::Error),
    #[error("bad CSR: {0}")]
    BadCsr(rcgen::Error),
    #[error("subject must be CN=system:node:<name>, O=system:nodes (got CN={cn:?}, O={org:?})")]
    NotANodeSubject { cn: String, org: String },
    #[error("node {requester:?} may only renew its own certificate, not one for {cn:?}")]
    OtherNode { cn: String, requester: String },
    #[error("signing with the service-account key: {0}")]
    Sign(String),
    #[error(
        "the PKI in {dir} is incomplete (missing {missing}): refusing to create a new cluster CA over it; restore the files or remove the directory"
    )]
    Partial { dir: PathBuf, missing: String },
    #[error("a kubelet serving certificate request names only DNS names and IP addresses, and at least one")]
    ServingNames,
}

/// What a kubelet serving CSR asks for (validated as upstream's kubelet-serving signer validates
/// it: `CN=system:node:<name>`, `O=system:nodes`, DNS and IP SANs only, at least one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServingRequest {
    /// The node named by the subject.
    pub node: String,
    pub dns: Vec<String>,
    pub ips: Vec<std::net::IpAddr>,
}

/// PEM material of the cluster.
#[derive(Debug, Clone)]
pub struct Pki {
    pub ca_pem: String,
    pub server_cert_pem: String,
    pub server_key_pem: String,
    pub admin_cert_pem: String,
    pub admin_key_pem: String,
    pub admin_token: String,
    /// Node bootstrap token (`<id>.<secret>`): lets a node submit its client CSR.
    pub bootstrap_token: String,
    ca_key_pem: String,
    /// PKCS#8 of the ECDSA P-256 key that signs service-account tokens (`sa.key`).
    sa_key_pkcs8: Vec<u8>,
}

fn read(path: &Path) -> Result<String, PkiError> {
    std::fs::read_to_string(path).map_err(|source| PkiError::Io {
        path: path.into(),
        source,
    })
}

/// Writes `data` to `path` (mode 0600) atomically: a temporary file, fsynced, renamed over
/// `path`, and the directory fsynced, so a crash leaves the old file or the new one.
fn write_private(path: &Path, data: &str) -> Result<(), PkiError> {
    use std::io::Write;
    let io = |source| PkiError::Io {
        path: path.into(),
        source,
    };
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(io)?;
    f.write_all(data.as_bytes()).map_err(io)?;
    f.sync_all().map_err(io)?;
    std::fs::rename(&tmp, path).map_err(io)?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(io)?;
    }
    Ok(())
}

const FILES: [&str; 8] = [
    "ca.crt",
    "ca.key",
    "server.crt",
    "server.key",
    "admin.crt",
    "admin.key",
    "admin.token",
    "bootstrap.token",
];

/// The service-account signing key at `path`, created on first use (also in a PKI from before
/// service-account tokens existed).
fn service_account_key(path: &Path) -> Result<Vec<u8>, PkiError> {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD;
    if path.exists() {
        let text = read(path)?;
        let body: String = text.lines().filter(|l| !l.starts_with("-----")).collect();
        return b64.decode(body.trim()).map_err(|e| PkiError::Io {
            path: path.into(),
            source: std::io::Error::other(e.to_string()),
        });
    }
    let rng = ring::rand::SystemRandom::new();
    let doc = ring::signature::EcdsaKeyPair::generate_pkcs8(
        &ring::signature::ECDSA_P256_SHA256_FIXED_SIGNING,
        &rng,
    )
    .map_err(|_| PkiError::Io {
        path: path.into(),
        source: std::io::Error::other("generating the key"),
    })?;
    let pem = format!(
        "-----BEGIN PRIVATE KEY-----\n{}\n-----END PRIVATE KEY-----\n",
        b64.encode(doc.as_ref())
    );
    write_private(path, &pem)?;
    Ok(doc.as_ref().to_vec())
}

/// The signer of kubelet serving certificates (what an agent asks for its TLS endpoint; the API
/// server verifies agents against them).
pub const KUBELET_SERVING_SIGNER: &str = "kubernetes.io/kubelet-serving";

/// How long issued node certificates (client and serving) are valid.
const NODE_CERT_DAYS: u64 = 365;

/// The node named by a CSR's subject (`CN=system:node:<name>`, `O=system:nodes`).
fn node_subject(csr: &rcgen::CertificateSigningRequestParams) -> Result<String, PkiError> {
    let dn = &csr.params.distinguished_name;
    let text = |t: &DnType| match dn.get(t) {
        Some(rcgen::DnValue::Utf8String(s)) => Some(s.clone()),
        Some(rcgen::DnValue::PrintableString(s)) => Some(s.as_str().to_string()),
        Some(other) => Some(format!("{other:?}")),
        None => None,
    };
    let cn = text(&DnType::CommonName).unwrap_or_default();
    let org = text(&DnType::OrganizationName).unwrap_or_default();
    match cn.strip_prefix("system:node:") {
        Some(node) if !node.is_empty() && org == "system:nodes" => Ok(node.to_string()),
        _ => Err(PkiError::NotANodeSubject { cn, org }),
    }
}

/// A new key and a CSR (PEM) for `CN=system:node:<node>, O=system:nodes` with `names` (DNS
/// names and IP addresses) as SANs: what hollow nodes and tests ask for as nodes do.
pub fn node_csr(node: &str, names: &[String]) -> Result<(KeyPair, String), PkiError> {
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(names.to_vec())?;
    params
        .distinguished_name
        .push(DnType::CommonName, format!("system:node:{node}"));
    params
        .distinguished_name
        .push(DnType::OrganizationName, "system:nodes");
    let pem = params.serialize_request(&key)?.pem()?;
    Ok((key, pem))
}

/// Parses a kubelet serving CSR (PEM) and checks it the way upstream's signer does.
pub fn serving_request(csr_pem: &str) -> Result<ServingRequest, PkiError> {
    let csr = rcgen::CertificateSigningRequestParams::from_pem(csr_pem).map_err(PkiError::BadCsr)?;
    serving_request_of(&csr)
}

fn serving_request_of(csr: &rcgen::CertificateSigningRequestParams) -> Result<ServingRequest, PkiError> {
    let node = node_subject(csr)?;
    let (mut dns, mut ips) = (Vec::new(), Vec::new());
    for san in &csr.params.subject_alt_names {
        match san {
            SanType::DnsName(d) => dns.push(d.as_str().to_string()),
            SanType::IpAddress(ip) => ips.push(*ip),
            _ => return Err(PkiError::ServingNames),
        }
    }
    if dns.is_empty() && ips.is_empty() {
        return Err(PkiError::ServingNames);
    }
    Ok(ServingRequest { node, dns, ips })
}

/// The user of the API server's client certificate for node agents. It is in no group: the
/// bootstrap binding `nodeos:kube-apiserver-kubelet-client` gives it `system:kubelet-api-admin`
/// and nothing else.
pub const KUBELET_CLIENT_USER: &str = "kube-apiserver-kubelet-client";

/// The signer of kubelet client certificates (what a joining node asks for).
pub const KUBELET_CLIENT_SIGNER: &str = "kubernetes.io/kube-apiserver-client-kubelet";

fn random_hex(n: usize) -> Result<String, PkiError> {
    let mut b = vec![0u8; n];
    getrandom::fill(&mut b).map_err(|e| PkiError::Io {
        path: "getrandom".into(),
        source: std::io::Error::other(e.to_string()),
    })?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

impl Pki {
    /// Loads the PKI from `dir`, creating it when absent. `sans` are the serving certificate's
    /// names and addresses (IP literals become IP SANs).
    pub fn load_or_create(dir: &Path, sans: &[String]) -> Result<Self, PkiError> {
        use std::os::unix::fs::PermissionsExt;
        let io = |source| PkiError::Io {
            path: dir.into(),
            source,
        };
        std::fs::create_dir_all(dir).map_err(io)?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(io)?;
        let missing: Vec<&str> = FILES.iter().copied().filter(|f| !dir.join(f).exists()).collect();
        // Some files but not all: never a new CA over what nodes and clients already trust.
        if !missing.is_empty() && missing.len() < FILES.len() {
            return Err(PkiError::Partial {
                dir: dir.into(),
                missing: missing.join(", "),
            });
        }
        let sa_key_pkcs8 = service_account_key(&dir.join("sa.key"))?;
        if missing.is_empty() {
            return Ok(Self {
                sa_key_pkcs8,
                ca_pem: read(&dir.join("ca.crt"))?,
                server_cert_pem: read(&dir.join("server.crt"))?,
                server_key_pem: read(&dir.join("server.key"))?,
                admin_cert_pem: read(&dir.join("admin.crt"))?,
                admin_key_pem: read(&dir.join("admin.key"))?,
                admin_token: read(&dir.join("admin.token"))?.trim().to_string(),
                bootstrap_token: read(&dir.join("bootstrap.token"))?.trim().to_string(),
                ca_key_pem: read(&dir.join("ca.key"))?,
            });
        }
        let ca_key = KeyPair::generate()?;
        let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "nodeos-cluster-ca");
        ca_params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca = ca_params.self_signed(&ca_key)?;

        let server_key = KeyPair::generate()?;
        let mut sp = CertificateParams::new(Vec::<String>::new())?;
        sp.distinguished_name.push(DnType::CommonName, "kube-apiserver");
        for s in sans {
            sp.subject_alt_names.push(match s.parse::<std::net::IpAddr>() {
                Ok(ip) => SanType::IpAddress(ip),
                Err(_) => SanType::DnsName(s.clone().try_into()?),
            });
        }
        sp.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let server = sp.signed_by(&server_key, &ca, &ca_key)?;

        let admin_key = KeyPair::generate()?;
        let mut ap = CertificateParams::new(Vec::<String>::new())?;
        ap.distinguished_name.push(DnType::CommonName, "admin");
        ap.distinguished_name
            .push(DnType::OrganizationName, "system:masters");
        ap.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let admin = ap.signed_by(&admin_key, &ca, &ca_key)?;

        let token = random_hex(24)?;
        let bootstrap_token = format!("{}.{}", &random_hex(3)?, &random_hex(8)?);
        let pki = Self {
            ca_pem: ca.pem(),
            server_cert_pem: server.pem(),
            server_key_pem: server_key.serialize_pem(),
            admin_cert_pem: admin.pem(),
            admin_key_pem: admin_key.serialize_pem(),
            admin_token: token,
            bootstrap_token,
            ca_key_pem: ca_key.serialize_pem(),
            sa_key_pkcs8,
        };
        write_private(&dir.join("ca.key"), &pki.ca_key_pem)?;
        write_private(&dir.join("bootstrap.token"), &pki.bootstrap_token)?;
        write_private(&dir.join("ca.crt"), &pki.ca_pem)?;
        write_private(&dir.join("server.crt"), &pki.server_cert_pem)?;
        write_private(&dir.join("server.key"), &pki.server_key_pem)?;
        write_private(&dir.join("admin.crt"), &pki.admin_cert_pem)?;
        write_private(&dir.join("admin.key"), &pki.admin_key_pem)?;
        write_private(&dir.join("admin.token"), &pki.admin_token)?;
        Ok(pki)
    }

    /// The bootstrap token's id (the part before the dot); the caller is `system:bootstrap:<id>`.
    pub fn bootstrap_token_id(&self) -> &str {
        self.bootstrap_token.split('.').next().unwrap_or_default()
    }

    /// Signs a node's client CSR (PEM): the subject must be `CN=system:node:<name>`,
    /// `O=system:nodes`. Returns the certificate PEM (client auth, issued by the cluster CA).
    pub fn sign_node_csr(&self, csr_pem: &str) -> Result<String, PkiError> {
        self.sign_node_csr_for(csr_pem, None)
    }

    /// [`Self::sign_node_csr`], for a CSR a node posted itself (`requester`, the node's name):
    /// it may only be for that same node (a renewal).
    pub fn sign_node_csr_for(&self, csr_pem: &str, requester: Option<&str>) -> Result<String, PkiError> {
        let csr = rcgen::CertificateSigningRequestParams::from_pem(csr_pem).map_err(PkiError::BadCsr)?;
        let node = node_subject(&csr)?;
        if let Some(r) = requester
            && r != node
        {
            return Err(PkiError::OtherNode {
                cn: format!("system:node:{node}"),
                requester: r.to_string(),
            });
        }
        self.issue(csr, ExtendedKeyUsagePurpose::ClientAuth)
    }

    /// Signs a kubelet serving CSR (PEM) that passes [`serving_request`]: a server-auth
    /// certificate for its DNS names and addresses, issued by the cluster CA. Whether the
    /// request may be signed at all (approval) is the caller's decision.
    pub fn sign_serving_csr(&self, csr_pem: &str) -> Result<String, PkiError> {
        let csr = rcgen::CertificateSigningRequestParams::from_pem(csr_pem).map_err(PkiError::BadCsr)?;
        serving_request_of(&csr)?;
        self.issue(csr, ExtendedKeyUsagePurpose::ServerAuth)
    }

    /// Issues a node certificate for `csr` with the one extended key usage `usage`.
    fn issue(
        &self,
        mut csr: rcgen::CertificateSigningRequestParams,
        usage: ExtendedKeyUsagePurpose,
    ) -> Result<String, PkiError> {
        csr.params.is_ca = IsCa::NoCa;
        csr.params.extended_key_usages = vec![usage];
        csr.params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        let now = std::time::SystemTime::now();
        csr.params.not_before = (now - std::time::Duration::from_secs(300)).into();
        csr.params.not_after = (now + std::time::Duration::from_secs(NODE_CERT_DAYS * 86_400)).into();
        let (ca, ca_key) = self.ca()?;
        Ok(csr.signed_by(&ca, &ca_key)?.pem())
    }

    /// A fresh client certificate for talking to node agents (`pods/log`, `pods/exec`, stats):
    /// CN [`KUBELET_CLIENT_USER`] in no group, issued by the cluster CA for a year.
    /// Returns (certificate PEM, key PEM).
    pub fn kubelet_client(&self) -> Result<(String, String), PkiError> {
        let key = KeyPair::generate()?;
        let mut p = CertificateParams::new(Vec::<String>::new())?;
        p.distinguished_name.push(DnType::CommonName, KUBELET_CLIENT_USER);
        p.is_ca = IsCa::NoCa;
        p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        p.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        let now = std::time::SystemTime::now();
        p.not_before = (now - std::time::Duration::from_secs(300)).into();
        p.not_after = (now + std::time::Duration::from_secs(365 * 86_400)).into();
        let (ca, ca_key) = self.ca()?;
        let cert = p.signed_by(&key, &ca, &ca_key)?;
        Ok((cert.pem(), key.serialize_pem()))
    }

    /// The CA certificate and key, to sign with.
    fn ca(&self) -> Result<(rcgen::Certificate, KeyPair), PkiError> {
        let ca_key = KeyPair::from_pem(&self.ca_key_pem)?;
        let ca = CertificateParams::from_ca_cert_pem(&self.ca_pem)?.self_signed(&ca_key)?;
        Ok((ca, ca_key))
    }

    /// A compact JWS (ES256) of `claims`, signed with the service-account key.
    pub fn sign_jwt(&self, claims: &serde_json::Value) -> Result<String, PkiError> {
        use base64::Engine;
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let rng = ring::rand::SystemRandom::new();
        let key = ring::signature::EcdsaKeyPair::from_pkcs8(
            &ring::signature::ECDSA_P256_SHA256_FIXED_SIGNING,
            &self.sa_key_pkcs8,
            &rng,
        )
        .map_err(|e| PkiError::Sign(e.to_string()))?;
        let header = serde_json::json!({"alg": "ES256", "typ": "JWT", "kid": self.sa_key_id()});
        let input = format!(
            "{}.{}",
            b64.encode(header.to_string()),
            b64.encode(claims.to_string())
        );
        let sig = key
            .sign(&rng, input.as_bytes())
            .map_err(|e| PkiError::Sign(e.to_string()))?;
        Ok(format!("{input}.{}", b64.encode(sig.as_ref())))
    }

    /// The claims of a JWS this PKI signed (None: malformed, another algorithm or a bad signature).
    pub fn verify_jwt(&self, token: &str) -> Option<serde_json::Value> {
        use base64::Engine;
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let mut parts = token.split('.');
        let (h, c, s) = (parts.next()?, parts.next()?, parts.next()?);
        if parts.next().is_some() {
            return None;
        }
        let header: serde_json::Value = serde_json::from_slice(&b64.decode(h).ok()?).ok()?;
        if header["alg"] != "ES256" {
            return None;
        }
        let rng = ring::rand::SystemRandom::new();
        let key = ring::signature::EcdsaKeyPair::from_pkcs8(
            &ring::signature::ECDSA_P256_SHA256_FIXED_SIGNING,
            &self.sa_key_pkcs8,
            &rng,
        )
        .ok()?;
        use ring::signature::KeyPair as _;
        let public = ring::signature::UnparsedPublicKey::new(
            &ring::signature::ECDSA_P256_SHA256_FIXED,
            key.public_key().as_ref(),
        );
        public
            .verify(format!("{h}.{c}").as_bytes(), &b64.decode(s).ok()?)
            .ok()?;
        serde_json::from_slice(&b64.decode(c).ok()?).ok()
    }

    /// A short id of the service-account key (the JWS `kid`): from its public half.
    fn sa_key_id(&self) -> String {
        use ring::signature::KeyPair as _;
        use sha2::Digest;
        let rng = ring::rand::SystemRandom::new();
        ring::signature::EcdsaKeyPair::from_pkcs8(
            &ring::signature::ECDSA_P256_SHA256_FIXED_SIGNING,
            &self.sa_key_pkcs8,
            &rng,
        )
        .map(|k| {
            sha2::Sha256::digest(k.public_key().as_ref())[..8]
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect()
        })
        .unwrap_or_default()
    }

    /// Writes `admin.kubeconfig` (client certificate) for `server` into `dir`.
    pub fn write_kubeconfig(&self, dir: &Path, server: SocketAddr) -> Result<PathBuf, PkiError> {
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        let host = match server.ip() {
            ip if ip.is_unspecified() => "127.0.0.1".to_string(),
            std::net::IpAddr::V6(ip) => format!("[{ip}]"),
            ip => ip.to_string(),
        };
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: nodeos\n  cluster:\n    server: https://{host}:{}\n    certificate-authority-data: {}\nusers:\n- name: admin\n  user:\n    client-certificate-data: {}\n    client-key-data: {}\ncontexts:\n- name: admin@nodeos\n  context:\n    cluster: nodeos\n    user: admin\ncurrent-context: admin@nodeos\n",
            server.port(),
            b64(&self.ca_pem),
            b64(&self.admin_cert_pem),
            b64(&self.admin_key_pem)
        );
        let path = dir.join("admin.kubeconfig");
        write_private(&path, &text)?;
        Ok(path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_account_tokens_verify_and_survive_reload() {
        let dir = tempfile::tempdir().expect("tempdir");
        let pki = Pki::load_or_create(dir.path(), &["localhost".into()]).expect("pki");
        let claims = serde_json::json!({"sub": "system:serviceaccount:default:x", "exp": 1});
        let token = pki.sign_jwt(&claims).expect("sign");
        assert_eq!(pki.verify_jwt(&token), Some(claims.clone()));
        let again = Pki::load_or_create(dir.path(), &["localhost".into()]).expect("reload");
        assert_eq!(again.verify_jwt(&token), Some(claims), "the key is kept on disk");
        let mut parts: Vec<&str> = token.split('.').collect();
        let other = again
            .sign_jwt(&serde_json::json!({"sub": "system:serviceaccount:kube-system:admin"}))
            .expect("sign");
        parts[1] = other.split('.').nth(1).expect("claims");
        assert_eq!(
            again.verify_jwt(&parts.join(".")),
            None,
            "claims swapped under a signature"
        );
        assert_eq!(again.verify_jwt("a.b"), None);
        let none = format!(
            "{}.{}.",
            "eyJhbGciOiJub25lIn0",
            token.split('.').nth(1).expect("claims")
        );
        assert_eq!(again.verify_jwt(&none), None, "alg none");
    }

    fn csr(cn: &str, org: &str) -> String {
        csr_with_names(cn, org, &[])
    }

    fn csr_with_names(cn: &str, org: &str, names: &[&str]) -> String {
        let key = KeyPair::generate().expect("key");
        let names = names.iter().map(|n| n.to_string()).collect::<Vec<_>>();
        let mut p = CertificateParams::new(names).expect("params");
        p.distinguished_name.push(DnType::CommonName, cn);
        p.distinguished_name.push(DnType::OrganizationName, org);
        p.serialize_request(&key).expect("csr").pem().expect("pem")
    }

    #[test]
    fn created_once_then_reused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let a = Pki::load_or_create(dir.path(), &["127.0.0.1".into()]).expect("create");
        let b = Pki::load_or_create(dir.path(), &["127.0.0.1".into()]).expect("load");
        assert_eq!(a.ca_pem, b.ca_pem);
        assert_eq!(a.bootstrap_token, b.bootstrap_token);
        assert_eq!(a.bootstrap_token.len(), 6 + 1 + 16);
    }

    #[test]
    fn signs_only_node_client_csrs() {
        let dir = tempfile::tempdir().expect("tempdir");
        let pki = Pki::load_or_create(dir.path(), &["127.0.0.1".into()]).expect("create");
        let pem = pki
            .sign_node_csr(&csr("system:node:n1", "system:nodes"))
            .expect("signed");
        let der = rustls::pki_types::CertificateDer::from_pem_slice(pem.as_bytes()).expect("pem");
        let (_, cert) = x509_parser::parse_x509_certificate(der.as_ref()).expect("x509");
        assert_eq!(
            cert.issuer()
                .iter_common_name()
                .next()
                .and_then(|c| c.as_str().ok()),
            Some("nodeos-cluster-ca")
        );
        assert_eq!(
            cert.subject()
                .iter_common_name()
                .next()
                .and_then(|c| c.as_str().ok()),
            Some("system:node:n1")
        );
        let eku = cert
            .extended_key_usage()
            .ok()
            .flatten()
            .map(|e| e.value.client_auth);
        assert_eq!(eku, Some(true));
        assert!(pki.sign_node_csr(&csr("admin", "system:masters")).is_err());
        assert!(pki.sign_node_csr("not a csr").is_err());
        let n1 = csr("system:node:n1", "system:nodes");
        assert!(pki.sign_node_csr_for(&n1, Some("n1")).is_ok());
        assert!(matches!(
            pki.sign_node_csr_for(&n1, Some("n2")),
            Err(PkiError::OtherNode { .. })
        ));
    }

    #[test]
    fn serving_csrs_are_validated_as_upstream_and_signed_for_server_auth() {
        let dir = tempfile::tempdir().expect("tempdir");
        let pki = Pki::load_or_create(dir.path(), &["127.0.0.1".into()]).expect("create");
        let good = csr_with_names("system:node:n1", "system:nodes", &["n1", "10.0.0.5"]);
        assert_eq!(
            serving_request(&good).expect("valid"),
            ServingRequest {
                node: "n1".into(),
                dns: vec!["n1".into()],
                ips: vec!["10.0.0.5".parse().expect("ip")],
            }
        );
        let pem = pki.sign_serving_csr(&good).expect("signed");
        let der = rustls::pki_types::CertificateDer::from_pem_slice(pem.as_bytes()).expect("pem");
        let (_, cert) = x509_parser::parse_x509_certificate(der.as_ref()).expect("x509");
        let eku = cert.extended_key_usage().ok().flatten().map(|e| e.value.clone());
        assert_eq!(
            eku.as_ref().map(|e| (e.server_auth, e.client_auth)),
            Some((true, false))
        );
        // No names at all, or a subject that is not a node: refused as upstream's signer does.
        for bad in [
            csr_with_names("system:node:n1", "system:nodes", &[]),
            csr_with_names("admin", "system:masters", &["n1"]),
            csr_with_names("system:node:", "system:nodes", &["n1"]),
        ] {
            assert!(serving_request(&bad).is_err(), "{bad}");
            assert!(pki.sign_serving_csr(&bad).is_err());
        }
        assert!(matches!(serving_request("garbage"), Err(PkiError::BadCsr(_))));
    }

    #[test]
    fn a_partial_pki_is_an_error_and_no_new_ca() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let pki = Pki::load_or_create(dir.path(), &["127.0.0.1".into()]).expect("create");
        let mode = |p: &Path| std::fs::metadata(p).expect("stat").permissions().mode() & 0o777;
        assert_eq!(mode(dir.path()), 0o700);
        assert_eq!(mode(&dir.path().join("ca.key")), 0o600);
        assert!(!dir.path().join("ca.key.tmp").exists());
        std::fs::remove_file(dir.path().join("ca.key")).expect("rm");
        let err = Pki::load_or_create(dir.path(), &["127.0.0.1".into()]).expect_err("partial");
        assert!(
            matches!(&err, PkiError::Partial { missing, .. } if missing == "ca.key"),
            "{err}"
        );
        assert_eq!(
            std::fs::read_to_string(dir.path().join("ca.crt")).expect("ca"),
            pki.ca_pem,
            "the CA is kept"
        );
        assert!(!dir.path().join("ca.key").exists());
    }
}
