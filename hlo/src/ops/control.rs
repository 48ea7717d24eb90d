//! Structured control flow as one op family: `scan` over a leading axis, `while_loop` and `cond`. Like a custom
//! kernel (`kernel.rs`), each carries its bodies as data: [`Program`]s recorded once from the user's closures,
//! so the graph hash, the emitter, the reference interpreter and autodiff can all read them. A loop with several
//! results is one node per result ([`ControlOp::result`]); the emitter lowers it once per operand list
//! (`LowerCx::shared`).
//!
//! - shape: a loop's body must give back its carry with the same shape and dtype (checked when the op is made,
//!   so the error names the user's line); a `cond`'s branches must return the same types;
//! - lowering: `stablehlo.while` (a scan adds a counter, takes step `t` of each `xs` with `dynamic_slice` and
//!   writes step `t` of each `ys` with `dynamic_update_slice`); `stablehlo.case` for `cond`. Everything a loop
//!   reads is part of its state, so its regions capture nothing from outside; a `case` branch reads the outer
//!   values directly, as branches have no arguments. An unrolled scan ([`ScanForm::unroll`]) is written out
//!   instead: the body once per step on static slices, each stacked result one `concatenate`, so that XLA sees
//!   the steps' values directly (a backward scan's slice of a forward's stacked residual is the residual);
//! - reference: the loop run in Rust over the body's [`Program::evaluate`];
//! - gradient (`control_grad.rs`): a scan's is a scan the other way round whose body runs the forward body's
//!   rules backwards on the values each forward step saved (its residuals: extra results when it is recorded on a
//!   gradient path; it is run again, saving, when it was not), or with [`ScanGrad::remat`] on the carry each step
//!   started from, recomputing the step; a `cond`'s is a `cond` over its branches' gradients; a `while_loop` has
//!   none (reverse mode needs a trip count) and refuses, naming its line;
//! - sharding: none (the loops run on whole operands; a mesh program replicates them).

use std::hash::{Hash, Hasher};
use std::ops::Range;
use std::sync::Arc;

use ndarray::{ArrayD, Axis, IxDyn};

use crate::builder::Builder;
use crate::dtype::{DType, TensorType};
use crate::emit::{i64_array, LowerCx};
use crate::infer_error::InferError;
use crate::op::{Op, OpRules};
use crate::ops::composite::Evaluating;
use crate::ops::control_grad::{cond_vjp, residuals, scan_vjp};
use crate::ops::elementwise::{Binary, BinaryKind, Compare, CompareDir, Convert};
use crate::ops::layout::Reshape;
use crate::ops::leaf::Constant;
use crate::ops::result_of::{ResultOf, SharedDef};
use crate::ops::slicing::{Concatenate, Slice};
use crate::program::{Program, ValueId};
use crate::shard::{DimShards, ShardIn};

/// Which construct, with its bodies and how its operands are laid out.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Control {
    /// Operands: the carry (`carry` values), the `xs` (`xs` values, each with a leading axis of `length`), then
    /// values the body captured. The body takes (carry, step `t` of each xs, captured) and returns (new carry,
    /// `y_t`…). Results: the final carry, each `y` stacked along a new leading axis, and with `save` the body's
    /// values it lists (by [`ValueId`]: an input is the carry a step started from, a step an intermediate), each
    /// stacked too: the gradient's residuals, which `remat` limits to carries.
    Scan {
        body: Program,
        carry: usize,
        xs: usize,
        length: usize,
        reverse: bool,
        /// Written out step by step instead of a loop ([`ScanForm::unroll`]).
        unroll: bool,
        remat: bool,
        save: Option<Vec<ValueId>>,
    },
    /// Operands: the carry, the values the condition captured (`cond_captured`), then those the body captured.
    /// `cond` takes (carry, its captured) and returns a bool scalar; `body` takes (carry, its captured) and
    /// returns the new carry. Results: the final carry.
    While { cond: Program, body: Program, carry: usize, cond_captured: usize },
    /// Operands: the bool scalar predicate, the branches' operands (`operands`), the values the true branch
    /// captured (`true_captured`), then those the false branch captured. Results: the branch's outputs.
    Cond { on_true: Program, on_false: Program, operands: usize, true_captured: usize },
}

