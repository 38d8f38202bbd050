//! The node's state partition (GPT name [`PARTITION_NAME`]) as a small crash-safe record of the
//! agent's identity: its client and serving certificates and keys, and the cluster CA they were
//! issued under. With it a rebooted node keeps its identity and never needs the bootstrap token
//! again, so the token can expire (as upstream's do, 24 h after `kubeadm init`).
//!
//! The partition holds no file system (the node has no mkfs, and building ext4 or FAT in the
//! image builder for four small files would be most of this feature): two slots of
//! [`SLOT_BYTES`], each a header (magic, generation, length, CRC-32 of generation, length and
//! payload) and a JSON payload (file name → base64 bytes). A save writes the slot that does not
//! hold the newest valid record and syncs it, so a write torn by a power cut leaves the previous
//! record readable; a load takes the valid record with the highest generation.

use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use base64::Engine;

/// The GPT partition name the image builder gives the state partition.
pub const PARTITION_NAME: &str = "nodeos-state";
/// Bytes per slot; the partition needs two.
pub const SLOT_BYTES: u64 = 512 * 1024;
const MAGIC: &[u8; 16] = b"NODEOS-STATE-v1\n";
const HEADER: usize = 32;

/// Files by name.
pub type Files = BTreeMap<String, Vec<u8>>;

/// Errors reading or writing the state partition.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: the partition holds {size} bytes, fewer than the two {SLOT_BYTES}-byte slots")]
    TooSmall { path: PathBuf, size: u64 },
    #[error("the record is {0} bytes, more than a slot holds")]
    TooLarge(usize),
    #[error("encoding the record: {0}")]
    Encode(#[from] serde_json::Error),
}

/// The record store on one block device (or, in tests, a file).
#[derive(Debug, Clone)]
pub struct StateStore {
    path: PathBuf,
}

/// A valid record found in a slot.
struct Found {
    slot: u64,
    generation: u64,
    files: Files,
}

impl StateStore {
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self { path: path.into() }
    }

    /// The state partition of this machine, found by its GPT name in sysfs.
    pub fn find() -> Option<Self> {
        Self::find_in(Path::new("/sys/class/block"), Path::new("/dev"))
    }

    fn find_in(sys_block: &Path, dev: &Path) -> Option<Self> {
        let mut entries: Vec<_> = std::fs::read_dir(sys_block).ok()?.flatten().collect();
        entries.sort_by_key(|e| e.file_name());
        entries.into_iter().find_map(|e| {
            let uevent = std::fs::read_to_string(e.path().join("uevent")).ok()?;
            let field = |k: &str| {
                uevent
                    .lines()
                    .find_map(|l| l.strip_prefix(k)?.strip_prefix('='))
                    .map(str::to_string)
            };
            if field("PARTNAME")? != PARTITION_NAME {
                return None;
            }
            Some(Self::new(dev.join(field("DEVNAME")?)))
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn io(&self) -> impl FnOnce(std::io::Error) -> StateError + '_ {
        move |source| StateError::Io {
            path: self.path.clone(),
            source,
        }
    }

    fn open(&self, write: bool) -> Result<std::fs::File, StateError> {
        let mut f = std::fs::OpenOptions::new()
            .read(true)
            .write(write)
            .open(&self.path)
            .map_err(self.io())?;
        // A block device's size is where its end is (its metadata says 0).
        let size = f.seek(SeekFrom::End(0)).map_err(self.io())?;
        if size < 2 * SLOT_BYTES {
            return Err(StateError::TooSmall {
                path: self.path.clone(),
                size,
            });
        }
        Ok(f)
    }

    fn newest(&self, f: &mut std::fs::File) -> Result<Option<Found>, StateError> {
        let mut best: Option<Found> = None;
        for slot in 0..2 {
            f.seek(SeekFrom::Start(slot * SLOT_BYTES)).map_err(self.io())?;
            let mut buf = vec![0u8; SLOT_BYTES as usize];
            f.read_exact(&mut buf).map_err(self.io())?;
            if let Some((generation, files)) = decode(&buf)
                && best.as_ref().is_none_or(|b| generation > b.generation)
            {
                best = Some(Found {
                    slot,
                    generation,
                    files,
                });
            }
        }
        Ok(best)
    }

    /// The newest valid record (None: the partition was never written, or both slots are
    /// damaged).
    pub fn load(&self) -> Result<Option<Files>, StateError> {
        let mut f = self.open(false)?;
        Ok(self.newest(&mut f)?.map(|found| found.files))
    }

    /// Replaces the record with `files`, durably, without ever overwriting the newest valid one.
    pub fn save(&self, files: &Files) -> Result<(), StateError> {
        let mut f = self.open(true)?;
        let newest = self.newest(&mut f)?;
        let (slot, generation) = match &newest {
            Some(n) => (1 - n.slot, n.generation + 1),
            None => (0, 1),
        };
        let bytes = encode(generation, files)?;
        f.seek(SeekFrom::Start(slot * SLOT_BYTES)).map_err(self.io())?;
        f.write_all(&bytes).map_err(self.io())?;
        f.sync_all().map_err(self.io())
    }
}

/// The bytes of a slot holding `files` as record `generation`.
fn encode(generation: u64, files: &Files) -> Result<Vec<u8>, StateError> {
    let b64 = base64::engine::general_purpose::STANDARD;
    let map: BTreeMap<&str, String> = files.iter().map(|(k, v)| (k.as_str(), b64.encode(v))).collect();
    let payload = serde_json::to_vec(&map)?;
    if HEADER + payload.len() > SLOT_BYTES as usize {
        return Err(StateError::TooLarge(payload.len()));
    }
    let len = payload.len() as u32;
    let mut out = Vec::with_capacity(HEADER + payload.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&generation.to_le_bytes());
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&crc(generation, len, &payload).to_le_bytes());
    out.extend_from_slice(&payload);
    Ok(out)
}

