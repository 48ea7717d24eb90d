//! Layer normalization with its scale and shift, `y = (x - mean) / √(var + eps) · w + b` over the last axis, as
//! one kernel whose result may have another float type than `x` (the bf16 a following matmul reads, written by
//! the kernel instead of a conversion of its own). Two implementations: on NVIDIA GPUs, lazuli's Triton kernels
//! (`triton/layer_norm.rs`: a forward that keeps each row's mean and inverse deviation, a backward that writes `dx`
//! and sums `dw` and `db` in the same pass); everywhere else the composite, which is also their reference.
//!
//! Results: `y`, and the f32 row statistics `mean` and `rstd` (`[N]`, `N` the product of the leading dimensions),
//! which only the backward reads. The composite computes in f32 (f64 for f64 inputs) and rounds `y` once, as the
//! kernels do.
//!
//! The added form ([`LayerNormCall::added`]) normalizes `x + a` (or `x + (a + c)`, `c` a bias along the last axis:
//! a linear layer's bf16 product and its bias) and also returns that sum (in `x`'s type): a residual stream's add
//! and the layer norm after it, which XLA cannot fuse into the kernel, in one pass. Operands `x, a, [c,] w, b`;
//! results `y, mean, rstd, sum`. One joint gradient rule serves `y` and the sum: the plain backward's `dx`, computed
//! on the sum, plus the sum's own cotangent, goes on to `x`, `a` and (summed over rows) `c`. On GPUs that rule is
//! one backward kernel (`add_layer_norm_grad`): the add, `a`'s rounding and `c`'s column sums happen in the pass
//! that computes `dx`, not in passes of their own over the cotangent.

use std::sync::{Arc, Mutex};

use lazuli_hlo::{Builder, Choice, DType, Gradient, KernelDef, KernelOp, NormSpec, Normalize, Op, Program, TensorType};
use lazuli_hlo::{Concatenate, OpRules, ReduceKind, Slice, UnaryKind};

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
    /// What is added to `x` before normalizing; `None` for the plain layer norm.
    pub added: Option<Added>,
}

/// The added form's increment: a tensor of `x`'s shape, and perhaps a bias `[D]` added with it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Added {
    pub dtype: DType,
    pub bias: Option<DType>,
}

impl LayerNormCall {
    pub fn new(x: TensorType, params: TensorType, out: DType, eps: f64) -> LayerNormCall {
        LayerNormCall { x, params, out, eps_bits: eps.to_bits(), added: None }
    }

    /// The call that first adds a tensor of `x`'s shape and type `dtype` to `x`, with a bias of type `bias` along
    /// the last axis when there is one.
    pub fn with_added(self, dtype: DType, bias: Option<DType>) -> LayerNormCall {
        LayerNormCall { added: Some(Added { dtype, bias }), ..self }
    }

    /// The call without the added tensor: its backward is the added form's, on the sum.
    fn plain(&self) -> LayerNormCall {
        LayerNormCall { added: None, ..self.clone() }
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
        let mut added = self.added.iter().flat_map(|a| [Some(a.dtype), a.bias]).flatten();
        if let Some(a) = added.find(|a| !a.is_float()) {
            return Err(format!("layer_norm: the tensor added to x and its bias must be floats, got {a}"));
        }
        if !(self.eps() > 0.0 && self.eps().is_finite()) {
            return Err(format!("layer_norm: eps must be positive and finite, got {}", self.eps()));
        }
        Ok((x.dims[..x.rank() - 1].iter().product(), width))
    }

    /// `x, w, b`, or `x, a, [c,] w, b` in the added form.
    fn operands(&self) -> Vec<TensorType> {
        let width = self.x.dims.last().copied().unwrap_or(0);
        let added = self.added.iter().flat_map(|a| {
            let bias = a.bias.map(|c| TensorType::new(c, [width]));
            [Some(TensorType::new(a.dtype, self.x.dims.clone())), bias]
        });
        let params = [self.params.clone(), self.params.clone()];
        [self.x.clone()].into_iter().chain(added.flatten()).chain(params).collect()
    }

    /// Where `w` is among the operands.
    fn scale_index(&self) -> usize {
        1 + self.added.map_or(0, |a| 1 + a.bias.is_some() as usize)
    }

