//! `stop`'s sticky trip flag: one `bool[]` tensor per thread that every program checked under `stop` reads and
//! hands on as `flag OR tripped` (`hlo::finite::sticky`). Each program's guards keep its state while the flag it
//! hands on is set, so once a step trips, that step and every program launched after it leave the state as it was
//! before the bad step, and the check can be read later without waiting for the device.
//!
//! The flag is an ordinary lazy tensor: each checked materialization records the flag's next value as one more
//! target (a placeholder `flag OR flag`, into which the program's check ORs its trip), so the engine uploads it,
//! lays it out on a mesh and keeps its value as it does any state's. A program that updates no state still hands
//! it on, and programs of any structure (a training step, an evaluation) share it. It is a scalar: never donated,
//! a new four-byte buffer per program.

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use lazuli_hlo::{BinaryKind, DType, Loc};

use crate::graph::tensor::{Node, Tensor};
use crate::runtime::CheckFinite;

thread_local! {
    /// The flag as the last checked program on this thread handed it on; `None` before the first and after a
    /// trip was reported.
    static FLAG: RefCell<Option<Tensor>> = const { RefCell::new(None) };
    /// Which flag chain is current: a new one after each reported trip. A value counted by a program of the
    /// current chain is covered by the flag: a later program need not count it again ([`epoch`]).
    static EPOCH: Cell<u64> = const { Cell::new(1) };
}

/// The current flag chain. A program checked under `stop` notes it on the values it counted; a later program of
/// the same chain reads the flag those counts went into, and so leaves such values out of its own count. After a
/// trip the flag starts clear, and values counted before it are counted again where they enter an update.
pub(crate) fn epoch() -> u64 {
    EPOCH.get()
}

/// The flag a materialization reads and its next value, a target of its program.
pub(crate) struct Next {
    read: Tensor,
    pub next: Tensor,
}

/// Under `stop`: the flag's next value, recorded at `at` for the materialization about to be planned.
pub(crate) fn next(mode: CheckFinite, at: Loc) -> Option<Next> {
    if mode != CheckFinite::Stop {
        return None;
    }
    let read = FLAG.with_borrow_mut(|f| f.get_or_insert_with(|| Tensor::scalar_of(DType::Bool, 0.0)).clone());
    let next = read.binary_at(&read, BinaryKind::Or, at);
    Some(Next { read, next })
}

/// The program that computes `next` was launched: its value is the flag from now on. Where a program launched
/// meanwhile (a piece of a large graph, computed first) handed on a flag of its own, both are kept.
pub(crate) fn launched(flag: Next) {
    FLAG.with_borrow_mut(|f| match f {
        Some(current) if !Rc::ptr_eq(&current.node, &flag.read.node) => {
            *f = Some(current.binary_at(&flag.next, BinaryKind::Or, Loc::caller()));
        }
        _ => *f = Some(flag.next),
    })
}

/// Whether `node` is the flag as this thread's next program reads it: not a placement of its own (on a mesh it
/// follows the program; it never puts a program on a mesh).
pub(crate) fn is_flag(node: &Node) -> bool {
    FLAG.with_borrow(|f| f.as_ref().is_some_and(|t| std::ptr::eq(&*t.node, node)))
}

/// A trip was reported: the next program starts from a clear flag, in a new chain.
pub(crate) fn reset() {
    FLAG.with_borrow_mut(|f| *f = None);
    EPOCH.set(EPOCH.get() + 1);
}
