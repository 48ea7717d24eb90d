//! A transformer layer's memory-bound pieces as fused ops: [`Tensor::layer_norm_affine`] (layer normalization with
//! its scale and shift), [`Tensor::add_layer_norm_affine`] (a residual add and the layer norm after it) and
//! [`Tensor::bias_gelu`] (an MLP's first bias and activation). On NVIDIA GPUs each runs as
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

    /// `(s, s.layer_norm_affine(weight, bias, eps, out))` for `s = self + added` (`+ added_bias` along the last
    /// axis, when given): a residual stream's add and the layer norm that reads it, as one op (one kernel on
    /// NVIDIA GPUs, which reads `self` and `added` once and writes the sum beside the normalized result). `added`
    /// has `self`'s shape and any float type: a linear layer's bf16 product, say, with the layer's bias as
    /// `added_bias`, so that the product is not widened and biased in a pass of its own. The sum has `self`'s
    /// type and is normalized as rounded to it. Elsewhere it records the adds and the layer norm. Panics at the
    /// caller's line when the shapes or dtypes do not fit, or when `LAZULI_LAYER_NORM=triton` forces a kernel that
    /// cannot run here; [`Tensor::try_add_layer_norm_affine`] returns those as errors.
    #[track_caller]
    pub fn add_layer_norm_affine(
        &self,
        added: &Tensor,
        added_bias: Option<&Tensor>,
        weight: &Tensor,
        bias: &Tensor,
        eps: f64,
        out: DType,
    ) -> (Tensor, Tensor) {
        add_layer_norm_at(self, (added, added_bias), (weight, bias), eps, out, Loc::caller())
            .unwrap_or_else(|e| raise(e))
    }

    /// [`Tensor::add_layer_norm_affine`], with [`Error::ShapeMismatch`] when the operands do not fit and
    /// [`Error::Unsupported`] when a forced implementation cannot run here.
    #[track_caller]
    pub fn try_add_layer_norm_affine(
        &self,
        added: &Tensor,
        added_bias: Option<&Tensor>,
        weight: &Tensor,
        bias: &Tensor,
        eps: f64,
        out: DType,
    ) -> Result<(Tensor, Tensor)> {
        add_layer_norm_at(self, (added, added_bias), (weight, bias), eps, out, Loc::caller())
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
    let call = layer_norm_call(x, (None, None), (w, b), eps, out, loc)?;
    let def = kernel(LAYER_NORM, "LAZULI_LAYER_NORM", loc, |rt| layer_norm(&call, &rt.target, rt.config.layer_norm))?;
    if def.device.is_none() {
        return composite(x, w, b, eps, out, loc);
    }
    try_apply(Op::Kernel(KernelOp::new(def, 0)), &[x, w, b], loc)
}

fn add_layer_norm_at(
    x: &Tensor,
    (added, added_bias): (&Tensor, Option<&Tensor>),
    (w, b): (&Tensor, &Tensor),
    eps: f64,
    out: DType,
    loc: Loc,
) -> Result<(Tensor, Tensor)> {
    let call = layer_norm_call(x, (Some(added), added_bias), (w, b), eps, out, loc)?;
    let def = kernel(LAYER_NORM, "LAZULI_LAYER_NORM", loc, |rt| layer_norm(&call, &rt.target, rt.config.layer_norm))?;
    if def.device.is_none() {
        // As a model writes it: the linear layer's bias (the product widened to it), then the residual add.
        let added = match added_bias {
            Some(c) => {
                let wide = DType::computing([added.dtype(), c.dtype()]);
                added.to_dtype_at(wide, loc).try_binary_at(c.to_dtype_at(wide, loc), BinaryKind::Add, loc)?
            }
            None => added.clone(),
        };
        let sum = x.try_binary_at(added.to_dtype_at(x.dtype(), loc), BinaryKind::Add, loc)?;
        let y = composite(&sum, w, b, eps, out, loc)?;
        return Ok((sum, y));
    }
    let operands: Vec<&Tensor> = [x, added].into_iter().chain(added_bias).chain([w, b]).collect();
    let sum = try_apply(Op::Kernel(KernelOp::new(def.clone(), 3)), &operands, loc)?;
    // One call, two results: autodiff gives the kernel's joint gradient rule both cotangents at once.
    Ok((sum, try_apply(Op::Kernel(KernelOp::new(def, 0)), &operands, loc)?))
}

const LAYER_NORM: &str = "layer_norm";

/// The kernels' signature of a layer norm of `x` (after adding `added`, of `x`'s shape, and its bias `[D]`), or
/// what does not fit.
fn layer_norm_call(
    x: &Tensor,
    (added, added_bias): (Option<&Tensor>, Option<&Tensor>),
    (w, b): (&Tensor, &Tensor),
    eps: f64,
    out: DType,
    loc: Loc,
) -> Result<LayerNormCall> {
    let operands: Vec<&Tensor> = [x].into_iter().chain(added).chain(added_bias).chain([w, b]).collect();
    let mismatch = |why: String| Error::ShapeMismatch {
        op: LAYER_NORM,
        shapes: operands.iter().map(|t| t.dims().to_vec()).collect(),
        why,
        at: loc,
    };
    if w.tensor_type() != b.tensor_type() {
        let (w, b) = (w.tensor_type(), b.tensor_type());
        return Err(mismatch(format!("the scale and shift must have one type, got {w} and {b}")));
    }
    if let Some(a) = added.filter(|a| a.dims() != x.dims()) {
        return Err(mismatch(format!("the added tensor must have x's shape {:?}, got {:?}", x.dims(), a.dims())));
    }
    let width = x.dims().last().copied().unwrap_or(0);
    if let Some(c) = added_bias.filter(|c| c.dims() != [width]) {
        return Err(mismatch(format!("the added bias must be [{width}] (x's last axis), got {:?}", c.dims())));
    }
    let call = LayerNormCall::new(x.tensor_type().clone(), w.tensor_type().clone(), out, eps);
    let call = match added {
        Some(a) => call.with_added(a.dtype(), added_bias.map(Tensor::dtype)),
        None => call,
    };
    call.dims().map_err(mismatch)?;
    Ok(call)
}

/// The ops `nn::LayerNorm` has always recorded, then the conversion to `out`.
fn composite(x: &Tensor, w: &Tensor, b: &Tensor, eps: f64, out: DType, loc: Loc) -> Result<Tensor> {
    let last = x.rank() - 1;
    let normalized = try_apply(Op::Normalize(Normalize(NormSpec::new(vec![last], eps))), &[x], loc)?;
    let y = normalized.try_binary_at(w, BinaryKind::Mul, loc)?.try_binary_at(b, BinaryKind::Add, loc)?;
    Ok(y.to_dtype_at(out, loc))
}