/// What a scan keeps for its reverse-mode gradient.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ScanGrad {
    /// Return the residuals as extra results: the scan is recorded where a gradient may be asked of it.
    pub save: bool,
    /// Save only the carry each step started from and recompute the rest of the step in the backward pass: less
    /// memory (one carry per step instead of every intermediate a rule reads) for one more forward pass.
    pub remat: bool,
}

/// How a scan runs its steps: which way, and whether as a loop or written out.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ScanForm {
    /// From the last step to the first.
    pub reverse: bool,
    /// Lowered as the body once per step instead of a `stablehlo.while`: the program grows with the length (and
    /// so does its compile), and in exchange XLA fuses across steps and keeps no loop state. Its gradient is
    /// written out too.
    pub unroll: bool,
}

impl ScanForm {
    /// A loop, from the first step or (`reverse`) the last.
    pub fn looped(reverse: bool) -> ScanForm {
        ScanForm { reverse, unroll: false }
    }
}

/// A control-flow op built for one signature; shared by the nodes of its results, hashed once.
#[derive(Debug)]
pub struct ControlDef {
    pub control: Control,
    pub operands: Vec<TensorType>,
    pub results: Vec<TensorType>,
    hash: u64,
}

/// `ty` with a new leading axis of `n`.
pub(crate) fn stacked(n: usize, ty: &TensorType) -> TensorType {
    let mut dims = vec![n];
    dims.extend_from_slice(&ty.dims);
    TensorType::new(ty.dtype, dims)
}

/// `ty` without its leading axis.
pub(crate) fn step_of(ty: &TensorType) -> TensorType {
    TensorType::new(ty.dtype, &ty.dims[1..])
}

fn list(tys: &[TensorType]) -> String {
    let items: Vec<String> = tys.iter().map(|t| t.to_string()).collect();
    format!("({})", items.join(", "))
}

/// A body's outputs, each present.
fn outputs(name: &str, what: &str, p: &Program) -> Result<Vec<TensorType>, InferError> {
    p.output_types()
        .into_iter()
        .map(|t| t.cloned().ok_or_else(|| InferError::Attribute(format!("{name}: the {what} leaves an output empty"))))
        .collect()
}

/// A program takes exactly `want`.
fn takes(name: &str, what: &str, p: &Program, want: &[TensorType]) -> Result<(), InferError> {
    if p.inputs == want {
        return Ok(());
    }
    Err(InferError::Attribute(format!("{name}: the {what} takes {}, the op gives it {}", list(&p.inputs), list(want))))
}

/// The body gives the carry back as it got it: same dtype and shape, value by value.
fn keeps_carry(name: &str, carry: &[TensorType], out: &[TensorType]) -> Result<(), InferError> {
    if out.len() != carry.len() {
        return Err(InferError::Shape(format!(
            "{name}: the body returns {} carry value(s) for a carry of {}",
            out.len(),
            carry.len()
        )));
    }
    for (i, (a, b)) in carry.iter().zip(out).enumerate() {
        let why =
            format!("{name}: the body turns carry {i} from {a} into {b}; a loop's carry keeps its shape and dtype");
        if a.dtype != b.dtype {
            return Err(InferError::DType(why));
        }
        if a.dims != b.dims {
            return Err(InferError::Shape(why));
        }
    }
    Ok(())
}

impl ControlDef {
    fn make(control: Control, operands: Vec<TensorType>, results: Vec<TensorType>) -> Arc<ControlDef> {
        let mut h = std::hash::DefaultHasher::new();
        (&control, &operands, &results).hash(&mut h);
        Arc::new(ControlDef { control, operands, results, hash: h.finish() })
    }

