//! On-disk format of the embedded store: a snapshot file and a write-ahead log, both sequences of
//! checksummed records `[len: u32 LE][crc32: u32 LE][payload]`.
//!
//! Payload: `op: u8` (1 put, 2 delete, 3 snapshot header), `revision: i64`, `create_revision: i64`,
//! `key_len: u32`, key, `value_len: u32`, value (all little-endian). A record is acknowledged only
//! after the log is fsynced, so a short or corrupt record at the end can only be the
//! unacknowledged tail of the log; recovery stops there and truncates it. A bad record with valid
//! records after it is damage to acknowledged data ([`valid_record_after`]): the store refuses to
//! start and keeps the file. Files are created with mode 0600.

use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use super::{Result, StoreError};

/// A decoded record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub op: Op,
    pub revision: i64,
    pub create_revision: i64,
    pub key: String,
    pub value: Vec<u8>,
}

/// Record kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Put = 1,
    Delete = 2,
    /// First record of a snapshot: `revision` is the store revision, `create_revision` the
    /// compacted revision.
    SnapshotHeader = 3,
}

/// Refuses absurd lengths from a corrupt file before allocating.
const MAX_RECORD: u32 = 64 << 20;

/// A record to encode, borrowing its key and value.
#[derive(Debug, Clone, Copy)]
pub struct Entry<'a> {
    pub op: Op,
    pub revision: i64,
    pub create_revision: i64,
    pub key: &'a str,
    pub value: &'a [u8],
}

impl Record {
    /// This record, to encode.
    #[cfg(test)]
    pub fn entry(&self) -> Entry<'_> {
        Entry {
            op: self.op,
            revision: self.revision,
            create_revision: self.create_revision,
            key: &self.key,
            value: &self.value,
        }
    }
}

