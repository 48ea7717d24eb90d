//! The persistent compile cache across processes, with the real plugins: every test runs
//! `examples/compile_cache_probe` (one process, one runtime) against its own cache directory and checks the probe's
//! results against a host computation, exactly against earlier runs, and the disk cache counters.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

const DEFAULT_PLUGIN: &str = "lammps-jax-pjrt-cpu";
const OTHER_PLUGIN: &str = "xla-cpu-pjrt";

/// What one probe run printed.
#[derive(Debug)]
struct Run {
    /// Row count → the result's f32 bit patterns.
    bits: BTreeMap<usize, Vec<u32>>,
    compiles: u64,
    hits: u64,
    misses: u64,
}

/// The probe binary, built next to this test's binary (`cargo test` builds examples; built here otherwise).
fn probe_binary() -> &'static Path {
    static BINARY: OnceLock<PathBuf> = OnceLock::new();
    BINARY.get_or_init(|| {
        let exe = std::env::current_exe().unwrap();
        let profile_dir = exe.parent().unwrap().parent().unwrap();
        let binary = profile_dir.join("examples").join(format!("compile_cache_probe{}", std::env::consts::EXE_SUFFIX));
        if !binary.is_file() {
            let mut build = Command::new(env!("CARGO"));
            build.args(["build", "--example", "compile_cache_probe"]).current_dir(env!("CARGO_MANIFEST_DIR"));
            if profile_dir.file_name().is_some_and(|n| n == "release") {
                build.arg("--release");
            }
            let status = build.status().unwrap();
            assert!(
                status.success() && binary.is_file(),
                "cannot build the probe: cargo build --example compile_cache_probe"
            );
        }
        binary
    })
}

/// A fresh, empty cache directory for one test.
fn fresh_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("lazuli-compile-cache-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn probe_command(dir: &Path, plugin: Option<&str>, rows: &[usize], env: &[(&str, &str)]) -> Command {
    let mut cmd = Command::new(probe_binary());
    cmd.args(rows.iter().map(|r| r.to_string()))
        .env("LAZULI_COMPILE_CACHE", dir)
        .env_remove("LAZULI_COMPILE_CACHE_LIMIT")
        .env("TF_CPP_MIN_LOG_LEVEL", "1");
    if let Some(plugin) = plugin {
        cmd.env("LAZULI_CPU_PLUGIN", plugin).env_remove("LAZULI_PJRT_PLUGIN");
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd
}

/// Parse and check a probe's output: every result close to the host computation.
fn parse(output: std::process::Output) -> Run {
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "probe failed: {stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    let mut run = Run { bits: BTreeMap::new(), compiles: 0, hits: 0, misses: 0 };
    for line in stdout.lines() {
        let fields: BTreeMap<&str, &str> = line.split(' ').filter_map(|f| f.split_once('=')).collect();
        if line.starts_with("program ") {
            let rows: usize = fields["rows"].parse().unwrap();
            let bits: Vec<u32> = fields["got"].split(',').map(|h| u32::from_str_radix(h, 16).unwrap()).collect();
            let want: Vec<f64> = fields["expected"].split(',').map(|v| v.parse().unwrap()).collect();
            assert_eq!(bits.len(), rows);
            for (i, (&b, &w)) in bits.iter().zip(&want).enumerate() {
                let got = f32::from_bits(b) as f64;
                assert!((got - w).abs() <= 1e-5 * (1.0 + w.abs()), "rows={rows} [{i}]: {got} vs {w} (host)");
            }
            run.bits.insert(rows, bits);
        } else if line.starts_with("counters ") {
            run.compiles = fields["compiles"].parse().unwrap();
            run.hits = fields["disk_cache_hits"].parse().unwrap();
            run.misses = fields["disk_cache_misses"].parse().unwrap();
        }
    }
    run
}

fn probe(dir: &Path, plugin: Option<&str>, rows: &[usize]) -> Run {
    let run = parse(probe_command(dir, plugin, rows, &[]).output().unwrap());
    assert_eq!(run.bits.len(), rows.len());
    assert_eq!(run.compiles, rows.len() as u64, "one program per row count");
    run
}

/// The cache entries in `dir`.
fn entries(dir: &Path) -> BTreeSet<PathBuf> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "lzx"))
        .collect()
}

/// The one entry added between two listings.
fn added(before: &BTreeSet<PathBuf>, after: &BTreeSet<PathBuf>) -> PathBuf {
    let new: Vec<&PathBuf> = after.difference(before).collect();
    assert_eq!(new.len(), 1, "expected one new entry, got {new:?}");
    new[0].clone()
}

