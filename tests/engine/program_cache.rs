//! The compiled programs a process keeps (`LAZULI_PROGRAM_CACHE_LIMIT`): the least recently used beyond the limit
//! are evicted, a program needed again is compiled again with the cache named as the cause, and a process that
//! compiles program after program keeps its memory mappings bounded (each program's machine code is mapped on
//! its own; Linux refuses mappings past 65,530, and XLA's compiler then fails and the process crashed).

use lazuli::diagnostics::{events, DiffKind, EventKind};
use lazuli::{CompileCache, Config, DType, Tensor};

use crate::common::child;

/// `x + 1` over `n` values: a program of its own for each `n`.
fn plus_one(n: usize) -> Vec<f32> {
    let x = Tensor::from_slice(&(0..n).map(|i| i as f32).collect::<Vec<_>>(), &[n]);
    (&x + 1.0).to_vec::<f32>().unwrap()
}

fn expected(n: usize) -> Vec<f32> {
    (0..n).map(|i| i as f32 + 1.0).collect()
}

#[test]
fn the_least_recently_used_programs_are_evicted_and_compiled_again() {
    if child::alone(module_path!(), "the_least_recently_used_programs_are_evicted_and_compiled_again") {
        return; // the runtime's configuration, the counters and the event capture are process-wide
    }
    let config = Config { program_cache_limit: 3, ..Config::from_env().unwrap() };
    lazuli::init(config).unwrap();
    let before = lazuli::metrics();
    for n in [1, 2, 3, 4] {
        assert_eq!(plus_one(n), expected(n));
    }
    let m = lazuli::metrics() - before;
    assert_eq!((m.compiles, m.programs_evicted), (4, 1), "{m}");

    // 2 is among the three most recent: a hit, and now the most recent.
    assert_eq!(plus_one(2), expected(2));
    assert_eq!((lazuli::metrics() - before).compiles, 4);

    // 1 was evicted: compiled again, and the recompile says why; that evicts 3, the least recently used.
    events::start_capture();
    assert_eq!(plus_one(1), expected(1));
    let ev = events::take_captured();
    let m = lazuli::metrics() - before;
    assert_eq!((m.compiles, m.programs_evicted), (5, 2), "{m}");
    let miss = ev.iter().find(|e| e.kind == EventKind::Program && !e.cache_hit).expect("a compile");
    let kinds: Vec<DiffKind> = miss.differences.iter().map(|d| d.kind).collect();
    assert_eq!(kinds, vec![DiffKind::Evicted], "{:?}", miss.explanation);
    assert_eq!(plus_one(4), expected(4));
    assert_eq!((lazuli::metrics() - before).compiles, 5, "4 stayed");
    assert_eq!(plus_one(3), expected(3));
    assert_eq!((lazuli::metrics() - before).compiles, 6, "3 was evicted");
}

/// The memory mappings of this process.
fn mappings() -> usize {
    std::fs::read_to_string("/proc/self/maps").map_or(0, |m| m.lines().count())
}

/// Hundreds of distinct programs in one process: the mappings stay near those of the programs kept. Each of these
/// programs maps about nine regions on the CPU plugin (a generated test program with a few dozen ops about 75):
/// kept, these 200 add about 1,700 (checked); evicted, a few dozen.
#[test]
fn many_distinct_programs_keep_the_mappings_bounded() {
    if child::alone(module_path!(), "many_distinct_programs_keep_the_mappings_bounded") {
        return; // the runtime's configuration is process-wide
    }
    // Compiled, not loaded from the persistent compile cache, as the programs of a process that meets new shapes.
    let config = Config { program_cache_limit: 8, compile_cache: CompileCache::Off, ..Config::from_env().unwrap() };
    lazuli::init(config).unwrap();
    for n in 1..=20 {
        assert_eq!(plus_one(n), expected(n));
    }
    let warm = mappings();
    for n in 21..=220 {
        let x = Tensor::from_slice(&vec![1.5f32; n], &[n]).to_dtype(DType::F64);
        assert_eq!((&x * 2.0).sum_all().item::<f64>().unwrap(), 3.0 * n as f64);
    }
    let grown = mappings().saturating_sub(warm);
    assert!(grown < 500, "{grown} more mappings after 200 programs with 8 kept");
    assert!(lazuli::metrics().programs_evicted >= 200, "{}", lazuli::metrics());
}