fn crc(generation: u64, len: u32, payload: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&generation.to_le_bytes());
    h.update(&len.to_le_bytes());
    h.update(payload);
    h.finalize()
}

/// The generation and files of a slot, when it holds a whole, undamaged record.
fn decode(slot: &[u8]) -> Option<(u64, Files)> {
    let header = slot.get(..HEADER)?;
    if &header[..16] != MAGIC {
        return None;
    }
    let generation = u64::from_le_bytes(header[16..24].try_into().ok()?);
    let len = u32::from_le_bytes(header[24..28].try_into().ok()?);
    let sum = u32::from_le_bytes(header[28..32].try_into().ok()?);
    let payload = slot.get(HEADER..HEADER + len as usize)?;
    if crc(generation, len, payload) != sum {
        return None;
    }
    let map: BTreeMap<String, String> = serde_json::from_slice(payload).ok()?;
    let b64 = base64::engine::general_purpose::STANDARD;
    let files = map
        .into_iter()
        .map(|(k, v)| Some((k, b64.decode(v).ok()?)))
        .collect::<Option<Files>>()?;
    Some((generation, files))
}

/// The identity files the record keeps, all in the agent's identity directory.
pub const IDENTITY_FILES: &[&str] = &["ca.crt", "node.crt", "node.key", "serving.crt", "serving.key"];

/// Writes the recorded identity files into `dir` (mode 0600; a file already there is left as it
/// is). Returns how many were written.
pub fn restore(store: &StateStore, dir: &Path) -> Result<usize, StateError> {
    let Some(files) = store.load()? else {
        return Ok(0);
    };
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| StateError::Io { path, source }
    };
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let mut written = 0;
    for (name, bytes) in files.iter().filter(|(n, _)| IDENTITY_FILES.contains(&n.as_str())) {
        let path = dir.join(name);
        if path.exists() {
            continue;
        }
        write_private(&path, bytes).map_err(io(&path))?;
        written += 1;
    }
    Ok(written)
}

/// Records the identity files now in `dir` (those missing are left out of the record).
pub fn persist(store: &StateStore, dir: &Path) -> Result<(), StateError> {
    let files: Files = IDENTITY_FILES
        .iter()
        .filter_map(|n| Some((n.to_string(), std::fs::read(dir.join(n)).ok()?)))
        .collect();
    store.save(&files)
}

