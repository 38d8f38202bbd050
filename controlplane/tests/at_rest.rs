//! Data at rest (issue 13, item 4): Secrets encrypted in the store by an EncryptionConfiguration
//! (aescbc on the embedded store, aesgcm on etcd), key rotation, the identity fallback, a
//! missing key refused with a 500 and never shown as ciphertext; etcd reached over TLS with a
//! client certificate, and refused without one.

use std::path::{Path, PathBuf};
use std::process::Command;

use base64::Engine;
use controlplane::process::{EtcdProcess, EtcdServerTls, TestCluster};
use controlplane::storage::Store;
use controlplane::storage::embedded::{EmbeddedConfig, EmbeddedStore};
use controlplane::storage::etcd::{EtcdStore, EtcdTls};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_controlplane"))
}

fn b64(b: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(b)
}

/// An EncryptionConfiguration for Secrets with `providers` (YAML list items), written to `dir`.
fn config(dir: &Path, name: &str, providers: &[String]) -> PathBuf {
    let path = dir.join(name);
    let text = format!(
        "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n- resources: [secrets]\n  providers:\n{}",
        providers.concat()
    );
    std::fs::write(&path, text).expect("write config");
    path
}

fn aes(kind: &str, name: &str, key: &[u8]) -> String {
    format!(
        "  - {kind}:\n      keys:\n      - name: {name}\n        secret: {}\n",
        b64(key)
    )
}

const IDENTITY: &str = "  - identity: {}\n";

