//! Cheap checks that a file can be handed to `dlopen`. The dynamic loader trusts an ELF file's headers: it maps
//! segments that a truncated file no longer holds and the process dies of SIGBUS (or an assertion in ld.so)
//! instead of getting an error. Reading the headers costs a few hundred bytes.

use std::fs;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

const MAGIC: &[u8; 4] = b"\x7fELF";
const ELFCLASS64: u8 = 2;
const ELFDATA2LSB: u8 = 1;
const ET_DYN: u16 = 3;
const PT_LOAD: u32 = 1;
/// The smallest program header entry of ELF64.
const PHDR_SIZE: u64 = 56;
/// More program headers than any shared object has; beyond it the header is garbage.
const MAX_PHDRS: u64 = 4096;

/// `Ok` if `path` is a regular, non-empty ELF file; for a 64-bit little-endian one also that it is a shared
/// object and that its program headers, loadable segments and section headers lie inside the file. The error
/// is a reason, without the path.
pub(crate) fn check_shared_object(path: &Path) -> Result<(), String> {
    let meta = fs::metadata(path).map_err(|e| format!("cannot read it: {e}"))?;
    if !meta.is_file() {
        return Err("it is not a regular file".into());
    }
    let len = meta.len();
    if len == 0 {
        return Err("it is empty".into());
    }
    let mut file = fs::File::open(path).map_err(|e| format!("cannot open it: {e}"))?;
    let mut header = [0u8; 64];
    let n = read_up_to(&mut file, &mut header).map_err(|e| format!("cannot read it: {e}"))?;
    if n < 4 || &header[..4] != MAGIC {
        let start: String = header[..n.min(4)].iter().map(|b| format!("{b:02x}")).collect();
        return Err(format!("it is not an ELF shared object (it starts with bytes {start}, not 7f454c46)"));
    }
    if header[4] != ELFCLASS64 || header[5] != ELFDATA2LSB {
        return Ok(()); // another layout: the loader's own checks are all there is
    }
    if n < header.len() {
        return Err(truncated("ELF header", header.len() as u64, len));
    }
    check_elf64(&mut file, &header, len)
}

fn check_elf64(file: &mut fs::File, header: &[u8; 64], len: u64) -> Result<(), String> {
    let e_type = u16_at(header, 16);
    if e_type != ET_DYN {
        return Err(format!("it is an ELF file but not a shared object (e_type {e_type})"));
    }
    let (phoff, phentsize, phnum) = (u64_at(header, 32), u64::from(u16_at(header, 54)), u64::from(u16_at(header, 56)));
    if phnum > MAX_PHDRS || (phnum > 0 && phentsize < PHDR_SIZE) {
        return Err(format!("its ELF header is damaged ({phnum} program headers of {phentsize} bytes)"));
    }
    within("program headers", phoff.checked_add(phentsize * phnum), len)?;
    let table = read_at(file, phoff, phentsize * phnum).map_err(|e| format!("cannot read its program headers: {e}"))?;
    for entry in table.chunks_exact(phentsize.max(1) as usize) {
        if u32_at(entry, 0) == PT_LOAD {
            within("loadable segments", u64_at(entry, 8).checked_add(u64_at(entry, 32)), len)?;
        }
    }
    // The section header table usually sits at the very end, so this catches a file cut anywhere.
    let (shoff, shentsize, shnum) = (u64_at(header, 40), u64::from(u16_at(header, 58)), u64::from(u16_at(header, 60)));
    if shoff != 0 {
        within("section headers", shoff.checked_add(shentsize * shnum.max(1)), len)?;
    }
    Ok(())
}

const PT_DYNAMIC: u32 = 2;
const DT_NEEDED: u64 = 1;
const DT_STRTAB: u64 = 5;
const DT_STRSZ: u64 = 10;
const DT_RPATH: u64 = 15;
const DT_RUNPATH: u64 = 29;
/// More dynamic entries than any shared object has.
const MAX_DYNAMIC: u64 = 1 << 16;

/// What a shared object asks the dynamic loader for.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Dynamic {
    /// `DT_NEEDED`: the libraries `dlopen` loads with it, by name.
    pub needed: Vec<String>,
    /// `DT_RUNPATH` (else `DT_RPATH`), split at `:`, `$ORIGIN` not yet expanded.
    pub search_path: Vec<String>,
}

