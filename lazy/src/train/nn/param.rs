//! `Param`: a named, trainable tensor slot. Modules hold params; optimizers replace their values each step
//! (functionally: a new lazy tensor), and the step boundary computes the new values in place (donation).
//!
//! A parameter may also keep copies of its value in other floating-point dtypes ([`Param::get_as`]): the
//! low-precision weights of mixed-precision training. Each copy is state of the parameter: written as
//! `convert(new value)` whenever the value is replaced, so an optimizer's update writes it in the same program
//! (XLA fuses the convert into the update's kernel), its gradient folded into the parameter's, and its old buffer
//! donated to its new value like the parameter's.

use std::cell::RefCell;
use std::rc::Rc;

use lazuli_hlo::{BinaryKind, DType, Loc};

use crate::graph::autodiff::no_grad;
use crate::graph::record::fail;
use crate::graph::tensor::Tensor;

/// A shared handle to a trainable tensor. Clones refer to the same slot, so a module and its optimizer see
/// the same value.
#[derive(Clone)]
pub struct Param {
    slot: Rc<RefCell<Slot>>,
}

/// A parameter's value and its copies in other dtypes (at most one per dtype).
struct Slot {
    value: Tensor,
    copies: Vec<Tensor>,
}

impl Param {
    /// A parameter holding `value`, marked as a gradient leaf.
    pub fn new(value: Tensor) -> Param {
        value.set_requires_grad(true);
        Param { slot: Rc::new(RefCell::new(Slot { value, copies: Vec::new() })) }
    }

    /// The current value.
    pub fn get(&self) -> Tensor {
        self.slot.borrow().value.clone()
    }

    /// The current value in `dtype` (any floating-point dtype; the parameter's own returns [`Param::get`]): a copy
    /// the parameter keeps, a gradient leaf of its own whose gradient belongs to the parameter. [`Param::grad`]
    /// and therefore the optimizers add it, converted to the parameter's dtype, to the parameter's gradient, and
    /// every new value ([`Param::set`], an optimizer's update) writes the copy as its convert in the same program:
    /// with f32 parameters and bf16 copies for the products, the weights' conversions cost a 2-byte write inside
    /// the update instead of a convert of each weight in each step.
    ///
    /// The first call creates the copy. When the value is computed already, the copy is computed before the
    /// thread's next program, together with every other copy asked for since, in one program (set-up that strict
    /// mode lets through; its event and errors name the line of the first). A parameter on a mesh computes its
    /// copy at once, so that the copy's layout can be read. Either way, from the first step on the copy is a
    /// program input like the value: the step's program has one structure from step 1, and
    /// `LAZULI_CHECK_FINITE=skip` keeps it on a skipped step as it keeps the value. (A copy first made from a
    /// pending value, after an update and before the step boundary, is computed by that step's program, and kept
    /// by skip from the next step on.) Panics at the caller's line for a dtype that is not floating-point, or (on
    /// a mesh) when computing the copy fails; otherwise an error computing the copy is the error of the
    /// materialization that computes it.
    #[track_caller]
    pub fn get_as(&self, dtype: DType) -> Tensor {
        let at = Loc::caller();
        check_copy_dtype("Param::get_as", dtype, at);
        let mut slot = self.slot.borrow_mut();
        if dtype == slot.value.dtype() {
            return slot.value.clone();
        }
        if let Some(copy) = slot.copies.iter().find(|c| c.dtype() == dtype) {
            return copy.clone();
        }
        let copy = slot.copy_of_value(dtype, at);
        if !slot.value.is_pending() {
            compute_before_next_program(&copy, slot.value.sharding().is_some(), at);
        }
        slot.copies.push(copy.clone());
        copy
    }

    /// Replace the value (an optimizer update, a checkpoint load). The new value becomes the gradient leaf, and
    /// the copies kept by [`Param::get_as`] follow it: a pending value (an update) writes each copy as its convert
    /// in the same program; a computed one (a load, `shard_params`) drops them, and the next `get_as` makes them
    /// anew. A copy of an older value is never returned.
    #[track_caller]
    pub fn set(&self, value: Tensor) {
        self.set_at(value, Loc::caller())
    }

