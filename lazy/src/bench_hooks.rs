//! Timing hooks for the benchmark harness (`bench/`): the host-side parts of a step boundary measured one by one,
//! without compiling, uploading or running anything. Not part of the user API's promises.

use std::time::{Duration, Instant};

use crate::error::Result;
use crate::runtime::runtime;
use crate::tensor::live_pending;
use crate::walk::{one_at_a_time, walk};

/// Where the time of a step boundary's host-side work goes, and what it found.
#[derive(Clone, Copy, Debug, Default)]
pub struct BoundaryTimes {
    /// Finding the live pending tensors (the targets of `sync()`).
    pub collect: Duration,
    /// Walking the pending graph under them, hashing its structure as it goes (the IR is only built on a miss).
    pub walk: Duration,
    /// Finishing the key from that hash (donations and partitioning).
    pub hash: Duration,
    /// The executable-cache lookup by that hash.
    pub lookup: Duration,
    pub nodes: usize,
    pub inputs: usize,
    pub outputs: usize,
    /// Whether a compiled program was found.
    pub cache_hit: bool,
}

/// Do what `sync()` does before it compiles or runs anything: collect the live pending tensors, walk their graph,
/// hash its structure and look the hash up in the executable cache; then stop. The tensors stay pending.
///
/// Donation planning (one pass over the graph) is left out, and with it the aliases it adds to the hashed graph:
/// the key equals `sync()`'s only when donation is off (`LAZULI_DONATE=0`) or nothing is donated.
pub fn time_boundary() -> Result<BoundaryTimes> {
    let rt = runtime()?;
    let t0 = Instant::now();
    let live = live_pending();
    let t1 = Instant::now();
    let one = one_at_a_time();
    let traced = walk(&live);
    let t2 = Instant::now();
    let key = traced.key();
    let t3 = Instant::now();
    let cache_hit = rt.cache.lock().unwrap_or_else(|e| e.into_inner()).contains_key(&key);
    let t4 = Instant::now();
    drop(one);
    Ok(BoundaryTimes {
        collect: t1 - t0,
        walk: t2 - t1,
        hash: t3 - t2,
        lookup: t4 - t3,
        nodes: traced.len(),
        inputs: traced.params.len(),
        outputs: traced.outputs.len(),
        cache_hit,
    })
}
