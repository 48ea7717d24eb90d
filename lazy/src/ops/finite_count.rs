//! [`count_nonfinite`]: how many elements of a list of float tensors are NaN or infinite, as one `i32` scalar, the
//! count a guarded finite check takes (`LAZULI_CHECK_FINITE`), for a loop that wants its own: a gradient clip that
//! skips a bad batch, an overflow test of a hand-written loss scaler. On NVIDIA GPUs one launch of lazuli's Triton
//! kernel over every tensor (`lazuli_kernels::finite_count`); elsewhere, or with `LAZULI_FINITE_COUNT=composite`,
//! each tensor's count by XLA's reductions.

use lazuli_hlo::{KernelOp, Loc, Op};

use crate::error::{Error, Result};
use crate::graph::record::{raise, try_apply};
use crate::graph::tensor::Tensor;

use super::fused_layers::kernel;

/// The number of NaN and infinite elements of `tensors` together, an `i32` scalar (0 for none). Panics at the
/// caller's line for a tensor that is not floating-point, or when `LAZULI_FINITE_COUNT=triton` forces the kernel
/// where it cannot run; [`try_count_nonfinite`] returns those as errors.
#[track_caller]
pub fn count_nonfinite(tensors: &[&Tensor]) -> Tensor {
    count_at(tensors, Loc::caller()).unwrap_or_else(|e| raise(e))
}

/// [`count_nonfinite`], with [`Error::InvalidArgument`] and [`Error::Unsupported`] as errors.
#[track_caller]
pub fn try_count_nonfinite(tensors: &[&Tensor]) -> Result<Tensor> {
    count_at(tensors, Loc::caller())
}

fn count_at(tensors: &[&Tensor], loc: Loc) -> Result<Tensor> {
    const OP: &str = "count_nonfinite";
    if let Some(t) = tensors.iter().find(|t| !t.dtype().is_float()) {
        let why = format!("counts NaN and infinite elements of float tensors, not {}", t.tensor_type());
        return Err(Error::InvalidArgument { op: OP, why, at: loc });
    }
    let types: Vec<_> = tensors.iter().map(|t| t.tensor_type().clone()).collect();
    let def = kernel(OP, "LAZULI_FINITE_COUNT", loc, |rt| {
        lazuli_kernels::finite_count::count_nonfinite(&types, &rt.target, rt.config.finite_count)
    })?;
    let count = try_apply(Op::Kernel(KernelOp::new(def, 0)), tensors, loc)?;
    count.try_reshape_at(&[], loc)
}
