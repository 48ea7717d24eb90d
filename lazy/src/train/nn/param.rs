//! `Param`: a named, trainable tensor slot. Modules hold params; optimizers replace their values each step
//! (functionally: a new lazy tensor), and the step boundary computes the new values in place (donation).

use std::cell::RefCell;
use std::rc::Rc;

use crate::graph::tensor::Tensor;

/// A shared handle to a trainable tensor. Clones refer to the same slot, so a module and its optimizer see
/// the same value.
#[derive(Clone)]
pub struct Param {
    slot: Rc<RefCell<Tensor>>,
}

impl Param {
    /// A parameter holding `value`, marked as a gradient leaf.
    pub fn new(value: Tensor) -> Param {
        value.set_requires_grad(true);
        Param { slot: Rc::new(RefCell::new(value)) }
    }

    /// The current value.
    pub fn get(&self) -> Tensor {
        self.slot.borrow().clone()
    }

    /// Replace the value (an optimizer update, a checkpoint load). The new value becomes the gradient leaf.
    #[track_caller]
    pub fn set(&self, value: Tensor) {
        let mut slot = self.slot.borrow_mut();
        if value.tensor_type() != slot.tensor_type() {
            crate::graph::record::fail(
                crate::Loc::caller(),
                format!(
                    "Param::set: new value {} does not match the parameter's {}",
                    value.tensor_type(),
                    slot.tensor_type()
                ),
            );
        }
        // A parameter laid out on a mesh keeps its layout: its new value is constrained to the old one's, so the
        // step's output is produced (and donated into) the same shards.
        let value = match (slot.sharding(), value.is_pending()) {
            (Some(s), true) if value.sharding().is_none() => value.with_sharding_constraint(&s.mesh, &s.spec()),
            _ => value,
        };
        value.set_requires_grad(true);
        // The gradient belongs to the parameter, not to one value of it: it moves to the new value, so that
        // `zero_grad()` after an optimizer step clears it (and the step's program does not output stale gradients).
        let grad = slot.take_grad();
        if let Some(g) = grad {
            value.put_grad(g);
        }
        slot.node.hand_over(&value.node);
        *slot = value;
    }

    /// The gradient accumulated by `backward()`, if any.
    pub fn grad(&self) -> Option<Tensor> {
        self.slot.borrow().grad()
    }

    /// Replace the gradient (gradient clipping scales it).
    pub(crate) fn set_grad(&self, g: Tensor) {
        self.slot.borrow().put_grad(g)
    }

    /// Forget the gradient (`grad()` is `None` until the next `backward()`).
    pub fn zero_grad(&self) {
        self.slot.borrow().zero_grad()
    }

    /// Two handles to the same slot?
    pub fn same(&self, other: &Param) -> bool {
        Rc::ptr_eq(&self.slot, &other.slot)
    }
}

impl std::fmt::Debug for Param {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Param({:?})", self.get())
    }
}
