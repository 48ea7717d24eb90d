//! Layer normalization with its scale and shift as one op: [`Tensor::layer_norm_affine`]. On NVIDIA GPUs it runs
//! as lazuli's Triton kernels (`lazuli_kernels::layer_norm`), which write the result directly in the type a
//! following matmul reads and sum the scale's and shift's gradients in the pass that computes the input's;
//! elsewhere, or with `LAZULI_LAYER_NORM=composite`, it records the same ops as
//! `x.layer_norm(&[-1], eps) * weight + bias` followed by a conversion, so CPU programs do not change.

use lazuli_hlo::{BinaryKind, Convert, DType, KernelOp, Loc, NormSpec, Normalize, Op};

use lazuli_kernels::layer_norm::{layer_norm, LayerNormCall};

use crate::error::{Error, Result};
use crate::graph::record::{apply, raise, try_apply};
use crate::graph::tensor::Tensor;
use crate::runtime::runtime;

impl Tensor {
    /// `(x - mean) / √(var + eps) · weight + bias` over the last axis (biased variance), with the result in `out`
    /// (say bf16 for a matmul that follows, while `x`, `weight` and `bias` stay f32): `nn::LayerNorm`'s forward
    /// as one op. Computed in f32 and rounded once. `weight` and `bias` are `[D]`, `D` the last dimension of `x`.
    /// Panics at the caller's line when the shapes or dtypes do not fit, or when `LAZULI_LAYER_NORM=triton`
    /// forces a kernel that cannot run here; [`Tensor::try_layer_norm_affine`] returns those as errors.
    #[track_caller]
    pub fn layer_norm_affine(&self, weight: &Tensor, bias: &Tensor, eps: f64, out: DType) -> Tensor {
        layer_norm_at(self, weight, bias, eps, out, Loc::caller()).unwrap_or_else(|e| raise(e))
    }

    /// [`Tensor::layer_norm_affine`], with [`Error::ShapeMismatch`] when the operands do not fit and
    /// [`Error::Unsupported`] when a forced implementation cannot run here.
    #[track_caller]
    pub fn try_layer_norm_affine(&self, weight: &Tensor, bias: &Tensor, eps: f64, out: DType) -> Result<Tensor> {
        layer_norm_at(self, weight, bias, eps, out, Loc::caller())
    }
}

fn layer_norm_at(x: &Tensor, w: &Tensor, b: &Tensor, eps: f64, out: DType, loc: Loc) -> Result<Tensor> {
    const OP: &str = "layer_norm";
    let shapes = || [x, w, b].iter().map(|t| t.dims().to_vec()).collect();
    if w.tensor_type() != b.tensor_type() {
        let why = format!("the scale and shift must have one type, got {} and {}", w.tensor_type(), b.tensor_type());
        return Err(Error::ShapeMismatch { op: OP, shapes: shapes(), why, at: loc });
    }
    let call = LayerNormCall::new(x.tensor_type().clone(), w.tensor_type().clone(), out, eps);
    call.dims().map_err(|why| Error::ShapeMismatch { op: OP, shapes: shapes(), why, at: loc })?;
    let rt = runtime().map_err(|e| Error::Config(format!("layer_norm recorded at {loc}: {e}")))?;
    let want = rt.config.layer_norm;
    let def = layer_norm(&call, &rt.target, want).map_err(|e| {
        let why = format!("{e} (asked for by LAZULI_LAYER_NORM)");
        Error::Unsupported { op: OP, backend: rt.target.to_string(), why, at: loc }
    })?;
    if def.device.is_none() {
        return composite(x, w, b, eps, out, loc);
    }
    try_apply(Op::Kernel(KernelOp::new(def, 0)), &[x, w, b], loc)
}

/// The ops `nn::LayerNorm` has always recorded, then the conversion to `out`.
fn composite(x: &Tensor, w: &Tensor, b: &Tensor, eps: f64, out: DType, loc: Loc) -> Result<Tensor> {
    let last = x.rank() - 1;
    let normalized = try_apply(Op::Normalize(Normalize(NormSpec::new(vec![last], eps))), &[x], loc)?;
    let y = normalized.try_binary_at(w, BinaryKind::Mul, loc)?.try_binary_at(b, BinaryKind::Add, loc)?;
    Ok(if y.dtype() == out { y } else { apply(Op::Convert(Convert { from: y.dtype(), to: out }), &[&y], loc) })
}
