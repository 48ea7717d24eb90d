//! Layer normalization with its scale and shift, `y = (x - mean) / √(var + eps) · w + b` over the last axis, as
//! one kernel whose result may have another float type than `x` (the bf16 a following matmul reads, written by
//! the kernel instead of a conversion of its own). Two implementations: on NVIDIA GPUs, lazuli's Triton kernels
//! (`triton/layer_norm.rs`: a forward that keeps each row's mean and inverse deviation, a backward that writes `dx`
//! and sums `dw` and `db` in the same pass); everywhere else the composite, which is also their reference.
//!
//! Results: `y`, and the f32 row statistics `mean` and `rstd` (`[N]`, `N` the product of the leading dimensions),
//! which only the backward reads. The composite computes in f32 (f64 for f64 inputs) and rounds `y` once, as the
//! kernels do.

use std::sync::{Arc, Mutex};

use lazuli_hlo::{Builder, Choice, DType, Gradient, KernelDef, KernelOp, NormSpec, Normalize, Op, Program, TensorType};
use lazuli_hlo::{OpRules, ReduceKind, Slice, UnaryKind};

use crate::choice::{made_once, triton_or_composite, triton_scalar, Made};
use crate::triton::layer_norm::{self as ttln, LayerNormSpec};
use crate::{Implementation, Target};

/// One layer-norm call's signature.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct LayerNormCall {
    pub x: TensorType,
    /// The scale and the shift: `[D]`, one float type.
    pub params: TensorType,
    /// The result's float type.
    pub out: DType,
    /// `f64::to_bits` of epsilon.
    pub eps_bits: u64,
}

impl LayerNormCall {
    pub fn new(x: TensorType, params: TensorType, out: DType, eps: f64) -> LayerNormCall {
        LayerNormCall { x, params, out, eps_bits: eps.to_bits() }
    }

    pub fn eps(&self) -> f64 {
        f64::from_bits(self.eps_bits)
    }

    /// The shape and dtype rule: `(rows, width)` of a well-formed call, or what does not fit.
    pub fn dims(&self) -> Result<(usize, usize), String> {
        let (x, p) = (&self.x, &self.params);
        if !x.dtype.is_float() || !p.dtype.is_float() || !self.out.is_float() {
            return Err(format!(
                "layer_norm: x, the scale and shift, and the result must be floats, got {x}, {p}, {}",
                self.out
            ));
        }
        let Some(&width) = x.dims.last() else {
            return Err(format!("layer_norm: x must have an axis to normalize, got {x}"));
        };
        if p.dims[..] != [width] {
            return Err(format!("layer_norm: the scale and shift must be [{width}] (x's last axis), got {p}"));
        }
        if !(self.eps() > 0.0 && self.eps().is_finite()) {
            return Err(format!("layer_norm: eps must be positive and finite, got {}", self.eps()));
        }
        Ok((x.dims[..x.rank() - 1].iter().product(), width))
    }

    fn operands(&self) -> Vec<TensorType> {
        vec![self.x.clone(), self.params.clone(), self.params.clone()]
    }

    fn output(&self) -> TensorType {
        TensorType::new(self.out, self.x.dims.clone())
    }

    fn stats(&self, rows: usize) -> TensorType {
        TensorType::new(DType::F32, [rows])
    }

    /// The computing type of the composite: f64 for f64 inputs, else f32.
    fn wide(&self) -> DType {
        DType::computing([self.x.dtype, self.params.dtype])
    }
}

/// The layer-norm kernel for `call` on `target`, as `want` asks (`Cudnn` has no layer norm: an error). Made once
/// per (call, target, setting) and shared.
pub fn layer_norm(call: &LayerNormCall, target: &Target, want: Implementation) -> Result<Arc<KernelDef>, String> {
    static MADE: Made<(LayerNormCall, Target, Implementation)> = Mutex::new(None);
    made_once(&MADE, (call.clone(), target.clone(), want), || make(call, target, want))
}

fn make(call: &LayerNormCall, target: &Target, want: Implementation) -> Result<Arc<KernelDef>, String> {
    let (rows, width) = call.dims()?;
    let operands = call.operands();
    let results = vec![call.output(), call.stats(rows), call.stats(rows)];
    let composite = Program::record(&operands, |b, x| {
        let (y, mean, rstd) = composite(b, call, rows, x);
        vec![Some(y), Some(mean), Some(rstd)]
    })?;
    let what = format!("{} → {}, {rows} rows of {width}", call.x.dtype, call.out);
    let (spec, choice) = triton_or_composite(KERNEL, what, (target, want), || triton_spec(call, rows, width))?;
    let (device, gradient) = match spec {
        Some(spec) => {
            let composite_def = layer_norm(call, target, Implementation::Composite)?;
            let backward = backward_kernel(call, rows, &spec, &composite_def, choice.clone())?;
            (Some(forward_program(call, rows, &spec)?), Gradient::Program(gradient(call, rows, &backward)?))
        }
        None => (None, Gradient::Composite),
    };
    let gradients = vec![gradient, Gradient::None, Gradient::None];
    KernelDef::new(KERNEL, operands, results, device, composite, gradients, choice)
}

