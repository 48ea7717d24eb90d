//! Gradients of the control-flow ops (`control.rs`).
//!
//! A scan's gradient is a scan the other way round. Its carry is the cotangent of the forward's carry and the
//! captured values' accumulated cotangents; its xs are the forward's xs, the residuals each forward step saved
//! and, for a `y`, the stacked cotangent; its ys are the xs' cotangents. Its body runs the forward body on a
//! tape (`composite::vjp_outputs_with`) on which every op whose value changes from step to step takes the value
//! the forward saved instead of running again, so each rule reads what the forward computed. Ops on constants
//! and captured values only (the same at every step) do run again: they cost little, and saving them would
//! store `length` copies of one value. What to save is read off the backward body itself: the values its
//! outputs depend on when every output has a cotangent. With `remat` only the carries are saved and the tape
//! replays the whole step (one more forward pass, a carry per step of memory).

use std::ops::Range;
use std::sync::Arc;

use crate::builder::Builder;
use crate::dtype::TensorType;
use crate::op::Op;
use crate::ops::composite::{vjp_outputs, vjp_outputs_with};
use crate::ops::control::{step_of, Control, ControlDef, ControlOp, ScanForm, ScanGrad};
use crate::program::{Program, Recorder, Step, Value, ValueId};

/// A scan's body and operands, as its gradient reads them.
struct ScanParts<'a> {
    body: &'a Program,
    ops: &'a [TensorType],
    carry: usize,
    xs: usize,
    remat: bool,
}

/// Where each group of inputs starts in a backward body (see [`ScanParts::backward_body`]).
struct Layout {
    xs_at: usize,
    saved_at: usize,
    g_at: usize,
    caps_at: usize,
}

