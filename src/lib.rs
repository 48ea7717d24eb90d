//! # lazuli
//!
//! A lazy-tensor framework on XLA. Tensor ops record into a graph; nothing runs until a value is needed
//! (`item()`, `to_vec()`, printing, or [`sync()`], the step boundary). Then the pending graph is lowered to
//! StableHLO, compiled once per graph structure through a PJRT plugin, and run.
//!
//! ```no_run
//! use lazuli::{DType, Tensor};
//! let x = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[2, 2]);
//! let w = Tensor::full(&[2, 2], 0.5, DType::F32);
//! let y = (x.matmul(&w) + 1.0).tanh().sum(&[1]);
//! println!("{y}"); // compiles and runs here
//! println!("{}", lazuli::metrics());
//! ```
//!
//! The crates underneath: [`pjrt`] (PJRT runtime and plugin provisioning), [`hlo`] (graph IR and StableHLO
//! emitter), [`lazy`] (tensors, recording, materialization, cache).
#![forbid(unsafe_code)]

/// Recording allocates many small nodes per step; mimalloc serves them much faster than glibc's malloc. Feature
/// `mimalloc` (on by default); turn it off to set a global allocator of your own. Feature `malloc-override` (on by
/// default) makes mimalloc C's `malloc` for the whole process too, so the PJRT plugin's allocations (each execution
/// allocates its results and bookkeeping) are served by it as well.
#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

pub use lazuli_hlo as hlo;
pub use lazuli_hlo::{Fused, FusedBuilder};
pub use lazuli_lazy as lazy;
pub use lazuli_pjrt as pjrt;

pub use lazuli_lazy::checkpoint;
pub use lazuli_lazy::diagnostics;
pub use lazuli_lazy::nn::{self, Module, Param};
pub use lazuli_lazy::optim::{self, AdamW, Optimizer, Schedule, Sgd};
pub use lazuli_lazy::random::{manual_seed, rng_state, set_rng_state};
pub use lazuli_lazy::shard::{self as sharding, mesh, shard_params, Mesh, PartitionSpec, Sharding};
pub use lazuli_lazy::{
    broadcast_shapes, grad, init, matmul_precision, memory_stats, metrics, no_grad, platform, runtime_info,
    scaled_dot_product_attention, set_matmul_precision, sync, value_and_grad, wait, with_attention,
    with_matmul_precision, AttentionLayout, AttentionOptions, Backend, Cause, Config, CpuLauncher, DType, Element,
    Error, Implementation, Loc, MemoryStats, Metrics, Operand, Precision, Result, RuntimeInfo, Tensor, TritonKernel,
    XlaOption,
};