    /// A scan of `body` over `operands` = (carry, xs, captured); see [`Control::Scan`]. With `grad.save` it also
    /// returns the residuals its gradient reads.
    pub fn scan(
        body: Program,
        operands: Vec<TensorType>,
        carry: usize,
        xs: usize,
        length: usize,
        form: ScanForm,
        grad: ScanGrad,
    ) -> Result<Arc<ControlDef>, InferError> {
        if carry + xs > operands.len() {
            return Err(InferError::Attribute(format!(
                "scan: {carry} carry and {xs} xs in {} operands",
                operands.len()
            )));
        }
        for (i, t) in operands[carry..carry + xs].iter().enumerate() {
            if t.rank() == 0 || t.dims[0] != length {
                return Err(InferError::Shape(format!(
                    "scan: xs {i} is {t}; every xs needs a leading axis of the scan's length {length}"
                )));
            }
        }
        let mut inputs = operands[..carry].to_vec();
        inputs.extend(operands[carry..carry + xs].iter().map(step_of));
        inputs.extend_from_slice(&operands[carry + xs..]);
        takes("scan", "body", &body, &inputs)?;
        let outs = outputs("scan", "body", &body)?;
        keeps_carry("scan", &operands[..carry], &outs[..carry.min(outs.len())])?;
        let mut results = operands[..carry].to_vec();
        results.extend(outs[carry..].iter().map(|t| stacked(length, t)));
        let save = grad.save.then(|| residuals(&body, &operands, carry, xs, grad.remat));
        results.extend(save.iter().flatten().map(|&v| stacked(length, &body.types[v])));
        let ScanForm { reverse, unroll } = form;
        let control = Control::Scan { body, carry, xs, length, reverse, unroll, remat: grad.remat, save };
        Ok(Self::make(control, operands, results))
    }

    /// A while loop over `operands` = (carry, the condition's captured, the body's captured).
    pub fn while_loop(
        cond: Program,
        body: Program,
        operands: Vec<TensorType>,
        carry: usize,
        cond_captured: usize,
    ) -> Result<Arc<ControlDef>, InferError> {
        if carry + cond_captured > operands.len() {
            return Err(InferError::Attribute("while_loop: more carry and captured values than operands".into()));
        }
        let (init, rest) = operands.split_at(carry);
        let (cond_caps, body_caps) = rest.split_at(cond_captured);
        takes("while_loop", "condition", &cond, &[init, cond_caps].concat())?;
        takes("while_loop", "body", &body, &[init, body_caps].concat())?;
        let pred = outputs("while_loop", "condition", &cond)?;
        if pred.len() != 1 || pred[0] != TensorType::scalar(DType::Bool) {
            return Err(InferError::DType(format!(
                "while_loop: the condition returns {}; it must return one bool scalar",
                list(&pred)
            )));
        }
        keeps_carry("while_loop", init, &outputs("while_loop", "body", &body)?)?;
        let results = init.to_vec();
        Ok(Self::make(Control::While { cond, body, carry, cond_captured }, operands, results))
    }

    /// A `cond` over `operands` = (predicate, the branches' operands, the true branch's captured, the false
    /// branch's captured).
    pub fn cond(
        on_true: Program,
        on_false: Program,
        operands: Vec<TensorType>,
        n: usize,
        true_captured: usize,
    ) -> Result<Arc<ControlDef>, InferError> {
        if operands.is_empty() || 1 + n + true_captured > operands.len() {
            return Err(InferError::Attribute("cond: more operands and captured values than the op has".into()));
        }
        if operands[0] != TensorType::scalar(DType::Bool) {
            return Err(InferError::DType(format!("cond: the predicate is {}; it must be a bool scalar", operands[0])));
        }
        let ops = &operands[1..1 + n];
        let (true_caps, false_caps) = operands[1 + n..].split_at(true_captured);
        takes("cond", "true branch", &on_true, &[ops, true_caps].concat())?;
        takes("cond", "false branch", &on_false, &[ops, false_caps].concat())?;
        let (a, b) = (outputs("cond", "true branch", &on_true)?, outputs("cond", "false branch", &on_false)?);
        if a.is_empty() {
            return Err(InferError::Attribute("cond: the branches return nothing".into()));
        }
        if a != b {
            let why = format!(
                "cond: the true branch returns {}, the false branch {}; both must return the same types",
                list(&a),
                list(&b)
            );
            let same_shapes = a.len() == b.len() && a.iter().zip(&b).all(|(x, y)| x.dims == y.dims);
            return Err(if same_shapes { InferError::DType(why) } else { InferError::Shape(why) });
        }
        Ok(Self::make(Control::Cond { on_true, on_false, operands: n, true_captured }, operands, a))
    }

