//! The embedded store's live values as its map keeps them: compressed with zstd against a
//! raw-content dictionary built into the binary ([`DICTIONARY`]). Only the map is compressed:
//! the watch history, the log and the snapshot hold values as written, so the dictionary may
//! change from one build to the next without touching data on disk.
//!
//! Why: in `bench scheduler` (5,000 hollow nodes, 10,000 pods) the stored values were the
//! largest single share of the control plane's heap (91 MB of 288 MB live, heaptrack), a pod
//! 4.3 KB of JSON of which 1.7 KB managedFields. Measured with zstd's command line on objects
//! of a small cluster of this server (level 1): a `kubectl run` pod 4,153 → 1,355 bytes without
//! a dictionary, → 294 with this one; a node 2,579 → 925 / 241, an event 1,148 → 547 / 112, a
//! Lease 563 → 83 with it.
//!
//! The dictionary (`packing-dictionary.jsonl`, 22 KB) is twelve objects as this API server
//! stored them in a small cluster (two nodes, `kubectl create deployment`, `kubectl create
//! job`, a Service, a ConfigMap; the node made to read like an agent's rather than a hollow
//! node's), one per line, the most common kinds last (zstd reaches the end of a dictionary
//! with the shortest offsets). It only has to share field names and shapes with what is
//! stored: any content decodes correctly, the dictionary only changes how small it gets.

use std::cell::RefCell;
use std::sync::LazyLock;

use bytes::Bytes;
use zstd::bulk::{Compressor, Decompressor};
use zstd::dict::{DecoderDictionary, EncoderDictionary};

/// Raw-content dictionary: typical stored objects (pods with managedFields, nodes, events,
/// leases, workloads), so that the field names and shapes every object repeats cost a
/// back-reference each.
static DICTIONARY: &[u8] = include_bytes!("packing-dictionary.jsonl");

/// zstd level 1 (the fast strategy, the smallest tables): the test pod packs to 290 bytes in
/// 8.7 µs and unpacks in 3.2 µs (one core of the 2-core CI machine, zstd optimised); level 3
/// packed it to 261 bytes in about the same time, 0.3 MB less for 10,000 such pods.
const LEVEL: i32 = 1;

static ENCODER: LazyLock<EncoderDictionary<'static>> =
    LazyLock::new(|| EncoderDictionary::copy(DICTIONARY, LEVEL));
static DECODER: LazyLock<DecoderDictionary<'static>> = LazyLock::new(|| DecoderDictionary::copy(DICTIONARY));

thread_local! {
    static COMPRESSOR: RefCell<Option<Compressor<'static>>> = const { RefCell::new(None) };
    static DECOMPRESSOR: RefCell<Option<Decompressor<'static>>> = const { RefCell::new(None) };
}

/// A live value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Packed {
    /// As written: compression did not make it smaller (an encrypted value, a tiny one), or
    /// failed.
    Raw(Bytes),
    /// A zstd frame against [`DICTIONARY`] of a value of `len` bytes (shared like the
    /// values: readers take it from the map under its lock and unpack it after).
    Zstd { len: u32, frame: Bytes },
}

impl Packed {
    /// Packs `value`; keeps it as it is when that is not smaller.
    pub(super) fn pack(value: &Bytes) -> Self {
        let Ok(len) = u32::try_from(value.len()) else {
            return Self::Raw(value.clone());
        };
        let frame = COMPRESSOR.with_borrow_mut(|c| {
            if c.is_none() {
                *c = Compressor::with_prepared_dictionary(&ENCODER).ok();
            }
            c.as_mut().and_then(|c| c.compress(value).ok())
        });
        match frame {
            Some(frame) if frame.len() < value.len() => Self::Zstd {
                len,
                // Through a boxed slice: the compressor's buffer has the capacity of its bound
                // (more than the value), which `Bytes` would keep.
                frame: Bytes::from(frame.into_boxed_slice()),
            },
            _ => Self::Raw(value.clone()),
        }
    }

    /// The value as written.
    pub(super) fn unpack(&self) -> std::io::Result<Bytes> {
        match self {
            Self::Raw(v) => Ok(v.clone()),
            Self::Zstd { len, frame } => DECOMPRESSOR.with_borrow_mut(|d| {
                if d.is_none() {
                    *d = Some(Decompressor::with_prepared_dictionary(&DECODER)?);
                }
                let Some(d) = d.as_mut() else {
                    return Err(std::io::Error::other("no zstd decompressor"));
                };
                let out = d.decompress(frame, *len as usize)?;
                if out.len() != *len as usize {
                    return Err(std::io::Error::other(format!(
                        "unpacked {} bytes, packed from {len}",
                        out.len()
                    )));
                }
                Ok(Bytes::from(out))
            }),
        }
    }

    /// Bytes held.
    #[cfg(test)]
    pub(super) fn held(&self) -> usize {
        match self {
            Self::Raw(v) => v.len(),
            Self::Zstd { frame, .. } => frame.len(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pod as this API server stores it after the scheduler bound it and its node reported
    /// it running (`kubectl run`: a pod the dictionary's pods, a Deployment's and a Job's, are
    /// not).
    const POD: &str = include_str!("packed_test_pod.json");

    /// What the test pod must pack to at most, as a share of its size (it packed to 294 of
    /// 4,153 bytes; without the dictionary zstd gets it to 1,355).
    const PACKED_RATIO: f64 = 0.125;

    #[test]
    fn a_stored_pod_packs_to_an_eighth_and_back() {
        let v = Bytes::from_static(POD.as_bytes());
        let p = Packed::pack(&v);
        assert!(matches!(p, Packed::Zstd { .. }), "not packed");
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
        // An encrypted value is noise to the compressor; a tiny one is smaller than a frame.
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
    fn a_damaged_frame_is_an_error_not_a_wrong_value() {
        let v = Bytes::from_static(POD.as_bytes());
        let Packed::Zstd { len, frame } = Packed::pack(&v) else {
            panic!("not packed");
        };
        let damaged = Packed::Zstd {
            len,
            frame: frame.slice(..frame.len() / 2),
        };
        assert!(damaged.unpack().is_err());
        let wrong_len = Packed::Zstd { len: len + 1, frame };
        assert!(wrong_len.unpack().is_err());
    }
}