impl ScanParts<'_> {
    /// Float carries, float xs and float captured values: the operands with cotangents.
    fn float_operands(&self) -> (Vec<usize>, Vec<usize>, Vec<usize>) {
        let (c, x) = (self.carry, self.carry + self.xs);
        (floats(self.ops, 0..c), floats(self.ops, c..x), floats(self.ops, x..self.ops.len()))
    }

    /// Every carry a step started from and, unless recomputing, every op step whose value depends on the carry
    /// or the xs: the body values a backward step may take from the forward, by value id in order.
    fn candidates(&self) -> Vec<ValueId> {
        let mut out: Vec<ValueId> = (0..self.carry).collect();
        if self.remat || self.body.steps.iter().any(|(s, _)| !matches!(s, Step::Op(_))) {
            return out;
        }
        let n_in = self.body.inputs.len();
        let mut varies: Vec<bool> = (0..n_in).map(|i| i < self.carry + self.xs).collect();
        for (_, args) in &self.body.steps {
            varies.push(args.iter().any(|&a| varies[a]));
        }
        out.extend((n_in..varies.len()).filter(|&v| varies[v]));
        out
    }

    /// `values` without the [`layout_only`] steps whose operands a backward step has anyway (inputs, values it
    /// reads from `values` by `live`, constants, or steps dropped so): those it runs again, which XLA fuses into
    /// their readers, rather than storing another copy of a value per step.
    fn without_layout_copies(&self, values: &[ValueId], live: &[bool]) -> Vec<ValueId> {
        let n_in = self.body.inputs.len();
        let mut has: Vec<bool> = vec![true; self.body.types.len()];
        for &v in values {
            has[v] = live[v];
        }
        let mut kept = Vec::new();
        for &v in values {
            let recompute = v >= n_in && {
                let (step, args) = &self.body.steps[v - n_in];
                matches!(step, Step::Op(op) if layout_only(op)) && args.iter().all(|&a| has[a])
            };
            has[v] = has[v] || recompute;
            if !recompute {
                kept.push(v);
            }
        }
        kept
    }

    /// Which of `values` a backward body reading them as inputs (seeded on `ys`) depends on, by value id.
    fn read(&self, values: &[ValueId], ys: &[usize]) -> Vec<bool> {
        let live = self.backward_body(values, ys).live();
        let saved_at = self.layout(values.len(), ys.len()).saved_at;
        let mut read = vec![false; self.body.types.len()];
        for (j, &v) in values.iter().enumerate() {
            read[v] = live[saved_at + j];
        }
        read
    }

    fn layout(&self, saved: usize, ys: usize) -> Layout {
        let (fc, _, fk) = self.float_operands();
        let xs_at = fc.len() + fk.len();
        let saved_at = xs_at + self.xs;
        Layout { xs_at, saved_at, g_at: saved_at + saved, caps_at: saved_at + saved + ys }
    }

    /// The backward body on (float carries' cotangents, float captured values' accumulated cotangents, x_t…,
    /// the values `saved` of the forward step…, the cotangent of each y in `ys`…, captured…), returning (float
    /// carries' cotangents, accumulators, float xs' cotangents). `saved` starts with every carry; the body's
    /// other steps run again.
    fn backward_body(&self, saved: &[ValueId], ys: &[usize]) -> Program {
        let (fc, _, fk) = self.float_operands();
        let (carry, xs, ops, body) = (self.carry, self.xs, self.ops, self.body);
        let at = self.layout(saved.len(), ys.len());
        let mut inputs: Vec<TensorType> = fc.iter().chain(&fk).map(|&i| ops[i].clone()).collect();
        inputs.extend(ops[carry..carry + xs].iter().map(step_of));
        inputs.extend(saved.iter().map(|&v| body.types[v].clone()));
        inputs.extend(
            ys.iter().map(|&y| body.types[body.outputs[carry + y].expect("a body returns every value")].clone()),
        );
        inputs.extend_from_slice(&ops[carry + xs..]);
        Program::record(&inputs, |r, a| {
            // The forward body's inputs are (carry_t…, x_t…, captured…).
            let primal = [&a[at.saved_at..at.saved_at + carry], &a[at.xs_at..at.saved_at], &a[at.caps_at..]].concat();
            let n_in = body.inputs.len();
            let mut given: Vec<Option<Value>> = vec![None; body.steps.len()];
            for (j, &v) in saved.iter().enumerate().filter(|(_, &v)| v >= n_in) {
                given[v - n_in] = Some(a[at.saved_at + j].clone());
            }
            let mut seeds: Vec<Option<Value>> = vec![None; body.outputs.len()];
            for (j, &c) in fc.iter().enumerate() {
                seeds[c] = Some(a[j].clone());
            }
            for (j, &y) in ys.iter().enumerate() {
                seeds[carry + y] = Some(a[at.g_at + j].clone());
            }
            let d = vjp_outputs_with(r, &primal, &seeds, given, |t, p| {
                body.replay(t, p, None).into_iter().map(|o| o.expect("a body returns every value")).collect()
            });
            self.cotangents(r, a, d).into_iter().map(Some).collect()
        })
        .expect("a scan body's gradient is well-typed")
    }

    /// A backward step's results from the cotangents `d` of the forward body's inputs: the float carries', the
    /// accumulators (inputs `fc.len()..`) plus the captured values', and the float xs'.
    fn cotangents(&self, r: &mut Recorder, a: &[Value], mut d: Vec<Option<Value>>) -> Vec<Value> {
        let (fc, fx, fk) = self.float_operands();
        let mut outs: Vec<Value> = fc.iter().map(|&c| or_zeros(r, d[c].take(), &self.ops[c])).collect();
        for (j, &k) in fk.iter().enumerate() {
            let acc = &a[fc.len() + j];
            outs.push(match d[k].take() {
                Some(dk) => r.add(acc, &dk),
                None => acc.clone(),
            });
        }
        outs.extend(fx.iter().map(|&i| or_zeros(r, d[i].take(), &step_of(&self.ops[i]))));
        outs
    }
}

/// The residuals a scan saves for its gradient (see [`Control::Scan`]): the values the backward body reads when
/// every float output has a cotangent, of the carries and the candidates worth storing.
pub(crate) fn residuals(body: &Program, ops: &[TensorType], carry: usize, xs: usize, remat: bool) -> Vec<ValueId> {
    if refuses_gradient(body) {
        // Its gradient refuses, naming the loop, when one is asked; until then it runs as it is.
        return (0..carry).collect();
    }
    let parts = ScanParts { body, ops, carry, xs, remat };
    let ys: Vec<usize> = (0..body.outputs.len() - carry)
        .filter(|&y| body.outputs[carry + y].is_some_and(|v| body.types[v].dtype.is_float()))
        .collect();
    let mut values = parts.candidates();
    let mut read = parts.read(&values, &ys);
    if !remat {
        values = parts.without_layout_copies(&values, &read);
        read = parts.read(&values, &ys);
    }
    values.into_iter().filter(|&v| read[v]).collect()
}