/// The `DT_NEEDED` and run path entries of a 64-bit little-endian ELF shared object (checked first with
/// [`check_shared_object`]).
pub(crate) fn dynamic_section(path: &Path) -> Result<Dynamic, String> {
    check_shared_object(path)?;
    let mut file = fs::File::open(path).map_err(|e| format!("cannot open it: {e}"))?;
    let header = read_at(&mut file, 0, 64).map_err(|e| format!("cannot read it: {e}"))?;
    let (phoff, phentsize, phnum) =
        (u64_at(&header, 32), u64::from(u16_at(&header, 54)), u64::from(u16_at(&header, 56)));
    let table = read_at(&mut file, phoff, phentsize * phnum).map_err(|e| format!("cannot read it: {e}"))?;
    let headers: Vec<&[u8]> = table.chunks_exact(phentsize.max(1) as usize).collect();
    let Some(dynamic) = headers.iter().find(|h| u32_at(h, 0) == PT_DYNAMIC) else {
        return Ok(Dynamic::default()); // statically linked
    };
    let size = u64_at(dynamic, 32).min(MAX_DYNAMIC * 16);
    let entries = read_at(&mut file, u64_at(dynamic, 8), size).map_err(|e| format!("cannot read it: {e}"))?;
    let entries: Vec<(u64, u64)> = entries.chunks_exact(16).map(|e| (u64_at(e, 0), u64_at(e, 8))).collect();
    let value = |tag| entries.iter().find(|(t, _)| *t == tag).map(|(_, v)| *v);
    let (Some(strtab), Some(strsz)) = (value(DT_STRTAB), value(DT_STRSZ)) else {
        return Err("its dynamic section has no string table".into());
    };
    // DT_STRTAB is an address: the loadable segment holding it says where it lies in the file.
    let offset = headers
        .iter()
        .filter(|h| u32_at(h, 0) == PT_LOAD)
        .find(|h| (u64_at(h, 16)..u64_at(h, 16) + u64_at(h, 32)).contains(&strtab))
        .map(|h| strtab - u64_at(h, 16) + u64_at(h, 8))
        .ok_or("its string table lies outside every loadable segment")?;
    let strings = read_at(&mut file, offset, strsz.min(1 << 24)).map_err(|e| format!("cannot read it: {e}"))?;
    let string = |at: u64| {
        let bytes = strings.get(at as usize..).unwrap_or_default();
        String::from_utf8_lossy(&bytes[..bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len())]).into_owned()
    };
    let needed = entries.iter().filter(|(t, _)| *t == DT_NEEDED).map(|(_, v)| string(*v)).collect();
    let search = value(DT_RUNPATH).or(value(DT_RPATH)).map(string).unwrap_or_default();
    Ok(Dynamic { needed, search_path: search.split(':').filter(|s| !s.is_empty()).map(String::from).collect() })
}

/// `end` (None: it overflowed) must not pass the end of the file.
fn within(what: &str, end: Option<u64>, len: u64) -> Result<(), String> {
    match end {
        Some(end) if end <= len => Ok(()),
        Some(end) => Err(truncated(what, end, len)),
        None => Err(format!("its ELF header is damaged (the {what} lie past 2^64)")),
    }
}

fn truncated(what: &str, end: u64, len: u64) -> String {
    format!("it is truncated or damaged: its {what} end at byte {end}, but the file has {len} bytes")
}

fn read_up_to(file: &mut fs::File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match file.read(&mut buf[filled..])? {
            0 => break,
            n => filled += n,
        }
    }
    Ok(filled)
}

fn read_at(file: &mut fs::File, offset: u64, len: u64) -> std::io::Result<Vec<u8>> {
    let mut buf = vec![0u8; len as usize]; // at most MAX_PHDRS entries of at most 64 KiB: bounded
    file.seek(SeekFrom::Start(offset))?;
    file.read_exact(&mut buf)?;
    Ok(buf)
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut bytes = [0u8; 8];
    bytes.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal ELF64 shared object header: one PT_LOAD segment of `seg` bytes at offset 0, section headers
    /// (1 entry of 64 bytes) at `shoff`.
    fn elf(seg: u64, shoff: u64, file_len: usize) -> Vec<u8> {
        let mut b = vec![0u8; file_len.max(64 + 56)];
        b[..4].copy_from_slice(MAGIC);
        b[4] = ELFCLASS64;
        b[5] = ELFDATA2LSB;
        b[16..18].copy_from_slice(&ET_DYN.to_le_bytes());
        b[32..40].copy_from_slice(&64u64.to_le_bytes());
        b[40..48].copy_from_slice(&shoff.to_le_bytes());
        b[54..56].copy_from_slice(&56u16.to_le_bytes());
        b[56..58].copy_from_slice(&1u16.to_le_bytes());
        b[58..60].copy_from_slice(&64u16.to_le_bytes());
        b[60..62].copy_from_slice(&1u16.to_le_bytes());
        b[64..68].copy_from_slice(&PT_LOAD.to_le_bytes());
        b[64 + 32..64 + 40].copy_from_slice(&seg.to_le_bytes());
        b.truncate(file_len);
        b
    }

    fn check_bytes(bytes: &[u8]) -> Result<(), String> {
        // Tests run in parallel: one file each.
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("lazuli-elf-test-{}-{n}.so", std::process::id()));
        fs::write(&path, bytes).unwrap();
        let result = check_shared_object(&path);
        fs::remove_file(&path).unwrap();
        result
    }

    #[test]
    fn intact_headers_pass() {
        check_bytes(&elf(1000, 1000, 1064)).unwrap();
        check_bytes(&elf(1000, 0, 1000)).unwrap(); // no section headers
    }

    #[test]
    fn damage_is_named() {
        let err = check_bytes(&elf(1000, 1000, 1063)).unwrap_err();
        assert!(err.contains("section headers end at byte 1064, but the file has 1063 bytes"), "{err}");
        let err = check_bytes(&elf(2000, 0, 1000)).unwrap_err();
        assert!(err.contains("loadable segments end at byte 2000"), "{err}");
        let err = check_bytes(&elf(1000, 1000, 100)).unwrap_err();
        assert!(err.contains("program headers end at byte 120"), "{err}");
        let err = check_bytes(&elf(1000, 1000, 40)).unwrap_err();
        assert!(err.contains("ELF header end at byte 64"), "{err}");
        let mut overflowing = elf(u64::MAX, 0, 1000);
        overflowing[64 + 8] = 1; // p_offset 1
        let err = check_bytes(&overflowing).unwrap_err();
        assert!(err.contains("past 2^64"), "{err}");
        let err = check_bytes(b"#!/bin/sh\n").unwrap_err();
        assert!(err.contains("not an ELF shared object (it starts with bytes 23212f62"), "{err}");
        let mut exe = elf(1000, 0, 1000);
        exe[16] = 2;
        assert!(check_bytes(&exe).unwrap_err().contains("not a shared object (e_type 2)"));
        let err = check_shared_object(&std::env::temp_dir()).unwrap_err();
        assert!(err.contains("not a regular file"), "{err}");
    }
}
