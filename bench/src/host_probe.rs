//! `LAZULI_BENCH_HOST_PROBE=1`: before each timed step, a fixed piece of host work is timed, so that a slower
//! recording in one mode (waiting, pipelined) can be told apart as a slower host (the probe slows with it) or as
//! lazuli's own work (the probe does not). Two probes: a chain of dependent integer operations (the core's clock)
//! and a walk through a random cycle over 8 MiB (caches and memory).

use std::sync::OnceLock;
use std::time::Instant;

/// Whether the probe is on.
pub fn wanted() -> bool {
    std::env::var("LAZULI_BENCH_HOST_PROBE").is_ok_and(|v| v == "1")
}

/// The probes' times in seconds: (compute, memory).
pub fn run() -> (f64, f64) {
    let t0 = Instant::now();
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for _ in 0..50_000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
    }
    let t1 = Instant::now();
    let cycle = cycle();
    let mut at = std::hint::black_box(x as usize % cycle.len());
    for _ in 0..2_000 {
        at = cycle[at] as usize;
    }
    std::hint::black_box(at);
    ((t1 - t0).as_secs_f64(), t1.elapsed().as_secs_f64())
}

/// A random cyclic permutation of 2M indices (Sattolo's algorithm).
fn cycle() -> &'static [u32] {
    static CYCLE: OnceLock<Vec<u32>> = OnceLock::new();
    CYCLE.get_or_init(|| {
        let n = 1 << 21;
        let mut v: Vec<u32> = (0..n as u32).collect();
        let mut s: u64 = 7;
        for i in (1..n).rev() {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let j = (s >> 33) as usize % i;
            v.swap(i, j);
        }
        v
    })
}
