//! Timing hooks for the benchmark harness (`bench/`): the host-side stages of a step boundary measured one by one
//! (collecting the live tensors, the walk, the plan, the cache lookup), the same code `sync()` runs, without
//! compiling, uploading or running anything. Not part of the user API's promises.

use std::time::{Duration, Instant};

use crate::error::Result;
use crate::exec::plan;
use crate::graph::tensor::live_pending;
use crate::graph::walk::walk;
use crate::runtime::runtime;

/// Where the time of a step boundary's host-side work goes, and what it found.
#[derive(Clone, Copy, Debug, Default)]
pub struct BoundaryTimes {
    /// Finding the live pending tensors (the targets of `sync()`).
    pub collect: Duration,
    /// Walking the pending graph under them, hashing its structure as it goes (the IR is only built on a miss).
    pub walk: Duration,
    /// The rest of the plan: layouts on a mesh, donations, and the key they finish.
    pub hash: Duration,
    /// The executable-cache lookup by that key.
    pub lookup: Duration,
    pub nodes: usize,
    pub inputs: usize,
    pub outputs: usize,
    /// Whether a compiled program was found.
    pub cache_hit: bool,
}

/// Do what `sync()` does before it compiles or runs anything: collect the live pending tensors, walk their graph
/// and plan the program (the same `Plan` as `sync()`'s, donations included, so the key is the one `sync()` looks
/// up); then stop. The tensors stay pending.
pub fn time_boundary() -> Result<BoundaryTimes> {
    let rt = runtime()?;
    let t0 = Instant::now();
    let live = live_pending();
    let t1 = Instant::now();
    let traced = walk(&live);
    let t2 = Instant::now();
    let mut planned = plan::prepare(traced, (rt.config.donate, false), rt.config.check_finite, None)?;
    let t3 = Instant::now();
    plan::lookup(rt, &mut planned);
    let t4 = Instant::now();
    let w = &planned.walk;
    Ok(BoundaryTimes {
        collect: t1 - t0,
        walk: t2 - t1,
        hash: t3 - t2,
        lookup: t4 - t3,
        nodes: w.len(),
        inputs: w.params.len(),
        outputs: w.outputs.len(),
        cache_hit: planned.cached.is_some(),
    })
}