    /// `y, mean, rstd`, and `x + a` in the added form.
    fn results(&self, rows: usize) -> Vec<TensorType> {
        let sum = self.added.map(|_| self.x.clone());
        [self.output(), self.stats(rows), self.stats(rows)].into_iter().chain(sum).collect()
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
    let composite = Program::record(&operands, |b, x| composite_results(b, call, rows, x))?;
    let added = call.added.map_or(String::new(), |a| match a.bias {
        Some(c) => format!(" added to {} and a {c} bias", a.dtype),
        None => format!(" added to {}", a.dtype),
    });
    let what = format!("{}{added} → {}, {rows} rows of {width}", call.x.dtype, call.out);
    let (spec, choice) = triton_or_composite(KERNEL, what, (target, want), || triton_spec(call, rows, width))?;
    // `y` and, in the added form, the sum carry gradients; the statistics none.
    let (device, carried) = match spec {
        Some(spec) => {
            let plain = call.plain();
            let composite_def = layer_norm(&plain, target, Implementation::Composite)?;
            let backward = backward_kernel(&plain, rows, &spec.plain(), &composite_def, choice.clone())?;
            let carried = match call.added {
                Some(added) => {
                    let joint = joint_backward_kernel(call, added, &spec, &backward, choice.clone())?;
                    Gradient::Joint(joint_gradient(call, rows, &joint)?)
                }
                None => Gradient::Program(gradient(call, rows, &backward)?),
            };
            (Some(forward_program(call, rows, &spec)?), carried)
        }
        None => (None, Gradient::Composite),
    };
    let sum = call.added.map(|_| carried.clone());
    let gradients = [carried, Gradient::None, Gradient::None].into_iter().chain(sum).collect();
    KernelDef::new(KERNEL, operands, call.results(rows), device, composite, gradients, choice)
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
        added: call.added.map(|a| triton_scalar(a.dtype, KERNEL)).transpose()?,
        added_bias: call.added.and_then(|a| a.bias).map(|c| triton_scalar(c, KERNEL)).transpose()?,
    };
    match spec.unsupported() {
        Some(why) => Err(why),
        None => Ok(spec),
    }
}

const KERNEL: &str = "layer_norm";

/// Every result of the call on its operands, in lazuli's ops: the added form's sum rounded to `x`'s type, then the
/// plain layer norm of it.
fn composite_results<B: Builder>(b: &mut B, call: &LayerNormCall, rows: usize, x: &[B::V]) -> Vec<Option<B::V>> {
    let p = call.scale_index();
    let (normalized, sum) = match call.added {
        Some(added) => {
            let wide = call.wide();
            let (xw, aw) = (b.convert(&x[0], wide), b.convert(&x[1], wide));
            let mut sum = b.add(&xw, &aw);
            if added.bias.is_some() {
                let c = b.convert(&x[2], wide);
                let last = call.x.rank() - 1;
                let c = b.broadcast(&c, &call.x.dims, &[last]);
                sum = b.add(&sum, &c);
            }
            let sum = b.convert(&sum, call.x.dtype);
            (sum.clone(), Some(sum))
        }
        None => (x[0].clone(), None),
    };
    let (y, mean, rstd) = composite(b, call, rows, &normalized, &x[p..]);
    [Some(y), Some(mean), Some(rstd)].into_iter().chain(sum.map(Some)).collect()
}