    /// How many results a user sees: a scan's residuals are the gradient's.
    pub fn visible_results(&self) -> usize {
        match &self.control {
            Control::Scan { body, .. } => body.outputs.len(),
            _ => self.results.len(),
        }
    }

    fn name(&self) -> &'static str {
        match self.control {
            Control::Scan { .. } => "scan",
            Control::While { .. } => "while_loop",
            Control::Cond { .. } => "cond",
        }
    }
}

impl PartialEq for ControlDef {
    fn eq(&self, other: &Self) -> bool {
        self.hash == other.hash
            && self.control == other.control
            && self.operands == other.operands
            && self.results == other.results
    }
}

impl Eq for ControlDef {}

impl SharedDef for ControlDef {
    fn def_name(&self) -> &'static str {
        self.name()
    }
    fn result_count(&self) -> usize {
        self.results.len()
    }
    fn content_hash(&self) -> u64 {
        self.hash
    }
}

/// One result of a control-flow op: the op of a node.
pub type ControlOp = ResultOf<ControlDef>;

impl OpRules for ControlOp {
    fn name(&self) -> &'static str {
        self.def.name()
    }

    fn infer(&self, operands: &[&TensorType]) -> Result<TensorType, InferError> {
        crate::op::signature(self.def.name(), &self.def.operands, operands)?;
        Ok(self.def.results[self.result].clone())
    }

    fn lower(&self, cx: &mut LowerCx<'_>) -> String {
        let key = format!("{:p}", Arc::as_ptr(&self.def));
        let def = &self.def;
        cx.shared(&key, |cx| def.lower_all(cx))[self.result].clone()
    }

    fn reference(&self, _: &TensorType, x: &[&ArrayD<f64>]) -> ArrayD<f64> {
        self.def.evaluate(x).swap_remove(self.result)
    }

    fn vjp<B: Builder>(&self, b: &mut B, x: &[B::V], _out: &B::V, g: &B::V) -> Vec<Option<B::V>> {
        match &self.def.control {
            Control::Scan { .. } if self.result >= self.def.visible_results() => vec![None; x.len()],
            Control::Scan { .. } => scan_vjp(&self.def, self.result, b, x, g),
            Control::Cond { .. } => cond_vjp(&self.def, self.result, b, x, g),
            Control::While { .. } => b.refuse(
                "while_loop: reverse-mode gradients need the number of iterations, which a while loop does not \
                 fix; write the loop as a scan (a fixed number of steps), or record it under no_grad",
            ),
        }
    }

    fn shard(&self, _x: &[ShardIn<'_>], _out: &TensorType) -> Option<DimShards> {
        None
    }
}

// Lowering.

/// A constant `value` of type `ty`, lowered in place.
fn constant(cx: &mut LowerCx<'_>, value: f64, ty: &TensorType) -> String {
    cx.lower_op(&Op::Constant(Constant::new(value, ty.clone())), Vec::new(), ty)
}

/// The index type of the loops' counters.
fn index() -> TensorType {
    TensorType::scalar(DType::I64)
}

/// One step of stacked values of type `ty`: its leading axis of size 1.
fn one_step(ty: &TensorType) -> TensorType {
    stacked(1, &step_of(ty))
}

/// `s`, one step of stacked values of type `ty` (see [`one_step`]), without its leading axis.
fn drop_step_axis(cx: &mut LowerCx<'_>, s: String, ty: &TensorType) -> String {
    let step = step_of(ty);
    cx.lower_op(&Op::Reshape(Reshape { dims: step.dims.to_vec() }), vec![(s, &one_step(ty))], &step)
}

/// `y`, a step of stacked values of type `ty`, given their leading axis (of size 1).
fn add_step_axis(cx: &mut LowerCx<'_>, y: String, ty: &TensorType) -> String {
    let one = one_step(ty);
    cx.lower_op(&Op::Reshape(Reshape { dims: one.dims.to_vec() }), vec![(y, &step_of(ty))], &one)
}

