//! `y = gelu(x + b)` (GELU's tanh form) over the last axis's bias: a transformer MLP's first bias and activation as
//! one kernel, with `y` in any float type (the bf16 the next matmul reads) and `x` in its own (the bf16 the
//! matmul before wrote). On NVIDIA GPUs lazuli's Triton kernels (`triton/bias_gelu.rs`): the forward keeps
//! nothing but its operands, the backward recomputes `x + b` and sums `db` in the pass that writes `dx`; elsewhere
//! the composite, also their reference. The composite computes in f32 (f64 for f64 inputs) and rounds once.

use std::sync::{Arc, Mutex};

use lazuli_hlo::{Builder, Choice, DType, Gelu, Gradient, KernelDef, KernelOp, Op, OpRules, Program, TensorType};

use crate::choice::{made_once, triton_or_composite, triton_scalar, Made};
use crate::triton::bias_gelu::{self as ttbg, BiasGeluSpec};
use crate::{Implementation, Target};

const KERNEL: &str = "bias_gelu";

/// One bias-GELU call's signature.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct BiasGeluCall {
    pub x: TensorType,
    /// `[C]`, C the last dimension of `x`.
    pub bias: TensorType,
    /// The result's float type.
    pub out: DType,
}

impl BiasGeluCall {
    /// The shape and dtype rule: `(rows, cols)` of a well-formed call, or what does not fit.
    pub fn dims(&self) -> Result<(usize, usize), String> {
        let (x, b) = (&self.x, &self.bias);
        if !x.dtype.is_float() || !b.dtype.is_float() || !self.out.is_float() {
            return Err(format!("bias_gelu: x, the bias and the result must be floats, got {x}, {b}, {}", self.out));
        }
        let Some(&cols) = x.dims.last() else {
            return Err(format!("bias_gelu: x must have a last axis for the bias, got {x}"));
        };
        if b.dims[..] != [cols] {
            return Err(format!("bias_gelu: the bias must be [{cols}] (x's last axis), got {b}"));
        }
        Ok((x.dims[..x.rank() - 1].iter().product(), cols))
    }

    fn operands(&self) -> Vec<TensorType> {
        vec![self.x.clone(), self.bias.clone()]
    }

    fn output(&self) -> TensorType {
        TensorType::new(self.out, self.x.dims.clone())
    }

    /// The computing type of the composite: f64 for f64 inputs, else f32.
    fn wide(&self) -> DType {
        DType::computing([self.x.dtype, self.bias.dtype])
    }
}

/// The bias-GELU kernel for `call` on `target`, as `want` asks. Made once per (call, target, setting).
pub fn bias_gelu(call: &BiasGeluCall, target: &Target, want: Implementation) -> Result<Arc<KernelDef>, String> {
    static MADE: Made<(BiasGeluCall, Target, Implementation)> = Mutex::new(None);
    made_once(&MADE, (call.clone(), target.clone(), want), || make(call, target, want))
}

fn make(call: &BiasGeluCall, target: &Target, want: Implementation) -> Result<Arc<KernelDef>, String> {
    let (rows, cols) = call.dims()?;
    let operands = call.operands();
    let composite = Program::record(&operands, |b, x| vec![Some(composite(b, call, x))])?;
    let what = format!("{} → {}, {rows} rows of {cols}", call.x.dtype, call.out);
    let (spec, choice) = triton_or_composite(KERNEL, what, (target, want), || triton_spec(call, rows, cols))?;
    let (device, gradient) = match spec {
        Some(spec) => {
            let composite_def = bias_gelu(call, target, Implementation::Composite)?;
            let backward = backward_kernel(call, &spec, &composite_def, choice.clone())?;
            (Some(forward_program(call, &spec)?), Gradient::Program(gradient(call, &backward)?))
        }
        None => (None, Gradient::Composite),
    };
    KernelDef::new(KERNEL, operands, vec![call.output()], device, composite, vec![gradient], choice)
}

fn triton_spec(call: &BiasGeluCall, rows: usize, cols: usize) -> Result<BiasGeluSpec, String> {
    let spec = BiasGeluSpec {
        rows,
        cols,
        x: triton_scalar(call.x.dtype, KERNEL)?,
        bias: triton_scalar(call.bias.dtype, KERNEL)?,
        y: triton_scalar(call.out, KERNEL)?,
    };
    match spec.unsupported() {
        Some(why) => Err(why),
        None => Ok(spec),
    }
}

/// `gelu(x + b)` of operands `x, b`, in lazuli's ops.
fn composite<B: Builder>(b: &mut B, call: &BiasGeluCall, x: &[B::V]) -> B::V {
    let wide = call.wide();
    let dims = call.x.dims.clone();
    let xw = b.convert(&x[0], wide);
    let bias = b.convert(&x[1], wide);
    let bias = b.broadcast(&bias, &dims, &[dims.len() - 1]);
    let u = b.add(&xw, &bias);
    let y = b.op(Op::Gelu(Gelu), &[&u]);
    b.convert(&y, call.out)
}