fn serve_args(config: &Path) -> Vec<String> {
    vec![
        "--no-scheduler".into(),
        "--no-controllers".into(),
        "--encryption-provider-config".into(),
        config.display().to_string(),
    ]
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// The stored bytes of `key` and of every file of the embedded store in `dir` (the server
/// stopped), read without any encryption configuration.
fn raw_embedded(dir: &Path, key: &str) -> (Vec<u8>, Vec<u8>) {
    let store = EmbeddedStore::open(EmbeddedConfig::new(dir.join("store"))).expect("open store");
    let value = runtime()
        .block_on(store.get(key))
        .expect("get")
        .expect("stored")
        .value
        .to_vec();
    drop(store);
    let mut all = Vec::new();
    for entry in std::fs::read_dir(dir.join("store")).expect("store dir") {
        let path = entry.expect("entry").path();
        if path.is_file() {
            all.extend(std::fs::read(path).expect("read store file"));
        }
    }
    (value, all)
}

/// The `pw` key of Secret `name`, base64 as the API shows it.
fn pw(c: &TestCluster, name: &str) -> String {
    c.jsonpath(&["secret", name], "{.data.pw}")
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

#[test]
fn secrets_are_encrypted_in_the_store_rotated_and_never_shown_as_ciphertext() {
    let keys = tempfile::tempdir().expect("tempdir");
    let (key1, key2) = ([0x11u8; 32], [0x22u8; 32]);
    let mut c = TestCluster::start(bin(), &["--no-scheduler", "--no-controllers"], &[]);
    // Written before encryption is turned on: plain in the store.
    c.kubectl(&[
        "create",
        "secret",
        "generic",
        "before",
        "--from-literal=pw=plain-before-1",
    ]);

    // aescbc first, identity after it: new writes are encrypted, old plain values still read.
    let on = config(
        keys.path(),
        "on.yaml",
        &[aes("aescbc", "key1", &key1), IDENTITY.into()],
    );
    c.restart_server_with(&serve_args(&on));
    c.kubectl(&[
        "create",
        "secret",
        "generic",
        "after",
        "--from-literal=pw=hidden-after-1",
    ]);
    c.kubectl(&["create", "configmap", "cm", "--from-literal=v=visible-cm-1"]);
    assert_eq!(pw(&c, "before"), b64(b"plain-before-1"));
    assert_eq!(pw(&c, "after"), b64(b"hidden-after-1"));
    let listed = c.kubectl(&["get", "secrets", "-o", "jsonpath={.items[*].data.pw}"]);
    assert!(
        listed.contains(&b64(b"hidden-after-1")) && listed.contains(&b64(b"plain-before-1")),
        "{listed}"
    );

    c.stop_server();
    let (after, files) = raw_embedded(c.dir.path(), "/registry/core/secrets/default/after");
    assert!(
        after.starts_with(b"k8s:enc:aescbc:v1:key1:"),
        "{}",
        String::from_utf8_lossy(&after)
    );
    let hidden = b64(b"hidden-after-1");
    assert!(
        !contains(&files, hidden.as_bytes()),
        "the encrypted value is in a store file"
    );
    assert!(!contains(&files, b"hidden-after-1"));
    // Only Secrets are configured: the ConfigMap and the older plain Secret are as they were.
    assert!(contains(&files, b"visible-cm-1"));
    assert!(contains(&files, b64(b"plain-before-1").as_bytes()));

    // Rotation: key2 writes, key1 still reads; replacing every Secret re-encrypts with key2.
    let rotated = config(
        keys.path(),
        "rotated.yaml",
        &[
            aes("aescbc", "key2", &key2),
            aes("aescbc", "key1", &key1),
            IDENTITY.into(),
        ],
    );
    c.restart_server_with(&serve_args(&rotated));
    assert_eq!(pw(&c, "after"), b64(b"hidden-after-1"));
    let all = c.kubectl(&["get", "secrets", "-o", "json"]);
    let (ok, out, err) = c.kubectl_result(&["replace", "-f", "-"], Some(&all));
    assert!(ok, "{out}{err}");
    c.stop_server();
    let (after, _) = raw_embedded(c.dir.path(), "/registry/core/secrets/default/after");
    assert!(
        after.starts_with(b"k8s:enc:aescbc:v1:key2:"),
        "{}",
        String::from_utf8_lossy(&after)
    );
    let (before, _) = raw_embedded(c.dir.path(), "/registry/core/secrets/default/before");
    assert!(
        before.starts_with(b"k8s:enc:aescbc:v1:key2:"),
        "the plain Secret was re-encrypted"
    );

    // Without key2 nothing reads them: a 500 naming the key, not the ciphertext.
    let lost = config(keys.path(), "lost.yaml", &[aes("aescbc", "key1", &key1)]);
    c.restart_server_with(&serve_args(&lost));
    let (ok, out, err) = c.kubectl_result(&["get", "secret", "after", "-o", "yaml"], None);
    assert!(!ok, "{out}");
    assert!(
        err.contains(
            r#"Internal error occurred: unable to transform key "/registry/core/secrets/default/after": no matching prefix found"#
        ),
        "{err}"
    );
    let (ok, out, err) = c.kubectl_result(&["get", "secrets"], None);
    assert!(!ok && err.contains("unable to transform key"), "{out}{err}");
    // A wrong key under the right name fails the same way (CBC padding).
    let forged = config(keys.path(), "forged.yaml", &[aes("aescbc", "key2", &[0x33; 32])]);
    c.restart_server_with(&serve_args(&forged));
    let (ok, out, err) = c.kubectl_result(&["get", "secret", "after"], None);
    assert!(
        !ok && err.contains("unable to transform key") && !out.contains("k8s:enc"),
        "{out}{err}"
    );
}

#[test]
fn a_bad_encryption_configuration_stops_the_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (providers, want) in [
        (
            vec![aes("aescbc", "k", b"short")],
            "secret is not of the expected length, got 5, expected one of [16 24 32]",
        ),
        (
            vec![aes("secretbox", "k", &[1; 16])],
            "secretbox.keys[0].secret: secret is not of the expected length, got 16, expected one of [32]",
        ),
        (
            vec!["  - kms:\n      name: x\n".to_string()],
            "supports the aescbc, aesgcm, secretbox and identity providers only",
        ),
    ] {
        let cfg = config(dir.path(), "bad.yaml", &providers);
        let out = Command::new(bin())
            .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(dir.path().join("data"))
            .arg("--encryption-provider-config")
            .arg(&cfg)
            .output()
            .expect("run controlplane");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success());
        assert!(
            err.contains("--encryption-provider-config") && err.contains(want),
            "{err}"
        );
        assert!(
            !dir.path().join("data/store").exists() && !dir.path().join("data/pki").exists(),
            "nothing was created"
        );
    }
}

/// A CA and a certificate it signs for `names` (server and client auth).
struct Certs {
    ca_pem: String,
    ca_cert: rcgen::Certificate,
    ca_key: rcgen::KeyPair,
}

impl Certs {
    fn new(cn: &str) -> Self {
        let ca_key = rcgen::KeyPair::generate().expect("key");
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.distinguished_name.push(rcgen::DnType::CommonName, cn);
        let ca_cert = params.self_signed(&ca_key).expect("self-sign");
        Self {
            ca_pem: ca_cert.pem(),
            ca_cert,
            ca_key,
        }
    }

