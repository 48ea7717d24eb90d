//! Mean softmax cross-entropy of logits `[N, C]` against class ids `[N]` (`Op::CrossEntropy`'s loss: a class id
//! outside `0..C` adds 0 and gets no gradient), as one kernel. On NVIDIA GPUs lazuli's Triton kernels
//! (`triton/cross_entropy.rs`): the forward reads the logits once and keeps each row's `log Σ exp`, the backward
//! reads them once more and writes the gradient in the logits' type. XLA's program of the composite read them three
//! times and wrote the gradient in a fourth pass's company; at a language model's vocabulary (GPT-2's 50,304) this is
//! the step's largest memory-bound piece. Elsewhere the composite: the one `CrossEntropy` node, also the reference.
//!
//! The logits may be narrower than the loss: bf16 logits (a matmul's product) with an f32 loss are read as bf16
//! and widened in registers, and their gradient is written in bf16, where XLA's program would first have written an
//! f32 copy of them for the kernel to read.
//!
//! Results: the loss (a scalar of the loss type) and the f32 `lse` `[N]`, which only the backward reads.
//!
//! In a step that will take the loss's gradient (`CrossEntropyCall::grad_in_forward`), the forward also writes the
//! gradient at a unit cotangent, walking each row a second time right after the first (partly from the L2 cache),
//! so no backward kernel reads the logits again; its third result is that gradient, which the gradient rule scales
//! by the loss's cotangent (XLA drops the scaling when the cotangent is `backward()`'s constant one). For any other
//! cotangent the lazy autodiff records the forward and backward kernels instead (`KernelDef::scaled_alternative`).

use std::sync::{Arc, Mutex};

use lazuli_hlo::{
    Builder, Choice, CrossEntropy, DType, Gradient, KernelDef, KernelOp, Op, OpRules, Program, TensorType,
};

use crate::choice::{made_once, triton_or_composite, triton_scalar, Made};
pub use crate::triton::cross_entropy::GradTiling;
use crate::triton::cross_entropy::{self as ttce, CrossEntropySpec};
use crate::triton::ttir::Scalar;
use crate::triton::TritonCall;
use crate::{Implementation, Target};

const KERNEL: &str = "cross_entropy";

/// One cross-entropy call's signature.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CrossEntropyCall {
    /// `[N, C]`, float.
    pub logits: TensorType,
    /// `[N]`, integer.
    pub ids: TensorType,
    /// The loss's float type: the logits' own, or a wider one they are converted to.
    pub out: DType,
    /// The forward also writes the gradient (at a unit cotangent), walking the logits so; `None`: the forward
    /// alone, and a backward kernel of its own reads the logits again.
    pub grad_in_forward: Option<GradTiling>,
}

impl CrossEntropyCall {
    /// The shape and dtype rule (`Op::CrossEntropy`'s): `(N, C)`, or what does not fit.
    pub fn dims(&self) -> Result<(usize, usize), String> {
        let infer = CrossEntropy.infer(&[&self.logits, &self.ids]);
        infer.map_err(|e| e.message().to_string())?;
        if !self.out.is_float() || self.out.byte_size() < self.logits.dtype.byte_size() {
            return Err(format!(
                "cross_entropy: the loss type {} is narrower than the logits' {}",
                self.out, self.logits
            ));
        }
        Ok((self.logits.dims[0], self.logits.dims[1]))
    }

    fn operands(&self) -> Vec<TensorType> {
        vec![self.logits.clone(), self.ids.clone()]
    }

    fn loss(&self) -> TensorType {
        TensorType::scalar(self.out)
    }

    fn lse(&self) -> TensorType {
        TensorType::new(DType::F32, [self.logits.dims[0]])
    }

    fn forward_only(&self) -> CrossEntropyCall {
        CrossEntropyCall { grad_in_forward: None, ..self.clone() }
    }
}

/// The cross-entropy kernel for `call` on `target`, as `want` asks. Made once per (call, target, setting).
pub fn cross_entropy(call: &CrossEntropyCall, target: &Target, want: Implementation) -> Result<Arc<KernelDef>, String> {
    static MADE: Made<(CrossEntropyCall, Target, Implementation)> = Mutex::new(None);
    made_once(&MADE, (call.clone(), target.clone(), want), || make(call, target, want))
}

