//! GPT disk images built in memory, without root or loop devices: a protective MBR, primary and
//! backup GPT, an EFI system partition (FAT, written with `fatfs`) with A/B boot slots, and a
//! state partition. GUIDs are derived from a seed so the same inputs give the same bytes.

use std::io::{Cursor, Seek, SeekFrom, Write};

use sha2::{Digest, Sha256};

/// Bytes per sector.
pub const SECTOR: u64 = 512;
const ENTRIES: u64 = 128;
const ENTRY_SIZE: u64 = 128;
/// First usable LBA: 1 MiB alignment.
const FIRST_LBA: u64 = 2048;

/// EFI System Partition type GUID (C12A7328-F81F-11D2-BA4B-00A0C93EC93B).
pub const ESP_TYPE: &str = "C12A7328-F81F-11D2-BA4B-00A0C93EC93B";
/// Linux filesystem data type GUID (0FC63DAF-8483-4772-8E79-3D69D8477DE4).
pub const LINUX_DATA_TYPE: &str = "0FC63DAF-8483-4772-8E79-3D69D8477DE4";

/// Errors building a disk.
#[derive(Debug, thiserror::Error)]
pub enum DiskError {
    #[error("FAT: {0}")]
    Fat(std::io::Error),
    #[error("bad GUID {0:?}")]
    Guid(String),
    #[error("{0} does not fit in the ESP ({1} MiB); raise --esp-mib")]
    TooBig(String, u64),
}

/// A partition to lay out.
#[derive(Debug, Clone)]
pub struct Partition {
    pub name: String,
    pub type_guid: String,
    pub size_mib: u64,
    /// Contents written at the partition start (may be shorter than the partition).
    pub contents: Vec<u8>,
}

/// Parses a textual GUID into its mixed-endian on-disk form.
pub fn guid_bytes(text: &str) -> Result<[u8; 16], DiskError> {
    let hex: String = text.chars().filter(|c| *c != '-').collect();
    if hex.len() != 32 {
        return Err(DiskError::Guid(text.into()));
    }
    let mut b = [0u8; 16];
    for (i, byte) in b.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).map_err(|_| DiskError::Guid(text.into()))?;
    }
    b[0..4].reverse();
    b[4..6].reverse();
    b[6..8].reverse();
    Ok(b)
}

/// A deterministic version-4-shaped GUID from a seed string.
pub fn derived_guid(seed: &str) -> [u8; 16] {
    let h = Sha256::digest(seed.as_bytes());
    let mut g = [0u8; 16];
    g.copy_from_slice(&h[..16]);
    g[7] = (g[7] & 0x0f) | 0x40;
    g[8] = (g[8] & 0x3f) | 0x80;
    g
}

fn utf16_name(name: &str) -> [u8; 72] {
    let mut out = [0u8; 72];
    for (i, u) in name.encode_utf16().take(36).enumerate() {
        out[2 * i..2 * i + 2].copy_from_slice(&u.to_le_bytes());
    }
    out
}

