//! Errors returned when a tensor is read or the runtime is set up. Programmer errors in recording (mismatched
//! shapes, bad axes) are panics at the user's line instead; see `record.rs`.

use lazuli_hlo::{DType, Loc};

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The runtime (plugin, client, transfer, execute) failed.
    #[error(transparent)]
    Pjrt(#[from] lazuli_pjrt::Error),
    /// XLA rejected the program. Its message names the Rust line of the failing op (every op carries a `loc`).
    #[error("XLA could not compile the graph materialized at {at}:\n{source}")]
    Compile { at: Loc, source: lazuli_pjrt::Error },
    /// XLA rejected a program holding custom kernels (a user's Triton IR, say); the kernels are named with the
    /// lines that recorded them.
    #[error("XLA could not compile the graph materialized at {at}, which holds these custom kernels:\n  {kernels}\n{source}")]
    KernelCompile { at: Loc, kernels: String, source: lazuli_pjrt::Error },
    /// Running the compiled program failed.
    #[error("running the graph materialized at {at} failed:\n{source}")]
    Execute { at: Loc, source: lazuli_pjrt::Error },
    /// A typed read asked for a different element type than the tensor has.
    #[error("{what} at {at}: the tensor is {actual}, but {wanted} was asked for; convert it with `.to_dtype(DType::{wanted_variant:?})` first")]
    DTypeMismatch { what: &'static str, at: Loc, actual: DType, wanted: DType, wanted_variant: DType },
    /// `item()` on a tensor with more than one element.
    #[error("item() at {at}: the tensor has {elements} elements; item() needs exactly one")]
    NotScalar { at: Loc, elements: usize },
    /// A mesh or sharding does not fit (unknown axis, indivisible dimension, too few devices, two meshes).
    #[error("sharding: {0}")]
    Sharding(String),
    /// Strict mode refused a graph break or a recompile (see `lazuli::diagnostics`).
    #[error("lazuli strict mode: {0}")]
    Strict(String),
    /// A checkpoint could not be written or does not match what it is loaded into.
    #[error("checkpoint: {0}")]
    Checkpoint(String),
    /// A program would need more memory than the device has free (checked before it is compiled).
    #[error("out of memory: {0}")]
    OutOfMemory(String),
    /// A broken invariant of lazuli itself; please report it.
    #[error("lazuli internal error: {0}")]
    Internal(String),
    /// The runtime was configured twice, or its configuration is invalid.
    #[error("lazuli runtime: {0}")]
    Config(String),
}