/// Ops that move or retype their operand's elements without arithmetic (a bf16 copy of a weight, a head split).
fn layout_only(op: &Op) -> bool {
    matches!(op, Op::Convert(_) | Op::Reshape(_) | Op::Transpose(_) | Op::BroadcastInDim(_) | Op::Slice(_))
}

/// Whether a program holds a `while_loop`, whose gradient refuses, at any depth.
fn refuses_gradient(p: &Program) -> bool {
    p.steps.iter().any(|(s, _)| match s {
        Step::Op(Op::Control(c)) => match &c.def.control {
            Control::While { .. } => true,
            Control::Scan { body, .. } => refuses_gradient(body),
            Control::Cond { on_true, on_false, .. } => refuses_gradient(on_true) || refuses_gradient(on_false),
        },
        _ => false,
    })
}

/// `d`, or zeros of `ty` where the body gave no cotangent.
fn or_zeros(r: &mut Recorder, d: Option<Value>, ty: &TensorType) -> Value {
    d.unwrap_or_else(|| r.constant(0.0, ty.clone()))
}

/// The indices in `range` of floating-point operands: the ones with cotangents.
fn floats(tys: &[TensorType], range: Range<usize>) -> Vec<usize> {
    range.filter(|&i| tys[i].dtype.is_float()).collect()
}

/// The cotangents of a scan's operands for the cotangent `g` of result `result` (a final carry or a stacked `y`):
/// a scan the other way round over the forward's xs and the residuals this cotangent's backward reads.
pub(crate) fn scan_vjp<B: Builder>(
    def: &Arc<ControlDef>,
    result: usize,
    b: &mut B,
    x: &[B::V],
    g: &B::V,
) -> Vec<Option<B::V>> {
    let Control::Scan { body, carry, xs, length, reverse, unroll, remat, save } = &def.control else {
        unreachable!("a scan")
    };
    let (carry, xs, ops) = (*carry, *xs, &def.operands);
    let parts = ScanParts { body, ops, carry, xs, remat: *remat };
    // A scan recorded off a gradient path runs again, saving.
    let saving = match save {
        Some(_) => def.clone(),
        None => {
            let grad = ScanGrad { save: true, remat: *remat };
            let form = ScanForm { reverse: *reverse, unroll: *unroll };
            ControlDef::scan(body.clone(), ops.clone(), carry, xs, *length, form, grad).expect("the same scan")
        }
    };
    let Control::Scan { save: Some(saved), .. } = &saving.control else { unreachable!("a saving scan") };
    let ys: Vec<usize> = result.checked_sub(carry).into_iter().collect();

    // The backward body on every carry and the saved steps, narrowed to the saved values this cotangent reads.
    let values: Vec<ValueId> = (0..carry).chain(saved.iter().copied().filter(|&v| v >= carry)).collect();
    let full = parts.backward_body(&values, &ys);
    let live = full.live();
    let at = parts.layout(values.len(), ys.len());
    let position = |v: &ValueId| at.saved_at + values.binary_search(v).expect("a residual is a carry or a step");
    let read: Vec<usize> = (0..saved.len()).filter(|&j| live[position(&saved[j])]).collect();
    let mut keep: Vec<usize> = (0..at.saved_at).collect();
    keep.extend(read.iter().map(|&j| position(&saved[j])));
    keep.extend(at.g_at..full.inputs.len());
    let back_body = full.restrict(&keep).expect("the forward saves every value its gradient reads");

    let (fc, fx, fk) = parts.float_operands();
    let refs: Vec<&B::V> = x.iter().collect();
    let mut operands: Vec<B::V> =
        fc.iter().map(|&c| if c == result { g.clone() } else { b.constant(0.0, ops[c].clone()) }).collect();
    operands.extend(fk.iter().map(|&k| b.constant(0.0, ops[k].clone())));
    operands.extend_from_slice(&x[carry..carry + xs]);
    let first_saved = saving.visible_results();
    operands.extend(read.iter().map(|&j| b.op(Op::Control(ControlOp::new(saving.clone(), first_saved + j)), &refs)));
    operands.extend(ys.iter().map(|_| g.clone()));
    operands.extend_from_slice(&x[carry + xs..]);
    let tys: Vec<TensorType> = operands.iter().map(|v| b.ty(v).clone()).collect();

    let (n_acc, n_xs) = (fc.len() + fk.len(), xs + read.len() + ys.len());
    let grad = ScanGrad { save: false, remat: *remat };
    let form = ScanForm { reverse: !reverse, unroll: *unroll };
    let back = ControlDef::scan(back_body, tys, n_acc, n_xs, *length, form, grad)
        .expect("a scan's gradient is a well-typed scan");
    let back_refs: Vec<&B::V> = operands.iter().collect();
    let mut grads = vec![None; ops.len()];
    for (j, &i) in fc.iter().chain(&fk).chain(&fx).enumerate() {
        grads[i] = Some(b.op(Op::Control(ControlOp::new(back.clone(), j)), &back_refs));
    }
    grads
}

