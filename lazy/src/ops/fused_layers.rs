//! A transformer layer's memory-bound pieces as fused ops: [`Tensor::layer_norm_affine`] (layer normalization with
//! its scale and shift) and [`Tensor::bias_gelu`] (an MLP's first bias and activation). On NVIDIA GPUs each runs as
//! lazuli's Triton kernels (`lazuli_kernels::layer_norm`, `lazuli_kernels::bias_gelu`), which write their result
//! directly in the type a following matmul reads and sum the parameters' gradients in the pass that computes the
//! input's. Elsewhere, or with `LAZULI_LAYER_NORM=composite` / `LAZULI_BIAS_GELU=composite`, they record the ops of
//! their formulas followed by a conversion, as a model would write them, so CPU programs do not change.

use lazuli_hlo::{BinaryKind, DType, Gelu, KernelDef, KernelOp, Loc, NormSpec, Normalize, Op};
use lazuli_kernels::bias_gelu::{bias_gelu, BiasGeluCall};
use lazuli_kernels::layer_norm::{layer_norm, LayerNormCall};
use std::cell::RefCell;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::graph::record::{raise, try_apply};
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

    /// `gelu(x + bias)` (GELU's tanh form, as [`Tensor::gelu`]) with `bias: [C]` added along the last axis and the
    /// result in `out`: an MLP's `linear(x).gelu()` after a matmul without its bias, as one op. `x` may be the
    /// matmul's bf16 result and `out` the bf16 the next matmul reads; the sum and GELU are computed in f32 and
    /// rounded once. Panics at the caller's line when the shapes or dtypes do not fit, or when
    /// `LAZULI_BIAS_GELU=triton` forces a kernel that cannot run here; [`Tensor::try_bias_gelu`] returns those.
    #[track_caller]
    pub fn bias_gelu(&self, bias: &Tensor, out: DType) -> Tensor {
        bias_gelu_at(self, bias, out, Loc::caller()).unwrap_or_else(|e| raise(e))
    }

    /// [`Tensor::bias_gelu`], with [`Error::ShapeMismatch`] and [`Error::Unsupported`] as errors.
    #[track_caller]
    pub fn try_bias_gelu(&self, bias: &Tensor, out: DType) -> Result<Tensor> {
        bias_gelu_at(self, bias, out, Loc::caller())
    }
}

fn bias_gelu_at(x: &Tensor, b: &Tensor, out: DType, loc: Loc) -> Result<Tensor> {
    const OP: &str = "bias_gelu";
    let call = BiasGeluCall { x: x.tensor_type().clone(), bias: b.tensor_type().clone(), out };
    call.dims().map_err(|why| Error::ShapeMismatch {
        op: OP,
        shapes: vec![x.dims().to_vec(), b.dims().to_vec()],
        why,
        at: loc,
    })?;
    let def = kernel(OP, "LAZULI_BIAS_GELU", loc, |rt| bias_gelu(&call, &rt.target, rt.config.bias_gelu))?;
    if def.device.is_some() {
        return try_apply(Op::Kernel(KernelOp::new(def, 0)), &[x, b], loc);
    }
    let wide = DType::computing([x.dtype(), b.dtype()]);
    let u = x.to_dtype_at(wide, loc).try_binary_at(b.to_dtype_at(wide, loc), BinaryKind::Add, loc)?;
    Ok(try_apply(Op::Gelu(Gelu), &[&u], loc)?.to_dtype_at(out, loc))
}

/// The kernel `make` builds from the runtime's target and setting (`variable` names the setting in errors). Where
/// it has no device program, the op records its formula's ops instead of the kernel, so the compile event would
/// not name it: the choice and its reason are noted for that event here.
pub(crate) fn kernel(
    op: &'static str,
    variable: &str,
    loc: Loc,
    make: impl FnOnce(&crate::runtime::Runtime) -> std::result::Result<Arc<KernelDef>, String>,
) -> Result<Arc<KernelDef>> {
    let rt = runtime().map_err(|e| Error::Config(format!("{op} recorded at {loc}: {e}")))?;
    let def = make(rt).map_err(|e| {
        let why = format!("{e} (asked for by {variable})");
        Error::Unsupported { op, backend: rt.target.to_string(), why, at: loc }
    })?;
    if def.device.is_none() && crate::diagnostics::events::enabled() {
        let line = format!("{} at {loc}: {} ({})", def.name, def.choice.implementation, def.choice.reason);
        FALLBACKS.with_borrow_mut(|f| {
            if !f.contains(&line) {
                f.push(line);
            }
        });
    }
    Ok(def)
}

thread_local! {
    /// The fused ops recorded as their formulas since the last program, each with its reason, once per line.
    static FALLBACKS: RefCell<Vec<String>> = const { RefCell::new(Vec::new()) };
}

/// The fused ops this thread recorded as their formulas since the last call, as `kernel_choices` names kernels:
/// `layer_norm at src/model.rs:12:9: composite (f32 → bf16, …; the device is cpu, not an NVIDIA GPU)`.
pub(crate) fn take_fallbacks() -> Vec<String> {
    FALLBACKS.with_borrow_mut(std::mem::take)
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
    let def = kernel(OP, "LAZULI_LAYER_NORM", loc, |rt| layer_norm(&call, &rt.target, rt.config.layer_norm))?;
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
    Ok(y.to_dtype_at(out, loc))
}