/// `(y, mean, rstd)` of `x` and the scale and shift `params`, in lazuli's ops.
fn composite<B: Builder>(
    b: &mut B,
    call: &LayerNormCall,
    rows: usize,
    x: &B::V,
    params: &[B::V],
) -> (B::V, B::V, B::V) {
    let wide = call.wide();
    let dims = call.x.dims.clone();
    let last = dims.len() - 1;
    let xw = b.convert(x, wide);
    let normalized = b.op(Op::Normalize(Normalize(NormSpec::new(vec![last], call.eps()))), &[&xw]);
    let affine = |b: &mut B, p: &B::V| {
        let p = b.convert(p, wide);
        b.broadcast(&p, &dims, &[last])
    };
    let (w, shift) = (affine(b, &params[0]), affine(b, &params[1]));
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

/// The forward program: the Triton call on the operands.
fn forward_program(call: &LayerNormCall, rows: usize, spec: &LayerNormSpec) -> Result<Program, String> {
    let triton = ttln::forward(spec);
    let (operands, results) = (call.operands(), call.results(rows));
    triton.validate(operands.len(), results.len())?;
    Program::record(&operands, |b, x| {
        let args: Vec<&_> = x.iter().collect();
        b.call(triton.custom_call(results.clone()), &args).into_iter().map(Some).collect()
    })
}

/// The backward as a kernel of its own. Operands `x, w, b, y, dy, mean, rstd`; results `dx` and the column sums
/// `[dw; db]` as one f32 `[2, width]` (see [`column_sums`]). Its device program is the Triton backward and the sum of
/// its programs' partial rows; its composite the composite forward's gradient.
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
    let width = spec.width;
    let composite = Program::record(&operands, |b, x| {
        let g = KernelOp::new(composite_def.clone(), 0).vjp(b, &x[..3], &x[3], &x[4]);
        let [Some(dx), Some(dw), Some(db)] = &g[..] else { unreachable!("a layer norm's vjp has its three gradients") };
        vec![Some(dx.clone()), Some(stack_rows(b, &[dw, db], width))]
    })?;
    let triton = ttln::backward(spec);
    triton.validate(5, 2)?;
    let partial = TensorType::new(DType::F32, [spec.backward_programs(), 2, width]);
    let device = Program::record(&operands, |b, x| {
        let (xv, w, dy, mean, rstd) = (&x[0], &x[1], &x[4], &x[5], &x[6]);
        let r = b.call(triton.custom_call(vec![call.x.clone(), partial.clone()]), &[xv, w, dy, mean, rstd]);
        vec![Some(r[0].clone()), Some(b.sum(&r[1], &[0]))]
    })?;
    let results = vec![call.x.clone(), TensorType::new(DType::F32, [2, width])];
    KernelDef::new("layer_norm_grad", operands, results, Some(device), composite, vec![Gradient::Composite; 2], choice)
}

/// `y`'s gradient: the backward kernel on the operands, `y`, its cotangent and the forward's statistics.
fn gradient(call: &LayerNormCall, rows: usize, backward: &Arc<KernelDef>) -> Result<Program, String> {
    let mut inputs = call.operands();
    inputs.extend([call.output(), call.output()]);
    Program::record(&inputs, |b, x| {
        let mean = b.sibling(1, call.stats(rows));
        let rstd = b.sibling(2, call.stats(rows));
        let args = [&x[0], &x[1], &x[2], &x[3], &x[4], &mean, &rstd];
        let dx = kernel_result(b, backward, 0, &args);
        let dw_db = column_sums(b, backward, 1, &args, &[call.params.dtype; 2]);
        [dx].into_iter().chain(dw_db).map(Some).collect()
    })
}

/// The added form's gradient, one rule for `y`'s and the sum's cotangents (`Gradient::Joint`): the joint backward
/// kernel on the sum, `y`'s cotangent and the sum's, whose results are the addends' and the scale's and shift's.
/// Per result, autodiff would add the two cotangents at each addend instead: a second conversion for `a` and a
/// second column sum for the bias.
fn joint_gradient(call: &LayerNormCall, rows: usize, joint: &Arc<KernelDef>) -> Result<Program, String> {
    let operands = call.operands();
    let mut inputs = operands.clone();
    inputs.extend(call.results(rows));
    Program::record(&inputs, |b, x| {
        let (n, p) = (operands.len(), call.scale_index());
        let (mean, rstd) = (b.sibling(1, call.stats(rows)), b.sibling(2, call.stats(rows)));
        let (y, sum) = (b.sibling(0, call.output()), b.sibling(3, call.x.clone()));
        let (dy, dsum) = (&x[n], &x[n + 3]);
        let args = [&sum, &x[p], &x[p + 1], &y, dy, &mean, &rstd, dsum];
        let (dx, da) = (kernel_result(b, joint, 0, &args), kernel_result(b, joint, 1, &args));
        // Operand order: x, a, [c,] w, b; the kernel's column sums: dw, db, [dc].
        let dtypes: Vec<DType> = [call.params.dtype; 2].into_iter().chain(call.added.and_then(|a| a.bias)).collect();
        let mut sums = column_sums(b, joint, 2, &args, &dtypes);
        let dc = sums.split_off(2);
        [dx, da].into_iter().chain(dc).chain(sums).map(Some).collect()
    })
}