fn make(call: &CrossEntropyCall, target: &Target, want: Implementation) -> Result<Arc<KernelDef>, String> {
    let (rows, classes) = call.dims()?;
    if let Some(tiling) = call.grad_in_forward {
        return make_with_grad(call, (rows, classes), tiling, (target, want));
    }
    let operands = call.operands();
    let composite = Program::record(&operands, |b, x| {
        let logits = b.convert(&x[0], call.out);
        let loss = b.op(Op::CrossEntropy(CrossEntropy), &[&logits, &x[1]]);
        vec![Some(loss), Some(composite_lse(b, &x[0]))]
    })?;
    let what = format!("{} logits, {rows} rows of {classes} classes", call.logits.dtype);
    let (spec, choice) = triton_or_composite(KERNEL, what, (target, want), || triton_spec(call, rows, classes))?;
    let (device, gradient) = match spec {
        Some(spec) => {
            let composite_def = cross_entropy(call, target, Implementation::Composite)?;
            let backward = backward_kernel(call, &spec, &composite_def, choice.clone())?;
            let forward = forward_program(call, &spec, ttce::forward(&spec), &[])?;
            (Some(forward), Gradient::Program(gradient(call, &backward)?))
        }
        None => (None, Gradient::Composite),
    };
    KernelDef::new(
        KERNEL,
        operands,
        vec![call.loss(), call.lse()],
        device,
        composite,
        vec![gradient, Gradient::None],
        choice,
    )
}

/// The forward that also writes the gradient where lazuli's kernel runs; elsewhere the forward alone (the same
/// composite: nothing is gained by computing the gradient early in a composite).
fn make_with_grad(
    call: &CrossEntropyCall,
    (rows, classes): (usize, usize),
    tiling: GradTiling,
    (target, want): (&Target, Implementation),
) -> Result<Arc<KernelDef>, String> {
    let plain = cross_entropy(&call.forward_only(), target, want)?;
    if plain.device.is_none() {
        return Ok(plain);
    }
    if let Some(why) = tiling.unsupported() {
        return Err(format!("{KERNEL} with the gradient: {why}"));
    }
    let spec = triton_spec(call, rows, classes)?;
    let operands = call.operands();
    let composite_def = cross_entropy(&call.forward_only(), target, Implementation::Composite)?;
    let composite = Program::record(&operands, |b, x| {
        let r = b.op(Op::Kernel(KernelOp::new(composite_def.clone(), 0)), &[&x[0], &x[1]]);
        let lse = b.op(Op::Kernel(KernelOp::new(composite_def.clone(), 1)), &[&x[0], &x[1]]);
        let one = b.constant(1.0, call.loss());
        let mut d = KernelOp::new(composite_def.clone(), 0).vjp(b, &x[..2], &r, &one);
        let dx = d.swap_remove(0).map(|d| b.convert(&d, call.logits.dtype));
        vec![Some(r), Some(lse), dx]
    })?;
    let device =
        forward_program(call, &spec, ttce::forward_with_grad(&spec, tiling), std::slice::from_ref(&call.logits))?;
    let mut inputs = operands.clone();
    inputs.extend([call.loss(), call.loss()]);
    let (dims, dtype) = (call.logits.dims.clone(), call.logits.dtype);
    let gradient = Program::record(&inputs, |b, x| {
        let unit = b.sibling(2, call.logits.clone());
        let g = b.convert(&x[3], dtype);
        let g = b.broadcast(&g, &dims, &[]);
        vec![Some(b.mul(&unit, &g)), None]
    })?;
    let def = KernelDef::new(
        "cross_entropy_with_grad",
        operands,
        vec![call.loss(), call.lse(), call.logits.clone()],
        Some(device),
        composite,
        vec![Gradient::Program(gradient), Gradient::None, Gradient::None],
        plain.choice.clone(),
    )?;
    // A loss scaled before its backward (gradient accumulation, loss scaling, `cross_entropy_with`'s options) gets
    // the forward and backward kernels instead, whose backward folds the scale into its one pass.
    KernelDef::with_scaled_alternative(def, plain)
}

fn triton_spec(call: &CrossEntropyCall, rows: usize, classes: usize) -> Result<CrossEntropySpec, String> {
    let ids = match call.ids.dtype {
        DType::I32 => Scalar::I32,
        DType::I64 => Scalar::I64,
        other => return Err(format!("lazuli's Triton {KERNEL} takes i32 or i64 class ids, not {other}")),
    };
    let spec = CrossEntropySpec { rows, classes, x: triton_scalar(call.logits.dtype, KERNEL)?, ids };
    match spec.unsupported() {
        Some(why) => Err(why),
        None => Ok(spec),
    }
}

/// Each row's `log Σ exp x` as f32 `[N]`, computed in f32 (f64 for f64 logits).
fn composite_lse<B: Builder>(b: &mut B, logits: &B::V) -> B::V {
    let wide = DType::computing([b.ty(logits).dtype]);
    let x = b.convert(logits, wide);
    let lse = b.logsumexp(&x, 1);
    b.convert(&lse, DType::F32)
}