/// Step `t` of `x` (of type `ty`): `dynamic_slice` along the leading axis, then the axis dropped.
fn slice_at(cx: &mut LowerCx<'_>, x: &str, ty: &TensorType, t: &str, zero: &str) -> String {
    let idx = index();
    let one = one_step(ty);
    let mut names = vec![x.to_string(), t.to_string()];
    names.extend(vec![zero.to_string(); ty.rank() - 1]);
    let mut tys = vec![ty];
    tys.extend(vec![&idx; ty.rank()]);
    let attrs = format!("slice_sizes = {}", i64_array(&one.dims));
    let s = cx.op("stablehlo.dynamic_slice", &names, &tys, &attrs, None, &one);
    drop_step_axis(cx, s, ty)
}

/// `acc` (of type `ty`) with step `t` replaced by `y`: `dynamic_update_slice` along the leading axis.
fn update_at(cx: &mut LowerCx<'_>, acc: &str, ty: &TensorType, y: &str, t: &str, zero: &str) -> String {
    let idx = index();
    let one = one_step(ty);
    let y1 = add_step_axis(cx, y.to_string(), ty);
    let mut names = vec![acc.to_string(), y1, t.to_string()];
    names.extend(vec![zero.to_string(); ty.rank() - 1]);
    let mut tys = vec![ty, &one];
    tys.extend(vec![&idx; ty.rank()]);
    cx.op("stablehlo.dynamic_update_slice", &names, &tys, "", None, ty)
}

/// Step `t` of `x` (of type `ty`): a static `slice` along the leading axis, then the axis dropped.
fn slice_static(cx: &mut LowerCx<'_>, x: &str, ty: &TensorType, t: usize) -> String {
    let slice = Op::Slice(Slice::along(&ty.dims, 0, t, t + 1, 1));
    let s = cx.lower_op(&slice, vec![(x.to_string(), ty)], &one_step(ty));
    drop_step_axis(cx, s, ty)
}

/// The steps' values `ys` stacked along a new leading axis into `ty`: each given the axis, then one
/// `concatenate` (zeros where there are no steps).
fn stack(cx: &mut LowerCx<'_>, ys: Vec<String>, ty: &TensorType) -> String {
    if ys.is_empty() {
        return constant(cx, 0.0, ty);
    }
    let one = one_step(ty);
    let parts: Vec<String> = ys.into_iter().map(|y| add_step_axis(cx, y, ty)).collect();
    cx.lower_op(&Op::Concatenate(Concatenate { dim: 0 }), parts.into_iter().map(|p| (p, &one)).collect(), ty)
}

/// What a scan's lowerings read of it (see [`Control::Scan`]).
#[derive(Clone, Copy)]
struct ScanLowering<'a> {
    body: &'a Program,
    carry: usize,
    xs: usize,
    length: usize,
    reverse: bool,
    save: &'a [ValueId],
    /// Written out, pass each step's inputs through one `optimization_barrier`: a step of a recomputing gradient
    /// would otherwise be merged with the forward step it recomputes (XLA's CSE sees the same ops on the same
    /// values), keeping every activation alive as if nothing were recomputed.
    barrier: bool,
}

/// The named values of a block with their types.
fn typed(names: &[String], tys: &[TensorType]) -> Vec<(String, TensorType)> {
    names.iter().cloned().zip(tys.iter().cloned()).collect()
}

impl ControlDef {
    /// Lower the op on the node's operands; returns every result's SSA name.
    fn lower_all(&self, cx: &mut LowerCx<'_>) -> Vec<String> {
        let args: Vec<String> = (0..cx.num_args()).map(|i| cx.arg(i).to_string()).collect();
        match &self.control {
            Control::Scan { body, carry, xs, length, reverse, unroll, remat, save } => {
                // A recomputing scan that saves nothing is a gradient's (or runs off any gradient path).
                let barrier = *remat && save.is_none();
                let save = save.as_deref().unwrap_or(&[]);
                let (carry, xs, length, reverse) = (*carry, *xs, *length, *reverse);
                let scan = ScanLowering { body, carry, xs, length, reverse, save, barrier };
                // A loop of no steps would write a step into its empty stacked results: none is written out.
                if *unroll || length == 0 {
                    self.lower_scan_unrolled(cx, &args, scan)
                } else {
                    self.lower_scan(cx, &args, scan)
                }
            }
            Control::While { cond, body, carry, cond_captured } => {
                self.lower_while(cx, &args, cond, body, *carry, *cond_captured)
            }
            Control::Cond { on_true, on_false, operands, true_captured } => {
                self.lower_cond(cx, &args, on_true, on_false, *operands, *true_captured)
            }
        }
    }

