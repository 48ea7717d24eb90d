//! Process-wide counters of what the runtime did, readable at any time and cheap to update (relaxed atomics).

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

pub(crate) struct Counters {
    pub compiles: AtomicU64,
    pub cache_hits: AtomicU64,
    pub executions: AtomicU64,
    pub compile_ns: AtomicU64,
    pub execute_ns: AtomicU64,
    pub bytes_to_device: AtomicU64,
    pub bytes_to_host: AtomicU64,
    pub bytes_donated: AtomicU64,
    pub disk_cache_hits: AtomicU64,
    pub disk_cache_misses: AtomicU64,
    pub boundary_ns: AtomicU64,
    pub upload_ns: AtomicU64,
    pub finish_ns: AtomicU64,
    pub wait_ns: AtomicU64,
    pub queued: AtomicU64,
    pub skipped_steps: AtomicU64,
    pub finite_read_ns: AtomicU64,
    pub locate_compiles: AtomicU64,
    pub locate_compile_ns: AtomicU64,
    pub locate_run_ns: AtomicU64,
    pub locate_build_ns: AtomicU64,
    pub locate_ahead: AtomicU64,
    pub locate_warm_runs: AtomicU64,
    pub locate_warm_ns: AtomicU64,
    pub gradients_remade: AtomicU64,
    pub copies_followed: AtomicU64,
    pub backward_replays: AtomicU64,
    pub programs_evicted: AtomicU64,
}

pub(crate) static COUNTERS: Counters = Counters {
    compiles: AtomicU64::new(0),
    cache_hits: AtomicU64::new(0),
    executions: AtomicU64::new(0),
    compile_ns: AtomicU64::new(0),
    execute_ns: AtomicU64::new(0),
    bytes_to_device: AtomicU64::new(0),
    bytes_to_host: AtomicU64::new(0),
    bytes_donated: AtomicU64::new(0),
    disk_cache_hits: AtomicU64::new(0),
    disk_cache_misses: AtomicU64::new(0),
    boundary_ns: AtomicU64::new(0),
    upload_ns: AtomicU64::new(0),
    finish_ns: AtomicU64::new(0),
    wait_ns: AtomicU64::new(0),
    queued: AtomicU64::new(0),
    skipped_steps: AtomicU64::new(0),
    finite_read_ns: AtomicU64::new(0),
    locate_compiles: AtomicU64::new(0),
    locate_compile_ns: AtomicU64::new(0),
    locate_run_ns: AtomicU64::new(0),
    locate_build_ns: AtomicU64::new(0),
    locate_ahead: AtomicU64::new(0),
    locate_warm_runs: AtomicU64::new(0),
    locate_warm_ns: AtomicU64::new(0),
    gradients_remade: AtomicU64::new(0),
    copies_followed: AtomicU64::new(0),
    backward_replays: AtomicU64::new(0),
    programs_evicted: AtomicU64::new(0),
};

impl Counters {
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Relaxed);
    }
}

