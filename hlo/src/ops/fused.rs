//! Fused elementwise expressions: a small chain of unary and binary ops over same-shaped operands (rank-0
//! operands are broadcast) recorded as **one** node. An optimizer update such as AdamW's is a dozen elementwise
//! ops per parameter; as one node per updated tensor, a step's graph is several times smaller to record, walk and
//! hash (PyTorch's fused optimizers make the same trade for the same reason). The compiled program is unchanged:
//! each step lowers through the `Unary`/`Binary` lowering, in the expression's order, and XLA fuses it as before.
//!
//! Every rule is derived from the steps' own rules: the shape rule checks each step, the reference evaluates them
//! in turn (rounding as separate ops would), and the gradient records the expression unfused and runs each step's
//! `vjp` backwards through it (`composite::vjp`), so no expression needs a hand-written derivative.

use crate::infer_error::InferError;
use std::sync::Arc;

use ndarray::{ArrayD, IxDyn};

use crate::builder::Builder;
use crate::dtype::{DType, TensorType};
use crate::emit::LowerCx;
use crate::op::{Op, OpRules};
use crate::ops::composite;
use crate::ops::elementwise::{Binary, BinaryKind, Unary, UnaryKind};

/// A value inside an expression: operand `i`, or the result of step `i`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Ref {
    /// Operand `i` of the expression.
    Arg(u8),
    /// The result of step `i`.
    Step(u8),
}

/// One step of an expression.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Step {
    /// A unary op on a value.
    Unary(UnaryKind, Ref),
    /// A binary op on two values.
    Binary(BinaryKind, Ref, Ref),
}

/// An expression over `args` operands; the last step is the result. Cloning shares the steps.
#[derive(Clone, Debug)]
pub struct Fused {
    /// Its name in diagnostics.
    pub name: &'static str,
    /// The number of operands.
    pub args: u8,
    /// The steps in order; the last one's result is the expression's.
    pub steps: Arc<[Step]>,
    /// Hash of the steps, taken once: every node of this expression hashes it instead of the steps.
    digest: u64,
    /// The result's dtype when every operand has one dtype, per operand dtype, once checked (shared by clones).
    uniform: Arc<UniformChecks>,
}

impl PartialEq for Fused {
    fn eq(&self, other: &Fused) -> bool {
        (self.name, self.args, self.digest, &self.steps) == (other.name, other.args, other.digest, &other.steps)
    }
}
impl Eq for Fused {}

/// Per operand dtype (in `DType::ALL`'s order), the result's dtype of an expression whose operands all have that
/// dtype: 0 until checked, else 1 + the result dtype's index. An optimizer records the same expression on
/// operands of one dtype for every parameter of every step; this answers those without a lookup.
#[derive(Debug, Default)]
struct UniformChecks([std::sync::atomic::AtomicU8; DType::ALL.len()]);