fn forward_program(call: &BiasGeluCall, spec: &BiasGeluSpec) -> Result<Program, String> {
    let triton = ttbg::forward(spec);
    triton.validate(2, 1)?;
    Program::record(&call.operands(), |b, x| {
        b.call(triton.custom_call(vec![call.output()]), &[&x[0], &x[1]]).into_iter().map(Some).collect()
    })
}

/// The backward as a kernel of its own: operands `x, b, y, dy`, results `dx, db`; its device program the Triton
/// backward and the sum of its partial `db` rows, its composite the composite forward's gradient.
fn backward_kernel(
    call: &BiasGeluCall,
    spec: &BiasGeluSpec,
    composite_def: &Arc<KernelDef>,
    choice: Choice,
) -> Result<Arc<KernelDef>, String> {
    let mut operands = call.operands();
    operands.extend([call.output(), call.output()]);
    let composite =
        Program::record(&operands, |b, x| KernelOp::new(composite_def.clone(), 0).vjp(b, &x[..2], &x[2], &x[3]))?;
    let triton = ttbg::backward(spec);
    triton.validate(3, 2)?;
    let partial = TensorType::new(DType::F32, [spec.backward_programs(), spec.cols]);
    let results = vec![call.x.clone(), partial];
    let device = Program::record(&operands, |b, x| {
        let r = b.call(triton.custom_call(results.clone()), &[&x[0], &x[1], &x[3]]);
        let db = b.sum(&r[1], &[0]);
        vec![Some(r[0].clone()), Some(b.convert(&db, call.bias.dtype))]
    })?;
    let results = vec![call.x.clone(), call.bias.clone()];
    KernelDef::new("bias_gelu_grad", operands, results, Some(device), composite, vec![Gradient::Composite; 2], choice)
}

/// `y`'s gradient: the backward kernel on the operands, `y` and its cotangent.
fn gradient(call: &BiasGeluCall, backward: &Arc<KernelDef>) -> Result<Program, String> {
    let mut inputs = call.operands();
    inputs.extend([call.output(), call.output()]);
    Program::record(&inputs, |b, x| {
        let args = [&x[0], &x[1], &x[2], &x[3]];
        (0..2).map(|i| Some(b.op(Op::Kernel(KernelOp::new(backward.clone(), i)), &args))).collect()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const H200: Target = Target::Cuda { compute_capability: Some((9, 0)) };

    fn call(x: DType, dims: &[usize], out: DType) -> BiasGeluCall {
        let bias = TensorType::new(DType::F32, [dims[dims.len() - 1]]);
        BiasGeluCall { x: TensorType::new(x, dims), bias, out }
    }

    #[test]
    fn the_gpu_gets_triton_and_the_cpu_the_composite_with_the_reason() {
        let c = call(DType::BF16, &[8, 1024, 3072], DType::BF16);
        let gpu = bias_gelu(&c, &H200, Implementation::Auto).expect("gpu");
        assert_eq!(gpu.choice.implementation, "triton");
        assert!(gpu.device.as_ref().expect("device").has_calls());
        let cpu = bias_gelu(&c, &Target::Cpu, Implementation::Auto).expect("cpu");
        assert_eq!(cpu.choice.implementation, "composite");
        let e = bias_gelu(&c, &Target::Cpu, Implementation::Triton).expect_err("forced");
        assert!(e.contains("bias_gelu: Triton was asked for but the device is cpu"), "{e}");
        let mut bad = c.clone();
        bad.bias = TensorType::new(DType::F32, [3071]);
        assert!(bad.dims().expect_err("width").contains("must be [3072]"));
    }

    #[test]
    fn the_composite_is_gelu_of_the_sum() {
        let c = call(DType::F32, &[2, 3], DType::F32);
        let def = bias_gelu(&c, &Target::Cpu, Implementation::Auto).expect("def");
        let x = ndarray::ArrayD::from_shape_vec(vec![2, 3], vec![-2.0, -0.5, 0.0, 0.3, 1.0, 4.0]).unwrap();
        let b = ndarray::ArrayD::from_shape_vec(vec![3], vec![0.1, -0.2, 0.5]).unwrap();
        let y = def.composite.evaluate(&[&x, &b]).remove(0).expect("y");
        for r in 0..2 {
            for c in 0..3 {
                let u: f64 = x[[r, c]] + b[[c]];
                let want = 0.5 * u * (1.0 + (lazuli_hlo::GELU_K * (u + lazuli_hlo::GELU_A * u.powi(3))).tanh());
                assert!((y[[r, c]] - want).abs() < 1e-6, "[{r}, {c}]: {} vs {want}", y[[r, c]]);
            }
        }
    }
}