/// Lays the partitions out on a new disk image and returns its bytes.
pub fn build_gpt(seed: &str, parts: &[Partition]) -> Result<Vec<u8>, DiskError> {
    let entries_sectors = ENTRIES * ENTRY_SIZE / SECTOR;
    let mut lba = FIRST_LBA;
    let mut ranges = Vec::new();
    for p in parts {
        let sectors = p.size_mib * 1024 * 1024 / SECTOR;
        ranges.push((lba, lba + sectors - 1));
        lba += sectors;
    }
    let last_usable = lba + FIRST_LBA - 1 - (1 + entries_sectors);
    let total_sectors = last_usable + 1 + entries_sectors + 1;
    let mut disk = vec![0u8; (total_sectors * SECTOR) as usize];

    // Protective MBR.
    let mbr = &mut disk[446..462];
    mbr[4] = 0xEE;
    mbr[1..4].copy_from_slice(&[0, 2, 0]);
    mbr[5..8].copy_from_slice(&[0xff, 0xff, 0xff]);
    mbr[8..12].copy_from_slice(&1u32.to_le_bytes());
    mbr[12..16].copy_from_slice(&(total_sectors.min(u64::from(u32::MAX)) as u32 - 1).to_le_bytes());
    disk[510] = 0x55;
    disk[511] = 0xAA;

    // Partition entries.
    let mut table = vec![0u8; (ENTRIES * ENTRY_SIZE) as usize];
    for (i, (p, (first, last))) in parts.iter().zip(&ranges).enumerate() {
        let e = &mut table[i * ENTRY_SIZE as usize..(i + 1) * ENTRY_SIZE as usize];
        e[0..16].copy_from_slice(&guid_bytes(&p.type_guid)?);
        e[16..32].copy_from_slice(&derived_guid(&format!("{seed}/part/{}", p.name)));
        e[32..40].copy_from_slice(&first.to_le_bytes());
        e[40..48].copy_from_slice(&last.to_le_bytes());
        e[56..128].copy_from_slice(&utf16_name(&p.name));
        let start = (*first * SECTOR) as usize;
        disk[start..start + p.contents.len()].copy_from_slice(&p.contents);
    }
    let table_crc = crc32fast::hash(&table);
    let disk_guid = derived_guid(&format!("{seed}/disk"));

    let header = |my_lba: u64, alt_lba: u64, entries_lba: u64| {
        let mut h = vec![0u8; 92];
        h[0..8].copy_from_slice(b"EFI PART");
        h[8..12].copy_from_slice(&0x0001_0000u32.to_le_bytes());
        h[12..16].copy_from_slice(&92u32.to_le_bytes());
        h[24..32].copy_from_slice(&my_lba.to_le_bytes());
        h[32..40].copy_from_slice(&alt_lba.to_le_bytes());
        h[40..48].copy_from_slice(&FIRST_LBA.to_le_bytes());
        h[48..56].copy_from_slice(&last_usable.to_le_bytes());
        h[56..72].copy_from_slice(&disk_guid);
        h[72..80].copy_from_slice(&entries_lba.to_le_bytes());
        h[80..84].copy_from_slice(&(ENTRIES as u32).to_le_bytes());
        h[84..88].copy_from_slice(&(ENTRY_SIZE as u32).to_le_bytes());
        h[88..92].copy_from_slice(&table_crc.to_le_bytes());
        let crc = crc32fast::hash(&h);
        h[16..20].copy_from_slice(&crc.to_le_bytes());
        h
    };
    let last_lba = total_sectors - 1;
    let backup_entries = last_lba - entries_sectors;
    let primary = header(1, last_lba, 2);
    let backup = header(last_lba, 1, backup_entries);
    disk[SECTOR as usize..SECTOR as usize + 92].copy_from_slice(&primary);
    let t0 = (2 * SECTOR) as usize;
    disk[t0..t0 + table.len()].copy_from_slice(&table);
    let b0 = (backup_entries * SECTOR) as usize;
    disk[b0..b0 + table.len()].copy_from_slice(&table);
    let h0 = (last_lba * SECTOR) as usize;
    disk[h0..h0 + 92].copy_from_slice(&backup);
    Ok(disk)
}

