//! lazuli's lazy tensors: recording ops into a graph, materializing it through PJRT, and caching compiled programs
//! by graph structure.
//!
//! - [`tensor`]: the `Tensor` handle, constructors from host data, reads (`item`, `to_vec`, `to_ndarray`,
//!   `Display`) and `sync()`, the step boundary.
//! - [`record`]: the user-facing ops (shape-checked at the user's line, numpy broadcasting).
//! - [`materialize`]: graph collection, structure hash, executable cache, execution.
//! - [`runtime`]: plugin and client set-up; [`metrics`](mod@metrics): counters.
#![forbid(unsafe_code)]

mod array_ops;
pub mod attention;
pub mod autodiff;
pub mod bench_hooks;
pub mod checkpoint;
mod compile_cache;
mod conv;
pub mod custom_kernel;
pub mod diagnostics;
pub mod element;
pub mod error;
mod launcher;
pub mod materialize;
pub mod metrics;
pub mod nn;
mod nn_functional;
mod operators;
pub mod optim;
pub mod precision;
pub mod random;
pub mod record;
mod reference;
pub mod runtime;
pub mod shard;
mod spmd;
pub mod tensor;
mod walk;

pub use attention::{scaled_dot_product_attention, with_attention, AttentionLayout, AttentionOptions};
pub use autodiff::{grad, grad_enabled, no_grad, value_and_grad};
pub use custom_kernel::TritonKernel;
pub use element::Element;
pub use error::{Error, Result};
pub use lazuli_hlo::{DType, Loc};
pub use lazuli_kernels::{Implementation, Target};
pub use lazuli_pjrt::MemoryStats;
pub use lazuli_pjrt::XlaOption;
pub use materialize::{wait, Cause};
pub use metrics::{metrics, Metrics};
pub use precision::{matmul_precision, set_matmul_precision, with_matmul_precision, Precision};
pub use random::{manual_seed, rng_state, set_rng_state};
pub use record::{broadcast_shapes, Operand};
pub use runtime::{init, memory_stats, platform, runtime_info, Backend, Config, CpuLauncher, RuntimeInfo};
pub use tensor::{sync, Tensor};
