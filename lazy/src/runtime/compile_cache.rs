//! The persistent compile cache: serialized executables on disk, so a new process skips XLA's compile for every
//! program an earlier process compiled with the same plugin on the same kind of CPU.
//!
//! An entry is one file, `<sha256 of the key>.lzx`, holding a header (magic, format version, the full key, payload
//! length, payload sha256) and then the plugin's serialized executable. The key is everything the executable
//! depends on: lazuli's version, the plugin file's sha256, the host CPU's features, platform and devices,
//! `XLA_FLAGS`, the compile options, the graph's structure hash and the sha256 of the StableHLO text (without its
//! source locations, so editing the user's file does not invalidate the cache; an executable loaded from disk
//! keeps the locations it was compiled with). The whole key is compared before the plugin ever sees the bytes:
//! one CPU plugin silently runs another plugin's executable and computes garbage. An entry that does not match
//! (corrupt, truncated, foreign) is deleted and the program recompiled; nothing here ever fails a computation.
//!
//! Writers write a private temporary file in the same directory, fsync it and rename it into place, so processes
//! sharing the directory see whole entries or none. Hits refresh the file's modification time; after each write
//! the least recently used entries are deleted until the directory fits the size limit.
//!
//! | variable | effect |
//! |---|---|
//! | `LAZULI_COMPILE_CACHE` | unset: `<lazuli cache dir>/executables`; `off`: disabled; else the directory to use |
//! | `LAZULI_COMPILE_CACHE_LIMIT` | size limit: bytes, or with a `K`, `M` or `G` suffix (binary); default `2G` |

use std::collections::HashSet;
use std::fs;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, SystemTime};

use lazuli_pjrt::{provision, CompileOptions, LoadedExecutable};
use sha2::{Digest, Sha256};

use crate::diagnostics::metrics::{Counters, COUNTERS};
use crate::runtime::Runtime;
use crate::settings::CompileCache;

const MAGIC: &[u8; 8] = b"LZXCACHE";
const FORMAT_VERSION: u32 = 1;
const EXTENSION: &str = "lzx";
/// A temporary file this old belongs to a writer that died.
const STALE_TEMP: Duration = Duration::from_secs(3600);

/// The executable for `text`: loaded from the disk cache when a matching entry exists, else compiled (and
/// stored). `structure` is the graph's structure hash.
pub(crate) fn compile(
    rt: &Runtime,
    text: &str,
    options: &CompileOptions,
    structure: u64,
) -> lazuli_pjrt::Result<LoadedExecutable> {
    let Some(cache) = DiskCache::get(rt) else {
        return rt.client.compile(text, options);
    };
    let Ok(options_bytes) = options.to_proto_bytes() else {
        return rt.client.compile(text, options); // invalid options: let the compile report them
    };
    let key = cache.key(text, &options_bytes, structure);
    let path = cache.dir.join(format!("{}.{EXTENSION}", hex(&Sha256::digest(key.as_bytes()))));
    if let Some(exe) = load(rt, &path, &key) {
        Counters::add(&COUNTERS.disk_cache_hits, 1);
        from_disk().lock().unwrap_or_else(|p| p.into_inner()).insert(structure);
        return Ok(exe);
    }
    Counters::add(&COUNTERS.disk_cache_misses, 1);
    from_disk().lock().unwrap_or_else(|p| p.into_inner()).remove(&structure);
    let exe = rt.client.compile(text, options)?;
    match exe.serialize() {
        Ok(payload) => cache.store(&path, &key, &payload),
        Err(e) => warn_once(&format!("the plugin cannot serialize executables ({e}); nothing is stored")),
    }
    Ok(exe)
}

/// Whether the program with this structure hash was last obtained from the disk cache (for diagnostics).
pub(crate) fn loaded_from_disk(structure: u64) -> bool {
    from_disk().lock().unwrap_or_else(|p| p.into_inner()).contains(&structure)
}

fn from_disk() -> &'static Mutex<HashSet<u64>> {
    static FROM_DISK: OnceLock<Mutex<HashSet<u64>>> = OnceLock::new();
    FROM_DISK.get_or_init(Default::default)
}

struct DiskCache {
    dir: PathBuf,
    limit: u64,
    /// The key's lines that hold for the whole process (version, plugin, CPU, devices, flags).
    process_key: String,
}

