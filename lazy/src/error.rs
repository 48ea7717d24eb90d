//! Errors returned when a tensor is read or the runtime is set up, and by the `try_*` forms of the recording ops.
//! The plain recording ops treat bad operands (mismatched shapes, bad axes) as programmer errors: they panic at the
//! user's line with the same message as the `Err` of their `try_*` form (see `graph/record.rs`).

use std::fmt;

use lazuli_hlo::{DType, Loc};

/// lazuli's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything a read, a step boundary, a checkpoint or the runtime's set-up can fail with. Each names the user's line
/// it concerns (where the value was materialized, or the call that failed).
#[derive(thiserror::Error)]
pub enum Error {
    /// The runtime (plugin, client, transfer, execute) failed: the PJRT call, the plugin's status code and its
    /// own message.
    #[error(transparent)]
    Pjrt(#[from] lazuli_pjrt::Error),
    /// XLA rejected the program. Its message names the Rust line of the failing op (every op carries a `loc`).
    #[error("XLA could not compile the graph materialized at {at}:\n{source}")]
    Compile {
        /// The line whose materialization compiled the program.
        at: Loc,
        /// XLA's error.
        source: lazuli_pjrt::Error,
    },
    /// XLA rejected a program holding custom kernels (a user's Triton IR, say); the kernels are named with the
    /// lines that recorded them.
    #[error("XLA could not compile the graph materialized at {at}, which holds these custom kernels:\n  {kernels}\n{source}")]
    KernelCompile {
        /// The line whose materialization compiled the program.
        at: Loc,
        /// The program's custom kernels, each with the line that recorded it.
        kernels: String,
        /// XLA's error.
        source: lazuli_pjrt::Error,
    },
    /// Running the compiled program failed.
    #[error("running the graph materialized at {at} failed:\n{source}")]
    Execute {
        /// The line whose materialization launched the program.
        at: Loc,
        /// The plugin's error.
        source: lazuli_pjrt::Error,
    },
    /// A typed read asked for a different element type than the tensor has.
    #[error("{what} at {at}: the tensor is {actual}, but {wanted} was asked for; convert it with `.to_dtype(DType::{wanted_variant:?})` first")]
    DTypeMismatch {
        /// The read (`item`, `to_vec`, …).
        what: &'static str,
        /// The line of the read.
        at: Loc,
        /// The tensor's dtype.
        actual: DType,
        /// The dtype of the element type asked for.
        wanted: DType,
        /// The same, named as a `DType` variant in the message's advice.
        wanted_variant: DType,
    },
    /// `item()` on a tensor with more than one element.
    #[error("item() at {at}: the tensor has {elements} elements; item() needs exactly one")]
    NotScalar {
        /// The line of the `item()`.
        at: Loc,
        /// The tensor's number of elements.
        elements: usize,
    },
    /// An op's operands' shapes do not fit it or each other (`matmul` of `[2, 3]` and `[4, 5]`, a reshape to
    /// another element count, a slice past the end, shapes that do not broadcast).
    #[error("{why}\n  recorded at {at}")]
    ShapeMismatch {
        /// The op (`matmul`, `add`, `reshape`, `concat`, …).
        op: &'static str,
        /// The shapes of its operands (for a reshape or broadcast, the operand's and the one asked for).
        shapes: Vec<Vec<usize>>,
        /// The whole message, naming the op and the operands' types.
        why: String,
        /// The line that recorded the op.
        at: Loc,
    },
    /// An operand's element type does not fit the op, or its operands' element types differ.
    #[error("{why}\n  recorded at {at}")]
    WrongDType {
        /// The op.
        op: &'static str,
        /// The element types of its operands.
        dtypes: Vec<DType>,
        /// The whole message.
        why: String,
        /// The line that recorded the op.
        at: Loc,
    },
    /// An axis out of range for an operand of this rank (negative axes count from the end).
    #[error("{why}\n  recorded at {at}")]
    BadAxis {
        /// The op.
        op: &'static str,
        /// The axis given.
        axis: i64,
        /// The rank it had to fit.
        rank: usize,
        /// The whole message.
        why: String,
        /// The line that recorded the op.
        at: Loc,
    },
    /// An argument of the op other than its operands is invalid (window sizes, a step of 0, no tensors to join, a
    /// shape too large to address).
    #[error("{why}\n  recorded at {at}")]
    InvalidArgument {
        /// The op.
        op: &'static str,
        /// The whole message.
        why: String,
        /// The line that recorded the op.
        at: Loc,
    },
    /// What was asked for does not run on this backend (a kernel implementation forced where it cannot apply).
    #[error("{why}\n  recorded at {at}")]
    Unsupported {
        /// The op.
        op: &'static str,
        /// The backend's platform (`cpu`, `cuda`, …).
        backend: String,
        /// The whole message.
        why: String,
        /// The line that recorded the op.
        at: Loc,
    },
    /// A mesh or sharding does not fit (unknown axis, indivisible dimension, too few devices, two meshes).
    #[error("sharding: {0}")]
    Sharding(String),
    /// Strict mode refused a graph break or a recompile (see `lazuli::diagnostics`).
    #[error("lazuli strict mode: {0}")]
    Strict(String),
    /// A checkpoint could not be written or does not match what it is loaded into.
    #[error("checkpoint: {0}")]
    Checkpoint(String),
    /// A safetensors file could not be read or written, or named tensors do not fit the module they are loaded
    /// into (`lazuli::safetensors`, `nn::load_named`, `nn::gpt2`).
    #[error("weights: {0}")]
    Weights(String),
    /// A program would need more memory than the device has free (checked before it is compiled).
    #[error("out of memory: {0}")]
    OutOfMemory(String),
    /// With `LAZULI_CHECK_FINITE=stop`: what entered a step's update (its loss, its gradients) held NaN or infinite
    /// values; parameters and optimizer state keep their values from before the step. The report names the step,
    /// each output with non-finite values and its line, and the first op that made a non-finite value from finite
    /// operands, with its line and its operands' ranges, or the step's input that was non-finite already
    /// (`exec/finite/`).
    #[error("non-finite values in the step materialized at {at}:\n{report}")]
    NonFinite {
        /// The line whose materialization ran the step.
        at: Loc,
        /// The line of the first op whose result was non-finite while its floating-point operands were finite, if
        /// it was found.
        op_at: Option<Loc>,
        /// That op's name (`log`, `div`, …).
        op: Option<&'static str>,
        /// The whole report.
        report: String,
    },
    /// A checked index (`Tensor::index_select_checked`, or `index_select` and `embedding` under
    /// `LAZULI_CHECK_INDICES=1`) was outside its axis: read when the step that computed it was materialized, and
    /// reported there (by that read, the next materialization or `wait()`), naming the line of the indexing op.
    #[error(
        "{op}: index {index} at position {position:?} of the indices is out of range for axis {axis} of size {size} \
         (valid: 0 to {size} exclusive); {count} of the {total} indices are out of range\n  recorded at {at}"
    )]
    IndexOutOfRange {
        /// The op (`index_select`, `embedding`, `cross_entropy`: its targets index the logits' class axis).
        op: &'static str,
        /// The first bad index, in the indices' row-major order.
        index: i64,
        /// Where it is in the indices.
        position: Vec<usize>,
        /// The indexed axis and its size.
        axis: usize,
        size: usize,
        /// How many indices were out of range, of how many.
        count: u64,
        total: usize,
        /// The line that recorded the op.
        at: Loc,
    },
    /// A broken invariant of lazuli itself; please report it.
    #[error("lazuli internal error: {0}")]
    Internal(String),
    /// The runtime was configured twice, or its configuration is invalid.
    #[error("lazuli runtime: {0}")]
    Config(String),
}

/// The message, as `Display` writes it. A `main` (or a test) that returns `lazuli::Result` prints its error's
/// `Debug`, and what it should show is the message with its lines, not the variant's fields with escaped newlines.
impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl Error {
    /// For an error of a recording op: the line that recorded it.
    pub fn recorded_at(&self) -> Option<Loc> {
        match self {
            Error::ShapeMismatch { at, .. }
            | Error::WrongDType { at, .. }
            | Error::BadAxis { at, .. }
            | Error::InvalidArgument { at, .. }
            | Error::Unsupported { at, .. }
            | Error::IndexOutOfRange { at, .. } => Some(*at),
            _ => None,
        }
    }
}