/// Builds a FAT filesystem image of `size_mib` holding `files` (path, contents). Timestamps are
/// fatfs's fixed default (no clock), the volume id is fixed: the bytes depend only on the inputs.
pub fn build_fat(size_mib: u64, label: &str, files: &[(&str, &[u8])]) -> Result<Vec<u8>, DiskError> {
    let mut img = Cursor::new(vec![0u8; (size_mib * 1024 * 1024) as usize]);
    let mut lab = [b' '; 11];
    for (d, s) in lab.iter_mut().zip(label.bytes()) {
        *d = s.to_ascii_uppercase();
    }
    let opts = fatfs::FormatVolumeOptions::new()
        .volume_id(0x4e4f_4445)
        .volume_label(lab);
    fatfs::format_volume(&mut img, opts).map_err(DiskError::Fat)?;
    img.seek(SeekFrom::Start(0)).map_err(DiskError::Fat)?;
    {
        let fs = fatfs::FileSystem::new(&mut img, fatfs::FsOptions::new()).map_err(DiskError::Fat)?;
        for (path, data) in files {
            let root = fs.root_dir();
            let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
            let mut dir = root.clone();
            for d in &parts[..parts.len() - 1] {
                dir = match dir.open_dir(d) {
                    Ok(x) => x,
                    Err(_) => dir.create_dir(d).map_err(DiskError::Fat)?,
                };
            }
            let mut f = dir.create_file(parts[parts.len() - 1]).map_err(DiskError::Fat)?;
            f.truncate().map_err(DiskError::Fat)?;
            f.write_all(data).map_err(|e| {
                if e.kind() == std::io::ErrorKind::WriteZero || e.raw_os_error().is_none() {
                    DiskError::TooBig((*path).to_string(), size_mib)
                } else {
                    DiskError::Fat(e)
                }
            })?;
        }
        fs.unmount().map_err(DiskError::Fat)?;
    }
    Ok(img.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guid_text_is_mixed_endian() {
        let b = guid_bytes(ESP_TYPE).expect("guid");
        assert_eq!(&b[..4], &[0x28, 0x73, 0x2a, 0xc1]);
        assert_eq!(&b[8..], &[0xba, 0x4b, 0x00, 0xa0, 0xc9, 0x3e, 0xc9, 0x3b]);
        assert!(guid_bytes("nope").is_err());
    }

    #[test]
    fn gpt_headers_and_crcs_are_valid() {
        let parts = [
            Partition {
                name: "esp".into(),
                type_guid: ESP_TYPE.into(),
                size_mib: 2,
                contents: vec![1, 2, 3],
            },
            Partition {
                name: "state".into(),
                type_guid: LINUX_DATA_TYPE.into(),
                size_mib: 1,
                contents: vec![],
            },
        ];
        let d = build_gpt("t", &parts).expect("gpt");
        assert_eq!(d.len() as u64 % SECTOR, 0);
        let h = &d[512..512 + 92];
        assert_eq!(&h[0..8], b"EFI PART");
        let mut copy = h.to_vec();
        copy[16..20].fill(0);
        assert_eq!(crc32fast::hash(&copy).to_le_bytes(), h[16..20]);
        let table = &d[1024..1024 + 128 * 128];
        assert_eq!(crc32fast::hash(table).to_le_bytes(), h[88..92]);
        // ESP contents land at LBA 2048.
        assert_eq!(&d[2048 * 512..2048 * 512 + 3], &[1, 2, 3]);
        // The backup header sits in the last sector and points back at LBA 1.
        let last = d.len() - 512;
        assert_eq!(&d[last..last + 8], b"EFI PART");
        assert_eq!(
            u64::from_le_bytes(d[last + 32..last + 40].try_into().expect("8 bytes")),
            1
        );
        assert_eq!(d[510..512], [0x55, 0xAA]);
    }

    #[test]
    fn fat_image_is_reproducible_and_readable() -> Result<(), Box<dyn std::error::Error>> {
        let files: &[(&str, &[u8])] = &[
            ("EFI/BOOT/BOOTX64.EFI", b"uki"),
            ("EFI/nodeos/slot-a.efi", b"uki"),
        ];
        let a = build_fat(34, "esp", files)?;
        let b = build_fat(34, "esp", files)?;
        assert_eq!(a, b);
        let fs = fatfs::FileSystem::new(Cursor::new(a), fatfs::FsOptions::new())?;
        let mut f = fs.root_dir().open_file("EFI/BOOT/BOOTX64.EFI")?;
        let mut s = String::new();
        std::io::Read::read_to_string(&mut f, &mut s)?;
        assert_eq!(s, "uki");
        Ok(())
    }
}