impl DiskCache {
    /// The cache for this process, set up on first use; `None` when disabled or unusable (said once).
    fn get(rt: &Runtime) -> Option<&'static DiskCache> {
        static CACHE: OnceLock<Option<DiskCache>> = OnceLock::new();
        CACHE.get_or_init(|| DiskCache::open(rt)).as_ref()
    }

    fn open(rt: &Runtime) -> Option<DiskCache> {
        let dir = match &rt.config.compile_cache {
            CompileCache::Off => return None,
            CompileCache::Dir(dir) => dir.clone(),
            CompileCache::Default => match provision::cache_dir_in(&rt.config.plugins) {
                Ok(base) => base.join("executables"),
                Err(e) => return disabled(&format!("{e}")),
            },
        };
        if let Err(e) = fs::create_dir_all(&dir) {
            return disabled(&format!("cannot create {}: {e}", dir.display()));
        }
        let limit = rt.config.compile_cache_limit;
        let plugin = match plugin_digest(rt.client.plugin().path(), &dir) {
            Ok(digest) => digest,
            Err(e) => return disabled(&format!("cannot read the plugin file to identify it: {e}")),
        };
        let platform = rt.client.platform_name().unwrap_or_else(|_| "unknown".into());
        let devices: Vec<String> = rt.client.devices().iter().map(|d| format!("{}:{}", d.id(), d.kind())).collect();
        let process_key = format!(
            "lazuli compile cache key {FORMAT_VERSION}\nlazuli {}\nplugin {plugin}\ncpu {}\nplatform {platform}\n\
             devices {}\nxla_flags {}\n",
            env!("CARGO_PKG_VERSION"),
            hex(&Sha256::digest(cpu_features().as_bytes())),
            devices.join(" "),
            crate::settings::xla_flags(),
        );
        Some(DiskCache { dir, limit, process_key })
    }

    fn key(&self, text: &str, options: &[u8], structure: u64) -> String {
        format!(
            "{}options {}\nstructure {structure:016x}\nprogram {}\n",
            self.process_key,
            hex(options),
            program_digest(text)
        )
    }

    /// Write the entry atomically, then evict. Failures cost only a later recompile.
    fn store(&self, path: &Path, key: &str, payload: &[u8]) {
        let bytes = encode_entry(key, payload);
        let tmp = temp_path(&self.dir);
        let written = fs::File::create(&tmp)
            .and_then(|mut f| f.write_all(&bytes).and_then(|()| f.sync_all()))
            .and_then(|()| fs::rename(&tmp, path));
        if let Err(e) = written {
            let _ = fs::remove_file(&tmp);
            warn_once(&format!("cannot write to {}: {e}", self.dir.display()));
            return;
        }
        evict(&self.dir, self.limit);
    }
}

fn disabled(reason: &str) -> Option<DiskCache> {
    warn_once(&format!("{reason}; the persistent compile cache is off for this process"));
    None
}

/// One line on stderr, once per process: the cache is an optimization, its troubles are not errors.
fn warn_once(message: &str) {
    static WARNED: AtomicBool = AtomicBool::new(false);
    if !WARNED.swap(true, Relaxed) {
        eprintln!("lazuli: compile cache: {message}");
    }
}

/// The executable in the entry at `path` if its header, key and checksum match and the plugin loads it; a
/// mismatching entry is deleted.
fn load(rt: &Runtime, path: &Path, key: &str) -> Option<LoadedExecutable> {
    let mut file = fs::File::open(path).ok()?;
    let mut bytes = Vec::new();
    if file.read_to_end(&mut bytes).is_err() {
        return None;
    }
    let rejected = match decode_entry(&bytes, key) {
        Ok(payload) => match rt.client.deserialize_executable(payload) {
            Ok(exe) => {
                // Least recently used is judged by modification time (access times are often not kept).
                let _ = file.set_modified(SystemTime::now());
                return Some(exe);
            }
            Err(e) => format!("the plugin refused it: {e}"),
        },
        Err(reason) => reason.to_string(),
    };
    tracing::warn!(target: "lazuli", entry = %path.display(), %rejected, "compile cache entry rejected; recompiling");
    let _ = fs::remove_file(path);
    None
}