/// The Triton kernels' spec, or why they do not apply.
fn triton_spec(call: &LayerNormCall, rows: usize, width: usize) -> Result<LayerNormSpec, String> {
    let spec = LayerNormSpec {
        rows,
        width,
        x: triton_scalar(call.x.dtype, KERNEL)?,
        params: triton_scalar(call.params.dtype, KERNEL)?,
        y: triton_scalar(call.out, KERNEL)?,
        eps_bits: call.eps_bits,
    };
    match spec.unsupported() {
        Some(why) => Err(why),
        None => Ok(spec),
    }
}

const KERNEL: &str = "layer_norm";

/// `(y, mean, rstd)` of operands `x, w, b`, in lazuli's ops.
fn composite<B: Builder>(b: &mut B, call: &LayerNormCall, rows: usize, x: &[B::V]) -> (B::V, B::V, B::V) {
    let wide = call.wide();
    let dims = call.x.dims.clone();
    let last = dims.len() - 1;
    let xw = b.convert(&x[0], wide);
    let normalized = b.op(Op::Normalize(Normalize(NormSpec::new(vec![last], call.eps()))), &[&xw]);
    let affine = |b: &mut B, p: &B::V| {
        let p = b.convert(p, wide);
        b.broadcast(&p, &dims, &[last])
    };
    let (w, shift) = (affine(b, &x[1]), affine(b, &x[2]));
    let scaled = b.mul(&normalized, &w);
    let y = b.add(&scaled, &shift);
    let y = b.convert(&y, call.out);
    // The statistics the kernels keep: each row's mean and 1/√(var + eps), f32 [N].
    let width = dims[last] as f64;
    let mean = b.reduce_kept(ReduceKind::Sum, &xw, &[last]);
    let mean = b.scale(&mean, 1.0 / width);
    let mean_full = b.expand(&mean, &dims);
    let centered = b.sub(&xw, &mean_full);
    let squares = b.mul(&centered, &centered);
    let var = b.sum(&squares, &[last]);
    let var = b.scale(&var, 1.0 / width);
    let eps = b.full_like(&var, call.eps());
    let var = b.add(&var, &eps);
    let rstd = b.unary(UnaryKind::Rsqrt, &var);
    let flat = |b: &mut B, v: &B::V| {
        let v = b.reshape(v, &[rows]);
        b.convert(&v, DType::F32)
    };
    (y, flat(b, &mean), flat(b, &rstd))
}

/// The forward program: the Triton call on `x, w, b`.
fn forward_program(call: &LayerNormCall, rows: usize, spec: &LayerNormSpec) -> Result<Program, String> {
    let triton = ttln::forward(spec);
    triton.validate(3, 3)?;
    let results = vec![call.output(), call.stats(rows), call.stats(rows)];
    Program::record(&call.operands(), |b, x| {
        b.call(triton.custom_call(results.clone()), &[&x[0], &x[1], &x[2]]).into_iter().map(Some).collect()
    })
}

/// The backward as a kernel of its own. Operands `x, w, b, y, dy, mean, rstd`; results `dx, dw, db`. Its device
/// program is the Triton backward and the sums of its partial `dw` and `db` rows; its composite the composite
/// forward's gradient.
fn backward_kernel(
    call: &LayerNormCall,
    rows: usize,
    spec: &LayerNormSpec,
    composite_def: &Arc<KernelDef>,
    choice: Choice,
) -> Result<Arc<KernelDef>, String> {
    let stats = call.stats(rows);
    let mut operands = call.operands();
    operands.extend([call.output(), call.output(), stats.clone(), stats]);
    let composite =
        Program::record(&operands, |b, x| KernelOp::new(composite_def.clone(), 0).vjp(b, &x[..3], &x[3], &x[4]))?;
    let triton = ttln::backward(spec);
    triton.validate(5, 2)?;
    let width = spec.width;
    let partial = TensorType::new(DType::F32, [spec.backward_programs(), 2, width]);
    let results = vec![call.x.clone(), partial];
    let device = Program::record(&operands, |b, x| {
        let (xv, w, dy, mean, rstd) = (&x[0], &x[1], &x[4], &x[5], &x[6]);
        let r = b.call(triton.custom_call(results.clone()), &[xv, w, dy, mean, rstd]);
        // One reduction for both sums, then dw and db apart.
        let sums = b.sum(&r[1], &[0]);
        let mut part = |i: usize| {
            let row = b.op(Op::Slice(Slice::along(&[2, width], 0, i, i + 1, 1)), &[&sums]);
            let row = b.reshape(&row, &[width]);
            b.convert(&row, call.params.dtype)
        };
        let (dw, db) = (part(0), part(1));
        vec![Some(r[0].clone()), Some(dw), Some(db)]
    })?;
    let results = vec![call.x.clone(), call.params.clone(), call.params.clone()];
    KernelDef::new("layer_norm_grad", operands, results, Some(device), composite, vec![Gradient::Composite; 3], choice)
}