/// A snapshot of the counters. Differences of two snapshots measure a region of code (`after - before`).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Metrics {
    /// Programs compiled (executable cache misses), including those loaded from the persistent compile cache.
    pub compiles: u64,
    /// Materializations whose program was already compiled.
    pub cache_hits: u64,
    /// Programs executed (counted when launched).
    pub executions: u64,
    /// Of `executions`, programs queued on the CPU launcher thread (see `Config::cpu_launcher`).
    pub queued: u64,
    /// Time compiling programs, and loading them from the persistent compile cache.
    pub compile_ms: f64,
    /// Time inside the plugin's execute call: launching programs (they run asynchronously; see `wait_ms`), on
    /// the launcher thread for queued programs.
    pub execute_ms: f64,
    /// Bytes copied host → device (tensor data and host scalars).
    pub bytes_to_device: u64,
    /// Bytes copied device → host (reads).
    pub bytes_to_host: u64,
    /// Bytes of input buffers donated to outputs (updated in place instead of copied).
    pub bytes_donated: u64,
    /// Programs loaded from the persistent compile cache instead of compiled (`compile_ms` then counts the load).
    pub disk_cache_hits: u64,
    /// Programs the persistent compile cache did not hold (or held corrupt or foreign), compiled and stored.
    pub disk_cache_misses: u64,
    /// Host work of materializations before their arguments are bound: collecting and walking the graph,
    /// sharding annotation, donation planning, hashing, cache lookup (compiles excluded).
    pub boundary_ms: f64,
    /// Binding arguments: host-to-device copies of new data (batches, host scalars) and shards. For a program
    /// queued on the CPU launcher, preparing its inputs here plus the launcher's copies.
    pub upload_ms: f64,
    /// After the program ran: storing outputs on their nodes, releasing donated inputs and the graph above them.
    pub finish_ms: f64,
    /// Waiting for launched programs to finish (`wait()`, and a full launch queue); reads' waits not included.
    pub wait_ms: f64,
    /// Steps whose outputs held NaN or infinities and whose state was kept as it was (`LAZULI_CHECK_FINITE=skip`).
    pub skipped_steps: u64,
    /// Reading steps' finite checks (`LAZULI_CHECK_FINITE`): mostly waiting for the checked step to finish.
    pub finite_read_ms: f64,
    /// Programs compiled to locate a trip's first non-finite value (`LAZULI_CHECK_FINITE=stop` and `log`), one
    /// per located trip, or one per step structure ahead of any trip under `LAZULI_LOCATE_AHEAD`; not in
    /// `compiles`.
    pub locate_compiles: u64,
    /// Time compiling those programs; not in `compile_ms`.
    pub locate_compile_ms: f64,
    /// Time running them: uploading the kept inputs, executing, reading the results.
    pub locate_run_ms: f64,
    /// Time building them before their compile: the locating graph and its IR text.
    pub locate_build_ms: f64,
    /// Locating programs whose compile ahead was started (`LAZULI_LOCATE_AHEAD`: one per step structure that runs
    /// more than once); each ends as one of `locate_compiles`.
    pub locate_ahead: u64,
    /// Of those, the ones run once on a finite step before any trip, so that a trip does not pay a new program's
    /// first run; and the time of those runs.
    pub locate_warm_runs: u64,
    pub locate_warm_ms: f64,
    /// Runs of a split step's gradients' program again, to feed its update's locator (a trip of the update, or
    /// that locator's warm run): the update keeps what makes its gradients, not the gradients themselves.
    pub gradients_remade: u64,
    /// Weights' old low-precision copies still held when the update that writes their new values was launched
    /// (under `stop` with the split step, by the gradients' program's check): kept inputs follow them to the new
    /// copies, which hold the old values on a trip, so the old copies are let go instead of living beside the new.
    pub copies_followed: u64,
    /// Backward passes whose gradient ops were made from a template kept from an earlier pass over a forward of
    /// the same shape, without running the gradient rules (`LAZULI_BACKWARD_REPLAY`).
    pub backward_replays: u64,
    /// Compiled programs evicted from the process's program cache: the least recently used beyond
    /// `LAZULI_PROGRAM_CACHE_LIMIT`.
    pub programs_evicted: u64,
}