    /// A `stablehlo.while` whose state is (counter, carry, xs, captured, the stacked outputs being filled: the
    /// ys, then the residuals `save`).
    fn lower_scan(&self, cx: &mut LowerCx<'_>, args: &[String], scan: ScanLowering<'_>) -> Vec<String> {
        let ScanLowering { body, carry, xs, length, reverse, save, .. } = scan;
        let ops = &self.operands;
        let filled = &self.results[carry..];
        let n_ys = filled.len() - save.len();
        let idx = index();
        let mut init = vec![constant(cx, 0.0, &idx)];
        init.extend(args.iter().cloned());
        for t in filled {
            init.push(constant(cx, 0.0, t));
        }
        let state: Vec<TensorType> = [std::slice::from_ref(&idx), ops, filled].concat();
        let state_refs: Vec<&TensorType> = state.iter().collect();
        let cond = cx.region(&state_refs, |cx, a| {
            let n = constant(cx, length as f64, &idx);
            let pred = TensorType::scalar(DType::Bool);
            let lt = Op::Compare(Compare { dir: CompareDir::Lt });
            vec![(cx.lower_op(&lt, vec![(a[0].clone(), &idx), (n, &idx)], &pred), pred)]
        });
        let step = cx.region(&state_refs, |cx, a| {
            let (i, rest) = a.split_first().expect("the counter");
            let (loop_ops, acc) = rest.split_at(ops.len());
            let t = if reverse {
                let last = constant(cx, length as f64 - 1.0, &idx);
                let sub = Op::Binary(Binary { kind: BinaryKind::Sub });
                cx.lower_op(&sub, vec![(last, &idx), (i.clone(), &idx)], &idx)
            } else {
                i.clone()
            };
            let zero = constant(cx, 0.0, &idx);
            let mut inputs = loop_ops[..carry].to_vec();
            for (k, ty) in ops[carry..carry + xs].iter().enumerate() {
                inputs.push(slice_at(cx, &loop_ops[carry + k], ty, &t, &zero));
            }
            inputs.extend_from_slice(&loop_ops[carry + xs..]);
            let values = body.lower_values(cx, inputs);
            let outs: Vec<String> =
                body.outputs.iter().map(|o| values[o.expect("a loop body returns every value")].clone()).collect();
            let one = constant(cx, 1.0, &idx);
            let add = Op::Binary(Binary { kind: BinaryKind::Add });
            let next = cx.lower_op(&add, vec![(i.clone(), &idx), (one, &idx)], &idx);
            let mut ret = vec![(next, idx.clone())];
            ret.extend(typed(&outs[..carry], &ops[..carry]));
            ret.extend(typed(&loop_ops[carry..], &ops[carry..]));
            let written = outs[carry..].iter().chain(save.iter().map(|&v| &values[v]));
            for (k, y) in written.enumerate() {
                ret.push((update_at(cx, &acc[k], &filled[k], y, &t, &zero), filled[k].clone()));
            }
            debug_assert_eq!(ret.len(), 1 + ops.len() + n_ys + save.len());
            ret
        });
        let outs =
            cx.op_multi("stablehlo.while", &init, &state_refs, "", Some(&format!("{cond}, {step}")), &state_refs);
        let mut results = outs[1..1 + carry].to_vec();
        results.extend_from_slice(&outs[1 + ops.len()..]);
        results
    }

