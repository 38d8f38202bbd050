//! Encryption at rest: kube-apiserver's `--encryption-provider-config` (an
//! `apiserver.config.k8s.io/v1` `EncryptionConfiguration`) as a [`Store`] wrapper.
//!
//! Each `resources` entry names resources (`secrets`, `deployments.apps`, `*.apps`, `*.` for
//! every core resource, `*.*` for all) and an ordered provider list. The first entry naming a
//! resource decides for it; its first provider encrypts every write, and a read tries the
//! providers in order by the value's prefix, as upstream's prefix transformers do:
//! - `aescbc`: `k8s:enc:aescbc:v1:<key name>:` + a random 16-byte IV + AES-CBC with PKCS#7
//!   padding (keys of 16, 24 or 32 bytes);
//! - `aesgcm`: `k8s:enc:aesgcm:v1:<key name>:` + a random 12-byte nonce + AES-GCM, with the
//!   store key as authenticated data (so a value moved to another key does not decrypt); keys
//!   of 16, 24 or 32 bytes;
//! - `secretbox`: `k8s:enc:secretbox:v1:<key name>:` + a random 24-byte nonce + NaCl
//!   secretbox (XSalsa20-Poly1305, the tag before the ciphertext, no authenticated data), keys
//!   of 32 bytes;
//! - `identity`: the plain value (a value carrying a `k8s:enc:` prefix is not taken for plain).
//!
//! An `identity` provider after an encrypting one keeps values written before encryption was
//! turned on readable; listing `identity` first (with the key still listed) turns encryption
//! off while old values stay readable. A value no provider reads is an error naming its key
//! (500 in the API), never returned as it is. `kms` is refused at start.

use std::path::Path;
use std::sync::Arc;

use aes::cipher::{BlockCipher, BlockDecryptMut, BlockEncryptMut, KeyInit, KeyIvInit, block_padding::Pkcs7};
use aes_gcm::aead::{Aead, AeadCore, Payload};
use base64::Engine;
use bytes::Bytes;
use crypto_secretbox::XSalsa20Poly1305;
use serde::Deserialize;

use super::{
    BoxFuture, Event, KeyValue, ListPage, Result, Revision, RevisionHold, Store, StoreError, WatchStream,
    Write,
};

/// Why an encryption configuration was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("reading {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("parsing the encryption configuration: {0}")]
    Parse(#[from] serde_yaml::Error),
    #[error(
        "the encryption configuration must be kind EncryptionConfiguration of apiVersion apiserver.config.k8s.io/v1, not {kind} of {api_version}"
    )]
    Kind { kind: String, api_version: String },
    #[error("resources[{index}]: {message}")]
    Invalid { index: usize, message: String },
}

/// What is wrong with one `resources` entry (wrapped in [`ConfigError::Invalid`] with its index).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct EntryError(String);

