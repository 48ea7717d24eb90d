//! Composite ops: one node whose meaning is an *expansion* into other ops, written once against [`Builder`].
//! The same expansion is lowered (each op through its own lowering, as lines of the composite's node), evaluated
//! by the reference interpreter, and differentiated by recording it on a [`Tape`] and running each op's own `vjp`
//! backwards. A composite thus needs no second copy of its formula; what it gains is one node where the
//! expansion would record many, and (where it has one) a hand-written gradient that is one node too.

use crate::infer_error::InferError;
use ndarray::ArrayD;

use crate::builder::Builder;
use crate::dtype::TensorType;
use crate::emit::LowerCx;
use crate::op::Op;

/// Lowers every op recorded on it into the StableHLO of the node being lowered. Values are SSA names with types.
pub(crate) struct Lowering<'c, 'a>(&'c mut LowerCx<'a>);

impl Builder for Lowering<'_, '_> {
    type V = (String, TensorType);
    fn ty<'x>(&'x self, v: &'x Self::V) -> &'x TensorType {
        &v.1
    }
    fn op(&mut self, op: Op, operands: &[&Self::V]) -> Self::V {
        let tys: Vec<&TensorType> = operands.iter().map(|v| &v.1).collect();
        let ty = op.infer(&tys).unwrap_or_else(|e| panic!("a composite's expansion is ill-typed: {e}"));
        let name = self.0.lower_op(&op, operands.iter().map(|v| (v.0.clone(), &v.1)).collect(), &ty);
        (name, ty)
    }
}

/// Lower `expand` applied to the node's operands; returns the SSA name of its result.
pub(crate) fn lower(
    cx: &mut LowerCx<'_>,
    expand: impl FnOnce(&mut Lowering<'_, '_>, &[(String, TensorType)]) -> (String, TensorType),
) -> String {
    let args: Vec<(String, TensorType)> =
        (0..cx.num_args()).map(|i| (cx.arg(i).to_string(), cx.arg_ty(i).clone())).collect();
    expand(&mut Lowering(cx), &args).0
}

/// Evaluates every op recorded on it with the op's reference semantics, rounding each result to its dtype as
/// separate ops would.
pub(crate) struct Evaluating;

impl Builder for Evaluating {
    type V = (ArrayD<f64>, TensorType);
    fn ty<'x>(&'x self, v: &'x Self::V) -> &'x TensorType {
        &v.1
    }
    fn op(&mut self, op: Op, operands: &[&Self::V]) -> Self::V {
        let tys: Vec<&TensorType> = operands.iter().map(|v| &v.1).collect();
        let ty = op.infer(&tys).unwrap_or_else(|e| panic!("a composite's expansion is ill-typed: {e}"));
        let arrays: Vec<&ArrayD<f64>> = operands.iter().map(|v| &v.0).collect();
        let value = op.reference(&ty, &arrays).mapv(|v| ty.dtype.round(v));
        (value, ty)
    }
}

/// The reference value of `expand` on `x`; every operand of a composite has the result's dtype.
pub(crate) fn reference(
    out: &TensorType,
    x: &[&ArrayD<f64>],
    expand: impl FnOnce(&mut Evaluating, &[(ArrayD<f64>, TensorType)]) -> (ArrayD<f64>, TensorType),
) -> ArrayD<f64> {
    let args: Vec<(ArrayD<f64>, TensorType)> =
        x.iter().map(|a| ((*a).clone(), TensorType::new(out.dtype, a.shape()))).collect();
    expand(&mut Evaluating, &args).0
}

/// A value recorded on a [`Tape`]: the outer builder's value and its place on the tape.
#[derive(Clone)]
pub(crate) struct Taped<V> {
    v: V,
    id: usize,
}

/// Records through an outer builder and remembers every op, so that the recording can be run backwards.
pub(crate) struct Tape<'b, B: Builder> {
    b: &'b mut B,
    /// Values by tape id: the operands first, then one per recorded op.
    values: Vec<B::V>,
    /// Each recorded op with its operands' tape ids.
    ops: Vec<(Op, Vec<usize>)>,
    /// Values known for the recorded ops, by their order of recording: the k-th op takes `given[k]` where it is
    /// present instead of being recorded through `b` (a scan's gradient reads the forward's saved values so).
    given: Vec<Option<B::V>>,
}