fn encode_entry(key: &str, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(MAGIC.len() + 48 + key.len() + payload.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    out.extend_from_slice(&(key.len() as u32).to_le_bytes());
    out.extend_from_slice(key.as_bytes());
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    out.extend_from_slice(&Sha256::digest(payload));
    out.extend_from_slice(payload);
    out
}

/// The payload of an entry whose header matches `key`, or why not.
fn decode_entry<'a>(bytes: &'a [u8], key: &str) -> std::result::Result<&'a [u8], &'static str> {
    let mut rest = bytes;
    let mut take = |n: usize| -> std::result::Result<&'a [u8], &'static str> {
        if rest.len() < n {
            return Err("truncated");
        }
        let (head, tail) = rest.split_at(n);
        rest = tail;
        Ok(head)
    };
    if take(MAGIC.len())? != MAGIC {
        return Err("not a lazuli compile cache entry");
    }
    if take(4)? != FORMAT_VERSION.to_le_bytes() {
        return Err("another entry format version");
    }
    let key_len = u32::from_le_bytes(take(4)?.try_into().map_err(|_| "truncated")?) as usize;
    if key_len != key.len() || take(key_len)? != key.as_bytes() {
        return Err("written under another key (another plugin, CPU, version, options or program)");
    }
    let payload_len = u64::from_le_bytes(take(8)?.try_into().map_err(|_| "truncated")?);
    let checksum = take(32)?;
    if rest.len() as u64 != payload_len {
        return Err("truncated or padded: the payload length does not match");
    }
    if Sha256::digest(rest).as_slice() != checksum {
        return Err("corrupt: the payload checksum does not match");
    }
    Ok(rest)
}

/// Delete the least recently used entries until the directory fits `limit`, and temporary files left by dead
/// writers. Another process evicting at the same time can at worst delete a little more.
fn evict(dir: &Path, limit: u64) {
    let Ok(listing) = fs::read_dir(dir) else { return };
    let mut entries = Vec::new();
    let mut total = 0u64;
    for item in listing.flatten() {
        let path = item.path();
        let Ok(meta) = item.metadata() else { continue };
        let modified = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
        if path.extension().is_some_and(|e| e == EXTENSION) {
            total += meta.len();
            entries.push((modified, meta.len(), path));
        } else if path.extension().is_some_and(|e| e == "tmp") && modified.elapsed().is_ok_and(|a| a > STALE_TEMP) {
            let _ = fs::remove_file(&path);
        }
    }
    if total <= limit {
        return;
    }
    entries.sort();
    for (_, len, path) in entries {
        if total <= limit {
            break;
        }
        if fs::remove_file(&path).is_ok() {
            total -= len;
        }
    }
}

/// A file name in `dir` no other thread or process uses.
fn temp_path(dir: &Path) -> PathBuf {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    dir.join(format!(".entry.{}.{nanos}.{}.tmp", std::process::id(), COUNTER.fetch_add(1, Relaxed)))
}

/// sha256 of the program text without its `loc("file":line:col)` annotations.
fn program_digest(text: &str) -> String {
    let mut h = Sha256::new();
    let mut rest = text;
    while let Some(at) = rest.find("loc(\"") {
        match location_len(&rest[at..]) {
            Some(len) => {
                h.update(&rest.as_bytes()[..at]);
                rest = &rest[at + len..];
            }
            None => {
                h.update(&rest.as_bytes()[..at + 5]);
                rest = &rest[at + 5..];
            }
        }
    }
    h.update(rest.as_bytes());
    hex(&h.finalize())
}

/// Length of the `loc("file":line:col)` at the start of `s`, if it is one.
fn location_len(s: &str) -> Option<usize> {
    let b = s.as_bytes();
    let mut i = 5; // after `loc("`
    while i < b.len() && b[i] != b'"' {
        i += if b[i] == b'\\' { 2 } else { 1 };
    }
    i += 1;
    for _ in 0..2 {
        if b.get(i) != Some(&b':') {
            return None;
        }
        let digits = b[i + 1..].iter().take_while(|c| c.is_ascii_digit()).count();
        if digits == 0 {
            return None;
        }
        i += 1 + digits;
    }
    (b.get(i) == Some(&b')')).then_some(i + 1)
}

/// The plugin file's sha256, once per process. Hashing a 200 MB plugin takes a noticeable fraction of a second,
/// so the digest is remembered in the cache directory (one file per plugin path) with the file's identity (size,
/// times, inode): a changed or replaced file has another identity and is hashed again.
fn plugin_digest(plugin: &Path, dir: &Path) -> std::io::Result<String> {
    let identity = file_identity(plugin)?;
    let name = Sha256::digest(plugin.as_os_str().as_encoded_bytes());
    let memo = dir.join(format!("plugin-{}.sha256", &hex(&name)[..32]));
    if let Ok(text) = fs::read_to_string(&memo) {
        if let Some((id, digest)) = text.rsplit_once('\n').and_then(|(head, _)| head.split_once("\n")) {
            if id == identity && digest.len() == 64 {
                return Ok(digest.to_string());
            }
        }
    }
    let digest = sha256_file(plugin)?;
    let tmp = temp_path(dir);
    if fs::write(&tmp, format!("{identity}\n{digest}\n")).and_then(|()| fs::rename(&tmp, &memo)).is_err() {
        let _ = fs::remove_file(&tmp);
    }
    Ok(digest)
}