/// Why a stored value did not decrypt.
#[derive(Debug, thiserror::Error)]
enum DecryptError {
    #[error("the stored data is not a whole number of AES blocks")]
    NotBlocks,
    #[error("invalid key or IV length")]
    KeyLength,
    #[error("invalid PKCS7 data (empty or not padded)")]
    Padding,
    #[error("the stored data is shorter than a nonce and a tag")]
    Short,
    #[error("cipher: message authentication failed")]
    Authentication,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct File {
    #[serde(default)]
    api_version: String,
    #[serde(default)]
    kind: String,
    #[serde(default)]
    resources: Vec<ResourceEntry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ResourceEntry {
    #[serde(default)]
    resources: Vec<String>,
    #[serde(default)]
    providers: Vec<ProviderEntry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ProviderEntry {
    aescbc: Option<KeysEntry>,
    aesgcm: Option<KeysEntry>,
    identity: Option<serde_yaml::Value>,
    secretbox: Option<KeysEntry>,
    kms: Option<serde_yaml::Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct KeysEntry {
    #[serde(default)]
    keys: Vec<KeyEntry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct KeyEntry {
    #[serde(default)]
    name: String,
    #[serde(default)]
    secret: String,
}

/// AES-192 in GCM with the usual 12-byte nonce (aes-gcm names only the 128 and 256 variants).
type Aes192Gcm = aes_gcm::AesGcm<aes::Aes192, aes_gcm::aead::consts::U12>;

/// One key of a provider.
enum Cipher {
    Cbc128([u8; 16]),
    Cbc192([u8; 24]),
    Cbc256([u8; 32]),
    Gcm128(Box<aes_gcm::Aes128Gcm>),
    Gcm192(Box<Aes192Gcm>),
    Gcm256(Box<aes_gcm::Aes256Gcm>),
    Secretbox(Box<XSalsa20Poly1305>),
}

/// One way a value can be stored, with the prefix that marks it (empty for identity).
struct Transformer {
    prefix: Vec<u8>,
    /// None: identity.
    cipher: Option<Cipher>,
}

const ENCRYPTED: &[u8] = b"k8s:enc:";
const CBC_IV: usize = 16;
const GCM_NONCE: usize = 12;
const SECRETBOX_NONCE: usize = 24;
/// The authentication tag of both AEADs (GCM and Poly1305).
const TAG: usize = 16;

fn random<const N: usize>() -> Result<[u8; N]> {
    let mut b = [0u8; N];
    getrandom::fill(&mut b).map_err(|e| StoreError::Io {
        path: "encryption".into(),
        source: std::io::Error::other(e.to_string()),
    })?;
    Ok(b)
}

fn cbc_encrypt<C>(key: &[u8], plain: &[u8]) -> Result<Vec<u8>>
where
    C: BlockCipher + BlockEncryptMut + KeyInit,
{
    let iv = random::<CBC_IV>()?;
    let enc = cbc::Encryptor::<C>::new_from_slices(key, &iv).map_err(|e| transform_err("", e))?;
    let mut out = iv.to_vec();
    out.extend(enc.encrypt_padded_vec_mut::<Pkcs7>(plain));
    Ok(out)
}

fn cbc_decrypt<C>(key: &[u8], data: &[u8]) -> std::result::Result<Vec<u8>, DecryptError>
where
    C: BlockCipher + BlockDecryptMut + KeyInit,
{
    if data.len() <= CBC_IV || !(data.len() - CBC_IV).is_multiple_of(16) {
        return Err(DecryptError::NotBlocks);
    }
    let (iv, body) = data.split_at(CBC_IV);
    let dec = cbc::Decryptor::<C>::new_from_slices(key, iv).map_err(|_| DecryptError::KeyLength)?;
    dec.decrypt_padded_vec_mut::<Pkcs7>(body)
        .map_err(|_| DecryptError::Padding)
}

/// A random nonce of `N` bytes, then `plain` sealed under it with `aad` (tag appended for GCM,
/// prepended for secretbox, as each cipher's crate and upstream's Go packages lay it out).
fn seal<A: Aead, const N: usize>(cipher: &A, aad: &[u8], plain: &[u8]) -> Result<Vec<u8>> {
    let nonce = random::<N>()?;
    let sealed = cipher
        .encrypt(
            aes_gcm::aead::Nonce::<A>::from_slice(&nonce),
            Payload { msg: plain, aad },
        )
        .map_err(|_| transform_err("", "sealing failed"))?;
    let mut out = nonce.to_vec();
    out.extend(sealed);
    Ok(out)
}

fn open<A: Aead + AeadCore>(
    cipher: &A,
    nonce_len: usize,
    aad: &[u8],
    data: &[u8],
) -> std::result::Result<Vec<u8>, DecryptError> {
    if data.len() < nonce_len + TAG {
        return Err(DecryptError::Short);
    }
    let (nonce, sealed) = data.split_at(nonce_len);
    cipher
        .decrypt(
            aes_gcm::aead::Nonce::<A>::from_slice(nonce),
            Payload { msg: sealed, aad },
        )
        .map_err(|_| DecryptError::Authentication)
}

fn transform_err(key: &str, e: impl std::fmt::Display) -> StoreError {
    StoreError::Transform {
        key: key.to_string(),
        reason: e.to_string(),
    }
}

impl Transformer {
    fn encrypt(&self, key: &str, plain: &[u8]) -> Result<Vec<u8>> {
        let body = match &self.cipher {
            None => return Ok(plain.to_vec()),
            Some(Cipher::Cbc128(k)) => cbc_encrypt::<aes::Aes128>(k, plain)?,
            Some(Cipher::Cbc192(k)) => cbc_encrypt::<aes::Aes192>(k, plain)?,
            Some(Cipher::Cbc256(k)) => cbc_encrypt::<aes::Aes256>(k, plain)?,
            Some(Cipher::Gcm128(k)) => seal::<_, GCM_NONCE>(&**k, key.as_bytes(), plain)?,
            Some(Cipher::Gcm192(k)) => seal::<_, GCM_NONCE>(&**k, key.as_bytes(), plain)?,
            Some(Cipher::Gcm256(k)) => seal::<_, GCM_NONCE>(&**k, key.as_bytes(), plain)?,
            Some(Cipher::Secretbox(k)) => seal::<_, SECRETBOX_NONCE>(&**k, b"", plain)?,
        };
        let mut out = self.prefix.clone();
        out.extend(body);
        Ok(out)
    }

    /// The plain value, when this transformer's prefix marks `data`.
    fn decrypt(&self, key: &str, data: &[u8]) -> Option<std::result::Result<Vec<u8>, DecryptError>> {
        let body = data.strip_prefix(self.prefix.as_slice())?;
        Some(match &self.cipher {
            None if body.starts_with(ENCRYPTED) => return None,
            None => Ok(body.to_vec()),
            Some(Cipher::Cbc128(k)) => cbc_decrypt::<aes::Aes128>(k, body),
            Some(Cipher::Cbc192(k)) => cbc_decrypt::<aes::Aes192>(k, body),
            Some(Cipher::Cbc256(k)) => cbc_decrypt::<aes::Aes256>(k, body),
            Some(Cipher::Gcm128(k)) => open(&**k, GCM_NONCE, key.as_bytes(), body),
            Some(Cipher::Gcm192(k)) => open(&**k, GCM_NONCE, key.as_bytes(), body),
            Some(Cipher::Gcm256(k)) => open(&**k, GCM_NONCE, key.as_bytes(), body),
            Some(Cipher::Secretbox(k)) => open(&**k, SECRETBOX_NONCE, b"", body),
        })
    }
}

/// The providers of one `resources` entry.
struct Rule {
    /// Store key prefixes of the resources it names.
    prefixes: Vec<String>,
    /// In the configured order; the first encrypts.
    transformers: Vec<Transformer>,
}

/// A parsed `EncryptionConfiguration`.
pub struct EncryptionConfig {
    rules: Vec<Rule>,
}

impl std::fmt::Debug for EncryptionConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the keys.
        f.debug_struct("EncryptionConfig")
            .field(
                "prefixes",
                &self.rules.iter().map(|r| &r.prefixes).collect::<Vec<_>>(),
            )
            .finish()
    }
}

/// The store key prefix of a resource pattern (`secrets`, `deployments.apps`, `*.apps`, `*.`,
/// `*.*`), in the API's key layout `/registry/<group or core>/<plural>/`.
fn key_prefix(pattern: &str) -> std::result::Result<String, EntryError> {
    let name_ok = |s: &str| {
        !s.is_empty()
            && s.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
    };
    let group_ok = |s: &str| {
        !s.is_empty()
            && s.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
    };
    match pattern.split_once('.') {
        Some(("*", "*")) => Ok("/registry/".into()),
        Some(("*", "")) => Ok("/registry/core/".into()),
        Some(("*", g)) if group_ok(g) => Ok(format!("/registry/{g}/")),
        Some((r, g)) if name_ok(r) && group_ok(g) => Ok(format!("/registry/{g}/{r}/")),
        None if name_ok(pattern) => Ok(format!("/registry/core/{pattern}/")),
        _ => Err(EntryError(format!(
            "resource {pattern:?} is not a resource name, resource.group, *.group, *. or *.*"
        ))),
    }
}

fn decode_key(secret: &str) -> std::result::Result<Vec<u8>, EntryError> {
    base64::engine::general_purpose::STANDARD
        .decode(secret.trim())
        .map_err(|e| EntryError(format!("secret is not valid base64: {e}")))
}

fn keyed_transformers(kind: &str, keys: &KeysEntry) -> std::result::Result<Vec<Transformer>, EntryError> {
    if keys.keys.is_empty() {
        return Err(EntryError(format!("{kind}: keys: Required value")));
    }
    let mut names = std::collections::HashSet::new();
    let mut out = Vec::new();
    for (i, k) in keys.keys.iter().enumerate() {
        if k.name.is_empty() || k.name.contains(':') {
            return Err(EntryError(format!(
                "{kind}.keys[{i}].name: Invalid value: {:?}: key names must be non-empty and contain no ':'",
                k.name
            )));
        }
        if !names.insert(k.name.as_str()) {
            return Err(EntryError(format!(
                "{kind}.keys[{i}].name: Duplicate value: {:?}",
                k.name
            )));
        }
        let secret =
            decode_key(&k.secret).map_err(|e| EntryError(format!("{kind}.keys[{i}].secret: {e}")))?;
        let wrong = |allowed: &str| {
            EntryError(format!(
                "{kind}.keys[{i}].secret: secret is not of the expected length, got {}, expected one of {allowed}",
                secret.len()
            ))
        };
        let cipher = match kind {
            "aescbc" => match secret.len() {
                16 => Cipher::Cbc128(secret.as_slice().try_into().map_err(|_| wrong("[16 24 32]"))?),
                24 => Cipher::Cbc192(secret.as_slice().try_into().map_err(|_| wrong("[16 24 32]"))?),
                32 => Cipher::Cbc256(secret.as_slice().try_into().map_err(|_| wrong("[16 24 32]"))?),
                _ => return Err(wrong("[16 24 32]")),
            },
            "aesgcm" => {
                let bad = |_| wrong("[16 24 32]");
                match secret.len() {
                    16 => Cipher::Gcm128(Box::new(KeyInit::new_from_slice(&secret).map_err(bad)?)),
                    24 => Cipher::Gcm192(Box::new(KeyInit::new_from_slice(&secret).map_err(bad)?)),
                    32 => Cipher::Gcm256(Box::new(KeyInit::new_from_slice(&secret).map_err(bad)?)),
                    _ => return Err(wrong("[16 24 32]")),
                }
            }
            _ => match secret.len() {
                32 => Cipher::Secretbox(Box::new(
                    KeyInit::new_from_slice(&secret).map_err(|_| wrong("[32]"))?,
                )),
                _ => return Err(wrong("[32]")),
            },
        };
        out.push(Transformer {
            prefix: format!("k8s:enc:{kind}:v1:{}:", k.name).into_bytes(),
            cipher: Some(cipher),
        });
    }
    Ok(out)
}

impl EncryptionConfig {
    /// Parses and checks a configuration (YAML or JSON).
    pub fn parse(text: &[u8]) -> std::result::Result<Self, ConfigError> {
        let file: File = serde_yaml::from_slice(text)?;
        if file.kind != "EncryptionConfiguration" || file.api_version != "apiserver.config.k8s.io/v1" {
            return Err(ConfigError::Kind {
                kind: file.kind,
                api_version: file.api_version,
            });
        }
        let mut rules = Vec::new();
        for (index, entry) in file.resources.iter().enumerate() {
            let invalid = |message: String| ConfigError::Invalid { index, message };
            if entry.resources.is_empty() {
                return Err(invalid("resources: Required value".into()));
            }
            if entry.providers.is_empty() {
                return Err(invalid("providers: Required value".into()));
            }
            let prefixes = entry
                .resources
                .iter()
                .map(|r| key_prefix(r))
                .collect::<std::result::Result<Vec<_>, _>>()
                .map_err(|e| invalid(e.0))?;
            let mut transformers = Vec::new();
            for (p, provider) in entry.providers.iter().enumerate() {
                let set = [
                    provider.aescbc.is_some(),
                    provider.aesgcm.is_some(),
                    provider.identity.is_some(),
                    provider.secretbox.is_some(),
                    provider.kms.is_some(),
                ]
                .iter()
                .filter(|s| **s)
                .count();
                if set != 1 {
                    return Err(invalid(format!(
                        "providers[{p}]: Invalid value: exactly one provider must be set, {set} are"
                    )));
                }
                if provider.kms.is_some() {
                    return Err(invalid(format!(
                        "providers[{p}]: this API server supports the aescbc, aesgcm, secretbox and identity providers only"
                    )));
                }
                let keyed = [
                    ("aescbc", &provider.aescbc),
                    ("aesgcm", &provider.aesgcm),
                    ("secretbox", &provider.secretbox),
                ];
                if let Some((kind, Some(keys))) = keyed.iter().find(|(_, k)| k.is_some()) {
                    transformers.extend(
                        keyed_transformers(kind, keys).map_err(|m| invalid(format!("providers[{p}].{m}")))?,
                    );
                } else {
                    transformers.push(Transformer {
                        prefix: Vec::new(),
                        cipher: None,
                    });
                }
            }
            rules.push(Rule {
                prefixes,
                transformers,
            });
        }
        Ok(Self { rules })
    }

    fn rule(&self, key: &str) -> Option<&Rule> {
        self.rules
            .iter()
            .find(|r| r.prefixes.iter().any(|p| key.starts_with(p.as_str())))
    }

    /// The value to store for `key`.
    fn encrypt(&self, key: &str, plain: impl Into<Bytes>) -> Result<Bytes> {
        let plain = plain.into();
        match self.rule(key).and_then(|r| r.transformers.first()) {
            Some(t) => t.encrypt(key, &plain).map(Bytes::from),
            None => Ok(plain),
        }
    }

    /// The plain value of what is stored under `key`.
    fn decrypt(&self, key: &str, stored: impl Into<Bytes>) -> Result<Bytes> {
        let stored = stored.into();
        let Some(rule) = self.rule(key) else {
            return Ok(stored);
        };
        for t in &rule.transformers {
            if let Some(plain) = t.decrypt(key, &stored) {
                return plain.map(Bytes::from).map_err(|e| transform_err(key, e));
            }
        }
        Err(transform_err(key, "no matching prefix found"))
    }

    fn kv(&self, mut kv: KeyValue) -> Result<KeyValue> {
        kv.value = self.decrypt(&kv.key, std::mem::take(&mut kv.value))?;
        Ok(kv)
    }

    fn event(&self, ev: Event) -> Result<Event> {
        Ok(Event {
            kind: ev.kind,
            kv: self.kv(ev.kv)?,
            prev: ev.prev.map(|p| self.kv(p)).transpose()?,
        })
    }

    fn page(&self, page: ListPage) -> Result<ListPage> {
        Ok(ListPage {
            items: page
                .items
                .into_iter()
                .map(|kv| self.kv(kv))
                .collect::<Result<_>>()?,
            ..page
        })
    }
}

/// A store that encrypts and decrypts the values of configured resources on their way to and
/// from `inner`.
pub struct EncryptedStore {
    inner: Arc<dyn Store>,
    config: SharedConfig,
}

/// The configuration in force, replaced whole when its file changes (see [`Reloader`]).
#[derive(Clone, Debug)]
struct SharedConfig(Arc<std::sync::RwLock<Arc<EncryptionConfig>>>);

impl SharedConfig {
    fn current(&self) -> Arc<EncryptionConfig> {
        match self.0.read() {
            Ok(c) => c.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    fn replace(&self, config: EncryptionConfig) {
        let config = Arc::new(config);
        match self.0.write() {
            Ok(mut c) => *c = config,
            Err(poisoned) => *poisoned.into_inner() = config,
        }
    }
}

/// kube-apiserver's `--encryption-provider-config-automatic-reload`: [`Reloader::check`] reads
/// the file again and, when its bytes changed and it parses, puts the new configuration in
/// force for every later read and write (values already stored keep their prefix and stay
/// readable while their key is listed). A file that does not parse changes nothing; the old
/// configuration stays, as upstream's does.
pub struct Reloader {
    config: SharedConfig,
    path: std::path::PathBuf,
    /// The file's bytes when last read (they hold the keys: never printed).
    loaded: Vec<u8>,
}

impl std::fmt::Debug for Reloader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reloader")
            .field("path", &self.path)
            .field("config", &self.config)
            .finish()
    }
}

impl Reloader {
    /// True when a new configuration was put in force.
    pub fn check(&mut self) -> std::result::Result<bool, ConfigError> {
        let text = std::fs::read(&self.path).map_err(|source| ConfigError::Read {
            path: self.path.display().to_string(),
            source,
        })?;
        if text == self.loaded {
            return Ok(false);
        }
        let parsed = EncryptionConfig::parse(&text);
        // A bad file is reported once, not at every check, until it changes again.
        self.loaded = text;
        self.config.replace(parsed?);
        Ok(true)
    }
}

impl std::fmt::Debug for EncryptedStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EncryptedStore")
            .field("config", &self.config.current())
            .finish()
    }
}

impl EncryptedStore {
    pub fn new(inner: Arc<dyn Store>, config: EncryptionConfig) -> Self {
        Self {
            inner,
            config: SharedConfig(Arc::new(std::sync::RwLock::new(Arc::new(config)))),
        }
    }

