//! Gradient clipping by the global norm, recorded into the step's graph like the optimizers' updates.

use lazuli_hlo::{BinaryKind, DType, Loc, Op, Reduce, ReduceKind, Unary, UnaryKind};

use crate::graph::autodiff::no_grad;
use crate::graph::constants::constant_like;
use crate::graph::record::{apply, fail};
use crate::graph::tensor::Tensor;
use crate::train::nn::Param;

/// PyTorch's `clip_grad_norm_`: scale every gradient in `params` by `min(1, max_norm / (total + 1e-6))`, where
/// `total` is the L2 norm of all their gradients together, and return `total` (before clipping), a scalar.
/// Parameters without a gradient are skipped; with none at all the result is 0.
///
/// Everything is recorded on the device, nothing is read: the norm and the scale are tensor ops of the step's
/// program, the gradients' `grad()` become their scaled values (pending like them), and `max_norm` enters as a
/// host scalar (a program parameter, so a new value does not recompile). Call it between `backward()` and the
/// optimizer's `step()`. The norm is accumulated in f32 (f64 when a gradient is f64), the result has that dtype,
/// and each gradient keeps its own. Panics at the caller's line when `max_norm` is negative or NaN.
#[track_caller]
pub fn clip_grad_norm(params: &[Param], max_norm: f64) -> Tensor {
    let loc = Loc::caller();
    if max_norm.is_nan() || max_norm < 0.0 {
        fail(loc, format!("clip_grad_norm: max_norm must be ≥ 0, got {max_norm}"));
    }
    let grads: Vec<(&Param, Tensor)> = params.iter().filter_map(|p| p.grad_at(loc).map(|g| (p, g))).collect();
    let wide = DType::computing(grads.iter().map(|(_, g)| g.dtype()));
    no_grad(|| {
        let mut squares: Option<Tensor> = None;
        for (_, g) in &grads {
            let g = g.to_dtype_at(wide, loc);
            let sq = g.binary_at(&g, BinaryKind::Mul, loc);
            let all: Vec<usize> = (0..sq.rank()).collect();
            let s = apply(Op::Reduce(Reduce { kind: ReduceKind::Sum, axes: all, keep: false }), &[&sq], loc);
            squares = Some(match squares {
                Some(acc) => acc.binary_at(&s, BinaryKind::Add, loc),
                None => s,
            });
        }
        let Some(squares) = squares else {
            return Tensor::scalar_of(wide, 0.0);
        };
        let total = apply(Op::Unary(Unary { kind: UnaryKind::Sqrt }), &[&squares], loc);
        let max = Tensor::scalar_of(wide, max_norm);
        let constant = |v: f64| constant_like(v, wide, &[], loc);
        let coef = max
            .binary_at(total.binary_at(constant(1e-6), BinaryKind::Add, loc), BinaryKind::Div, loc)
            .binary_at(constant(1.0), BinaryKind::Min, loc);
        for (p, g) in &grads {
            let scaled = g.binary_at(coef.to_dtype_at(g.dtype(), loc), BinaryKind::Mul, loc);
            p.set_grad(scaled);
        }
        total
    })
}