    /// [`Param::set`] with its nodes and errors at `at` (an optimizer's `step()` line).
    pub(crate) fn set_at(&self, value: Tensor, at: Loc) {
        let mut slot = self.slot.borrow_mut();
        if value.tensor_type() != slot.value.tensor_type() {
            fail(
                at,
                format!(
                    "Param::set: new value {} does not match the parameter's {}",
                    value.tensor_type(),
                    slot.value.tensor_type()
                ),
            );
        }
        // A parameter laid out on a mesh keeps its layout: its new value is constrained to the old one's, so the
        // step's output is produced (and donated into) the same shards.
        let value = match (slot.value.sharding(), value.is_pending()) {
            (Some(s), true) if value.sharding().is_none() => value.with_sharding_constraint(&s.mesh, &s.spec()),
            _ => value,
        };
        value.set_requires_grad(true);
        // The gradient belongs to the parameter, not to one value of it: it moves to the new value, so that
        // `zero_grad()` after an optimizer step clears it (and the step's program does not output stale gradients).
        slot.fold_copy_grads(at);
        if let Some(g) = slot.value.take_grad() {
            value.put_grad(g);
        }
        slot.value.node.hand_over(&value.node);
        slot.value = value;
        slot.follow_value(at);
    }

    /// The gradient accumulated by `backward()`, if any: the value's own plus those of its copies
    /// ([`Param::get_as`]), each converted to the parameter's dtype.
    #[track_caller]
    pub fn grad(&self) -> Option<Tensor> {
        self.grad_at(Loc::caller())
    }

    /// [`Param::grad`] with the nodes that add the copies' gradients at `at`.
    pub(crate) fn grad_at(&self, at: Loc) -> Option<Tensor> {
        let slot = self.slot.borrow();
        slot.fold_copy_grads(at);
        slot.value.grad()
    }

    /// Replace the gradient (gradient clipping scales it), the copies' parts included.
    pub(crate) fn set_grad(&self, g: Tensor) {
        let slot = self.slot.borrow();
        slot.copies.iter().for_each(Tensor::zero_grad);
        slot.value.put_grad(g)
    }

    /// Forget the gradient, the copies' parts included (`grad()` is `None` until the next `backward()`).
    pub fn zero_grad(&self) {
        let slot = self.slot.borrow();
        slot.copies.iter().for_each(Tensor::zero_grad);
        slot.value.zero_grad()
    }

    /// Two handles to the same slot?
    pub fn same(&self, other: &Param) -> bool {
        Rc::ptr_eq(&self.slot, &other.slot)
    }
}

impl Slot {
    /// `value` converted to `dtype`, laid out like it, as a gradient leaf (no gradient flows through the convert:
    /// the copy's own is folded into the value's by `fold_copy_grads`).
    fn copy_of_value(&self, dtype: DType, at: Loc) -> Tensor {
        no_grad(|| {
            let copy = self.value.to_dtype_at(dtype, at);
            let copy = crate::train::optim::follow(&copy, &self.value);
            copy.set_requires_grad(true);
            copy
        })
    }

    /// Move each copy's gradient into the value's, converted to its dtype (the convert's gradient, as if the copy
    /// were converted from the value at its use).
    fn fold_copy_grads(&self, at: Loc) {
        for copy in &self.copies {
            let Some(g) = copy.take_grad() else { continue };
            let total = no_grad(|| {
                let g = g.to_dtype_at(self.value.dtype(), at);
                match self.value.take_grad() {
                    Some(own) => own.binary_at(&g, BinaryKind::Add, at),
                    None => g,
                }
            });
            self.value.put_grad(total);
        }
    }

    /// Bring the copies up to a new value: each old copy hands its buffer over to its successor, as the value does.
    fn follow_value(&mut self, at: Loc) {
        if !self.value.is_pending() {
            self.copies.clear();
            return;
        }
        let next: Vec<Tensor> = self.copies.iter().map(|c| self.copy_of_value(c.dtype(), at)).collect();
        let noted = !self.copies.is_empty() && crate::exec::finite::notes_copies();
        for (old, new) in self.copies.iter_mut().zip(next) {
            if noted {
                crate::exec::finite::chain::note_copy(&old.node, &new.node, &self.value.node);
            }
            crate::train::optim::replace(old, new);
        }
    }
}

/// Compute a new copy of a computed value with the other copies asked for before the next program, or at once on a
/// mesh: a copy's layout ([`Tensor::sharding`]) is known once it is computed, and a sharded parameter's copy is
/// to have its parameter's from its creation on.
fn compute_before_next_program(copy: &Tensor, sharded: bool, at: Loc) {
    crate::exec::setup::defer(copy.node.clone(), at);
    if sharded {
        if let Err(e) = crate::exec::setup::compute_waiting() {
            fail(at, format!("Param::get_as: computing the parameter's {} copy failed: {e}", copy.dtype()));
        }
    }
}

/// A copy's dtype must be floating-point (a gradient leaf); panics at `at`, naming `what`, otherwise.
pub(crate) fn check_copy_dtype(what: &str, dtype: DType, at: Loc) {
    if !dtype.is_float() {
        fail(at, format!("{what}: a copy of a parameter needs a floating-point dtype, not {dtype}"));
    }
}

impl std::fmt::Debug for Param {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Param({:?})", self.get())
    }
}
