//! The recording interface gradient rules are written against. `lazuli-lazy` implements it for lazy tensors, so
//! each op's vector-Jacobian product lives in hlo beside its shape rule and lowering, yet records lazily.

use crate::dtype::{DType, TensorType};
use crate::op::Op;
use crate::ops::{
    elementwise::{Binary, BinaryKind, Compare, CompareDir, Convert, Select, Unary, UnaryKind},
    layout::{BroadcastInDim, Reshape, Transpose},
    leaf::Constant,
    reduce::{Reduce, ReduceKind},
};

/// Records ops on values of type `V` (lazy tensors). Gradient rules only use `op` and the helpers below.
pub trait Builder {
    type V: Clone;

    /// The static type of a value.
    fn ty<'a>(&'a self, v: &'a Self::V) -> &'a TensorType;

    /// Record `op` on `operands`; the op's shape rule infers the result type. Gradient rules only produce
    /// well-typed ops, so a rule violation here is a bug in a rule, reported with the op's location.
    fn op(&mut self, op: Op, operands: &[&Self::V]) -> Self::V;

    /// Whether a gradient with respect to `v` is wanted. Rules skip recording cotangents nobody will use (a
    /// constant's, a batch's); a builder that cannot tell says yes.
    fn needs_grad(&self, _v: &Self::V) -> bool {
        true
    }

    /// Stop: a gradient rule met an op it cannot differentiate (a `while_loop`'s reverse mode). The lazy
    /// recorder names the forward op's line.
    fn refuse(&mut self, why: &str) -> ! {
        panic!("lazuli: {why}")
    }

    // Helpers, all in terms of `op`.

