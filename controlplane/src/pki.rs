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
}

fn read(path: &Path) -> Result<String, PkiError> {
    std::fs::read_to_string(path).map_err(|source| PkiError::Io {
        path: path.into(),
        source,
    })
}

fn write_private(path: &Path, data: &str) -> Result<(), PkiError> {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(|source| PkiError::Io {
            path: path.into(),
            source,
        })?;
    f.write_all(data.as_bytes()).map_err(|source| PkiError::Io {
        path: path.into(),
        source,
    })
}

const FILES: [&str; 6] = [
    "ca.crt",
    "server.crt",
    "server.key",
    "admin.crt",
    "admin.key",
    "admin.token",
];

impl Pki {
    /// Loads the PKI from `dir`, creating it when absent. `sans` are the serving certificate's
    /// names and addresses (IP literals become IP SANs).
    pub fn load_or_create(dir: &Path, sans: &[String]) -> Result<Self, PkiError> {
        std::fs::create_dir_all(dir).map_err(|source| PkiError::Io {
            path: dir.into(),
            source,
        })?;
        if FILES.iter().all(|f| dir.join(f).exists()) {
            return Ok(Self {
                ca_pem: read(&dir.join("ca.crt"))?,
                server_cert_pem: read(&dir.join("server.crt"))?,
                server_key_pem: read(&dir.join("server.key"))?,
                admin_cert_pem: read(&dir.join("admin.crt"))?,
                admin_key_pem: read(&dir.join("admin.key"))?,
                admin_token: read(&dir.join("admin.token"))?.trim().to_string(),
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

        let mut token = [0u8; 24];
        getrandom::fill(&mut token).map_err(|e| PkiError::Io {
            path: dir.join("admin.token"),
            source: std::io::Error::other(e.to_string()),
        })?;
        let token: String = token.iter().map(|b| format!("{b:02x}")).collect();

        let pki = Self {
            ca_pem: ca.pem(),
            server_cert_pem: server.pem(),
            server_key_pem: server_key.serialize_pem(),
            admin_cert_pem: admin.pem(),
            admin_key_pem: admin_key.serialize_pem(),
            admin_token: token,
        };
        write_private(&dir.join("ca.key"), &ca_key.serialize_pem())?;
        write_private(&dir.join("ca.crt"), &pki.ca_pem)?;
        write_private(&dir.join("server.crt"), &pki.server_cert_pem)?;
        write_private(&dir.join("server.key"), &pki.server_key_pem)?;
        write_private(&dir.join("admin.crt"), &pki.admin_cert_pem)?;
        write_private(&dir.join("admin.key"), &pki.admin_key_pem)?;
        write_private(&dir.join("admin.token"), &pki.admin_token)?;
        Ok(pki)
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