#[test]
fn a_second_process_loads_from_disk_and_computes_the_same() {
    let dir = fresh_dir("second-process");
    let cold = probe(&dir, None, &[2, 3]);
    assert_eq!((cold.hits, cold.misses), (0, 2), "{cold:?}");
    assert_eq!(entries(&dir).len(), 2);
    let warm = probe(&dir, None, &[2, 3]);
    assert_eq!((warm.hits, warm.misses), (2, 0), "{warm:?}");
    assert_eq!(warm.bits, cold.bits, "a loaded executable computes exactly what the compiled one did");
    // A program the directory does not hold is compiled and added beside the others.
    let more = probe(&dir, None, &[2, 5]);
    assert_eq!((more.hits, more.misses), (1, 1), "{more:?}");
    assert_eq!(entries(&dir).len(), 3);

    // Off: nothing read or written.
    let off = parse(probe_command(&dir, None, &[7], &[("LAZULI_COMPILE_CACHE", "off")]).output().unwrap());
    assert_eq!((off.hits, off.misses), (0, 0), "{off:?}");
    assert_eq!(entries(&dir).len(), 3);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn corrupt_and_truncated_entries_are_deleted_and_recompiled() {
    let dir = fresh_dir("corrupt");
    let mut paths = Vec::new();
    let mut reference = BTreeMap::new();
    for rows in [2, 3, 4, 5] {
        let before = entries(&dir);
        reference.append(&mut probe(&dir, None, &[rows]).bits);
        paths.push(added(&before, &entries(&dir)));
    }
    let damage: [fn(&mut Vec<u8>); 4] = [
        |b| {
            let at = b.len() - b.len() / 3; // a flipped payload byte
            b[at] ^= 0x01;
        },
        |b| b[40] ^= 0x20, // a flipped byte of the key in the header
        |b| b.truncate(b.len() - 100),
        |b| *b = b"not an executable at all".to_vec(),
    ];
    for (path, damage) in paths.iter().zip(damage) {
        let mut bytes = std::fs::read(path).unwrap();
        damage(&mut bytes);
        std::fs::write(path, &bytes).unwrap();
    }
    let run = probe(&dir, None, &[2, 3, 4, 5]);
    assert_eq!((run.hits, run.misses), (0, 4), "every damaged entry was rejected, not loaded: {run:?}");
    assert_eq!(run.bits, reference);
    // They were replaced by good entries.
    assert_eq!(entries(&dir), paths.iter().cloned().collect());
    let again = probe(&dir, None, &[2, 3, 4, 5]);
    assert_eq!((again.hits, again.misses), (4, 0), "{again:?}");
    assert_eq!(again.bits, reference);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The two CPU plugins have different keys, so each only reads its own entries; an entry of one put where the
/// other looks (a file-name collision, a copied directory) is refused by the key in its header, before the plugin
/// sees it: the 0.0.1 plugin would run the foreign executable and compute garbage.
#[test]
fn another_plugins_entries_are_never_loaded() {
    let dir = fresh_dir("foreign");
    let before = entries(&dir);
    let default_cold = probe(&dir, Some(DEFAULT_PLUGIN), &[3]);
    let default_entry = added(&before, &entries(&dir));
    let before = entries(&dir);
    let other_cold = probe(&dir, Some(OTHER_PLUGIN), &[3]);
    assert_eq!((other_cold.hits, other_cold.misses), (0, 1), "the default plugin's entry is not the other's");
    let other_entry = added(&before, &entries(&dir));

    for (plugin, victim, intruder, reference) in [
        (OTHER_PLUGIN, &other_entry, &default_entry, &other_cold),
        (DEFAULT_PLUGIN, &default_entry, &other_entry, &default_cold),
    ] {
        let foreign = std::fs::read(intruder).unwrap();
        std::fs::write(victim, &foreign).unwrap();
        let run = probe(&dir, Some(plugin), &[3]);
        assert_eq!((run.hits, run.misses), (0, 1), "{plugin} refused the foreign entry: {run:?}");
        assert_eq!(run.bits, reference.bits, "{plugin} computed what its own compile did");
        assert_ne!(std::fs::read(victim).unwrap(), foreign, "the foreign entry was replaced");
        let again = probe(&dir, Some(plugin), &[3]);
        assert_eq!((again.hits, again.misses), (1, 0), "{plugin}: {again:?}");
        assert_eq!(again.bits, reference.bits);
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn concurrent_processes_leave_the_directory_consistent() {
    let dir = fresh_dir("concurrent");
    let rows = [2, 3, 4, 5];
    let children: Vec<_> = (0..6)
        .map(|_| probe_command(&dir, None, &rows, &[]).stdout(std::process::Stdio::piped()).spawn().unwrap())
        .collect();
    let runs: Vec<Run> = children.into_iter().map(|c| parse(c.wait_with_output().unwrap())).collect();
    for run in &runs[1..] {
        assert_eq!(run.bits, runs[0].bits);
    }
    let leftovers: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "tmp"))
        .collect();
    assert!(leftovers.is_empty(), "temporary files left: {leftovers:?}");
    assert_eq!(entries(&dir).len(), rows.len());
    let after = probe(&dir, None, &rows);
    assert_eq!((after.hits, after.misses), (rows.len() as u64, 0), "every entry is whole: {after:?}");
    assert_eq!(after.bits, runs[0].bits);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_size_limit_evicts_the_least_recently_used() {
    let dir = fresh_dir("evict");
    let mut entry = BTreeMap::new();
    for rows in [2, 3] {
        let before = entries(&dir);
        probe(&dir, None, &[rows]);
        entry.insert(rows, added(&before, &entries(&dir)));
    }
    // Use the 2-row program again: now the 3-row one is the least recently used.
    std::thread::sleep(std::time::Duration::from_millis(20));
    assert_eq!(probe(&dir, None, &[2]).hits, 1);
    let size = |rows: usize| std::fs::metadata(&entry[&rows]).unwrap().len();
    // Room for the two others, not for all three (the programs' entries are about the same size).
    let limit = size(2) + size(3) + size(3) / 2;
    let before = entries(&dir);
    let run =
        parse(probe_command(&dir, None, &[4], &[("LAZULI_COMPILE_CACHE_LIMIT", &limit.to_string())]).output().unwrap());
    assert_eq!((run.hits, run.misses), (0, 1));
    let newest = added(&before, &entries(&dir));
    let left = entries(&dir);
    assert!(left.contains(&entry[&2]) && left.contains(&newest), "{left:?}");
    assert!(!left.contains(&entry[&3]), "the least recently used entry was evicted: {left:?}");
    let total: u64 = left.iter().map(|p| std::fs::metadata(p).unwrap().len()).sum();
    assert!(total <= limit, "{total} > {limit}");
    std::fs::remove_dir_all(&dir).unwrap();
}
