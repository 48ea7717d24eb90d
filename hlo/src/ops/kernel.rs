//! Custom kernels as one op family. A kernel is data ([`KernelDef`]): the operand and result types it was built
//! for, its composite (what it computes, as a [`Program`] of lazuli's ops), the device implementation chosen
//! when it was recorded (a program around cuDNN or Triton custom calls, or none: the composite), one gradient
//! rule per result, and why that implementation was chosen. The kernels themselves are made in `lazuli-kernels`;
//! here they get the five rules every op has, derived from those programs:
//!
//! - shape: the types the kernel was built for;
//! - lowering: the device program if there is one, else the composite's ops (each op's own lowering);
//! - reference: the composite, evaluated op by op;
//! - gradient: the result's gradient program (which may call backward kernels), or autodiff through the
//!   composite, or one joint program over all results' cotangents (autodiff gives it every result's at once);
//! - sharding: through the composite's ops; a custom call runs on whole operands.
//!
//! A kernel with several results is recorded as one node per result ([`KernelOp::result`]); the emitter lowers
//! the kernel once per operand list and each node picks its result, so a forward call's second result (say,
//! attention's softmax statistics, which its backward reads) costs no second call.

use crate::infer_error::InferError;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use ndarray::ArrayD;

use crate::builder::Builder;
use crate::dtype::TensorType;
use crate::emit::LowerCx;
use crate::op::OpRules;
use crate::ops::result_of::{ResultOf, SharedDef};
use crate::program::Program;
use crate::shard::{DimShards, ShardIn};

/// How the gradient of one of a kernel's results is computed.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Gradient {
    /// The result carries no gradient (integer results, statistics only a backward reads).
    None,
    /// Autodiff through the composite's ops.
    Composite,
    /// A program on (operands…, result, result's cotangent) returning one cotangent per operand (or none).
    Program(Program),
    /// One program for the whole call, on (operands…, one cotangent per result) returning one cotangent per
    /// operand (or none); every result that carries a gradient holds the same program. Autodiff calls it once
    /// per call with every result's cotangent (zeros for results without one), so that the cotangents are
    /// combined inside it: a sum and a layer norm of it need one pass over `d sum + d(layer norm)`, not two. The
    /// rule is linear in the cotangents, so calling it per result with zeros elsewhere gives the same gradient.
    Joint(Program),
}

/// Which implementation a kernel runs with and why, for events and reports:
/// `attention at src/model.rs:42: composite (head dim 80 is not supported by cuDNN)`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Choice {
    /// `cudnn`, `triton` or `composite`.
    pub implementation: &'static str,
    /// Why this one (and why not the others).
    pub reason: String,
}

/// A kernel built for one signature. Made by `lazuli-kernels` (or a user's custom kernel) and shared by every node
/// that calls it; compared and hashed by content, with the hash taken once.
#[derive(Clone, Debug)]
pub struct KernelDef {
    /// Its op name in diagnostics (`attention`, a user kernel's name).
    pub name: &'static str,
    pub operands: Vec<TensorType>,
    pub results: Vec<TensorType>,
    /// The device implementation (custom calls and the ops around them), or `None` for the composite.
    pub device: Option<Program>,
    /// What the kernel computes, with lazuli's ops: the fallback, the reference and the default gradient.
    pub composite: Program,
    /// One rule per result.
    pub gradients: Vec<Gradient>,
    pub choice: Choice,
    /// For a kernel whose first result's gradient is computed ahead for a unit cotangent (`backward()`'s seed),
    /// the kernel to record in its place when the cotangent turns out to be anything else (the lazy autodiff
    /// swaps them): it would otherwise scale a precomputed gradient in a pass of its own. Set with
    /// [`KernelDef::with_scaled_alternative`].
    pub scaled_alternative: Option<Arc<KernelDef>>,
    hash: u64,
}