fn file_identity(path: &Path) -> std::io::Result<String> {
    let meta = fs::metadata(path)?;
    let nanos = |t: std::io::Result<SystemTime>| {
        t.ok().and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok()).map_or(0, |d| d.as_nanos())
    };
    #[cfg(unix)]
    let extra = {
        use std::os::unix::fs::MetadataExt;
        format!("dev {} ino {} ctime {}.{:09}", meta.dev(), meta.ino(), meta.ctime(), meta.ctime_nsec())
    };
    #[cfg(not(unix))]
    let extra = String::new();
    Ok(format!("{} len {} mtime {} {extra}", path.display(), meta.len(), nanos(meta.modified())).replace('\n', " "))
}

fn sha256_file(path: &Path) -> std::io::Result<String> {
    let mut file = fs::File::open(path)?;
    let mut h = Sha256::new();
    let mut chunk = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut chunk)?;
        if n == 0 {
            return Ok(hex(&h.finalize()));
        }
        h.update(&chunk[..n]);
    }
}

/// The host CPU's features, as the plugin's code generation sees them: an executable records them.
fn cpu_features() -> String {
    #[cfg(target_os = "linux")]
    if let Ok(info) = fs::read_to_string("/proc/cpuinfo") {
        // `flags` on x86, `Features` on ARM; the first processor's line.
        let line = info.lines().find(|l| l.starts_with("flags") || l.starts_with("Features"));
        if let Some((_, flags)) = line.and_then(|l| l.split_once(':')) {
            return format!("{} {}", std::env::consts::ARCH, flags.trim());
        }
    }
    #[cfg(target_arch = "x86_64")]
    return x86_features();
    #[cfg(not(target_arch = "x86_64"))]
    return format!("{} unknown", std::env::consts::ARCH);
}

#[cfg(target_arch = "x86_64")]
fn x86_features() -> String {
    let mut out = String::from("x86_64 detected");
    macro_rules! detect {
        ($($f:tt),*) => {$(
            if std::arch::is_x86_feature_detected!($f) {
                out.push(' ');
                out.push_str($f);
            }
        )*};
    }
    detect!("sse4.1", "sse4.2", "avx", "avx2", "fma", "f16c", "bmi1", "bmi2", "avx512f", "avx512bw", "avx512dq");
    detect!("avx512vl", "avx512cd", "avx512vnni");
    out
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes.iter().fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_round_trip_and_reject_mismatches() {
        let entry = encode_entry("key A", b"payload bytes");
        assert_eq!(decode_entry(&entry, "key A"), Ok(&b"payload bytes"[..]));
        assert!(decode_entry(&entry, "key B").is_err(), "another key");
        assert!(decode_entry(&entry, "key AB").is_err(), "another key length");
        assert!(decode_entry(&entry[..entry.len() - 1], "key A").is_err(), "truncated payload");
        assert!(decode_entry(&entry[..10], "key A").is_err(), "truncated header");
        let mut padded = entry.clone();
        padded.push(0);
        assert!(decode_entry(&padded, "key A").is_err(), "extra bytes");
        for i in 0..entry.len() {
            let mut flipped = entry.clone();
            flipped[i] ^= 0x40;
            assert!(decode_entry(&flipped, "key A").is_err(), "a flipped byte at {i} goes unnoticed");
        }
    }

    #[test]
    fn program_digest_ignores_locations_only() {
        let a = "%0 = \"stablehlo.add\"(%a, %b) : (tensor<f32>) -> tensor<f32> loc(\"src/a.rs\":3:9)\n";
        let b = "%0 = \"stablehlo.add\"(%a, %b) : (tensor<f32>) -> tensor<f32> loc(\"src/b \\\"q\\\".rs\":30:1)\n";
        let c = "%0 = \"stablehlo.subtract\"(%a, %b) : (tensor<f32>) -> tensor<f32> loc(\"src/a.rs\":3:9)\n";
        assert_eq!(program_digest(a), program_digest(b));
        assert_ne!(program_digest(a), program_digest(c));
        // Not a location: kept.
        assert_ne!(program_digest("x loc(\"f\":1) y"), program_digest("x  y"));
        assert_eq!(location_len("loc(\"f\":12:3) tail"), Some(13));
        assert_eq!(location_len("loc(\"f\":12)"), None);
        assert_eq!(location_len("loc(\"unterminated"), None);
    }

    #[test]
    fn cpu_features_are_known_here() {
        let f = cpu_features();
        assert!(f.starts_with(std::env::consts::ARCH), "{f}");
        assert!(!f.ends_with("unknown") || !cfg!(target_os = "linux"), "{f}");
    }
}
