//! Unified kernel images: the systemd EFI stub with `.osrel`, `.cmdline`, `.initrd` and `.linux`
//! sections appended. New sections go after the stub's last section (virtual addresses aligned
//! to SectionAlignment, file offsets to FileAlignment), which is what the stub expects.

/// Errors building a UKI.
#[derive(Debug, thiserror::Error)]
pub enum UkiError {
    #[error("EFI stub is not a PE32+ image: {0}")]
    NotPe(&'static str),
    #[error(
        "EFI stub has no room for {needed} more section headers (headers end at {headers_end:#x}, first section data at {first_data:#x})"
    )]
    NoHeaderRoom {
        needed: usize,
        headers_end: usize,
        first_data: usize,
    },
    #[error("section name {0:?} is longer than 8 bytes")]
    Name(String),
}

const SECTION_HEADER: usize = 40;
const IMAGE_SCN_CNT_INITIALIZED_DATA: u32 = 0x0000_0040;
const IMAGE_SCN_MEM_READ: u32 = 0x4000_0000;

fn u16_at(b: &[u8], o: usize) -> Result<u16, UkiError> {
    b.get(o..o + 2)
        .map(|s| u16::from_le_bytes([s[0], s[1]]))
        .ok_or(UkiError::NotPe("truncated"))
}
fn u32_at(b: &[u8], o: usize) -> Result<u32, UkiError> {
    b.get(o..o + 4)
        .map(|s| u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
        .ok_or(UkiError::NotPe("truncated"))
}
fn put_u16(b: &mut [u8], o: usize, v: u16) {
    b[o..o + 2].copy_from_slice(&v.to_le_bytes());
}
fn put_u32(b: &mut [u8], o: usize, v: u32) {
    b[o..o + 4].copy_from_slice(&v.to_le_bytes());
}
fn align(v: usize, a: usize) -> usize {
    v.div_ceil(a) * a
}

/// A parsed view of the stub's headers.
#[derive(Debug, Clone, Copy)]
struct Layout {
    coff: usize,
    opt: usize,
    nsections: usize,
    section_table: usize,
    section_align: usize,
    file_align: usize,
    size_of_headers: usize,
}

fn layout(pe: &[u8]) -> Result<Layout, UkiError> {
    if pe.get(0..2) != Some(b"MZ") {
        return Err(UkiError::NotPe("no MZ header"));
    }
    let pe_off = u32_at(pe, 0x3c)? as usize;
    if pe.get(pe_off..pe_off + 4) != Some(b"PE\0\0") {
        return Err(UkiError::NotPe("no PE signature"));
    }
    let coff = pe_off + 4;
    let nsections = u16_at(pe, coff + 2)? as usize;
    let opt_size = u16_at(pe, coff + 16)? as usize;
    let opt = coff + 20;
    if u16_at(pe, opt)? != 0x20b {
        return Err(UkiError::NotPe("optional header is not PE32+"));
    }
    Ok(Layout {
        coff,
        opt,
        nsections,
        section_table: opt + opt_size,
        section_align: u32_at(pe, opt + 32)? as usize,
        file_align: u32_at(pe, opt + 36)? as usize,
        size_of_headers: u32_at(pe, opt + 60)? as usize,
    })
}

/// One section header: (name, virtual address, virtual size, file offset, file size).
pub type SectionInfo = (String, u32, u32, u32, u32);

/// The sections of a PE image.
pub fn sections(pe: &[u8]) -> Result<Vec<SectionInfo>, UkiError> {
    let l = layout(pe)?;
    let mut out = Vec::new();
    for i in 0..l.nsections {
        let h = l.section_table + i * SECTION_HEADER;
        let raw = pe
            .get(h..h + 8)
            .ok_or(UkiError::NotPe("truncated section table"))?;
        let name = String::from_utf8_lossy(raw).trim_end_matches('\0').to_string();
        out.push((
            name,
            u32_at(pe, h + 12)?,
            u32_at(pe, h + 8)?,
            u32_at(pe, h + 20)?,
            u32_at(pe, h + 16)?,
        ));
    }
    Ok(out)
}

/// Appends `sections` (name, contents) to a copy of `stub` and returns the new image.
pub fn build(stub: &[u8], new_sections: &[(&str, &[u8])]) -> Result<Vec<u8>, UkiError> {
    let l = layout(stub)?;
    let existing = sections(stub)?;
    let first_data = existing
        .iter()
        .map(|s| s.3 as usize)
        .filter(|o| *o > 0)
        .min()
        .unwrap_or(l.size_of_headers)
        .min(l.size_of_headers);
    let headers_end = l.section_table + (l.nsections + new_sections.len()) * SECTION_HEADER;
    if headers_end > first_data {
        return Err(UkiError::NoHeaderRoom {
            needed: new_sections.len(),
            headers_end: l.section_table + l.nsections * SECTION_HEADER,
            first_data,
        });
    }
    let mut img = stub.to_vec();
    // Drop a certificate table if the stub has one: appended sections would invalidate it.
    let cert_dir = l.opt + 112 + 4 * 8;
    if u32_at(&img, l.opt + 108)? > 4 {
        let (off, size) = (
            u32_at(&img, cert_dir)? as usize,
            u32_at(&img, cert_dir + 4)? as usize,
        );
        if off > 0 && size > 0 && off + size == img.len() {
            img.truncate(off);
        }
        put_u32(&mut img, cert_dir, 0);
        put_u32(&mut img, cert_dir + 4, 0);
    }
    let mut next_va = existing
        .iter()
        .map(|s| align(s.1 as usize + s.2 as usize, l.section_align))
        .max()
        .unwrap_or(0);
    let mut init_data = u32_at(&img, l.opt + 8)? as usize;
    for (i, (name, data)) in new_sections.iter().enumerate() {
        if name.len() > 8 {
            return Err(UkiError::Name((*name).to_string()));
        }
        let file_off = align(img.len(), l.file_align);
        img.resize(file_off, 0);
        img.extend_from_slice(data);
        let raw_size = align(data.len(), l.file_align);
        img.resize(file_off + raw_size, 0);
        let h = l.section_table + (l.nsections + i) * SECTION_HEADER;
        let mut header = [0u8; SECTION_HEADER];
        header[..name.len()].copy_from_slice(name.as_bytes());
        img[h..h + SECTION_HEADER].copy_from_slice(&header);
        put_u32(&mut img, h + 8, data.len() as u32);
        put_u32(&mut img, h + 12, next_va as u32);
        put_u32(&mut img, h + 16, raw_size as u32);
        put_u32(&mut img, h + 20, file_off as u32);
        put_u32(
            &mut img,
            h + 36,
            IMAGE_SCN_CNT_INITIALIZED_DATA | IMAGE_SCN_MEM_READ,
        );
        next_va = align(next_va + data.len(), l.section_align);
        init_data += raw_size;
    }
    put_u16(&mut img, l.coff + 2, (l.nsections + new_sections.len()) as u16);
    put_u32(&mut img, l.opt + 8, init_data as u32);
    put_u32(&mut img, l.opt + 56, next_va as u32); // SizeOfImage
    put_u32(&mut img, l.opt + 64, 0); // CheckSum: not required by UEFI
    Ok(img)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal PE32+ image: headers (0x400 bytes) and one `.text` section.
    fn fake_stub() -> Vec<u8> {
        let mut b = vec![0u8; 0x600];
        b[0..2].copy_from_slice(b"MZ");
        put_u32(&mut b, 0x3c, 0x80);
        b[0x80..0x84].copy_from_slice(b"PE\0\0");
        let coff = 0x84;
        put_u16(&mut b, coff, 0x8664);
        put_u16(&mut b, coff + 2, 1);
        put_u16(&mut b, coff + 16, 240);
        let opt = coff + 20;
        put_u16(&mut b, opt, 0x20b);
        put_u32(&mut b, opt + 32, 0x1000);
        put_u32(&mut b, opt + 36, 0x200);
        put_u32(&mut b, opt + 56, 0x2000);
        put_u32(&mut b, opt + 60, 0x400);
        put_u32(&mut b, opt + 108, 16);
        let st = opt + 240;
        b[st..st + 5].copy_from_slice(b".text");
        put_u32(&mut b, st + 8, 0x100);
        put_u32(&mut b, st + 12, 0x1000);
        put_u32(&mut b, st + 16, 0x200);
        put_u32(&mut b, st + 20, 0x400);
        b
    }

    #[test]
    fn sections_are_appended_aligned() {
        let img = build(
            &fake_stub(),
            &[(".osrel", b"ID=nodeos\n"), (".linux", &[7u8; 5000])],
        )
        .expect("build");
        let s = sections(&img).expect("parse");
        assert_eq!(s.len(), 3);
        assert_eq!(s[1].0, ".osrel");
        assert_eq!(s[1].1, 0x2000);
        assert_eq!(s[2].0, ".linux");
        assert_eq!(s[2].1, 0x3000);
        assert_eq!(s[2].3 % 0x200, 0);
        let off = s[2].3 as usize;
        assert_eq!(&img[off..off + 5000], &[7u8; 5000][..]);
        assert_eq!(u32_at(&img, 0x84 + 20 + 56).expect("size"), 0x5000);
    }

    #[test]
    fn not_pe_is_rejected() {
        assert!(matches!(build(b"hello", &[]), Err(UkiError::NotPe(_))));
    }

    #[test]
    fn long_names_are_rejected() {
        assert!(matches!(
            build(&fake_stub(), &[(".waytoolong", b"x")]),
            Err(UkiError::Name(_))
        ));
    }
}