impl<B: Builder> Builder for Tape<'_, B> {
    type V = Taped<B::V>;
    fn ty<'x>(&'x self, v: &'x Self::V) -> &'x TensorType {
        self.b.ty(&v.v)
    }
    fn op(&mut self, op: Op, operands: &[&Self::V]) -> Self::V {
        let v = match self.given.get(self.ops.len()).cloned().flatten() {
            Some(v) => v,
            None => {
                let ins: Vec<&B::V> = operands.iter().map(|t| &t.v).collect();
                self.b.op(op.clone(), &ins)
            }
        };
        self.values.push(v.clone());
        self.ops.push((op, operands.iter().map(|t| t.id).collect()));
        Taped { v, id: self.values.len() - 1 }
    }
    fn refuse(&mut self, why: &str) -> ! {
        self.b.refuse(why)
    }
}

/// The cotangents of `x` for the expansion `expand` whose result's cotangent is `g`: the expansion is recorded
/// through `b` and each of its ops' `vjp` runs in reverse order.
pub(crate) fn vjp<B: Builder>(
    b: &mut B,
    x: &[B::V],
    g: &B::V,
    expand: impl FnOnce(&mut Tape<'_, B>, &[Taped<B::V>]) -> Taped<B::V>,
) -> Vec<Option<B::V>> {
    vjp_outputs(b, x, &[Some(g.clone())], |t, x| vec![expand(t, x)])
}

/// [`vjp`] for an expansion with several results, each with a cotangent or none (`seeds`, one per result).
pub(crate) fn vjp_outputs<B: Builder>(
    b: &mut B,
    x: &[B::V],
    seeds: &[Option<B::V>],
    expand: impl FnOnce(&mut Tape<'_, B>, &[Taped<B::V>]) -> Vec<Taped<B::V>>,
) -> Vec<Option<B::V>> {
    vjp_outputs_with(b, x, seeds, Vec::new(), expand)
}

/// [`vjp_outputs`] where the k-th op the expansion records has the value `given[k]` where that is present: the op
/// is not recorded again, and the rules of the ops read the given values (a forward pass's saved residuals).
pub(crate) fn vjp_outputs_with<B: Builder>(
    b: &mut B,
    x: &[B::V],
    seeds: &[Option<B::V>],
    given: Vec<Option<B::V>>,
    expand: impl FnOnce(&mut Tape<'_, B>, &[Taped<B::V>]) -> Vec<Taped<B::V>>,
) -> Vec<Option<B::V>> {
    let args: Vec<Taped<B::V>> = x.iter().enumerate().map(|(id, v)| Taped { v: v.clone(), id }).collect();
    let mut tape = Tape { b, values: x.to_vec(), ops: Vec::new(), given };
    let outs = expand(&mut tape, &args);
    let Tape { b, values, ops, .. } = tape;
    let mut cot: Vec<Option<B::V>> = vec![None; values.len()];
    // Two results may be one value (or an operand): their cotangents add.
    for (out, seed) in outs.iter().zip(seeds) {
        let Some(seed) = seed else { continue };
        cot[out.id] = Some(match cot[out.id].take() {
            Some(prev) => b.add(&prev, seed),
            None => seed.clone(),
        });
    }
    let joint = joint_calls(&ops);
    for (k, (op, ins)) in ops.iter().enumerate().rev() {
        let id = x.len() + k;
        let operands: Vec<B::V> = ins.iter().map(|&i| values[i].clone()).collect();
        // The recorded values are this rule's own: every cotangent is wanted, whatever `b` would say of them.
        let grads = match (op, &joint[k]) {
            // A later result of a call with a joint rule: its cotangent waits for the call's first result.
            (_, JointCall::Later) => continue,
            (Op::Kernel(kernel), JointCall::First(results)) => {
                let cotangents: Vec<_> =
                    results.iter().filter_map(|&(r, m)| Some((r, cot[x.len() + m].take()?))).collect();
                match kernel.joint_vjp(&mut AllGrads(&mut *b), &operands, cotangents) {
                    Some(grads) => grads,
                    None => continue,
                }
            }
            _ => {
                let Some(gk) = cot[id].take() else { continue };
                op.vjp(&mut AllGrads(&mut *b), &operands, &values[id], &gk)
            }
        };
        for (&i, d) in ins.iter().zip(grads) {
            let Some(d) = d else { continue };
            cot[i] = Some(match cot[i].take() {
                Some(prev) => b.add(&prev, &d),
                None => d,
            });
        }
    }
    cot.truncate(x.len());
    cot
}

/// Where a recorded op stands among the results of a kernel call with a joint gradient rule (`Gradient::Joint`).
enum JointCall {
    /// Not such a result: its own rule runs.
    No,
    /// The call's first result on the tape, where the rule runs backwards last: every result of the call on the
    /// tape, `(result index, tape op)`, itself included; their cotangents are complete by then.
    First(Vec<(usize, usize)>),
    /// A later result of the call: its cotangent is the first's to take.
    Later,
}

/// For each recorded op, its place among the results of a joint-rule kernel call (`kernel::joint_calls`).
fn joint_calls(ops: &[(Op, Vec<usize>)]) -> Vec<JointCall> {
    let mut out: Vec<JointCall> = ops.iter().map(|_| JointCall::No).collect();
    let calls: Vec<(usize, (&crate::ops::kernel::KernelOp, &Vec<usize>))> = ops
        .iter()
        .enumerate()
        .filter_map(|(k, (op, ins))| match op {
            Op::Kernel(kernel) if kernel.has_joint_gradient() => Some((k, (kernel, ins))),
            _ => None,
        })
        .collect();
    let keyed: Vec<_> = calls.iter().map(|&(_, call)| call).collect();
    for group in crate::ops::kernel::joint_calls(&keyed) {
        let results = group.iter().map(|&i| (calls[i].1 .0.result, calls[i].0)).collect();
        group[1..].iter().for_each(|&i| out[calls[i].0] = JointCall::Later);
        out[calls[group[0]].0] = JointCall::First(results);
    }
    out
}

/// A builder that wants every cotangent (see `Builder::needs_grad`), recording through another. The other is
/// behind `dyn`: a composite inside a composite's expansion would otherwise instantiate rules for ever-deeper
/// wrapper types.
struct AllGrads<'a, V>(&'a mut dyn Builder<V = V>);

impl<V: Clone> Builder for AllGrads<'_, V> {
    type V = V;
    fn ty<'a>(&'a self, v: &'a V) -> &'a TensorType {
        self.0.ty(v)
    }
    fn op(&mut self, op: Op, operands: &[&V]) -> V {
        self.0.op(op, operands)
    }
    fn refuse(&mut self, why: &str) -> ! {
        self.0.refuse(why)
    }
}

/// Check a composite's operands: `n` of one floating-point type, which is the result's.
pub(crate) fn same_float(name: &str, operands: &[&TensorType], n: usize) -> Result<TensorType, InferError> {
    crate::op::arity(name, operands, n)?;
    let t = operands[0];
    if !t.dtype.is_float() {
        return Err(InferError::DType(format!("{name} needs a floating-point operand, got {t}")));
    }
    if let Some(o) = operands.iter().find(|o| **o != t) {
        return Err(InferError::Shape(format!("{name}: operands {t} and {o} differ")));
    }
    Ok(t.clone())
}

/// The rules a composite takes from its `expand(b, x)`: lowering, reference, and sharding as its operands lie
/// (the composites are shape-preserving; XLA reduces across devices where an expansion reduces a split axis).
/// `expanded!(taped)` adds a `vjp` through the expansion, for composites without a hand-written gradient.
macro_rules! expanded {
    () => {
        fn lower(&self, cx: &mut $crate::emit::LowerCx<'_>) -> String {
            $crate::ops::composite::lower(cx, |b, x| self.expand(b, x))
        }
        fn reference(&self, out: &TensorType, x: &[&ndarray::ArrayD<f64>]) -> ndarray::ArrayD<f64> {
            $crate::ops::composite::reference(out, x, |b, x| self.expand(b, x))
        }
        fn shard(&self, x: &[$crate::shard::ShardIn<'_>], out: &TensorType) -> Option<$crate::shard::DimShards> {
            $crate::shard::elementwise(x, out)
        }
    };
    (taped) => {
        $crate::ops::composite::expanded!();
        fn vjp<B: Builder>(&self, b: &mut B, x: &[B::V], _: &B::V, g: &B::V) -> Vec<Option<B::V>> {
            $crate::ops::composite::vjp(b, x, g, |t, x| self.expand(t, x))
        }
    };
}
pub(crate) use expanded;

/// Check `op`'s `vjp` (run on reference values) against central finite differences of its reference semantics,
/// in f64, for the objective `sum(op(x) * w)` with fixed pseudo-random `w`.
#[cfg(test)]
pub(crate) fn check_vjp(op: &Op, inputs: &[ArrayD<f64>]) {
    check_vjp_but(op, inputs, &[]);
}

/// [`check_vjp`] where the operands at `ints` hold integers (class ids) and must have no cotangent. They are
/// typed as integers; every other operand is f64.
#[cfg(test)]
pub(crate) fn check_vjp_but(op: &Op, inputs: &[ArrayD<f64>], ints: &[usize]) {
    use crate::dtype::DType;
    let ty_of =
        |i: usize, a: &ArrayD<f64>| TensorType::new(if ints.contains(&i) { DType::I32 } else { DType::F64 }, a.shape());
    let ty = |a: &ArrayD<f64>| TensorType::new(DType::F64, a.shape());
    let eval = |xs: &[ArrayD<f64>]| {
        let tys: Vec<TensorType> = xs.iter().enumerate().map(|(i, a)| ty_of(i, a)).collect();
        let out = op.infer(&tys.iter().collect::<Vec<_>>()).expect("well-typed");
        op.reference(&out, &xs.iter().collect::<Vec<_>>())
    };
    let out = eval(inputs);
    let w =
        ArrayD::from_shape_vec(out.raw_dim(), (0..out.len()).map(|k| ((k * 7 + 3) % 11) as f64 / 5.0 - 1.0).collect())
            .expect("same element count");
    let objective = |xs: &[ArrayD<f64>]| (eval(xs) * &w).sum();
    let x: Vec<(ArrayD<f64>, TensorType)> = inputs.iter().enumerate().map(|(i, a)| (a.clone(), ty_of(i, a))).collect();
    let grads = op.vjp(&mut Evaluating, &x, &(out.clone(), ty(&out)), &(w.clone(), ty(&w)));
    assert_eq!(grads.len(), inputs.len(), "{}: one cotangent slot per operand", op.name());
    for (i, g) in grads.iter().enumerate() {
        if ints.contains(&i) {
            assert!(g.is_none(), "{}: operand {i} holds integers and has no cotangent", op.name());
            continue;
        }
        let g = g.as_ref().expect("a float operand has a cotangent").0.as_standard_layout().into_owned();
        for k in 0..inputs[i].len() {
            let (mut plus, mut minus) = (inputs.to_vec(), inputs.to_vec());
            let eps = 1e-6;
            plus[i].as_slice_mut().expect("standard layout")[k] += eps;
            minus[i].as_slice_mut().expect("standard layout")[k] -= eps;
            let fd = (objective(&plus) - objective(&minus)) / (2.0 * eps);
            let got = g.as_slice().expect("made standard above")[k];
            assert!(
                (got - fd).abs() <= 1e-6 * (1.0 + fd.abs()),
                "{}: d/d operand {i}[{k}]: vjp {got} vs {fd}",
                op.name()
            );
        }
    }
}

/// Deterministic test values in [-2, 2) of shape `dims`, varied by `seed`.
#[cfg(test)]
pub(crate) fn data(dims: &[usize], seed: usize) -> ArrayD<f64> {
    let n: usize = dims.iter().product();
    let v = (0..n).map(|k| (((k + seed) * 2654435761) % 1000) as f64 / 250.0 - 2.0).collect();
    ArrayD::from_shape_vec(ndarray::IxDyn(dims), v).expect("same element count")
}