/// The added form's backward as a kernel of its own. Operands the plain backward's (`x` the sum, `w, b, y, dy,
/// mean, rstd`) and `ds`, the sum's cotangent; results `dx + ds` (the cotangent of `x`), the same in the addend's
/// type, and the column sums `[dw; db; dc]` as one f32 `[n, width]` (`dc`, the bias's, only with a bias). Its
/// device program is the Triton backward of the added form (the add, the addend's rounding and the bias's sums in
/// the pass that computes `dx`) and one reduction of the programs' partial sums; its composite the plain
/// backward's results, added to and summed in lazuli's ops.
fn joint_backward_kernel(
    call: &LayerNormCall,
    added: Added,
    spec: &LayerNormSpec,
    plain_backward: &Arc<KernelDef>,
    choice: Choice,
) -> Result<Arc<KernelDef>, String> {
    let mut operands = plain_backward.operands.clone();
    operands.push(call.x.clone());
    let width = spec.width;
    let n = spec.backward_sums();
    let (dx, da) = (call.x.clone(), TensorType::new(added.dtype, call.x.dims.clone()));
    let results = vec![dx.clone(), da.clone(), TensorType::new(DType::F32, [n, width])];
    let composite = Program::record(&operands, |b, x| {
        let args: Vec<&_> = x[..7].iter().collect();
        let (dx, dw_db) = (kernel_result(b, plain_backward, 0, &args), kernel_result(b, plain_backward, 1, &args));
        let total = b.add(&x[7], &dx);
        let rows: Vec<usize> = (0..call.x.rank() - 1).collect();
        let dc = added.bias.map(|_| b.sum(&total, &rows));
        let sums = match dc {
            Some(dc) => {
                let dc = stack_rows(b, &[&dc], width);
                b.op(Op::Concatenate(Concatenate { dim: 0 }), &[&dw_db, &dc])
            }
            None => dw_db,
        };
        vec![Some(total.clone()), Some(b.convert(&total, added.dtype)), Some(sums)]
    })?;
    let triton = ttln::backward(spec);
    triton.validate(6, 3)?;
    let partial = TensorType::new(DType::F32, [spec.backward_programs(), n, width]);
    let device = Program::record(&operands, |b, x| {
        let (xv, w, dy, mean, rstd, ds) = (&x[0], &x[1], &x[4], &x[5], &x[6], &x[7]);
        let r = b.call(triton.custom_call(vec![dx.clone(), da.clone(), partial.clone()]), &[xv, w, dy, mean, rstd, ds]);
        vec![Some(r[0].clone()), Some(r[1].clone()), Some(b.sum(&r[2], &[0]))]
    })?;
    let gradients = vec![Gradient::Composite; results.len()];
    KernelDef::new("add_layer_norm_grad", operands, results, Some(device), composite, gradients, choice)
}

/// Result `r` of `def` on `args`, a backward kernel's `[n, width]` f32 column sums, as `n` gradients of `[width]`,
/// row `i` in `dtypes[i]`. One tensor for all of a call's sums, sliced apart in the graph rather than inside the
/// kernel: where the gradients are a program's outputs (the first program of a split step) the sums are one
/// output, and the program that reads them slices them inside its own fusions, instead of each row being written
/// out by a copy of its own.
fn column_sums<B: Builder>(b: &mut B, def: &Arc<KernelDef>, r: usize, args: &[&B::V], dtypes: &[DType]) -> Vec<B::V> {
    let sums = kernel_result(b, def, r, args);
    let dims = def.results[r].dims.clone();
    let row = |b: &mut B, (i, &dtype): (usize, &DType)| {
        let row = b.op(Op::Slice(Slice::along(&dims, 0, i, i + 1, 1)), &[&sums]);
        let row = b.reshape(&row, &dims[1..]);
        b.convert(&row, dtype)
    };
    dtypes.iter().enumerate().map(|r| row(b, r)).collect()
}

/// `[width]` vectors stacked as the rows of one f32 `[n, width]`, as the backward kernels return column sums.
fn stack_rows<B: Builder>(b: &mut B, rows: &[&B::V], width: usize) -> B::V {
    let rows: Vec<B::V> = rows
        .iter()
        .map(|r| {
            let r = b.convert(r, DType::F32);
            b.reshape(&r, &[1, width])
        })
        .collect();
    match &rows[..] {
        [one] => one.clone(),
        _ => b.op(Op::Concatenate(Concatenate { dim: 0 }), &rows.iter().collect::<Vec<_>>()),
    }
}