/// A forward's device program: the Triton call `triton` (per-row losses, `lse`, then results of the types `extra`),
/// the mean of its per-row losses in the loss type, `lse` and the extra results.
fn forward_program(
    call: &CrossEntropyCall,
    spec: &CrossEntropySpec,
    triton: TritonCall,
    extra: &[TensorType],
) -> Result<Program, String> {
    triton.validate(2, 2 + extra.len())?;
    let mut results = vec![call.lse(), call.lse()];
    results.extend_from_slice(extra);
    Program::record(&call.operands(), |b, x| {
        let r = b.call(triton.custom_call(results), &[&x[0], &x[1]]);
        let total = b.sum(&r[0], &[0]);
        let mean = b.scale(&total, 1.0 / spec.rows as f64);
        let mut out = vec![Some(b.convert(&mean, call.out))];
        out.extend(r[1..].iter().cloned().map(Some));
        out
    })
}

/// The backward as a kernel of its own: operands `x, t, lse, g` (`g` the loss's cotangent), result `dx`; its device
/// program the Triton backward, its composite the composite forward's gradient.
fn backward_kernel(
    call: &CrossEntropyCall,
    spec: &CrossEntropySpec,
    composite_def: &Arc<KernelDef>,
    choice: Choice,
) -> Result<Arc<KernelDef>, String> {
    let mut operands = call.operands();
    operands.extend([call.lse(), call.loss()]);
    // The composite forward's gradient (its own formula) does not read the forward's result: `g` stands in for it.
    let composite = Program::record(&operands, |b, x| {
        let mut d = KernelOp::new(composite_def.clone(), 0).vjp(b, &x[..2], &x[3], &x[3]);
        vec![d.swap_remove(0)]
    })?;
    let triton = ttce::backward(spec);
    triton.validate(4, 1)?;
    let classes = spec.classes;
    let device = Program::record(&operands, |b, x| {
        // Each row's scale: the cotangent over N, 0 where the class id is out of range (no gradient there).
        let valid = lazuli_hlo::ops::loss::in_range(b, &x[1], classes);
        let g = b.convert(&x[3], DType::F32);
        let g = b.scale(&g, 1.0 / spec.rows as f64);
        let g = b.broadcast(&g, &[spec.rows], &[]);
        let scale = b.mask(&valid, &g);
        vec![Some(b.call(triton.custom_call(vec![call.logits.clone()]), &[&x[0], &x[1], &x[2], &scale]).remove(0))]
    })?;
    KernelDef::new(
        "cross_entropy_grad",
        operands,
        vec![call.logits.clone()],
        Some(device),
        composite,
        vec![Gradient::Composite],
        choice,
    )
}