impl KernelDef {
    /// Check that the programs fit the signature and make the kernel.
    pub fn new(
        name: &'static str,
        operands: Vec<TensorType>,
        results: Vec<TensorType>,
        device: Option<Program>,
        composite: Program,
        gradients: Vec<Gradient>,
        choice: Choice,
    ) -> Result<Arc<KernelDef>, String> {
        let want_results: Vec<Option<&TensorType>> = results.iter().map(Some).collect();
        let fits = |what: &str, p: &Program| -> Result<(), String> {
            if p.inputs != operands {
                return Err(format!("{name}: the {what} takes {:?}, the kernel's operands are {operands:?}", p.inputs));
            }
            if p.output_types() != want_results {
                let got: Vec<String> =
                    p.output_types().iter().map(|t| t.map_or("none".into(), |t| t.to_string())).collect();
                let want: Vec<String> = results.iter().map(|t| t.to_string()).collect();
                return Err(format!(
                    "{name}: the {what} returns ({}), the kernel's results are ({})",
                    got.join(", "),
                    want.join(", ")
                ));
            }
            Ok(())
        };
        fits("composite", &composite)?;
        if composite.has_calls() {
            return Err(format!("{name}: the composite may not contain custom calls"));
        }
        if let Some(d) = &device {
            fits("device program", d)?;
        }
        if gradients.len() != results.len() {
            return Err(format!("{name}: {} gradient rules for {} results", gradients.len(), results.len()));
        }
        let mut joint: Option<&Program> = None;
        for (r, g) in gradients.iter().enumerate() {
            if let Gradient::Joint(p) = g {
                let mut inputs = operands.clone();
                inputs.extend(results.iter().cloned());
                let fits = p.inputs == inputs && p.outputs.len() == operands.len();
                let same = joint.is_none_or(|j| j == p);
                if !fits || !same {
                    return Err(format!(
                        "{name}: result {r}'s joint gradient must take (operands, a cotangent per result), return one \
                         cotangent per operand, and be the one every joint result holds"
                    ));
                }
                joint = Some(p);
            }
            if let Gradient::Program(p) = g {
                let mut inputs = operands.clone();
                inputs.extend([results[r].clone(), results[r].clone()]);
                if p.inputs != inputs || p.outputs.len() != operands.len() {
                    return Err(format!(
                        "{name}: result {r}'s gradient must take (operands, result, cotangent) and return one \
                         cotangent per operand"
                    ));
                }
                for (i, t) in p.output_types().into_iter().enumerate() {
                    if t.is_some_and(|t| *t != operands[i]) {
                        return Err(format!("{name}: result {r}'s gradient for operand {i} is {t:?}"));
                    }
                }
            }
        }
        let mut h = std::hash::DefaultHasher::new();
        (name, &operands, &results, &device, &composite, &gradients, &choice).hash(&mut h);
        let hash = h.finish();
        let scaled_alternative = None;
        Ok(Arc::new(KernelDef {
            name,
            operands,
            results,
            device,
            composite,
            gradients,
            choice,
            scaled_alternative,
            hash,
        }))
    }

    /// `def` with `alternative` as its [`KernelDef::scaled_alternative`]: a kernel of the same operands whose
    /// first result is `def`'s, and whose gradient takes any cotangent.
    pub fn with_scaled_alternative(def: Arc<KernelDef>, alternative: Arc<KernelDef>) -> Result<Arc<KernelDef>, String> {
        if alternative.operands != def.operands || alternative.results.first() != def.results.first() {
            let (name, alt) = (def.name, alternative.name);
            return Err(format!("{name}: the alternative {alt} has other operands or another first result"));
        }
        Ok(Arc::new(KernelDef { scaled_alternative: Some(alternative), ..Arc::unwrap_or_clone(def) }))
    }

    /// Lower the kernel on the node's operands: its device program if it has one, else its composite.
    fn lower_all(&self, cx: &mut LowerCx<'_>) -> Vec<String> {
        let inputs: Vec<String> = (0..cx.num_args()).map(|i| cx.arg(i).to_string()).collect();
        let program = self.device.as_ref().unwrap_or(&self.composite);
        program.lower(cx, inputs).into_iter().map(|o| o.expect("a kernel's programs return every result")).collect()
    }
}

impl PartialEq for KernelDef {
    fn eq(&self, other: &Self) -> bool {
        self.hash == other.hash
            && self.name == other.name
            && self.operands == other.operands
            && self.results == other.results
            && self.device == other.device
            && self.composite == other.composite
            && self.gradients == other.gradients
            && self.choice == other.choice
    }
}

impl Eq for KernelDef {}

impl SharedDef for KernelDef {
    fn def_name(&self) -> &'static str {
        self.name
    }
    fn result_count(&self) -> usize {
        self.results.len()
    }
    fn content_hash(&self) -> u64 {
        self.hash
    }
}

/// One result of a kernel call: the op of a node.
pub type KernelOp = ResultOf<KernelDef>;

impl KernelOp {
    /// Whether this result's gradient is the call's joint rule ([`Gradient::Joint`]).
    pub fn has_joint_gradient(&self) -> bool {
        matches!(self.def.gradients[self.result], Gradient::Joint(_))
    }

    /// The call's joint rule on operands `x` and its results' cotangents, given as `(result, cotangent)` pairs
    /// (several for one result are added; zeros stand in for a result without any). `None` when no cotangent is
    /// given (nothing to propagate) or the kernel has no joint rule.
    pub fn joint_vjp<B: Builder>(
        &self,
        b: &mut B,
        x: &[B::V],
        cotangents: impl IntoIterator<Item = (usize, B::V)>,
    ) -> Option<Vec<Option<B::V>>> {
        let program = self.def.gradients.iter().find_map(|g| match g {
            Gradient::Joint(p) => Some(p),
            _ => None,
        })?;
        let mut by_result: Vec<Option<B::V>> = vec![None; self.def.results.len()];
        for (r, g) in cotangents {
            by_result[r] = Some(match by_result[r].take() {
                Some(prev) => b.add(&prev, &g),
                None => g,
            });
        }
        if by_result.iter().all(Option::is_none) {
            return None;
        }
        let mut inputs = x.to_vec();
        for (r, g) in by_result.into_iter().enumerate() {
            inputs.push(g.unwrap_or_else(|| b.constant(0.0, self.def.results[r].clone())));
        }
        Some(program.replay(b, &inputs, Some((&self.def, x))))
    }
}