    /// The scan written out: the body once per step, in the scan's order, on static slices of the xs; each
    /// stacked result one `concatenate` of the steps' values in the xs' order.
    fn lower_scan_unrolled(&self, cx: &mut LowerCx<'_>, args: &[String], scan: ScanLowering<'_>) -> Vec<String> {
        let ScanLowering { body, carry, xs, length, reverse, save, barrier } = scan;
        let ops = &self.operands;
        let filled = &self.results[carry..];
        let mut step_tys = ops[..carry].to_vec();
        step_tys.extend(ops[carry..carry + xs].iter().map(step_of));
        step_tys.extend_from_slice(&ops[carry + xs..]);
        let step_refs: Vec<&TensorType> = step_tys.iter().collect();
        let mut state = args[..carry].to_vec();
        let mut steps: Vec<Vec<String>> = vec![vec![String::new(); length]; filled.len()];
        for s in 0..length {
            let t = if reverse { length - 1 - s } else { s };
            let mut inputs = state.clone();
            for (k, ty) in ops[carry..carry + xs].iter().enumerate() {
                inputs.push(slice_static(cx, &args[carry + k], ty, t));
            }
            inputs.extend_from_slice(&args[carry + xs..]);
            if barrier {
                inputs = cx.op_multi("stablehlo.optimization_barrier", &inputs, &step_refs, "", None, &step_refs);
            }
            let values = body.lower_values(cx, inputs);
            let mut outs = body.outputs.iter().map(|o| values[o.expect("a loop body returns every value")].clone());
            state = outs.by_ref().take(carry).collect();
            for (k, y) in outs.chain(save.iter().map(|&v| values[v].clone())).enumerate() {
                steps[k][t] = y;
            }
        }
        let mut results = state;
        for (ty, ys) in filled.iter().zip(steps) {
            results.push(stack(cx, ys, ty));
        }
        results
    }

    /// A `stablehlo.while` whose state is (carry, the condition's captured, the body's captured).
    fn lower_while(
        &self,
        cx: &mut LowerCx<'_>,
        args: &[String],
        cond: &Program,
        body: &Program,
        carry: usize,
        cond_captured: usize,
    ) -> Vec<String> {
        let ops = &self.operands;
        let refs: Vec<&TensorType> = ops.iter().collect();
        let reads = |a: &[String], caps: Range<usize>| -> Vec<String> { [&a[..carry], &a[caps]].concat() };
        let body_caps = carry + cond_captured..ops.len();
        let test = cx.region(&refs, |cx, a| {
            let pred = cond.lower(cx, reads(&a, carry..carry + cond_captured)).remove(0).expect("a condition");
            vec![(pred, TensorType::scalar(DType::Bool))]
        });
        let step = cx.region(&refs, |cx, a| {
            let outs = body.lower(cx, reads(&a, body_caps.clone()));
            let mut ret: Vec<(String, TensorType)> = outs
                .into_iter()
                .zip(&ops[..carry])
                .map(|(o, t)| (o.expect("a loop body returns every value"), t.clone()))
                .collect();
            ret.extend(typed(&a[carry..], &ops[carry..]));
            ret
        });
        let outs = cx.op_multi("stablehlo.while", args, &refs, "", Some(&format!("{test}, {step}")), &refs);
        outs[..carry].to_vec()
    }

    /// A `stablehlo.case` on the predicate as an index: branch 0 is the false branch, 1 the true one. Branches
    /// have no arguments and read the operands from outside.
    fn lower_cond(
        &self,
        cx: &mut LowerCx<'_>,
        args: &[String],
        on_true: &Program,
        on_false: &Program,
        n: usize,
        true_captured: usize,
    ) -> Vec<String> {
        let (pred, i32t) = (TensorType::scalar(DType::Bool), TensorType::scalar(DType::I32));
        let convert = Op::Convert(Convert { from: DType::Bool, to: DType::I32 });
        let index = cx.lower_op(&convert, vec![(args[0].clone(), &pred)], &i32t);
        let ops = &args[1..1 + n];
        let true_caps = &args[1 + n..1 + n + true_captured];
        let false_caps = &args[1 + n + true_captured..];
        let results = &self.results;
        let branch = |cx: &mut LowerCx<'_>, p: &Program, caps: &[String]| {
            cx.region(&[], |cx, _| {
                let outs = p.lower(cx, [ops, caps].concat());
                outs.into_iter()
                    .zip(results)
                    .map(|(o, t)| (o.expect("a branch returns every value"), t.clone()))
                    .collect()
            })
        };
        let f = branch(cx, on_false, false_caps);
        let t = branch(cx, on_true, true_caps);
        let out_refs: Vec<&TensorType> = results.iter().collect();
        cx.op_multi("stablehlo.case", &[index], &[&i32t], "", Some(&format!("{f}, {t}")), &out_refs)
    }
}