/// The counters now.
pub fn metrics() -> Metrics {
    let c = &COUNTERS;
    Metrics {
        compiles: c.compiles.load(Relaxed),
        cache_hits: c.cache_hits.load(Relaxed),
        executions: c.executions.load(Relaxed),
        queued: c.queued.load(Relaxed),
        compile_ms: c.compile_ns.load(Relaxed) as f64 / 1e6,
        execute_ms: c.execute_ns.load(Relaxed) as f64 / 1e6,
        bytes_to_device: c.bytes_to_device.load(Relaxed),
        bytes_to_host: c.bytes_to_host.load(Relaxed),
        bytes_donated: c.bytes_donated.load(Relaxed),
        disk_cache_hits: c.disk_cache_hits.load(Relaxed),
        disk_cache_misses: c.disk_cache_misses.load(Relaxed),
        boundary_ms: c.boundary_ns.load(Relaxed) as f64 / 1e6,
        upload_ms: c.upload_ns.load(Relaxed) as f64 / 1e6,
        finish_ms: c.finish_ns.load(Relaxed) as f64 / 1e6,
        wait_ms: c.wait_ns.load(Relaxed) as f64 / 1e6,
        skipped_steps: c.skipped_steps.load(Relaxed),
        finite_read_ms: c.finite_read_ns.load(Relaxed) as f64 / 1e6,
        locate_compiles: c.locate_compiles.load(Relaxed),
        locate_compile_ms: c.locate_compile_ns.load(Relaxed) as f64 / 1e6,
        locate_run_ms: c.locate_run_ns.load(Relaxed) as f64 / 1e6,
        locate_build_ms: c.locate_build_ns.load(Relaxed) as f64 / 1e6,
        locate_ahead: c.locate_ahead.load(Relaxed),
        locate_warm_runs: c.locate_warm_runs.load(Relaxed),
        locate_warm_ms: c.locate_warm_ns.load(Relaxed) as f64 / 1e6,
        gradients_remade: c.gradients_remade.load(Relaxed),
        copies_followed: c.copies_followed.load(Relaxed),
        backward_replays: c.backward_replays.load(Relaxed),
        programs_evicted: c.programs_evicted.load(Relaxed),
    }
}

impl std::ops::Sub for Metrics {
    type Output = Metrics;
    fn sub(self, b: Metrics) -> Metrics {
        Metrics {
            compiles: self.compiles - b.compiles,
            cache_hits: self.cache_hits - b.cache_hits,
            executions: self.executions - b.executions,
            queued: self.queued - b.queued,
            compile_ms: self.compile_ms - b.compile_ms,
            execute_ms: self.execute_ms - b.execute_ms,
            bytes_to_device: self.bytes_to_device - b.bytes_to_device,
            bytes_to_host: self.bytes_to_host - b.bytes_to_host,
            bytes_donated: self.bytes_donated - b.bytes_donated,
            disk_cache_hits: self.disk_cache_hits - b.disk_cache_hits,
            disk_cache_misses: self.disk_cache_misses - b.disk_cache_misses,
            boundary_ms: self.boundary_ms - b.boundary_ms,
            upload_ms: self.upload_ms - b.upload_ms,
            finish_ms: self.finish_ms - b.finish_ms,
            wait_ms: self.wait_ms - b.wait_ms,
            skipped_steps: self.skipped_steps - b.skipped_steps,
            finite_read_ms: self.finite_read_ms - b.finite_read_ms,
            locate_compiles: self.locate_compiles - b.locate_compiles,
            locate_compile_ms: self.locate_compile_ms - b.locate_compile_ms,
            locate_run_ms: self.locate_run_ms - b.locate_run_ms,
            locate_build_ms: self.locate_build_ms - b.locate_build_ms,
            locate_ahead: self.locate_ahead - b.locate_ahead,
            locate_warm_runs: self.locate_warm_runs - b.locate_warm_runs,
            locate_warm_ms: self.locate_warm_ms - b.locate_warm_ms,
            gradients_remade: self.gradients_remade - b.gradients_remade,
            copies_followed: self.copies_followed - b.copies_followed,
            backward_replays: self.backward_replays - b.backward_replays,
            programs_evicted: self.programs_evicted - b.programs_evicted,
        }
    }
}

impl fmt::Display for Metrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "compiles: {}, cache hits: {}, executions: {}, compile: {:.1} ms, execute: {:.3} ms, to device: {} B, to host: {} B, donated: {} B, disk cache hits: {}, misses: {}",
            self.compiles,
            self.cache_hits,
            self.executions,
            self.compile_ms,
            self.execute_ms,
            self.bytes_to_device,
            self.bytes_to_host,
            self.bytes_donated,
            self.disk_cache_hits,
            self.disk_cache_misses
        )?;
        if self.skipped_steps > 0 {
            write!(f, ", skipped steps: {}", self.skipped_steps)?;
        }
        if self.programs_evicted > 0 {
            write!(f, ", programs evicted: {}", self.programs_evicted)?;
        }
        Ok(())
    }
}