/// Results of kernel calls with a joint gradient rule ([`Gradient::Joint`]), grouped by call. `results` holds each
/// such result with what identifies its operands (their nodes, their places on a tape): results of one call are
/// the same kernel on the same operands, as the emitter lowers them once. Each group lists indices into `results`
/// in its order. Autodiff runs a call's rule at its first result in topological order, the last one a backward
/// pass reaches, when every result's cotangent is complete.
pub fn joint_calls<K: PartialEq>(results: &[(&KernelOp, K)]) -> Vec<Vec<usize>> {
    let mut grouped = vec![false; results.len()];
    let mut groups = Vec::new();
    for (i, (op, key)) in results.iter().enumerate() {
        if grouped[i] {
            continue;
        }
        let same = |j: &usize| !grouped[*j] && Arc::ptr_eq(&results[*j].0.def, &op.def) && results[*j].1 == *key;
        let members: Vec<usize> = (i..results.len()).filter(same).collect();
        members.iter().for_each(|&j| grouped[j] = true);
        groups.push(members);
    }
    groups
}

impl OpRules for KernelOp {
    fn name(&self) -> &'static str {
        self.def.name
    }

    fn infer(&self, operands: &[&TensorType]) -> Result<TensorType, InferError> {
        crate::op::signature(self.def.name, &self.def.operands, operands)?;
        Ok(self.def.results[self.result].clone())
    }

    fn lower(&self, cx: &mut LowerCx<'_>) -> String {
        let key = format!("{:p}", Arc::as_ptr(&self.def));
        let def = &self.def;
        cx.shared(&key, |cx| def.lower_all(cx))[self.result].clone()
    }

    fn reference(&self, _: &TensorType, x: &[&ArrayD<f64>]) -> ArrayD<f64> {
        let mut outs = self.def.composite.evaluate(x);
        outs.swap_remove(self.result).expect("a composite returns every result")
    }

    fn vjp<B: Builder>(&self, b: &mut B, x: &[B::V], out: &B::V, g: &B::V) -> Vec<Option<B::V>> {
        match &self.def.gradients[self.result] {
            Gradient::None => vec![None; x.len()],
            Gradient::Composite => crate::ops::composite::vjp(b, x, g, |tape, args| {
                let mut outs = self.def.composite.replay(tape, args, None);
                outs.swap_remove(self.result).expect("a composite returns every result")
            }),
            Gradient::Program(p) => {
                let mut inputs = x.to_vec();
                inputs.extend([out.clone(), g.clone()]);
                p.replay(b, &inputs, Some((&self.def, x)))
            }
            Gradient::Joint(_) => {
                self.joint_vjp(b, x, [(self.result, g.clone())]).unwrap_or_else(|| vec![None; x.len()])
            }
        }
    }

    fn shard(&self, x: &[ShardIn<'_>], _out: &TensorType) -> Option<DimShards> {
        if self.def.device.is_some() {
            return None;
        }
        self.def.composite.shard_outputs(x).swap_remove(self.result)
    }
}

/// A kernel `(x, a) → (s = x + a, y = s²)` on f64 `[n]` whose joint rule returns `t = ds + 2s·dy + ds·dy` for both
/// operands. The last term is no gradient: it is a marker that is only there when the rule saw both cotangents in
/// one call (run per result, with zeros for the other, it vanishes), and twice as large if the rule ran twice. For
/// the tests of the grouping of a call's cotangents, here and in `lazuli-lazy`'s autodiff.
#[doc(hidden)]
pub fn joint_rule_probe(n: usize) -> Arc<KernelDef> {
    let ty = TensorType::new(crate::dtype::DType::F64, [n]);
    let operands = vec![ty.clone(), ty.clone()];
    let composite = Program::record(&operands, |b, x| {
        let s = b.add(&x[0], &x[1]);
        let y = b.mul(&s, &s);
        vec![Some(s), Some(y)]
    })
    .expect("the probe's composite");
    let mut inputs = operands.clone();
    inputs.extend([ty.clone(), ty.clone()]);
    let joint = Program::record(&inputs, |b, x| {
        let s = b.sibling(0, ty.clone());
        let two_s = b.scale(&s, 2.0);
        let through_y = b.mul(&two_s, &x[3]);
        let marker = b.mul(&x[2], &x[3]);
        let t = b.add(&x[2], &through_y);
        vec![Some(b.add(&t, &marker)), Some(b.add(&t, &marker))]
    })
    .expect("the probe's joint rule");
    let choice = Choice { implementation: "composite", reason: "a test probe".into() };
    let gradients = vec![Gradient::Joint(joint.clone()), Gradient::Joint(joint)];
    KernelDef::new("joint_probe", operands, vec![ty.clone(), ty], None, composite, gradients, choice)
        .expect("the probe")
}