    fn issue(&self, cn: &str, names: &[&str]) -> (String, String) {
        let key = rcgen::KeyPair::generate().expect("key");
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let mut params = rcgen::CertificateParams::new(names).expect("params");
        params.distinguished_name.push(rcgen::DnType::CommonName, cn);
        params.extended_key_usages = vec![
            rcgen::ExtendedKeyUsagePurpose::ServerAuth,
            rcgen::ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let cert = params.signed_by(&key, &self.ca_cert, &self.ca_key).expect("sign");
        (cert.pem(), key.serialize_pem())
    }
}

#[test]
fn etcd_over_tls_with_a_client_certificate_and_aesgcm_secrets() {
    let dir = tempfile::tempdir().expect("tempdir");
    let write = |name: &str, text: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, text).expect("write");
        p
    };
    let certs = Certs::new("etcd-ca");
    let (server_cert, server_key) = certs.issue("etcd", &["127.0.0.1", "localhost"]);
    let (client_cert, client_key) = certs.issue("kube-apiserver-etcd-client", &[]);
    let tls = EtcdServerTls {
        cert_file: write("etcd.crt", &server_cert),
        key_file: write("etcd.key", &server_key),
        ca_file: write("ca.crt", &certs.ca_pem),
    };
    let etcd = EtcdProcess::spawn_tls(&dir.path().join("etcd"), &tls)
        .expect("start etcd (apt-get install etcd-server)");
    assert!(
        etcd.endpoint.starts_with("https://127.0.0.1:"),
        "{}",
        etcd.endpoint
    );
    let cert_file = write("client.crt", &client_cert);
    let key_file = write("client.key", &client_key);
    let gcm = config(dir.path(), "gcm.yaml", &[aes("aesgcm", "g1", &[0x44; 32])]);
    let (ca, cert, key, enc) = (
        tls.ca_file.display().to_string(),
        cert_file.display().to_string(),
        key_file.display().to_string(),
        gcm.display().to_string(),
    );
    let args: [&str; 12] = [
        "--no-scheduler",
        "--no-controllers",
        "--etcd",
        &etcd.endpoint,
        "--etcd-cafile",
        &ca,
        "--etcd-certfile",
        &cert,
        "--etcd-keyfile",
        &key,
        "--encryption-provider-config",
        &enc,
    ];
    let c = TestCluster::start(bin(), &args, &[]);
    c.kubectl(&[
        "create",
        "secret",
        "generic",
        "s",
        "--from-literal=pw=gcm-hidden-1",
    ]);
    assert_eq!(c.jsonpath(&["secret", "s"], "{.data.pw}"), b64(b"gcm-hidden-1"));

    let rt = runtime();
    let key = "/registry/core/secrets/default/s";
    // The raw value in etcd, read with the client certificate: encrypted.
    let with_cert = EtcdTls {
        ca_pem: certs.ca_pem.clone(),
        client: Some((client_cert.clone(), client_key.clone())),
    };
    let raw = EtcdStore::new(&etcd.endpoint, Some(&with_cert)).expect("store");
    let value = rt.block_on(raw.get(key)).expect("get").expect("stored").value;
    assert!(
        value.starts_with(b"k8s:enc:aesgcm:v1:g1:"),
        "{}",
        String::from_utf8_lossy(&value)
    );
    assert!(!contains(&value, b64(b"gcm-hidden-1").as_bytes()));

    // etcd refuses a client without a certificate; the client refuses an etcd its CA did not sign.
    let no_cert = EtcdTls {
        ca_pem: certs.ca_pem.clone(),
        client: None,
    };
    let anonymous = EtcdStore::new(&etcd.endpoint, Some(&no_cert)).expect("store");
    assert!(
        rt.block_on(anonymous.get(key)).is_err(),
        "etcd answered a client without a certificate"
    );
    let other_ca = EtcdTls {
        ca_pem: Certs::new("other-ca").ca_pem,
        client: Some((client_cert, client_key)),
    };
    let misled = EtcdStore::new(&etcd.endpoint, Some(&other_ca)).expect("store");
    let err = rt
        .block_on(misled.get(key))
        .expect_err("an unverified etcd was trusted");
    assert!(err.to_string().contains("invalid peer certificate"), "{err}");
    // An https endpoint without a CA is a start error, not an unverified connection.
    let plain = EtcdStore::new(&etcd.endpoint, None).expect_err("https without a CA");
    assert!(plain.to_string().contains("needs --etcd-cafile"), "{plain}");
}