// Reference semantics.

/// A program's outputs on `inputs`, each present (bodies return every value).
fn run(p: &Program, inputs: &[&ArrayD<f64>]) -> Vec<ArrayD<f64>> {
    p.evaluate(inputs).into_iter().map(|o| o.expect("a body returns every value")).collect()
}

/// Every value of a program on `inputs` (inputs, then each step's), by the ops' reference semantics.
fn run_values(p: &Program, inputs: &[&ArrayD<f64>]) -> Vec<ArrayD<f64>> {
    let args: Vec<(ArrayD<f64>, TensorType)> =
        inputs.iter().zip(&p.inputs).map(|(a, t)| ((*a).clone(), t.clone())).collect();
    p.replay_values(&mut Evaluating, &args, None).into_iter().map(|v| v.0).collect()
}

impl ControlDef {
    /// Every result on `x`, looping in Rust over the bodies' reference evaluation.
    fn evaluate(&self, x: &[&ArrayD<f64>]) -> Vec<ArrayD<f64>> {
        match &self.control {
            Control::Scan { body, carry, xs, length, reverse, save, .. } => {
                let (carry, xs) = (*carry, *xs);
                let save = save.as_deref().unwrap_or(&[]);
                let mut state: Vec<ArrayD<f64>> = x[..carry].iter().map(|a| (*a).clone()).collect();
                let mut filled: Vec<ArrayD<f64>> =
                    self.results[carry..].iter().map(|t| ArrayD::zeros(IxDyn(&t.dims))).collect();
                let n_ys = filled.len() - save.len();
                for s in 0..*length {
                    let t = if *reverse { length - 1 - s } else { s };
                    let steps: Vec<ArrayD<f64>> =
                        x[carry..carry + xs].iter().map(|a| a.index_axis(Axis(0), t).to_owned()).collect();
                    let mut inputs: Vec<&ArrayD<f64>> = state.iter().chain(&steps).collect();
                    inputs.extend_from_slice(&x[carry + xs..]);
                    let values = run_values(body, &inputs);
                    for (j, &v) in save.iter().enumerate() {
                        filled[n_ys + j].index_axis_mut(Axis(0), t).assign(&values[v]);
                    }
                    let mut outs: Vec<ArrayD<f64>> =
                        body.outputs.iter().map(|o| values[o.expect("a body returns every value")].clone()).collect();
                    for (k, y) in outs.drain(carry..).enumerate() {
                        filled[k].index_axis_mut(Axis(0), t).assign(&y);
                    }
                    state = outs;
                }
                state.extend(filled);
                state
            }
            Control::While { cond, body, carry, cond_captured } => {
                let mut state: Vec<ArrayD<f64>> = x[..*carry].iter().map(|a| (*a).clone()).collect();
                let (cond_caps, body_caps) = x[*carry..].split_at(*cond_captured);
                loop {
                    let mut inputs: Vec<&ArrayD<f64>> = state.iter().collect();
                    inputs.extend_from_slice(cond_caps);
                    if run(cond, &inputs)[0].iter().all(|&p| p == 0.0) {
                        return state;
                    }
                    let mut inputs: Vec<&ArrayD<f64>> = state.iter().collect();
                    inputs.extend_from_slice(body_caps);
                    state = run(body, &inputs);
                }
            }
            Control::Cond { on_true, on_false, operands, true_captured } => {
                let ops = &x[1..1 + operands];
                let (true_caps, false_caps) = x[1 + operands..].split_at(*true_captured);
                let taken = x[0].iter().any(|&p| p != 0.0);
                let (p, caps) = if taken { (on_true, true_caps) } else { (on_false, false_caps) };
                run(p, &[ops, caps].concat())
            }
        }
    }
}