impl UniformChecks {
    /// The slot of `dtype`: its index in `DType::ALL`.
    fn slot(dtype: DType) -> Option<usize> {
        DType::ALL.iter().position(|&d| d == dtype)
    }
    fn get(&self, operand: DType) -> Option<DType> {
        match self.0[Self::slot(operand)?].load(std::sync::atomic::Ordering::Relaxed) {
            0 => None,
            n => Some(DType::ALL[n as usize - 1]),
        }
    }
    fn set(&self, operand: DType, result: DType) {
        if let (Some(i), Some(r)) = (Self::slot(operand), Self::slot(result)) {
            self.0[i].store(r as u8 + 1, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

impl std::hash::Hash for Fused {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        (self.name, self.args, self.digest).hash(h);
    }
}

/// Builds a [`Fused`] expression step by step.
pub struct FusedBuilder {
    name: &'static str,
    args: u8,
    steps: Vec<Step>,
}

impl FusedBuilder {
    /// An expression called `name` (its name in diagnostics) over `args` operands.
    pub fn new(name: &'static str, args: u8) -> FusedBuilder {
        FusedBuilder { name, args, steps: Vec::new() }
    }
    /// Operand `i` (panics if `i` is not below the operand count).
    pub fn arg(&self, i: u8) -> Ref {
        assert!(i < self.args, "fused expression {}: operand {i} of {}", self.name, self.args);
        Ref::Arg(i)
    }
    fn push(&mut self, s: Step) -> Ref {
        self.steps.push(s);
        Ref::Step((self.steps.len() - 1) as u8)
    }
    /// A step applying `k` to `a`; returns its result.
    pub fn unary(&mut self, k: UnaryKind, a: Ref) -> Ref {
        self.push(Step::Unary(k, a))
    }
    /// A step applying `k` to `a` and `b`; returns its result.
    pub fn binary(&mut self, k: BinaryKind, a: Ref, b: Ref) -> Ref {
        self.push(Step::Binary(k, a, b))
    }
    /// `a + b`.
    pub fn add(&mut self, a: Ref, b: Ref) -> Ref {
        self.binary(BinaryKind::Add, a, b)
    }
    /// `a - b`.
    pub fn sub(&mut self, a: Ref, b: Ref) -> Ref {
        self.binary(BinaryKind::Sub, a, b)
    }
    /// `a * b`.
    pub fn mul(&mut self, a: Ref, b: Ref) -> Ref {
        self.binary(BinaryKind::Mul, a, b)
    }
    /// `a / b`.
    pub fn div(&mut self, a: Ref, b: Ref) -> Ref {
        self.binary(BinaryKind::Div, a, b)
    }
    /// The expression, whose result is the last step.
    pub fn finish(self) -> Fused {
        assert!(!self.steps.is_empty(), "fused expression {} has no steps", self.name);
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        self.steps.hash(&mut h);
        Fused {
            name: self.name,
            args: self.args,
            steps: self.steps.into(),
            digest: h.finish(),
            uniform: Arc::default(),
        }
    }
}

impl Step {
    fn op(self) -> Op {
        match self {
            Step::Unary(kind, _) => Op::Unary(Unary { kind }),
            Step::Binary(kind, _, _) => Op::Binary(Binary { kind }),
        }
    }
    /// The step's operands: the first `n` of the array.
    fn refs(&self) -> ([Ref; 2], usize) {
        match *self {
            Step::Unary(_, a) => ([a, a], 1),
            Step::Binary(_, a, b) => ([a, b], 2),
        }
    }
}

impl Fused {
    /// Run the steps over `args` (operands already broadcast to one shape): each step's value from `apply`.
    /// The steps as separate ops on `b`, rank-0 operands broadcast to the result's `dims`: the lowering (each
    /// step through its own op's lowering) and, taped, the gradient.
    fn expand<B: Builder>(&self, b: &mut B, x: &[B::V], dims: &[usize]) -> B::V {
        let args: Vec<_> = x.iter().map(|a| b.broadcast(a, dims, &[])).collect();
        self.run(&args, |op, ins| b.op(op.clone(), ins)).pop().expect("at least one step")
    }

    fn run<V>(&self, args: &[V], mut apply: impl FnMut(&Op, &[&V]) -> V) -> Vec<V> {
        let mut vals: Vec<V> = Vec::with_capacity(self.steps.len());
        for s in self.steps.iter() {
            let (refs, n) = s.refs();
            let at = |r: Ref| match r {
                Ref::Arg(i) => &args[i as usize],
                Ref::Step(i) => &vals[i as usize],
            };
            let v = apply(&s.op(), &[at(refs[0]), at(refs[1])][..n]);
            vals.push(v);
        }
        vals
    }
}

impl OpRules for Fused {
    fn name(&self) -> &'static str {
        self.name
    }
    fn infer(&self, operands: &[&TensorType]) -> Result<TensorType, InferError> {
        if operands.len() != self.args as usize {
            return Err(InferError::Shape(format!(
                "{} takes {} operand(s), got {}",
                self.name,
                self.args,
                operands.len()
            )));
        }
        let full = operands.iter().find(|t| t.rank() > 0).unwrap_or(&operands[0]);
        if let Some(t) = operands.iter().find(|t| t.rank() > 0 && t.dims != full.dims) {
            return Err(InferError::Shape(format!(
                "{}: operand shapes differ: {full} vs {t} (only rank-0 operands broadcast)",
                self.name
            )));
        }
        // Elementwise steps keep the shape, so the result's dtype depends only on the operands' dtypes. Operands of
        // one dtype (every update the optimizers record) are checked once per expression and dtype, then answered
        // from the expression; other mixes are checked by the steps' rules (on rank-0 types) every time.
        let one_dtype = operands.first().map(|t| t.dtype).filter(|&d| operands.iter().all(|t| t.dtype == d));
        if let Some(dtype) = one_dtype.and_then(|d| self.uniform.get(d)) {
            return Ok(TensorType::new(dtype, full.dims.clone()));
        }
        let tys: Vec<TensorType> = operands.iter().map(|t| TensorType::scalar(t.dtype)).collect();
        let mut err = None;
        let out = self.run(&tys, |op, ins| {
            op.infer(ins).unwrap_or_else(|e| {
                err.get_or_insert(e.prefixed(self.name));
                ins[0].clone()
            })
        });
        if let Some(e) = err {
            return Err(e);
        }
        let dtype = out.last().expect("at least one step").dtype;
        if let Some(d) = one_dtype {
            self.uniform.set(d, dtype);
        }
        Ok(TensorType::new(dtype, full.dims.clone()))
    }
    fn lower(&self, cx: &mut LowerCx<'_>) -> String {
        let dims = cx.out_ty().dims.clone();
        composite::lower(cx, |b, x| self.expand(b, x, &dims))
    }
    fn reference(&self, out: &TensorType, x: &[&ArrayD<f64>]) -> ArrayD<f64> {
        let shape = IxDyn(&out.dims);
        let args: Vec<ArrayD<f64>> =
            x.iter().map(|a| a.broadcast(shape.clone()).expect("checked by infer").to_owned()).collect();
        // Round after every step, as the unfused ops would.
        let vals = self.run(&args, |op, ins| op.reference(out, ins).mapv(|v| out.dtype.round(v)));
        vals.last().expect("at least one step").clone()
    }
    fn vjp<B: Builder>(&self, b: &mut B, x: &[B::V], _: &B::V, g: &B::V) -> Vec<Option<B::V>> {
        // Record the expression unfused and run each step's own rule backwards.
        let dims = b.ty(g).dims.clone();
        composite::vjp(b, x, g, |t, x| self.expand(t, x, &dims))
    }
    fn shard(&self, x: &[crate::shard::ShardIn<'_>], out: &TensorType) -> Option<crate::shard::DimShards> {
        crate::shard::elementwise(x, out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The per-dtype answer of an expression whose operands share one dtype: each dtype is checked by the steps'
    /// own rules once, then answered from the expression; a dtype the steps reject stays an error.
    #[test]
    fn a_uniform_dtype_is_checked_once_per_dtype_and_errors_stay_errors() {
        let mut e = FusedBuilder::new("and_then_add", 2);
        let (a, b) = (e.arg(0), e.arg(1));
        let both = e.binary(BinaryKind::And, a, b);
        e.add(both, a);
        let expr = e.finish();
        let clone = expr.clone();
        let ty = |dt| TensorType::new(dt, [3]);
        for _ in 0..2 {
            let (i, s) = (ty(DType::I32), TensorType::scalar(DType::I32));
            assert_eq!(expr.infer(&[&i, &s]).expect("i32 takes `and`"), ty(DType::I32));
            // Clones share the answers: the first call's, or a check of their own, give the same type.
            assert_eq!(clone.infer(&[&i, &i]).expect("i32 takes `and`"), ty(DType::I32));
            let f = ty(DType::F32);
            let err = expr.infer(&[&f, &f]).expect_err("f32 has no `and`");
            assert!(format!("{err:?}").contains("and_then_add"), "{err:?}");
        }
        assert_eq!(expr.uniform.get(DType::I32), Some(DType::I32));
        assert_eq!(expr.uniform.get(DType::F32), None, "an error is not remembered as an answer");
    }
}
