//! Whether the cached plugin file is intact, and the marker next to it that remembers the last check.
//!
//! The marker `<so>.sha256` holds one `key value` pair a line:
//!
//! ```text
//! lazuli-plugin-marker 2
//! wheel-sha256 <sha256 of the wheel the file came from>
//! so-sha256 <sha256 of the file>
//! so-size <bytes>
//! verified size=<bytes> mtime=<ns> ctime=<ns> dev=<n> ino=<n>
//! ```
//!
//! `verified` is the file's identity when its sha256 last matched the pin in [`PluginSpec`]. Every start
//! compares the file's size with the pin; the sha256 is computed again only when the identity differs (a
//! write, truncation, copy or replacement changes mtime, ctime or the inode). Measured on the 200 MB plugin:
//! hashing 140-210 ms (with the CPU's SHA extensions), the check with a matching marker under 50 µs, the load
//! itself 14 ms; every test process starts here. A cache the process cannot write to is hashed every time.
//! Markers of lazuli before this format (the wheel's sha256 alone) carry no identity: the file is hashed once
//! against the pinned sha256 and the marker rewritten, so no download is needed.

use std::fs;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use sha2::{Digest, Sha256};

use super::{unique, PluginSpec};

const HEADER: &str = "lazuli-plugin-marker 2";

/// What [`check`] found at the cache path.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Cached {
    Intact,
    Missing,
    /// Damaged or not the pinned file; the reason, without the path.
    Damaged(String),
}

/// How far [`check`] goes for a file whose identity differs from the marker's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Depth {
    /// Hash it (and record the identity when it matches).
    Hash,
    /// Report it as missing; for polling while another process fetches.
    MarkerOnly,
}

/// Checks the file at `so` against the pins of `spec`. Never loads it.
pub(super) fn check(spec: &PluginSpec, so: &Path, depth: Depth) -> Cached {
    let meta = match fs::metadata(so) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Cached::Missing,
        Err(e) => return Cached::Damaged(format!("cannot read it: {e}")),
    };
    if let Err(reason) = pinned_size(spec, &meta) {
        return Cached::Damaged(reason);
    }
    if marker_vouches_for(spec, so, &identity(&meta)) {
        return Cached::Intact;
    }
    match depth {
        Depth::MarkerOnly => Cached::Missing,
        Depth::Hash => hash_and_record(spec, so),
    }
}

/// The marker's path: `<so>.sha256`.
pub(super) fn marker_path(so: &Path) -> PathBuf {
    let mut name = so.as_os_str().to_owned();
    name.push(".sha256");
    PathBuf::from(name)
}

/// Writes the marker for the file now at `so`, whose sha256 matched the pin while it had `identity`.
/// Temp file + rename, so readers see the old marker or the new one. Best effort: a read-only cache just
/// means hashing again next time.
pub(super) fn record(spec: &PluginSpec, so: &Path, identity: &str) {
    let Some(dir) = so.parent() else { return };
    let text = format!(
        "{HEADER}\nwheel-sha256 {}\nso-sha256 {}\nso-size {}\nverified {identity}\n",
        spec.sha256, spec.so_sha256, spec.so_size
    );
    let tmp = unique(dir, "marker");
    if fs::write(&tmp, text).and_then(|()| fs::rename(&tmp, marker_path(so))).is_err() {
        let _ = fs::remove_file(&tmp);
    }
}

/// Size, times and inode: what changes when the file is written, truncated, copied or replaced.
pub(super) fn identity(meta: &fs::Metadata) -> String {
    let nanos = |t: std::io::Result<SystemTime>| {
        t.ok().and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok()).map_or(0, |d| d.as_nanos())
    };
    #[cfg(unix)]
    let rest = {
        use std::os::unix::fs::MetadataExt;
        let ctime = i128::from(meta.ctime()) * 1_000_000_000 + i128::from(meta.ctime_nsec());
        format!(" ctime={ctime} dev={} ino={}", meta.dev(), meta.ino())
    };
    #[cfg(not(unix))]
    let rest = String::new();
    format!("size={} mtime={}{rest}", meta.len(), nanos(meta.modified()))
}

/// The sha256 of everything written through it.
pub(super) struct HashingWriter<W> {
    pub(super) inner: W,
    hasher: Sha256,
}

impl<W: Write> HashingWriter<W> {
    pub(super) fn new(inner: W) -> Self {
        HashingWriter { inner, hasher: Sha256::new() }
    }

    pub(super) fn finish(self) -> (W, String) {
        (self.inner, hex(&self.hasher.finalize()))
    }
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

pub(super) fn sha256_file(path: &Path) -> std::io::Result<String> {
    sha256_reader(&mut fs::File::open(path)?)
}

fn pinned_size(spec: &PluginSpec, meta: &fs::Metadata) -> Result<(), String> {
    if !meta.is_file() {
        return Err("it is not a regular file".into());
    }
    if meta.len() != spec.so_size {
        return Err(format!("{} bytes, expected {}", meta.len(), spec.so_size));
    }
    Ok(())
}

/// The marker is in the current format, for these pins, and saw the file with this identity.
fn marker_vouches_for(spec: &PluginSpec, so: &Path, identity: &str) -> bool {
    let Ok(text) = fs::read_to_string(marker_path(so)) else { return false };
    if text.lines().next() != Some(HEADER) {
        return false; // an older format, or damaged
    }
    let field = |key: &str| text.lines().find_map(|l| l.strip_prefix(key)?.strip_prefix(' '));
    field("so-sha256") == Some(spec.so_sha256)
        && field("so-size") == Some(spec.so_size.to_string().as_str())
        && field("verified") == Some(identity)
}

/// Hashes the open file and records its identity when the sha256 matches the pin. The identity comes from the
/// same open file before and after hashing, so a file replaced meanwhile is never vouched for.
fn hash_and_record(spec: &PluginSpec, so: &Path) -> Cached {
    let hashed = fs::File::open(so).and_then(|mut file| {
        let before = identity(&file.metadata()?);
        let digest = sha256_reader(&mut file)?;
        let after = identity(&file.metadata()?);
        Ok((before, digest, after))
    });
    match hashed {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Cached::Missing,
        Err(e) => Cached::Damaged(format!("cannot read it: {e}")),
        Ok((before, _, after)) if before != after => Cached::Damaged("it changed while being verified".into()),
        Ok((_, digest, _)) if digest != spec.so_sha256 => {
            Cached::Damaged(format!("sha256 {digest}, expected {}", spec.so_sha256))
        }
        Ok((before, ..)) => {
            record(spec, so, &before);
            Cached::Intact
        }
    }
}

fn sha256_reader(reader: &mut impl Read) -> std::io::Result<String> {
    let mut hasher = Sha256::new();
    let mut chunk = vec![0u8; 1 << 20];
    loop {
        let n = reader.read(&mut chunk)?;
        if n == 0 {
            return Ok(hex(&hasher.finalize()));
        }
        hasher.update(&chunk[..n]);
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