/// Result `i` of `def` on `args`.
fn kernel_result<B: Builder>(b: &mut B, def: &Arc<KernelDef>, i: usize, args: &[&B::V]) -> B::V {
    b.op(Op::Kernel(KernelOp::new(def.clone(), i)), args)
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

    /// The added form: four operands and results, a device program and one joint gradient rule on the GPU, and a
    /// composite that normalizes the sum it returns (with a linear layer's bias added, five operands).
    #[test]
    fn the_added_form_returns_the_sum_and_normalizes_it() {
        let c = call(&[2, 3, 5], DType::BF16).with_added(DType::BF16, None);
        let gpu = layer_norm(&c, &H200, Implementation::Auto).expect("gpu");
        assert_eq!((gpu.operands.len(), gpu.results.len()), (4, 4));
        assert_eq!(gpu.results[3], TensorType::new(DType::F32, [2, 3, 5]));
        assert!(gpu.device.as_ref().is_some_and(|d| d.has_calls()));
        assert!(gpu.choice.reason.contains("added to bf16"), "{}", gpu.choice.reason);
        let rules: Vec<bool> = gpu.gradients.iter().map(|g| matches!(g, Gradient::Joint(_))).collect();
        assert_eq!(rules, [true, false, false, true]);
        let plain = layer_norm(&call(&[2, 3, 5], DType::BF16), &H200, Implementation::Auto).expect("plain");
        assert_ne!(plain.device, gpu.device);
        let e = layer_norm(&call(&[4, 6], DType::F32).with_added(DType::I32, None), &H200, Implementation::Auto);
        assert!(e.expect_err("ints").contains("must be floats"));
        // With a linear layer's bias: the joint backward kernel's device program and composite both return the
        // addends' cotangents and the bias's (`KernelDef::new` checks each program against the results).
        let biased = call(&[8, 1024, 768], DType::BF16).with_added(DType::BF16, Some(DType::F32));
        let gpu = layer_norm(&biased, &H200, Implementation::Auto).expect("biased gpu");
        let Gradient::Joint(rule) = &gpu.gradients[0] else { panic!("a joint rule") };
        let want = [DType::F32, DType::BF16, DType::F32, DType::F32, DType::F32];
        assert_eq!(rule.output_types().iter().map(|t| t.expect("every operand").dtype).collect::<Vec<_>>(), want);

        let c = call(&[2, 5], DType::F32).with_added(DType::F32, Some(DType::F32));
        let cpu = layer_norm(&c, &Target::Cpu, Implementation::Auto).expect("cpu");
        assert!(cpu.device.is_none() && cpu.operands.len() == 5);
        let x = ndarray::ArrayD::from_shape_fn(vec![2, 5], |i| ((i[0] * 5 + i[1]) as f64 * 0.61).cos());
        let a = ndarray::ArrayD::from_shape_fn(vec![2, 5], |i| (i[0] as f64 - i[1] as f64) * 0.3);
        let lin = ndarray::ArrayD::from_shape_fn(vec![5], |i| 0.25 - i[0] as f64 * 0.15);
        let w = ndarray::ArrayD::from_shape_fn(vec![5], |i| 0.5 + i[0] as f64 * 0.2);
        let bias = ndarray::ArrayD::from_shape_fn(vec![5], |i| i[0] as f64 * 0.1);
        let out = cpu.composite.evaluate(&[&x, &a, &lin, &w, &bias]);
        let (y, sum) = (out[0].as_ref().unwrap(), out[3].as_ref().unwrap());
        for r in 0..2 {
            let row: Vec<f64> = (0..5).map(|k| x[[r, k]] + a[[r, k]] + lin[[k]]).collect();
            let m = row.iter().sum::<f64>() / 5.0;
            let s = 1.0 / (row.iter().map(|v| (v - m).powi(2)).sum::<f64>() / 5.0 + 1e-5).sqrt();
            for k in 0..5 {
                assert!((sum[[r, k]] - row[k]).abs() < 1e-6, "sum [{r}, {k}]");
                assert!((y[[r, k]] - ((row[k] - m) * s * w[[k]] + bias[[k]])).abs() < 1e-5, "y [{r}, {k}]");
            }
        }
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