/// `y`'s gradient: the backward kernel on the operands, `y`, its cotangent and the forward's statistics.
fn gradient(call: &LayerNormCall, rows: usize, backward: &Arc<KernelDef>) -> Result<Program, String> {
    let mut inputs = call.operands();
    inputs.extend([call.output(), call.output()]);
    Program::record(&inputs, |b, x| {
        let mean = b.sibling(1, call.stats(rows));
        let rstd = b.sibling(2, call.stats(rows));
        let args = [&x[0], &x[1], &x[2], &x[3], &x[4], &mean, &rstd];
        (0..3).map(|i| Some(b.op(Op::Kernel(KernelOp::new(backward.clone(), i)), &args))).collect()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(x: &[usize], out: DType) -> LayerNormCall {
        LayerNormCall::new(TensorType::new(DType::F32, x), TensorType::new(DType::F32, [x[x.len() - 1]]), out, 1e-5)
    }

    const H200: Target = Target::Cuda { compute_capability: Some((9, 0)) };

    #[test]
    fn the_gpu_gets_triton_and_the_cpu_the_composite_with_the_reason() {
        let c = call(&[8, 1024, 768], DType::BF16);
        let gpu = layer_norm(&c, &H200, Implementation::Auto).expect("gpu");
        assert_eq!(gpu.choice.implementation, "triton");
        let device = gpu.device.as_ref().expect("a device program");
        assert!(device.has_calls());
        let cpu = layer_norm(&c, &Target::Cpu, Implementation::Auto).expect("cpu");
        assert_eq!(cpu.choice.implementation, "composite");
        assert!(cpu.choice.reason.contains("not an NVIDIA GPU"), "{}", cpu.choice.reason);
        let e = layer_norm(&c, &Target::Cpu, Implementation::Triton).expect_err("forced");
        assert!(e.contains("Triton was asked for but the device is cpu"), "{e}");
        let e = layer_norm(&c, &H200, Implementation::Cudnn).expect_err("no cudnn");
        assert!(e.contains("no cuDNN layer_norm"), "{e}");
    }

    #[test]
    fn ill_formed_calls_say_what_does_not_fit() {
        let mut c = call(&[4, 6], DType::F32);
        c.params = TensorType::new(DType::F32, [5]);
        assert!(c.dims().expect_err("width").contains("must be [6]"));
        let c =
            LayerNormCall::new(TensorType::new(DType::I32, [4, 6]), TensorType::new(DType::F32, [6]), DType::F32, 1e-5);
        assert!(c.dims().expect_err("ints").contains("must be floats"));
        let c =
            LayerNormCall::new(TensorType::new(DType::F32, [4, 6]), TensorType::new(DType::F32, [6]), DType::F32, 0.0);
        assert!(c.dims().expect_err("eps").contains("eps"));
    }

    /// The composite's statistics and result, evaluated by the reference interpreter, against the formula.
    #[test]
    fn the_composite_computes_the_formula_and_the_statistics() {
        let c = call(&[2, 3, 5], DType::F32);
        let def = layer_norm(&c, &Target::Cpu, Implementation::Auto).expect("def");
        let x = ndarray::ArrayD::from_shape_fn(vec![2, 3, 5], |i| ((i[0] * 15 + i[1] * 5 + i[2]) as f64 * 0.37).sin());
        let w = ndarray::ArrayD::from_shape_fn(vec![5], |i| 1.0 + i[0] as f64 * 0.1);
        let bias = ndarray::ArrayD::from_shape_fn(vec![5], |i| i[0] as f64 * -0.2);
        let out = def.composite.evaluate(&[&x, &w, &bias]);
        let (y, mean, rstd) = (out[0].as_ref().unwrap(), out[1].as_ref().unwrap(), out[2].as_ref().unwrap());
        for r in 0..6 {
            let row: Vec<f64> = (0..5).map(|k| x[[r / 3, r % 3, k]]).collect();
            let m = row.iter().sum::<f64>() / 5.0;
            let v = row.iter().map(|a| (a - m).powi(2)).sum::<f64>() / 5.0;
            let s = 1.0 / (v + 1e-5).sqrt();
            assert!((mean[[r]] - m).abs() < 1e-6 && (rstd[[r]] - s).abs() < 1e-4 * s, "row {r}");
            for k in 0..5 {
                let want = (row[k] - m) * s * w[[k]] + bias[[k]];
                assert!((y[[r / 3, r % 3, k]] - want).abs() < 1e-5, "[{r}, {k}]");
            }
        }
    }
}
