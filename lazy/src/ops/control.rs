//! Structured control flow: [`scan`], [`while_loop`] and [`cond`], with bodies written as ordinary Rust closures
//! over tensors. Each closure is traced once into a program (`graph/trace.rs`) that the op carries
//! (`lazuli_hlo::ControlOp`), so a loop of a thousand steps is one op in the graph and one loop in the compiled
//! program, not a thousand unrolled copies.
//!
//! Tensors a body uses without computing them from its arguments (weights, a mask, a host scalar) are lifted
//! into extra operands of the loop: computed once before it, passed to every step unchanged, and given
//! gradients like any operand.

use lazuli_hlo::{ControlDef, ControlOp, Loc, Op, ScanForm, ScanGrad, TensorType};

use crate::error::{Error, Result};
use crate::graph::autodiff::grad_enabled;
use crate::graph::record::{named_op_error, raise, try_apply};
use crate::graph::tensor::Tensor;
use crate::graph::trace::{trace, Captures, Traced};

/// A scan's options: direction, where there are no `xs` the number of steps, and how its gradient gets each
/// step's intermediate values. [`scan`] is `Scan::new().run(…)`.
///
/// ```no_run
/// use lazuli_lazy::{Scan, Tensor};
/// let xs = Tensor::from_slice(&[1.0f32, 2.0, 3.0], &[3]);
/// // Sums from the last element to the first: ys = [6, 5, 3].
/// let (total, ys) = Scan::new().reverse(true).run(
///     |c, x| {
///         let s = &c[0] + &x[0];
///         (vec![s.clone()], vec![s])
///     },
///     &[Tensor::zeros(&[], lazuli_lazy::DType::F32)],
///     &[xs],
/// );
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Scan {
    reverse: bool,
    length: Option<usize>,
    remat: bool,
    unroll: bool,
}

impl Scan {
    /// Forward over the leading axis, as many steps as the `xs` are long.
    pub fn new() -> Scan {
        Scan::default()
    }

    /// Visit the steps from the last to the first (`ys` stay in the `xs`' order).
    pub fn reverse(mut self, on: bool) -> Scan {
        self.reverse = on;
        self
    }

    /// The number of steps: needed without `xs`, checked against them otherwise.
    pub fn length(mut self, n: usize) -> Scan {
        self.length = Some(n);
        self
    }

    /// Recompute each step's intermediates in the backward pass instead of saving them. By default a scan on a
    /// gradient path saves, per step, the values its ops' gradient rules read (as the unrolled loop keeps its
    /// activations), so the backward pass runs no forward op again; with `remat` it saves only the carry each
    /// step started from and runs the step again from it: memory of one carry per step instead of every
    /// activation, for about one more forward pass of compute (gradient checkpointing per step).
    pub fn remat(mut self, on: bool) -> Scan {
        self.remat = on;
        self
    }

    /// Write the steps out in the compiled program instead of looping: the body once per step, each step's
    /// values visible to XLA across steps (fusions that join one step's end to the next one's start, no loop
    /// state to copy), as an unrolled Python loop under `jax.jit`. The graph still holds the body once, so
    /// recording and walking stay as fast as the loop's; the compile grows with the number of steps. Its
    /// gradient is written out too. Meant for a few dozen steps (layers), not a long sequence.
    pub fn unroll(mut self, on: bool) -> Scan {
        self.unroll = on;
        self
    }

    /// [`scan`] with these options.
    #[track_caller]
    pub fn run(
        &self,
        f: impl FnOnce(&[Tensor], &[Tensor]) -> (Vec<Tensor>, Vec<Tensor>),
        carry: &[Tensor],
        xs: &[Tensor],
    ) -> (Vec<Tensor>, Vec<Tensor>) {
        self.scan_at(f, carry, xs, Loc::caller()).unwrap_or_else(|e| raise(e))
    }

    /// [`try_scan`] with these options.
    #[track_caller]
    pub fn try_run(
        &self,
        f: impl FnOnce(&[Tensor], &[Tensor]) -> (Vec<Tensor>, Vec<Tensor>),
        carry: &[Tensor],
        xs: &[Tensor],
    ) -> Result<(Vec<Tensor>, Vec<Tensor>)> {
        self.scan_at(f, carry, xs, Loc::caller())
    }