/// A body's gradient as a program: on (`before`…, the body's inputs `primal`…, `after`…) it replays `body` on
/// `primal`, seeds its outputs with `seeds(values)` and returns `finish(values, cotangents of primal)`.
fn gradient_program(
    inputs: &[TensorType],
    primal: Range<usize>,
    body: &Program,
    seeds: impl FnOnce(&[Value]) -> Vec<Option<Value>>,
    finish: impl FnOnce(&mut Recorder, &[Value], Vec<Option<Value>>) -> Vec<Value>,
) -> Program {
    Program::record(inputs, |r, a| {
        let seeds = seeds(a);
        let d = vjp_outputs(r, &a[primal], &seeds, |t, p| {
            body.replay(t, p, None).into_iter().map(|o| o.expect("a body returns every value")).collect()
        });
        finish(r, a, d).into_iter().map(Some).collect()
    })
    .expect("a body's gradient is well-typed")
}

/// The cotangents of a `cond`'s operands for the cotangent `g` of result `result`: a `cond` on the same predicate
/// over the branches' gradients, each on (operands, both branches' captured values, `g`).
pub(crate) fn cond_vjp<B: Builder>(
    def: &Arc<ControlDef>,
    result: usize,
    b: &mut B,
    x: &[B::V],
    g: &B::V,
) -> Vec<Option<B::V>> {
    let Control::Cond { on_true, on_false, operands: n, true_captured } = &def.control else { unreachable!("a cond") };
    let ops = &def.operands;
    let wanted = floats(ops, 1..ops.len());
    let mut inputs: Vec<TensorType> = ops[1..].to_vec();
    inputs.push(b.ty(g).clone());
    let g_at = inputs.len() - 1;
    // Operand `i` of the cond is input `i - 1` of a branch's gradient.
    let branch = |p: &Program, caps: Range<usize>| {
        let picked: Vec<usize> = (0..*n).chain(caps).collect();
        let on_all = select_inputs(p, &inputs, &picked);
        gradient_program(
            &inputs,
            0..inputs.len(),
            &on_all,
            |a| {
                let mut seeds = vec![None; p.outputs.len()];
                seeds[result] = Some(a[g_at].clone());
                seeds
            },
            |r, _, mut d| wanted.iter().map(|&i| or_zeros(r, d[i - 1].take(), &ops[i])).collect(),
        )
    };
    let t = branch(on_true, *n..*n + true_captured);
    let f = branch(on_false, *n + true_captured..ops.len() - 1);
    let mut tys = vec![ops[0].clone()];
    tys.extend(inputs.iter().cloned());
    let back = ControlDef::cond(t, f, tys, inputs.len(), 0).expect("a cond's gradient is a well-typed cond");
    let mut operands: Vec<&B::V> = x.iter().collect();
    operands.push(g);
    let mut grads = vec![None; ops.len()];
    for (j, &i) in wanted.iter().enumerate() {
        grads[i] = Some(b.op(Op::Control(ControlOp::new(back.clone(), j)), &operands));
    }
    grads
}

/// `p` rewritten to take `all` as its inputs, reading its own input `j` from `all[picked[j]]` (the others unused).
fn select_inputs(p: &Program, all: &[TensorType], picked: &[usize]) -> Program {
    Program::record(all, |r, a| {
        let mine: Vec<Value> = picked.iter().map(|&i| a[i].clone()).collect();
        p.replay(r, &mine, None)
    })
    .expect("a branch replays on its own inputs")
}