    /// A [`Reloader`] for the file this store's configuration came from (`loaded`: its bytes).
    pub fn reloader(&self, path: &Path, loaded: Vec<u8>) -> Reloader {
        Reloader {
            config: self.config.clone(),
            path: path.to_path_buf(),
            loaded,
        }
    }
}

struct DecryptedWatch {
    inner: Box<dyn WatchStream>,
    config: SharedConfig,
}

impl WatchStream for DecryptedWatch {
    fn next(&mut self) -> BoxFuture<'_, Result<Event>> {
        Box::pin(async move {
            let ev = self.inner.next().await?;
            self.config.current().event(ev)
        })
    }
}

impl Store for EncryptedStore {
    fn get<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<KeyValue>>> {
        Box::pin(async move {
            self.inner
                .get(key)
                .await?
                .map(|kv| self.config.current().kv(kv))
                .transpose()
        })
    }

    fn list<'a>(
        &'a self,
        prefix: &'a str,
        start_after: Option<&'a str>,
        limit: usize,
    ) -> BoxFuture<'a, Result<ListPage>> {
        Box::pin(async move {
            self.config
                .current()
                .page(self.inner.list(prefix, start_after, limit).await?)
        })
    }

    fn list_at<'a>(
        &'a self,
        prefix: &'a str,
        start_after: Option<&'a str>,
        limit: usize,
        revision: Revision,
    ) -> BoxFuture<'a, Result<ListPage>> {
        Box::pin(async move {
            self.config
                .current()
                .page(self.inner.list_at(prefix, start_after, limit, revision).await?)
        })
    }

    fn hold_revision(&self, revision: Revision) -> BoxFuture<'_, Result<RevisionHold>> {
        self.inner.hold_revision(revision)
    }

    fn write(&self, w: Write) -> BoxFuture<'_, Result<Event>> {
        Box::pin(async move {
            let w = match w {
                Write::Create { key, value } => Write::Create {
                    value: self.config.current().encrypt(&key, value)?,
                    key,
                },
                Write::Update { key, value, expected } => Write::Update {
                    value: self.config.current().encrypt(&key, value)?,
                    key,
                    expected,
                },
                delete @ Write::Delete { .. } => delete,
            };
            self.config.current().event(self.inner.write(w).await?)
        })
    }

    fn watch<'a>(&'a self, prefix: &'a str, after: Revision) -> BoxFuture<'a, Result<Box<dyn WatchStream>>> {
        Box::pin(async move {
            let inner = self.inner.watch(prefix, after).await?;
            Ok(Box::new(DecryptedWatch {
                inner,
                config: self.config.clone(),
            }) as Box<dyn WatchStream>)
        })
    }

    fn revision(&self) -> BoxFuture<'_, Result<Revision>> {
        self.inner.revision()
    }

    fn compacted(&self) -> BoxFuture<'_, Result<Revision>> {
        self.inner.compacted()
    }

    fn failure(&self) -> Option<String> {
        self.inner.failure()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b64(b: &[u8]) -> String {
        base64::engine::general_purpose::STANDARD.encode(b)
    }

    fn config(providers: &str) -> EncryptionConfig {
        let text = format!(
            "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n- resources: [secrets, '*.apps']\n  providers:\n{providers}"
        );
        match EncryptionConfig::parse(text.as_bytes()) {
            Ok(c) => c,
            Err(e) => panic!("{e}: {text}"),
        }
    }

    fn aes(kind: &str, name: &str, key: &[u8]) -> String {
        format!(
            "  - {kind}:\n      keys:\n      - name: {name}\n        secret: {}\n",
            b64(key)
        )
    }

    const SECRET: &str = "/registry/core/secrets/default/s1";

    #[test]
    fn key_prefixes() {
        for (pattern, want) in [
            ("secrets", Ok("/registry/core/secrets/")),
            ("deployments.apps", Ok("/registry/apps/deployments/")),
            ("*.apps", Ok("/registry/apps/")),
            ("*.", Ok("/registry/core/")),
            ("*.*", Ok("/registry/")),
            ("widgets.example.com", Ok("/registry/example.com/widgets/")),
            ("Secrets", Err(())),
            ("", Err(())),
            ("secrets.*", Err(())),
            ("secrets.", Err(())),
            ("*", Err(())),
        ] {
            assert_eq!(key_prefix(pattern).as_deref().map_err(|_| ()), want, "{pattern}");
        }
    }

    #[test]
    fn each_provider_round_trips_and_hides_the_value() {
        for (providers, prefix) in [
            (aes("aescbc", "k1", &[7; 32]), "k8s:enc:aescbc:v1:k1:"),
            (aes("aescbc", "k1", &[7; 16]), "k8s:enc:aescbc:v1:k1:"),
            (aes("aescbc", "k1", &[7; 24]), "k8s:enc:aescbc:v1:k1:"),
            (aes("aesgcm", "g", &[9; 32]), "k8s:enc:aesgcm:v1:g:"),
            (aes("aesgcm", "g", &[9; 16]), "k8s:enc:aesgcm:v1:g:"),
            (aes("aesgcm", "g", &[9; 24]), "k8s:enc:aesgcm:v1:g:"),
            (aes("secretbox", "s", &[5; 32]), "k8s:enc:secretbox:v1:s:"),
        ] {
            let c = config(&providers);
            let plain = br#"{"data":{"password":"aHVudGVyMg=="}}"#.to_vec();
            let stored = c.encrypt(SECRET, plain.clone()).expect("works");
            assert!(stored.starts_with(prefix.as_bytes()), "{providers}");
            assert!(!stored.windows(12).any(|w| w == b"aHVudGVyMg=="), "{providers}");
            // A new IV or nonce every time.
            assert_ne!(stored, c.encrypt(SECRET, plain.clone()).expect("works"));
            assert_eq!(c.decrypt(SECRET, stored).expect("works"), plain, "{providers}");
        }
    }

    #[test]
    fn other_resources_are_stored_plain() {
        let c = config(&aes("aescbc", "k1", &[7; 32]));
        let plain = b"{}".to_vec();
        let key = "/registry/core/configmaps/default/c";
        assert_eq!(c.encrypt(key, plain.clone()).expect("works"), plain);
        assert!(
            c.encrypt("/registry/apps/deployments/default/d", plain.clone())
                .expect("works")
                .starts_with(b"k8s:enc:")
        );
        assert_eq!(c.decrypt(key, plain.clone()).expect("works"), plain);
    }

    #[test]
    fn rotation_identity_fallback_and_refusals() {
        let old = config(&aes("aescbc", "old", &[1; 32]));
        let stored_old = old.encrypt(SECRET, b"{\"a\":1}".to_vec()).expect("works");
        // A new first key writes with its name; the old key still reads.
        let rotated = config(&(aes("aescbc", "new", &[2; 32]) + &aes("aescbc", "old", &[1; 32])));
        assert_eq!(
            rotated.decrypt(SECRET, stored_old.clone()).expect("works"),
            b"{\"a\":1}"[..]
        );
        assert!(
            rotated
                .encrypt(SECRET, b"{}".to_vec())
                .expect("works")
                .starts_with(b"k8s:enc:aescbc:v1:new:")
        );
        // Plain values written before encryption need identity in the list.
        let err = old
            .decrypt(SECRET, b"{}".to_vec())
            .expect_err("fails")
            .to_string();
        assert_eq!(
            err,
            format!("unable to transform key \"{SECRET}\": no matching prefix found")
        );
        let with_identity = config(&(aes("aescbc", "old", &[1; 32]) + "  - identity: {}\n"));
        assert_eq!(
            with_identity.decrypt(SECRET, b"{}".to_vec()).expect("works"),
            b"{}"[..]
        );
        // Identity first: writes are plain, encrypted values still read through the key.
        let off = config(&("  - identity: {}\n".to_string() + &aes("aescbc", "old", &[1; 32])));
        assert_eq!(off.encrypt(SECRET, b"{}".to_vec()).expect("works"), b"{}"[..]);
        assert_eq!(
            off.decrypt(SECRET, stored_old.clone()).expect("works"),
            b"{\"a\":1}"[..]
        );
        // Identity alone never hands out ciphertext as the object.
        let plain_only = config("  - identity: {}\n");
        assert!(plain_only.decrypt(SECRET, stored_old.clone()).is_err());
        // The wrong key with the right name does not read the object: CBC has no MAC, so it
        // fails on the padding, except about once in 256 (a random IV per write) when the
        // garbage it decrypts happens to end in valid padding, as upstream's aescbc does.
        let wrong = config(&aes("aescbc", "old", &[3; 32]));
        let read = wrong.decrypt(SECRET, stored_old).ok();
        assert_ne!(read.as_deref(), Some(&b"{\"a\":1}"[..]));
    }

    /// NaCl's secretbox test vector (key 32 × 0x01, nonce 24 × 0x02, message 64 × 0x03), stored
    /// the way upstream's secretbox transformer stores it: prefix, nonce, then the box (tag
    /// first). Reading it proves the layout, not just a round trip through our own writer.
    #[test]
    fn secretbox_reads_what_nacl_seals() {
        let c = config(&aes("secretbox", "k", &[1; 32]));
        let boxed = "8442bc313f4626f1359e3b50122b6ce6fe66ddfe7d39d14e637eb4fd5b45beadab55198df6ab5368439792a23c87db70acb6156dc5ef957ac04f6276cf6093b84be77ff0849cc33e34b7254d5a8f65ad";
        let mut stored = b"k8s:enc:secretbox:v1:k:".to_vec();
        stored.extend([2u8; 24]);
        stored.extend(
            (0..boxed.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&boxed[i..i + 2], 16).expect("hex")),
        );
        assert_eq!(c.decrypt(SECRET, stored.clone()).expect("opens"), [3u8; 64][..]);
        // Any flipped bit fails; secretbox binds no key, so another key path still reads it.
        let mut flipped = stored.clone();
        flipped[40] ^= 0x20;
        assert!(c.decrypt(SECRET, flipped).is_err());
        assert!(c.decrypt("/registry/core/secrets/default/other", stored).is_ok());
    }

    #[tokio::test]
    async fn a_changed_file_is_put_in_force_and_a_bad_one_changes_nothing() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file_text = |providers: &str| {
            format!(
                "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n- resources: [secrets]\n  providers:\n{providers}"
            )
        };
        let path = dir.path().join("encryption.yaml");
        let first = file_text(&aes("aescbc", "old", &[1; 32]));
        std::fs::write(&path, &first).expect("write");
        let inner: Arc<dyn Store> =
            Arc::new(super::super::embedded::open_default(&dir.path().join("store")).expect("store"));
        let store = EncryptedStore::new(
            inner.clone(),
            EncryptionConfig::parse(first.as_bytes()).expect("valid"),
        );
        let mut reloader = store.reloader(&path, first.into_bytes());
        let raw = |key: &'static str| {
            let inner = inner.clone();
            async move { inner.get(key).await.expect("get").expect("stored").value }
        };
        let put = |key: &str| Write::Create {
            key: key.to_string(),
            value: Bytes::from_static(b"{}"),
        };
        store.write(put(SECRET)).await.expect("write");
        assert!(raw(SECRET).await.starts_with(b"k8s:enc:aescbc:v1:old:"));
        assert!(
            !reloader.check().expect("unchanged file"),
            "same bytes: nothing to do"
        );
        // A new first key: later writes use it, the old value still reads.
        let rotated = file_text(&(aes("secretbox", "new", &[2; 32]) + &aes("aescbc", "old", &[1; 32])));
        std::fs::write(&path, &rotated).expect("write");
        assert!(reloader.check().expect("valid file"));
        const OTHER: &str = "/registry/core/secrets/default/s2";
        store.write(put(OTHER)).await.expect("write");
        assert!(raw(OTHER).await.starts_with(b"k8s:enc:secretbox:v1:new:"));
        assert_eq!(
            store.get(SECRET).await.expect("get").expect("stored").value,
            &b"{}"[..]
        );
        // A broken file is an error once and leaves the rotated configuration in force.
        std::fs::write(&path, "kind: nonsense\n").expect("write");
        assert!(reloader.check().is_err());
        assert!(!reloader.check().expect("same broken bytes"), "reported once");
        const THIRD: &str = "/registry/core/secrets/default/s3";
        store.write(put(THIRD)).await.expect("write");
        assert!(raw(THIRD).await.starts_with(b"k8s:enc:secretbox:v1:new:"));
        assert_eq!(
            store.get(OTHER).await.expect("get").expect("stored").value,
            &b"{}"[..]
        );
    }

    #[test]
    fn gcm_binds_the_value_to_its_key() {
        let c = config(&aes("aesgcm", "g", &[9; 32]));
        let stored = c.encrypt(SECRET, b"{}".to_vec()).expect("works");
        let err = c
            .decrypt("/registry/core/secrets/default/other", stored.clone())
            .expect_err("fails")
            .to_string();
        assert!(err.ends_with("cipher: message authentication failed"), "{err}");
        let mut flipped = stored.to_vec();
        let last = flipped.len() - 1;
        flipped[last] ^= 1;
        assert!(c.decrypt(SECRET, flipped).is_err());
        assert!(c.decrypt(SECRET, b"k8s:enc:aesgcm:v1:g:short".to_vec()).is_err());
    }

    #[test]
    fn bad_configurations_are_refused() {
        let head = "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n";
        for (body, want) in [
            (
                "- resources: [secrets]\n  providers:\n  - aescbc:\n      keys:\n      - name: k\n        secret: c2hvcnQ=\n",
                "secret is not of the expected length, got 5, expected one of [16 24 32]",
            ),
            (
                "- resources: [secrets]\n  providers:\n  - aesgcm:\n      keys:\n      - name: k\n        secret: c2hvcnQ=\n",
                "secret is not of the expected length, got 5, expected one of [16 24 32]",
            ),
            (
                "- resources: [secrets]\n  providers:\n  - secretbox:\n      keys:\n      - name: k\n        secret: AAAAAAAAAAAAAAAAAAAAAA==\n",
                "providers[0].secretbox.keys[0].secret: secret is not of the expected length, got 16, expected one of [32]",
            ),
            (
                "- resources: [secrets]\n  providers:\n  - aescbc:\n      keys:\n      - name: k\n        secret: '!!'\n",
                "secret is not valid base64",
            ),
            (
                "- resources: [secrets]\n  providers:\n  - aescbc:\n      keys: []\n",
                "keys: Required value",
            ),
            (
                "- resources: [secrets]\n  providers:\n  - secretbox:\n      keys: []\n",
                "secretbox: keys: Required value",
            ),
            (
                "- resources: [secrets]\n  providers:\n  - kms:\n      name: x\n",
                "supports the aescbc, aesgcm, secretbox and identity providers only",
            ),
            (
                "- resources: [secrets]\n  providers:\n  - identity: {}\n    aescbc:\n      keys: []\n",
                "exactly one provider must be set, 2 are",
            ),
            (
                "- resources: [secrets]\n  providers: []\n",
                "providers: Required value",
            ),
            (
                "- resources: [Secrets]\n  providers:\n  - identity: {}\n",
                "is not a resource name",
            ),
            (
                "- resources: [secrets]\n  providers:\n  - aescbc:\n      keys:\n      - name: k\n        secret: AAAAAAAAAAAAAAAAAAAAAA==\n      - name: k\n        secret: AAAAAAAAAAAAAAAAAAAAAA==\n",
                "Duplicate value: \"k\"",
            ),
        ] {
            let err = match EncryptionConfig::parse(format!("{head}{body}").as_bytes()) {
                Ok(_) => panic!("accepted: {body}"),
                Err(e) => e.to_string(),
            };
            assert!(err.contains(want), "{err} lacks {want}");
        }
        let err = EncryptionConfig::parse(b"apiVersion: v1\nkind: ConfigMap\n")
            .expect_err("fails")
            .to_string();
        assert!(err.contains("must be kind EncryptionConfiguration"), "{err}");
    }
}