    /// A constant with every element `value`, of type `ty`.
    fn constant(&mut self, value: f64, ty: TensorType) -> Self::V {
        self.op(Op::Constant(Constant::new(value, ty)), &[])
    }
    /// A constant shaped like `like`.
    fn full_like(&mut self, like: &Self::V, value: f64) -> Self::V {
        let ty = self.ty(like).clone();
        self.constant(value, ty)
    }
    fn binary(&mut self, kind: BinaryKind, a: &Self::V, b: &Self::V) -> Self::V {
        self.op(Op::Binary(Binary { kind }), &[a, b])
    }
    fn add(&mut self, a: &Self::V, b: &Self::V) -> Self::V {
        self.binary(BinaryKind::Add, a, b)
    }
    fn sub(&mut self, a: &Self::V, b: &Self::V) -> Self::V {
        self.binary(BinaryKind::Sub, a, b)
    }
    fn mul(&mut self, a: &Self::V, b: &Self::V) -> Self::V {
        self.binary(BinaryKind::Mul, a, b)
    }
    fn div(&mut self, a: &Self::V, b: &Self::V) -> Self::V {
        self.binary(BinaryKind::Div, a, b)
    }
    fn unary(&mut self, kind: UnaryKind, a: &Self::V) -> Self::V {
        self.op(Op::Unary(Unary { kind }), &[a])
    }
    fn neg(&mut self, a: &Self::V) -> Self::V {
        self.unary(UnaryKind::Neg, a)
    }
    /// `a * value` with `value` a constant of `a`'s type.
    fn scale(&mut self, a: &Self::V, value: f64) -> Self::V {
        let c = self.full_like(a, value);
        self.mul(a, &c)
    }
    fn compare(&mut self, dir: CompareDir, a: &Self::V, b: &Self::V) -> Self::V {
        self.op(Op::Compare(Compare { dir }), &[a, b])
    }
    fn select(&mut self, p: &Self::V, a: &Self::V, b: &Self::V) -> Self::V {
        self.op(Op::Select(Select), &[p, a, b])
    }
    /// `g` where `p` holds, zero elsewhere.
    fn mask(&mut self, p: &Self::V, g: &Self::V) -> Self::V {
        let z = self.full_like(g, 0.0);
        self.select(p, g, &z)
    }
    fn convert(&mut self, a: &Self::V, to: DType) -> Self::V {
        if self.ty(a).dtype == to {
            return a.clone();
        }
        let from = self.ty(a).dtype;
        self.op(Op::Convert(Convert { from, to }), &[a])
    }
    fn reshape(&mut self, a: &Self::V, dims: &[usize]) -> Self::V {
        if self.ty(a).dims[..] == dims[..] {
            return a.clone();
        }
        self.op(Op::Reshape(Reshape { dims: dims.to_vec() }), &[a])
    }
    fn transpose(&mut self, a: &Self::V, perm: &[usize]) -> Self::V {
        if perm.iter().enumerate().all(|(i, &p)| i == p) {
            return a.clone();
        }
        self.op(Op::Transpose(Transpose { perm: perm.to_vec() }), &[a])
    }
    fn broadcast(&mut self, a: &Self::V, dims: &[usize], map: &[usize]) -> Self::V {
        if self.ty(a).dims[..] == dims[..] {
            return a.clone();
        }
        self.op(Op::BroadcastInDim(BroadcastInDim { dims: dims.to_vec(), map: map.to_vec() }), &[a])
    }
    /// Sum over `axes` (sorted, unique), removing them.
    fn sum(&mut self, a: &Self::V, axes: &[usize]) -> Self::V {
        if axes.is_empty() {
            return a.clone();
        }
        self.op(Op::Reduce(Reduce { kind: ReduceKind::Sum, axes: axes.to_vec(), keep: false }), &[a])
    }
    /// Reduce over `axes` (sorted, unique), keeping them as size 1.
    fn reduce_kept(&mut self, kind: ReduceKind, a: &Self::V, axes: &[usize]) -> Self::V {
        self.op(Op::Reduce(Reduce { kind, axes: axes.to_vec(), keep: true }), &[a])
    }
    /// Broadcast `a`, whose rank is `dims`'s, to `dims` (size-1 dimensions expand).
    fn expand(&mut self, a: &Self::V, dims: &[usize]) -> Self::V {
        let map: Vec<usize> = (0..dims.len()).collect();
        self.broadcast(a, dims, &map)
    }
    /// The maximum of `x` along `axis`, kept as size 1, with an infinite maximum taken as 0: the shift that keeps
    /// the softmax family NaN-free (a row that is all -inf stays -inf after it instead of becoming NaN).
    fn finite_max_kept(&mut self, x: &Self::V, axis: usize) -> Self::V {
        let m = self.reduce_kept(ReduceKind::Max, x, &[axis]);
        let inf = self.full_like(&m, f64::INFINITY);
        let am = self.unary(UnaryKind::Abs, &m);
        let infinite = self.compare(CompareDir::Eq, &am, &inf);
        let zero = self.full_like(&m, 0.0);
        self.select(&infinite, &zero, &m)
    }
    /// `log Σ exp x` along `axis` (removed), shifted by [`Builder::finite_max_kept`]: a row that is all -inf gives
    /// -inf.
    fn logsumexp(&mut self, x: &Self::V, axis: usize) -> Self::V {
        let dims = self.ty(x).dims.clone();
        let m = self.finite_max_kept(x, axis);
        let m_full = self.expand(&m, &dims);
        let shifted = self.sub(x, &m_full);
        let e = self.unary(UnaryKind::Exp, &shifted);
        let sum = self.reduce_kept(ReduceKind::Sum, &e, &[axis]);
        let log = self.unary(UnaryKind::Log, &sum);
        let lse = self.add(&log, &m);
        let kept: Vec<usize> = dims.iter().enumerate().filter(|&(d, _)| d != axis).map(|(_, &n)| n).collect();
        self.reshape(&lse, &kept)
    }
    /// The reverse of broadcasting `like`-typed values to `g`'s shape with dimension map `map`: sum `g` over the
    /// added and the expanded dimensions, then reshape to `like`'s dims.
    fn unbroadcast(&mut self, g: &Self::V, like: &[usize], map: &[usize]) -> Self::V {
        let gdims = self.ty(g).dims.clone();
        let axes: Vec<usize> = (0..gdims.len())
            .filter(|d| match map.iter().position(|m| m == d) {
                None => true,
                Some(i) => like[i] == 1 && gdims[*d] != 1,
            })
            .collect();
        // Only expanded size-1 dimensions (no added ones): a sum that keeps them is already `like`-shaped.
        if like.len() == gdims.len() && !axes.is_empty() {
            return self.op(Op::Reduce(Reduce { kind: ReduceKind::Sum, axes, keep: true }), &[g]);
        }
        let s = self.sum(g, &axes);
        self.reshape(&s, like)
    }
}
