//! lazuli's lazy tensors, in folders that follow a step: ops record into a graph (`graph`, `ops`); a step
//! boundary walks it, plans, compiles and launches a program (`exec`) on the process's runtime (`runtime`:
//! plugin, client, settings, launcher thread, compile cache); models, optimizers and checkpoints build on it
//! (`train`), meshes split it over devices (`mesh`), and `diagnostics` watches it all. Each folder uses only the
//! ones listed before it (and `error`):
//!
//! - [`diagnostics`]: events, strict mode, the report, metrics (uses nothing else of this crate).
//! - [`runtime`]: `Config`, the plugin and client, values on a device, the CPU launcher, the compile cache.
//! - [`graph`]: `Tensor` and its nodes, recording, the walk of a pending graph, autodiff.
//! - [`ops`]: the op methods users call (array ops, activations, losses, convolutions, random numbers,
//!   attention, custom kernels).
//! - [`exec`]: the step boundary: `materialize` and its stages, reads, the reference interpreter.
//! - [`train`]: `nn` (modules, layers, the GPT), `optim` (SGD, AdamW), `checkpoint`.
//! - [`mesh`]: meshes, shardings of tensors and parameters, the planner.
#![forbid(unsafe_code)]

pub mod diagnostics;
pub mod error;
pub mod exec;
pub mod graph;
pub mod mesh;
pub mod ops;
pub mod runtime;
pub mod settings;
pub mod train;

pub use diagnostics::metrics::{self, metrics, Metrics};
pub use diagnostics::Cause;
pub use error::{Error, Result};
pub use exec::read::sync;
pub use exec::{profile, wait};
pub use graph::autodiff::{grad, grad_enabled, no_grad, value_and_grad};
pub use graph::element::{self, Element};
pub use graph::precision::{matmul_precision, set_matmul_precision, with_matmul_precision, Precision};
pub use graph::record::{broadcast_shapes, where_, Operand};
pub use graph::tensor::Tensor;
pub use lazuli_hlo::{DType, Loc};
pub use lazuli_kernels::{Implementation, Target};
pub use lazuli_pjrt::XlaOption;
pub use lazuli_pjrt::{CompiledMemoryStats, MemoryStats};
pub use ops::attention::{
    scaled_dot_product_attention, try_scaled_dot_product_attention, with_attention, AttentionLayout, AttentionOptions,
};
pub use ops::checkpoint::checkpoint;
pub use ops::control::{cond, scan, try_cond, try_scan, try_while_loop, while_loop, Scan};
pub use ops::custom_kernel::TritonKernel;
pub use ops::einsum::{einsum, try_einsum};
pub use ops::finite_count::{count_nonfinite, try_count_nonfinite};
pub use ops::indexing::AxisSlice;
pub use ops::nn_functional::CrossEntropyOptions;
pub use ops::random::{manual_seed, rng_state, set_rng_state};
pub use runtime::{init, memory_stats, platform, program_memory, runtime_info, Config, RuntimeInfo};
pub use settings::{
    Backend, BlockScan, CheckFinite, CompileCache, CpuLauncher, LocateAhead, SplitUpdate, LOCATE_AHEAD_AFTER,
};
pub use train::{checkpoint, data, nn, optim, safetensors};
