//! The precision of float products (`dot_general`, so `matmul`, `Linear` and attention): a process-wide default,
//! and a scope per thread over it. A product records the precision in force when it is recorded, and its
//! gradient's products keep it.

use std::cell::Cell;
use std::sync::atomic::{AtomicU8, Ordering};

pub use lazuli_hlo::Precision;

const LEVELS: [Precision; 3] = [Precision::Default, Precision::High, Precision::Highest];

/// An index into `LEVELS`, or `UNSET` until `LAZULI_MATMUL_PRECISION` is read or a level is set.
static PROCESS: AtomicU8 = AtomicU8::new(UNSET);
const UNSET: u8 = u8::MAX;

thread_local! {
    static SCOPED: Cell<Option<Precision>> = const { Cell::new(None) };
}

fn index(p: Precision) -> u8 {
    LEVELS.iter().position(|&l| l == p).unwrap_or(0) as u8
}

/// Record products at `precision` from now on, on every thread without a [`with_matmul_precision`] scope (as
/// JAX's `jax_default_matmul_precision` and PyTorch's `torch.set_float32_matmul_precision`). Until it is
/// called, the level is `LAZULI_MATMUL_PRECISION` (`default`, `high` or `highest`), else [`Precision::Default`]:
/// on NVIDIA GPUs XLA then computes f32 products with TF32 inputs, as JAX does; `Precision::Highest` keeps f32,
/// as PyTorch does by default. A different precision makes a different program.
pub fn set_matmul_precision(precision: Precision) {
    PROCESS.store(index(precision), Ordering::Relaxed);
}

/// Record the products of `f` at `precision` on this thread. Restored on return or panic.
pub fn with_matmul_precision<R>(precision: Precision, f: impl FnOnce() -> R) -> R {
    struct Restore(Option<Precision>);
    impl Drop for Restore {
        fn drop(&mut self) {
            SCOPED.with(|s| s.set(self.0));
        }
    }
    let _restore = Restore(SCOPED.with(|s| s.replace(Some(precision))));
    f()
}

/// The precision a product recorded now on this thread gets. Panics, naming the caller's line, if
/// `LAZULI_MATMUL_PRECISION` holds something else than `default`, `high` or `highest`.
#[track_caller]
pub fn matmul_precision() -> Precision {
    precision_at(crate::Loc::caller())
}

/// [`matmul_precision`] for an op recorded at `loc`.
pub(crate) fn precision_at(loc: crate::Loc) -> Precision {
    if let Some(p) = SCOPED.with(|s| s.get()) {
        return p;
    }
    let mut level = PROCESS.load(Ordering::Relaxed);
    if level == UNSET {
        let from_env = crate::settings::matmul_precision().unwrap_or_else(|why| crate::graph::record::fail(loc, why));
        // A level set meanwhile wins over the environment.
        let _ = PROCESS.compare_exchange(UNSET, index(from_env), Ordering::Relaxed, Ordering::Relaxed);
        level = PROCESS.load(Ordering::Relaxed);
    }
    LEVELS[level as usize]
}