/// Appends the encoded record to `out` (length and CRC header, then the payload in place).
pub fn encode(rec: Entry<'_>, out: &mut Vec<u8>) {
    let payload_len = 1 + 8 + 8 + 4 + rec.key.len() + 4 + rec.value.len();
    out.reserve(8 + payload_len);
    let start = out.len();
    out.extend_from_slice(&(payload_len as u32).to_le_bytes());
    out.extend_from_slice(&[0; 4]);
    out.push(rec.op as u8);
    out.extend_from_slice(&rec.revision.to_le_bytes());
    out.extend_from_slice(&rec.create_revision.to_le_bytes());
    out.extend_from_slice(&(rec.key.len() as u32).to_le_bytes());
    out.extend_from_slice(rec.key.as_bytes());
    out.extend_from_slice(&(rec.value.len() as u32).to_le_bytes());
    out.extend_from_slice(rec.value);
    let crc = crc32fast::hash(&out[start + 8..]);
    out[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
}

fn decode_payload(p: &[u8]) -> Option<Record> {
    let op = match *p.first()? {
        1 => Op::Put,
        2 => Op::Delete,
        3 => Op::SnapshotHeader,
        _ => return None,
    };
    let i64_at = |o: usize| {
        p.get(o..o + 8)
            .map(|b| i64::from_le_bytes(b.try_into().unwrap_or([0; 8])))
    };
    let u32_at = |o: usize| {
        p.get(o..o + 4)
            .map(|b| u32::from_le_bytes(b.try_into().unwrap_or([0; 4])) as usize)
    };
    let revision = i64_at(1)?;
    let create_revision = i64_at(9)?;
    let klen = u32_at(17)?;
    let key = String::from_utf8(p.get(21..21 + klen)?.to_vec()).ok()?;
    let vlen = u32_at(21 + klen)?;
    let value = p.get(25 + klen..25 + klen + vlen)?.to_vec();
    if 25 + klen + vlen != p.len() {
        return None;
    }
    Some(Record {
        op,
        revision,
        create_revision,
        key,
        value,
    })
}

/// Decodes the record at `pos` of `data`: the record and where it ends.
fn record_at(data: &[u8], pos: usize) -> Option<(Record, usize)> {
    let header = data.get(pos..pos.checked_add(8)?)?;
    let len = u32::from_le_bytes([header[0], header[1], header[2], header[3]]);
    let crc = u32::from_le_bytes([header[4], header[5], header[6], header[7]]);
    if len > MAX_RECORD {
        return None;
    }
    let end = pos + 8 + len as usize;
    let payload = data.get(pos + 8..end)?;
    if crc32fast::hash(payload) != crc {
        return None;
    }
    Some((decode_payload(payload)?, end))
}

/// The offset of the first valid record that starts after `from` (a torn tail has none: its
/// bytes are a partial record, zeros or nothing).
pub fn valid_record_after(data: &[u8], from: usize) -> Option<usize> {
    (from + 1..data.len().saturating_sub(8)).find(|&pos| record_at(data, pos).is_some())
}

/// Decodes records from `data`; returns them and the length of the valid prefix.
pub fn decode_all(data: &[u8]) -> (Vec<Record>, usize) {
    let mut out = Vec::new();
    let mut pos = 0;
    while let Some((rec, end)) = record_at(data, pos) {
        out.push(rec);
        pos = end;
    }
    (out, pos)
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> StoreError + '_ {
    move |source| StoreError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// Reads a whole file, or an empty vector if it does not exist.
pub fn read_file(path: &Path) -> Result<Vec<u8>> {
    match File::open(path) {
        Ok(mut f) => {
            let mut v = Vec::new();
            f.read_to_end(&mut v).map_err(io(path))?;
            Ok(v)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(io(path)(e)),
    }
}

/// fsyncs a directory so renames and creations in it are durable.
pub fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(io(dir))
}

/// Writes a file atomically and durably (temp file, fsync, rename, fsync dir), its content
/// written by `fill` through a buffered writer (a snapshot of the whole store is streamed to
/// the file, never held in memory at once).
pub fn write_atomic(
    path: &Path,
    fill: impl FnOnce(&mut std::io::BufWriter<File>) -> std::io::Result<()>,
) -> Result<()> {
    let tmp = path.with_extension("tmp");
    {
        let f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(io(&tmp))?;
        let mut w = std::io::BufWriter::with_capacity(1 << 20, f);
        fill(&mut w).map_err(io(&tmp))?;
        let f = w.into_inner().map_err(|e| io(&tmp)(e.into_error()))?;
        f.sync_all().map_err(io(&tmp))?;
    }
    std::fs::rename(&tmp, path).map_err(io(path))?;
    if let Some(dir) = path.parent() {
        sync_dir(dir)?;
    }
    Ok(())
}

/// Opens the log for appending, truncated to `valid_len` (dropping an unacknowledged torn tail).
pub fn open_log(path: &Path, valid_len: u64) -> Result<File> {
    let created = !path.exists();
    let f = OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)
        .map_err(io(path))?;
    if created && let Some(dir) = path.parent() {
        sync_dir(dir)?;
    }
    if f.metadata().map_err(io(path))?.len() != valid_len {
        f.set_len(valid_len).map_err(io(path))?;
        f.sync_all().map_err(io(path))?;
    }
    Ok(f)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(rev: i64, key: &str, value: &[u8]) -> Record {
        Record {
            op: Op::Put,
            revision: rev,
            create_revision: rev,
            key: key.into(),
            value: value.to_vec(),
        }
    }

    #[test]
    fn round_trip() {
        let mut buf = Vec::new();
        encode(rec(1, "/a", b"x").entry(), &mut buf);
        encode(
            Record {
                op: Op::Delete,
                ..rec(2, "/a", b"")
            }
            .entry(),
            &mut buf,
        );
        let (recs, len) = decode_all(&buf);
        assert_eq!(len, buf.len());
        assert_eq!(recs.len(), 2);
        assert_eq!(recs[0], rec(1, "/a", b"x"));
        assert_eq!(recs[1].op, Op::Delete);
    }

    #[test]
    fn torn_and_corrupt_tails_are_cut() {
        let mut buf = Vec::new();
        encode(rec(1, "/a", b"one").entry(), &mut buf);
        let good = buf.len();
        encode(rec(2, "/b", b"two").entry(), &mut buf);
        // Torn: the second record is cut short.
        let (recs, len) = decode_all(&buf[..buf.len() - 2]);
        assert_eq!((recs.len(), len), (1, good));
        // Corrupt: a flipped byte in the second record's payload.
        let mut bad = buf.clone();
        let last = bad.len() - 1;
        bad[last] ^= 0xff;
        let (recs, len) = decode_all(&bad);
        assert_eq!((recs.len(), len), (1, good));
        // Garbage length.
        let (recs, len) = decode_all(&[0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0]);
        assert_eq!((recs.len(), len), (0, 0));
    }
}
