//! The embedded store's cold values as its map keeps them: LZ4 blocks against a raw-content
//! dictionary built into the binary ([`DICTIONARY`]). A value is packed only once the watch
//! history no longer holds its event (`embedded.rs`): recently written objects, which watchers,
//! informers' relists and writers read most, stay as written and cost nothing to read. The log,
//! the snapshot and the history hold values as written, so the dictionary may change from one
//! build to the next without touching data on disk.
//!
//! Why: in `bench scheduler` (5,000 hollow nodes, 10,000 pods) the stored values were the
//! largest share of the control plane's heap (about 100 of 300 MB live, jemalloc's heap
//! profile), a pod 4.2 KB of JSON of which 1.7 KB managedFields.
//!
//! Why LZ4 and not zstd: zstd level 1 with this dictionary packs the test pod smaller (4,153 →
//! 290 bytes) but unpacks it in 2.8 µs, and with every live value packed, paged lists of 100
//! pods fell from 2,695-3,667/s to 1,548-1,702/s in `bench api` (issue 10 asks ≥ 2,000; that
//! version is in the history, 6e635bf). LZ4 with the dictionary (`lz4_flex`, optimised, one core
//! of the 2-core CI machine): 4,153 → 558 bytes, unpacked in 0.9 µs (a copy of the 4 KB takes
//! 0.1 µs); without the dictionary 1,885 bytes. Packing costs 11 µs a value (the dictionary's
//! table is rebuilt each call), paid by the store's writer thread between batches of writes,
//! 32 values at a time. `lz4_flex` is generic `#[inline]` code compiled at the calling crate's
//! optimisation level: in the dev profile (tests) packing takes about 200 µs and unpacking 17 µs.
//!
//! The dictionary (`packing-dictionary.jsonl`, 22 KB, inside LZ4's 64 KB window) is twelve
//! objects as this API server stored them in a small cluster (two nodes, `kubectl create
//! deployment`, `kubectl create job`, a Service, a ConfigMap; the node made to read like an
//! agent's rather than a hollow node's), one per line. It only has to share field names and
//! shapes with what is stored: any content decodes correctly, the dictionary only changes how
//! small it gets.

use bytes::Bytes;

/// Raw-content dictionary: typical stored objects (pods with managedFields, nodes, events,
/// leases, workloads), so that the field names and shapes every object repeats cost a
/// back-reference each.
static DICTIONARY: &[u8] = include_bytes!("packing-dictionary.jsonl");

/// A live value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Packed {
    /// As written: not packed yet, or packing did not make it smaller (an encrypted value, a
    /// tiny one).
    Raw(Bytes),
    /// An LZ4 block against [`DICTIONARY`] of a value of `len` bytes (shared like the values:
    /// readers take it from the map under its lock and unpack it after).
    Lz4 { len: u32, block: Bytes },
}

impl Packed {
    /// Packs `value`; keeps it as it is when that is not smaller.
    pub(super) fn pack(value: &Bytes) -> Self {
        let Ok(len) = u32::try_from(value.len()) else {
            return Self::Raw(value.clone());
        };
        let block = lz4_flex::block::compress_with_dict(value, DICTIONARY);
        if block.len() >= value.len() {
            return Self::Raw(value.clone());
        }
        // Through a boxed slice: the compressor's buffer has the capacity of its bound (more
        // than the value), which `Bytes` would keep.
        Self::Lz4 {
            len,
            block: Bytes::from(block.into_boxed_slice()),
        }
    }

    /// Whether the value is kept as written.
    pub(super) fn is_raw(&self) -> bool {
        matches!(self, Self::Raw(_))
    }

    /// The value as written.
    pub(super) fn unpack(&self) -> std::io::Result<Bytes> {
        match self {
            Self::Raw(v) => Ok(v.clone()),
            Self::Lz4 { len, block } => {
                let mut out = vec![0u8; *len as usize];
                let n = lz4_flex::block::decompress_into_with_dict(block, &mut out, DICTIONARY)
                    .map_err(std::io::Error::other)?;
                if n != out.len() {
                    return Err(std::io::Error::other(format!(
                        "unpacked {n} bytes, packed from {len}"
                    )));
                }
                Ok(Bytes::from(out))
            }
        }
    }

    /// Bytes held.
    #[cfg(test)]
    pub(super) fn held(&self) -> usize {
        match self {
            Self::Raw(v) => v.len(),
            Self::Lz4 { block, .. } => block.len(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pod as this API server stores it after the scheduler bound it and its node reported
    /// it running, made by `kubectl run` (the dictionary's pods are a Deployment's and a Job's).
    const POD: &str = include_str!("packed_test_pod.json");

    /// What the test pod must pack to at most, as a share of its size (it packs to 558 of
    /// 4,153 bytes; without the dictionary to 1,885).
    const PACKED_RATIO: f64 = 0.2;

    #[test]
    fn a_stored_pod_packs_to_a_fifth_and_back() {
        let v = Bytes::from_static(POD.as_bytes());
        let p = Packed::pack(&v);
        assert!(matches!(p, Packed::Lz4 { .. }), "not packed");
        assert!(
            (p.held() as f64) <= v.len() as f64 * PACKED_RATIO,
            "{} bytes packed to {}",
            v.len(),
            p.held()
        );
        assert_eq!(p.unpack().expect("unpack"), v);
    }

    #[test]
    fn values_packing_does_not_shrink_stay_as_written() {
        // An encrypted value is noise to the compressor; a tiny one is smaller than a block.
        let mut x = 0x9e37_79b9_7f4a_7c15_u64;
        let noise: Vec<u8> = (0..4096)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        for v in [Bytes::from(noise), Bytes::from_static(b"v1"), Bytes::new()] {
            let p = Packed::pack(&v);
            assert_eq!(p, Packed::Raw(v.clone()));
            assert_eq!(p.unpack().expect("unpack"), v);
        }
    }

    #[test]
    fn a_damaged_block_is_an_error_not_a_wrong_value() {
        let v = Bytes::from_static(POD.as_bytes());
        let Packed::Lz4 { len, block } = Packed::pack(&v) else {
            panic!("not packed");
        };
        let damaged = Packed::Lz4 {
            len,
            block: block.slice(..block.len() / 2),
        };
        assert!(damaged.unpack().is_err());
        let wrong_len = Packed::Lz4 { len: len + 1, block };
        assert!(wrong_len.unpack().is_err());
    }
}