/// Writes `data` to `path`, readable by root only.
pub fn write_private(path: &Path, data: &[u8]) -> std::io::Result<()> {
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?
        .write_all(data)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn partition(dir: &Path, bytes: u64) -> StateStore {
        let path = dir.join("state.img");
        std::fs::File::create(&path)
            .and_then(|f| f.set_len(bytes))
            .expect("partition file");
        StateStore::new(path)
    }

    fn files(pairs: &[(&str, &str)]) -> Files {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.as_bytes().to_vec()))
            .collect()
    }

    #[test]
    fn records_alternate_slots_and_the_newest_wins() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = partition(dir.path(), 2 * SLOT_BYTES);
        assert!(
            store.load().expect("reads").is_none(),
            "a blank partition holds nothing"
        );
        let first = files(&[("node.crt", "one")]);
        store.save(&first).expect("save");
        assert_eq!(store.load().expect("reads"), Some(first.clone()));
        let second = files(&[("node.crt", "two"), ("node.key", "k")]);
        store.save(&second).expect("save");
        assert_eq!(store.load().expect("reads"), Some(second.clone()));
        // The second went to slot 1; slot 0 still holds the first.
        let raw = std::fs::read(store.path()).expect("read");
        assert_eq!(decode(&raw[..SLOT_BYTES as usize]).map(|r| r.0), Some(1));
        assert_eq!(decode(&raw[SLOT_BYTES as usize..]).map(|r| r.0), Some(2));
        // A third overwrites the older slot (0), never the newest.
        store.save(&files(&[("node.crt", "three")])).expect("save");
        let raw = std::fs::read(store.path()).expect("read");
        assert_eq!(decode(&raw[..SLOT_BYTES as usize]).map(|r| r.0), Some(3));
        assert_eq!(decode(&raw[SLOT_BYTES as usize..]).map(|r| r.0), Some(2));
    }

    #[test]
    fn a_torn_or_damaged_record_leaves_the_previous_one() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = partition(dir.path(), 2 * SLOT_BYTES);
        let old = files(&[("node.crt", "old")]);
        store.save(&old).expect("save");
        store.save(&files(&[("node.crt", "new")])).expect("save");
        // Damage the newest record (slot 1) as a torn write would: the old one is read.
        let mut raw = std::fs::read(store.path()).expect("read");
        raw[SLOT_BYTES as usize + HEADER + 3] ^= 0xff;
        std::fs::write(store.path(), &raw).expect("write");
        assert_eq!(store.load().expect("reads"), Some(old.clone()));
        // The next save goes over the damaged slot and becomes the newest.
        let next = files(&[("node.crt", "next")]);
        store.save(&next).expect("save");
        assert_eq!(store.load().expect("reads"), Some(next));
        let raw = std::fs::read(store.path()).expect("read");
        assert_eq!(decode(&raw[..SLOT_BYTES as usize]).map(|r| r.1), Some(old));
    }

    #[test]
    fn small_partitions_and_large_records_are_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let small = partition(dir.path(), SLOT_BYTES);
        assert!(matches!(small.load(), Err(StateError::TooSmall { .. })));
        let store = partition(dir.path(), 2 * SLOT_BYTES);
        let huge = files(&[("node.crt", &"x".repeat(SLOT_BYTES as usize))]);
        assert!(matches!(store.save(&huge), Err(StateError::TooLarge(_))));
        assert!(store.load().expect("reads").is_none(), "nothing written");
    }

    #[test]
    fn identity_files_round_trip_through_the_partition() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = partition(dir.path(), 2 * SLOT_BYTES);
        let id = dir.path().join("id");
        std::fs::create_dir(&id).expect("mkdir");
        for (name, body) in [
            ("node.crt", "C"),
            ("node.key", "K"),
            ("ca.crt", "CA"),
            ("other", "x"),
        ] {
            std::fs::write(id.join(name), body).expect("write");
        }
        persist(&store, &id).expect("persist");
        let after_reboot = dir.path().join("after");
        assert_eq!(restore(&store, &after_reboot).expect("restore"), 3);
        assert_eq!(
            std::fs::read_to_string(after_reboot.join("node.key")).expect("read"),
            "K"
        );
        assert!(
            !after_reboot.join("other").exists(),
            "only identity files are kept"
        );
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(after_reboot.join("node.key"))
            .expect("stat")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        // Files already there win.
        std::fs::write(after_reboot.join("node.crt"), "newer").expect("write");
        std::fs::remove_file(after_reboot.join("ca.crt")).expect("rm");
        assert_eq!(restore(&store, &after_reboot).expect("restore"), 1);
        assert_eq!(
            std::fs::read_to_string(after_reboot.join("node.crt")).expect("read"),
            "newer"
        );
    }

    #[test]
    fn the_partition_is_found_by_its_gpt_name() {
        let dir = tempfile::tempdir().expect("tempdir");
        let sys = dir.path().join("sys");
        for (dev, uevent) in [
            ("vda", "MAJOR=254\nMINOR=0\nDEVNAME=vda\nDEVTYPE=disk\n"),
            (
                "vda1",
                "MAJOR=254\nMINOR=1\nDEVNAME=vda1\nDEVTYPE=partition\nPARTN=1\nPARTNAME=nodeos-esp\n",
            ),
            (
                "vda2",
                "MAJOR=254\nMINOR=2\nDEVNAME=vda2\nDEVTYPE=partition\nPARTN=2\nPARTNAME=nodeos-state\n",
            ),
        ] {
            std::fs::create_dir_all(sys.join(dev)).expect("mkdir");
            std::fs::write(sys.join(dev).join("uevent"), uevent).expect("write");
        }
        let found = StateStore::find_in(&sys, Path::new("/dev")).expect("found");
        assert_eq!(found.path(), Path::new("/dev/vda2"));
        std::fs::remove_dir_all(sys.join("vda2")).expect("rm");
        assert!(StateStore::find_in(&sys, Path::new("/dev")).is_none());
    }
}