    fn scan_at(
        &self,
        f: impl FnOnce(&[Tensor], &[Tensor]) -> (Vec<Tensor>, Vec<Tensor>),
        carry: &[Tensor],
        xs: &[Tensor],
        loc: Loc,
    ) -> Result<(Vec<Tensor>, Vec<Tensor>)> {
        let invalid = |why: String| Error::InvalidArgument { op: "scan", why, at: loc };
        if let Some(x) = xs.iter().find(|x| x.rank() == 0) {
            let why = format!("scan: xs {} has no leading axis to scan over", x.tensor_type());
            return Err(Error::ShapeMismatch { op: "scan", shapes: vec![x.dims().to_vec()], why, at: loc });
        }
        let length = match (self.length, xs.first()) {
            (Some(n), _) => n,
            (None, Some(x)) => x.dims()[0],
            (None, None) => {
                return Err(invalid("scan: without xs, give the number of steps: Scan::new().length(n)".into()))
            }
        };
        let (nc, nx) = (carry.len(), xs.len());
        let mut types: Vec<TensorType> = carry.iter().map(|c| c.tensor_type().clone()).collect();
        types.extend(xs.iter().map(|x| TensorType::new(x.dtype(), &x.dims()[1..])));
        let mut returned = 0;
        let traced = trace(&types, loc, Captures::Lift, |a| {
            let (new_carry, ys) = f(&a[..nc], &a[nc..]);
            returned = new_carry.len();
            new_carry.into_iter().chain(ys).map(Some).collect()
        })
        .map_err(|e| invalid(format!("scan: in the body: {e}")))?;
        if returned != nc {
            return Err(invalid(format!("scan: the body returns {returned} carry value(s) for a carry of {nc}")));
        }
        let operands: Vec<&Tensor> = carry.iter().chain(xs).chain(&traced.captured).collect();
        let grad = ScanGrad { save: on_gradient_path(&operands), remat: self.remat };
        let form = ScanForm { reverse: self.reverse, unroll: self.unroll };
        let def = ControlDef::scan(traced.program, tys(&operands), nc, nx, length, form, grad)
            .map_err(|why| named_op_error("scan", why, &type_refs(&operands), loc))?;
        let mut results = record(&def, &operands, loc)?;
        let ys = results.split_off(nc);
        Ok((results, ys))
    }
}

/// Run `f(carry, x_t) -> (new carry, y_t)` over the leading axis of `xs`, from the first step to the last;
/// returns the final carry and each `y` stacked along a new leading axis. The body must give the carry back
/// with the same shapes and dtypes; a body that does not panics naming the caller's line ([`try_scan`]
/// returns it as an error). Differentiable: the gradient is a scan the other way round.
///
/// ```no_run
/// use lazuli_lazy::{scan, DType, Tensor};
/// let xs = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[4, 1]);
/// let w = Tensor::from_slice(&[0.5f32], &[1]); // used by the body: lifted into an operand of the loop
/// let h0 = Tensor::zeros(&[1], DType::F32);
/// let (h, hs) = scan(
///     |h, x| {
///         let next = (&(&h[0] * &w) + &x[0]).tanh();
///         (vec![next.clone()], vec![next])
///     },
///     &[h0],
///     &[xs],
/// );
/// assert_eq!(hs[0].dims(), &[4, 1]);
/// ```
#[track_caller]
pub fn scan(
    f: impl FnOnce(&[Tensor], &[Tensor]) -> (Vec<Tensor>, Vec<Tensor>),
    carry: &[Tensor],
    xs: &[Tensor],
) -> (Vec<Tensor>, Vec<Tensor>) {
    Scan::new().scan_at(f, carry, xs, Loc::caller()).unwrap_or_else(|e| raise(e))
}

/// [`scan`], with [`Error::ShapeMismatch`] or [`Error::WrongDType`] when the body changes the carry's shape or
/// dtype, and [`Error::InvalidArgument`] when it returns another number of carry values.
#[track_caller]
pub fn try_scan(
    f: impl FnOnce(&[Tensor], &[Tensor]) -> (Vec<Tensor>, Vec<Tensor>),
    carry: &[Tensor],
    xs: &[Tensor],
) -> Result<(Vec<Tensor>, Vec<Tensor>)> {
    Scan::new().scan_at(f, carry, xs, Loc::caller())
}

/// Run `body(carry) -> new carry` while `cond(carry)` (a bool scalar) holds; returns the final carry. The body
/// must keep the carry's shapes and dtypes. Forward only: reverse-mode gradients need a trip count, so
/// `backward()` through a while loop panics naming its line; use [`scan`] for a fixed number of steps.
///
/// ```no_run
/// use lazuli_lazy::{while_loop, Tensor};
/// // Doubles x until it reaches 100: 3 → 192.
/// let x = Tensor::from_slice(&[3.0f32], &[]);
/// let out = while_loop(|c| c[0].lt(&Tensor::scalar(100.0f32)), |c| vec![&c[0] * 2.0], &[x]);
/// ```
#[track_caller]
pub fn while_loop(
    cond: impl FnOnce(&[Tensor]) -> Tensor,
    body: impl FnOnce(&[Tensor]) -> Vec<Tensor>,
    init: &[Tensor],
) -> Vec<Tensor> {
    while_at(cond, body, init, Loc::caller()).unwrap_or_else(|e| raise(e))
}

/// [`while_loop`], with the error instead of the panic when the body changes the carry's shape or dtype or the
/// condition is not a bool scalar.
#[track_caller]
pub fn try_while_loop(
    cond: impl FnOnce(&[Tensor]) -> Tensor,
    body: impl FnOnce(&[Tensor]) -> Vec<Tensor>,
    init: &[Tensor],
) -> Result<Vec<Tensor>> {
    while_at(cond, body, init, Loc::caller())
}

