//! The compiled programs a process keeps, by graph structure hash, up to a limit (`LAZULI_PROGRAM_CACHE_LIMIT`):
//! beyond it the least recently used one is evicted. Every compiled program holds its machine code and, on the CPU
//! plugin, a few hundred memory mappings of its own; a process that compiles program after program (inputs of
//! ever new shapes, a sweep in one process) would otherwise end when the operating system refuses the next
//! mapping (Linux allows 65,530 by default: about 870 small programs), inside XLA's compiler. A program evicted and
//! needed again is loaded from the persistent compile cache where it is on, else compiled again, and that
//! recompile names the cache as its cause.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use lazuli_pjrt::LoadedExecutable;

/// How many compiled programs a process keeps by default. A training step is one or two programs; evaluation,
/// set-up and the NaN locator's a few more. At a few hundred mappings for a GPT-2-sized program, this many stay
/// far below Linux's default limit.
pub const DEFAULT_LIMIT: usize = 64;

pub(crate) struct ProgramCache {
    limit: usize,
    entries: HashMap<u64, Entry>,
    /// Incremented by every use; an entry's `used` is the clock at its last use.
    clock: u64,
    /// Keys evicted so far: a later compile of one of them is the cache's doing, not a new graph's.
    evicted: HashSet<u64>,
}

struct Entry {
    exe: Arc<LoadedExecutable>,
    used: u64,
}

impl ProgramCache {
    /// An empty cache that keeps at most `limit` programs (at least one).
    pub fn new(limit: usize) -> ProgramCache {
        ProgramCache { limit: limit.max(1), entries: HashMap::new(), clock: 0, evicted: HashSet::new() }
    }

    /// The program compiled for `key`, now the most recently used.
    pub fn get(&mut self, key: u64) -> Option<Arc<LoadedExecutable>> {
        self.clock += 1;
        let entry = self.entries.get_mut(&key)?;
        entry.used = self.clock;
        Some(entry.exe.clone())
    }

    /// Keep `exe` as `key`'s program, evicting the least recently used ones beyond the limit; returns how many
    /// were evicted. A program still running or held elsewhere lives on until its last holder drops it.
    pub fn insert(&mut self, key: u64, exe: Arc<LoadedExecutable>) -> usize {
        self.clock += 1;
        self.entries.insert(key, Entry { exe, used: self.clock });
        let mut evicted = 0;
        while self.entries.len() > self.limit {
            let Some(oldest) = self.entries.iter().min_by_key(|(_, e)| e.used).map(|(&k, _)| k) else { break };
            self.entries.remove(&oldest);
            self.evicted.insert(oldest);
            evicted += 1;
        }
        evicted
    }

    /// Whether `key`'s program was compiled before and evicted.
    pub fn was_evicted(&self, key: u64) -> bool {
        self.evicted.contains(&key)
    }
}
