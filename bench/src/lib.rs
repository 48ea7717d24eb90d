//! lazuli's benchmark harness: the same training steps in lazuli and in JAX (and PyTorch on a GPU), from the same
//! weights, alternating, several repetitions, medians, spreads and ratios. `lazuli-bench cpu` prints the CPU table;
//! BENCHMARKS.md at the repository root records the results.
//!
//! - [`workloads`]: the models, their lazuli side and the shared safetensors file;
//! - [`worker`]: the Python side (`python/worker.py`, embedded) as a child process;
//! - [`pyenv`]: the comparison environment, made on first use;
//! - [`compare`]: alternating runs and the CPU table rows; [`gpu`]: the GPU rows, one process per framework and
//!   attention variant; [`trace`]: the host-side cost of a step, phase by phase;
//!   [`compile`]: cold compile against a warm start from the persistent compile cache; [`attention`]: attention
//!   alone, lazuli's implementations beside JAX's cuDNN call and PyTorch's SDPA; [`nan`]: a planted NaN caught by
//!   lazuli's finite check, PyTorch and JAX; [`nan_gpt`]: the same in GPT-2 small's step, the trip timed.
#![forbid(unsafe_code)]

pub mod attention;
pub mod check_cost;
pub mod compare;
pub mod compile;
pub mod depth;
pub mod gpt_bf16;
pub mod gpu;
pub mod head;
pub mod host_probe;
pub mod nan;
pub mod nan_gpt;
pub mod profile;
pub mod pyenv;
pub mod stats;
pub mod trace;
pub mod worker;
pub mod workloads;

/// The allocator the harness was built with (its features; `main.rs` declares it), printed with every table.
pub const ALLOCATOR: &str = if cfg!(feature = "malloc-override") {
    "mimalloc, also as C's malloc"
} else if cfg!(feature = "mimalloc") {
    "mimalloc (Rust's allocations only)"
} else {
    "the system's malloc"
};

pub type BenchResult<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// Whether two loss curves agree: every pair within `rtol · max(1, |b|)`. On disagreement, the first step that
/// differs and both values.
pub fn losses_agree(a: &[f64], b: &[f64], rtol: f64) -> std::result::Result<(), String> {
    if a.len() != b.len() || a.is_empty() {
        return Err(format!("{} losses against {}", a.len(), b.len()));
    }
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        if !x.is_finite() || !y.is_finite() || (x - y).abs() > rtol * y.abs().max(1.0) {
            return Err(format!("step {}: {x} against {y} (tolerance {rtol} relative)", i + 1));
        }
    }
    Ok(())
}