fn while_at(
    cond: impl FnOnce(&[Tensor]) -> Tensor,
    body: impl FnOnce(&[Tensor]) -> Vec<Tensor>,
    init: &[Tensor],
    loc: Loc,
) -> Result<Vec<Tensor>> {
    let invalid = |why: String| Error::InvalidArgument { op: "while_loop", why, at: loc };
    let types: Vec<TensorType> = init.iter().map(|c| c.tensor_type().clone()).collect();
    let test = trace(&types, loc, Captures::Lift, |a| vec![Some(cond(a))])
        .map_err(|e| invalid(format!("while_loop: in the condition: {e}")))?;
    let step = trace(&types, loc, Captures::Lift, |a| body(a).into_iter().map(Some).collect())
        .map_err(|e| invalid(format!("while_loop: in the body: {e}")))?;
    let operands: Vec<&Tensor> = init.iter().chain(&test.captured).chain(&step.captured).collect();
    let n_test = test.captured.len();
    let def = ControlDef::while_loop(test.program, step.program, tys(&operands), init.len(), n_test)
        .map_err(|why| named_op_error("while_loop", why, &type_refs(&operands), loc))?;
    record(&def, &operands, loc)
}

/// `on_true(operands)` where the bool scalar `pred` holds, else `on_false(operands)`; only the branch taken runs.
/// Both branches must return the same shapes and dtypes. Differentiable: the gradient is a `cond` over the
/// branches' gradients.
///
/// ```no_run
/// use lazuli_lazy::{cond, Tensor};
/// let x = Tensor::from_slice(&[1.0f32, -2.0], &[2]);
/// let big = x.sum_all().gt(&Tensor::scalar(0.0f32));
/// let y = cond(&big, |a| vec![&a[0] * 2.0], |a| vec![a[0].neg()], &[x]).remove(0);
/// ```
#[track_caller]
pub fn cond(
    pred: &Tensor,
    on_true: impl FnOnce(&[Tensor]) -> Vec<Tensor>,
    on_false: impl FnOnce(&[Tensor]) -> Vec<Tensor>,
    operands: &[Tensor],
) -> Vec<Tensor> {
    cond_at(pred, on_true, on_false, operands, Loc::caller()).unwrap_or_else(|e| raise(e))
}

/// [`cond`], with the error instead of the panic when the branches return different types or the predicate is
/// not a bool scalar.
#[track_caller]
pub fn try_cond(
    pred: &Tensor,
    on_true: impl FnOnce(&[Tensor]) -> Vec<Tensor>,
    on_false: impl FnOnce(&[Tensor]) -> Vec<Tensor>,
    operands: &[Tensor],
) -> Result<Vec<Tensor>> {
    cond_at(pred, on_true, on_false, operands, Loc::caller())
}

fn cond_at(
    pred: &Tensor,
    on_true: impl FnOnce(&[Tensor]) -> Vec<Tensor>,
    on_false: impl FnOnce(&[Tensor]) -> Vec<Tensor>,
    operands: &[Tensor],
    loc: Loc,
) -> Result<Vec<Tensor>> {
    let invalid = |why: String| Error::InvalidArgument { op: "cond", why, at: loc };
    let types: Vec<TensorType> = operands.iter().map(|c| c.tensor_type().clone()).collect();
    let t: Traced = trace(&types, loc, Captures::Lift, |a| on_true(a).into_iter().map(Some).collect())
        .map_err(|e| invalid(format!("cond: in the true branch: {e}")))?;
    let f: Traced = trace(&types, loc, Captures::Lift, |a| on_false(a).into_iter().map(Some).collect())
        .map_err(|e| invalid(format!("cond: in the false branch: {e}")))?;
    let all: Vec<&Tensor> = std::iter::once(pred).chain(operands).chain(&t.captured).chain(&f.captured).collect();
    let def = ControlDef::cond(t.program, f.program, tys(&all), operands.len(), t.captured.len())
        .map_err(|why| named_op_error("cond", why, &type_refs(&all), loc))?;
    record(&def, &all, loc)
}

fn tys(ts: &[&Tensor]) -> Vec<TensorType> {
    ts.iter().map(|t| t.tensor_type().clone()).collect()
}

fn type_refs<'a>(ts: &[&'a Tensor]) -> Vec<&'a TensorType> {
    ts.iter().map(|t| t.tensor_type()).collect()
}

/// Whether a gradient may be asked of the op's results: then a scan saves its residuals as it runs.
fn on_gradient_path(operands: &[&Tensor]) -> bool {
    grad_enabled() && operands.iter().any(|t| t.dtype().is_float() && (t.node.grad_path || t.node.requires_grad()))
}

/// One node per result the user sees; they lower as one op (`LowerCx::shared`).
fn record(def: &std::sync::Arc<ControlDef>, operands: &[&Tensor], loc: Loc) -> Result<Vec<Tensor>> {
    (0..def.visible_results()).map(|r| try_apply(Op::Control(ControlOp::new(def.clone(), r)), operands, loc)).collect()
}
