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
//! ## Map
//!
//! - Tensors: [`Tensor`] (constructors, reads, and every op as a method or operator), [`DType`], [`Element`]
//!   (the Rust types a tensor is read as), [`Operand`] (what a binary op takes: a tensor or a host scalar).
//! - Steps: [`sync()`] (the step boundary), [`wait()`]; gradients: [`Tensor::backward`], [`grad()`],
//!   [`value_and_grad()`], [`no_grad()`], [`checkpoint()`] (recompute a block in the backward pass instead of
//!   keeping its activations).
//! - Models and training: [`nn`] (modules, layers, the GPT, loading by name), [`optim`] (SGD, AdamW, schedules),
//!   [`checkpoint`](mod@checkpoint) (saving and loading), [`safetensors`] (any safetensors file: weights from
//!   and for other frameworks; GPT-2's in [`nn::gpt2`]), [`data`] (token files, seeded batches, prefetching).
//! - Several devices: [`sharding`] (meshes, partition specs, the planner); several processes: [`distributed`]
//!   (joining a group, its key-value store and barriers, failure detection; `lazuli-run` starts one).
//! - Numerics: [`Precision`] of products, [`manual_seed`] and the generator's state, [`count_nonfinite()`] (NaN and
//!   infinite elements of many tensors, one kernel on GPUs).
//! - Kernels: [`scaled_dot_product_attention`] with its [`AttentionOptions`] and [`Implementation`]; a Triton
//!   kernel of your own with [`TritonKernel`]; a fused elementwise expression with [`ir::FusedBuilder`].
//! - Control flow: [`scan()`] (and [`Scan`] for its options), [`while_loop()`], [`cond()`], each with bodies as
//!   closures over tensors, and their `try_` forms.
//! - The runtime: [`init`] with a [`Config`], [`runtime_info()`], [`metrics()`], [`memory_stats()`] (the device
//!   allocator's, on GPUs), [`program_memory()`] (XLA's plan of the latest program: a step's peak), [`profile()`]
//!   (the device's kernels).
//! - When something goes wrong: [`Error`] (each names the line that caused it), [`diagnostics`] (graph breaks,
//!   recompiles, strict mode, the report behind the `lazuli-report` tool).
//!
//! ## Allocator
//!
//! lazuli sets no global allocator: that is the application's choice. Recording a step allocates thousands of
//! small nodes, which [mimalloc](https://docs.rs/mimalloc) serves much faster than glibc's malloc, so an
//! application without an allocator of its own should declare it (with mimalloc's feature `override`, it serves C's
//! `malloc` too, so the PJRT plugin's allocations as well); the README's "Allocator" section has what each buys.
//!
//! ```ignore
//! #[global_allocator]
//! static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
//! ```
//!
//! The crates underneath (`lazuli-lazy`, `lazuli-hlo`, `lazuli-pjrt`, …) are lazuli's implementation; their APIs
//! make no promises.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod ir;

#[doc(inline)]
pub use lazuli_lazy::{checkpoint, data, diagnostics, nn, optim, safetensors};

#[doc(inline)]
pub use lazuli_lazy::mesh as sharding;

/// Multi-process runs: [`Config::distributed`](crate::Config) or the `LAZULI_COORDINATOR`,
/// `LAZULI_PROCESS_ID` and `LAZULI_NUM_PROCESSES` variables (which `lazuli-run` sets) make the runtime join a
/// group; [`group()`](distributed::group) is this process's [`Member`](distributed::Member), with the group's
/// key-value store and barriers. The loss of another member ends this process with an error naming it.
pub mod distributed {
    pub use lazuli_lazy::runtime::distributed::{group, shutdown, Distributed, Failure, GROUP_FAILED_EXIT_CODE};
    pub use lazuli_lazy::runtime::distributed::{Member, MemberError};
}

// Tensors and their element types.
pub use lazuli_lazy::{broadcast_shapes, where_, CrossEntropyOptions, DType, Element, Operand, Tensor};
// Slicing several axes at once (`x.slice_axes(&s![.., 1..5;2])`), and einsum with a string spec.
pub use lazuli_lazy::{count_nonfinite, try_count_nonfinite};
pub use lazuli_lazy::{einsum, s, try_einsum, AxisSlice};
// The step boundary and waiting for the device.
pub use lazuli_lazy::{sync, wait};
// Gradients.
pub use lazuli_lazy::{grad, grad_enabled, no_grad, value_and_grad};
// Models and optimizers, by their short names.
pub use lazuli_lazy::nn::{Module, Param};
pub use lazuli_lazy::optim::{AdamW, Optimizer, Schedule, Sgd};
// Sharding, by the short names of its common items.
pub use lazuli_lazy::mesh::{mesh, shard_params, Mesh, PartitionSpec, Sharding};
// Precision of products and convolutions.
pub use lazuli_lazy::{matmul_precision, set_matmul_precision, with_matmul_precision, Precision};
// Attention and custom kernels.
pub use lazuli_lazy::{
    scaled_dot_product_attention, try_scaled_dot_product_attention, with_attention, AttentionLayout, AttentionOptions,
    Implementation, TritonKernel,
};
// Structured control flow: loops and branches with bodies as closures over tensors.
pub use lazuli_lazy::{cond, scan, try_cond, try_scan, try_while_loop, while_loop, Scan};
// Random numbers.
pub use lazuli_lazy::{manual_seed, rng_state, set_rng_state};
// The runtime: set-up, what it loaded, what it did.
// (`metrics` by its path in the module: the crate's root name `metrics` is the module as well as the function.)
pub use lazuli_lazy::metrics::{metrics, Metrics};
pub use lazuli_lazy::profile;
pub use lazuli_lazy::{
    init, memory_stats, platform, program_memory, runtime_info, Backend, BlockScan, CheckFinite, CompileCache,
    CompiledMemoryStats, Config, CpuLauncher, LocateAhead, MemoryStats, RuntimeInfo, SplitUpdate, XlaOption,
    LOCATE_AHEAD_AFTER,
};
// Errors and the source locations they name.
pub use lazuli_lazy::{Cause, Error, Loc, Result};