/// The loss's gradient: the backward kernel on the operands, the forward's `lse` and the cotangent.
fn gradient(call: &CrossEntropyCall, backward: &Arc<KernelDef>) -> Result<Program, String> {
    let mut inputs = call.operands();
    inputs.extend([call.loss(), call.loss()]);
    Program::record(&inputs, |b, x| {
        let lse = b.sibling(1, call.lse());
        let dx = b.op(Op::Kernel(KernelOp::new(backward.clone(), 0)), &[&x[0], &x[1], &lse, &x[3]]);
        vec![Some(dx), None]
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const H200: Target = Target::Cuda { compute_capability: Some((9, 0)) };

    fn call(n: usize, c: usize, x: DType, ids: DType) -> CrossEntropyCall {
        CrossEntropyCall {
            logits: TensorType::new(x, [n, c]),
            ids: TensorType::new(ids, [n]),
            out: x,
            grad_in_forward: None,
        }
    }

    #[test]
    fn the_gpu_gets_triton_and_the_cpu_or_odd_ids_the_composite_with_the_reason() {
        let c = call(8192, 50304, DType::BF16, DType::I32);
        let gpu = cross_entropy(&c, &H200, Implementation::Auto).expect("gpu");
        assert_eq!(gpu.choice.implementation, "triton");
        assert!(gpu.device.as_ref().expect("device").has_calls());
        let cpu = cross_entropy(&c, &Target::Cpu, Implementation::Auto).expect("cpu");
        assert_eq!(cpu.choice.implementation, "composite");
        let e = cross_entropy(&c, &Target::Cpu, Implementation::Triton).expect_err("forced");
        assert!(e.contains("cross_entropy: Triton was asked for but the device is cpu"), "{e}");
        let u8_ids = cross_entropy(&call(4, 300, DType::F32, DType::U8), &H200, Implementation::Auto).expect("u8");
        assert_eq!(u8_ids.choice.implementation, "composite");
        assert!(u8_ids.choice.reason.contains("i32 or i64 class ids, not u8"), "{}", u8_ids.choice.reason);
        let e = call(4, 5, DType::F32, DType::F32).dims().expect_err("float ids");
        assert!(e.contains("integer class ids [4]"), "{e}");
        let narrowing = CrossEntropyCall { out: DType::BF16, ..call(4, 5, DType::F32, DType::I32) };
        assert!(narrowing.dims().expect_err("narrower").contains("narrower"));
        let widening = CrossEntropyCall { out: DType::F32, ..call(8192, 50304, DType::BF16, DType::I32) };
        let def = cross_entropy(&widening, &H200, Implementation::Auto).expect("bf16 logits, f32 loss");
        assert_eq!(def.results[0], TensorType::scalar(DType::F32));
    }

    /// With the gradient in the forward: on the GPU a third result, the gradient at a unit cotangent, whose
    /// composite (evaluated by the reference interpreter) is `(softmax(x) - onehot(t)) / N`, 0 on a row whose id is
    /// out of range; where the kernel does not run, the forward alone.
    #[test]
    fn the_forward_with_the_gradient_has_it_as_a_third_result() {
        let c = CrossEntropyCall { grad_in_forward: Some(GradTiling::DEFAULT), ..call(3, 4, DType::F32, DType::I32) };
        let cpu = cross_entropy(&c, &Target::Cpu, Implementation::Auto).expect("cpu");
        assert_eq!((cpu.results.len(), cpu.choice.implementation), (2, "composite"));
        let def = cross_entropy(&c, &H200, Implementation::Auto).expect("gpu");
        assert_eq!(def.results, vec![TensorType::scalar(DType::F32), c.lse(), c.logits.clone()]);
        let alternative = def.scaled_alternative.as_ref().expect("the forward and backward kernels, for a scaled loss");
        assert_eq!((alternative.name, alternative.results.len()), ("cross_entropy", 2));
        assert!(def.device.as_ref().expect("device").has_calls());
        let odd =
            CrossEntropyCall { grad_in_forward: Some(GradTiling { rows: 3, ..GradTiling::DEFAULT }), ..c.clone() };
        let e = cross_entropy(&odd, &H200, Implementation::Auto).expect_err("3 rows a block");
        assert!(e.contains("rows and columns are powers of two"), "{e}");
        let x = ndarray::ArrayD::from_shape_fn(vec![3, 4], |i| ((i[0] * 4 + i[1]) as f64 * 0.7).sin() * 3.0);
        let t = ndarray::ArrayD::from_shape_vec(vec![3], vec![2.0, 0.0, 9.0]).expect("ids");
        let out = def.composite.evaluate(&[&x, &t]);
        let dx = out[2].as_ref().expect("dx");
        for r in 0..3 {
            let total: f64 = (0..4).map(|j| x[[r, j]].exp()).sum();
            for j in 0..4 {
                let want =
                    if r < 2 { (x[[r, j]].exp() / total - (t[[r]] as usize == j) as u8 as f64) / 3.0 } else { 0.0 };
                assert!((dx[[r, j]] - want).abs() < 1e-6, "dx[{r}, {j}]: {} vs {want}", dx[[r, j]]);
            }
        }
    }

    /// The composite's loss and `lse`, evaluated by the reference interpreter, against the formula; a class id
    /// out of range adds 0.
    #[test]
    fn the_composite_computes_the_loss_and_each_rows_lse() {
        let c = call(3, 4, DType::F32, DType::I32);
        let def = cross_entropy(&c, &Target::Cpu, Implementation::Auto).expect("def");
        let x = ndarray::ArrayD::from_shape_fn(vec![3, 4], |i| ((i[0] * 4 + i[1]) as f64 * 0.7).sin() * 3.0);
        let t = ndarray::ArrayD::from_shape_vec(vec![3], vec![2.0, 0.0, 9.0]).expect("ids");
        let out = def.composite.evaluate(&[&x, &t]);
        let (loss, lse) = (out[0].as_ref().expect("loss"), out[1].as_ref().expect("lse"));
        let mut want = 0.0;
        for r in 0..3 {
            let row_lse = (0..4).map(|j| x[[r, j]].exp()).sum::<f64>().ln();
            assert!((lse[[r]] - row_lse).abs() < 1e-5, "row {r}: {} vs {row_lse}", lse[[r]]);
            if r < 2 {
                want += (row_lse - x[[r, t[[r]] as usize]]) / 3.0;
            }
        }
        let loss = loss.iter().next().copied().expect("a scalar");
        assert!((loss - want).abs() < 1e-5, "{loss} vs {want}");
    }
}
