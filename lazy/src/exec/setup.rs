//! Set-up computed together. A parameter's low-precision copy ([`crate::nn::Param::get_as`]) is made the first
//! time a forward pass asks for it, one parameter at a time; computing each at once would cost a program (and a
//! round trip to the device) per parameter before the first step. Instead each waits here, and the thread's next
//! materialization first computes every waiting value in one program. The step that reads them then finds them
//! computed: program inputs from the first step on, as the parameters themselves are.

use std::cell::RefCell;
use std::rc::Rc;

use lazuli_hlo::Loc;

use crate::diagnostics::{unchecked, Cause};
use crate::error::Result;
use crate::graph::tensor::Node;

/// The values waiting, and the line that asked for the first of them.
struct Waiting {
    nodes: Vec<Rc<Node>>,
    first: Loc,
}

thread_local! {
    static WAITING: RefCell<Option<Waiting>> = const { RefCell::new(None) };
}

/// Compute `node` (pending) with the other waiting set-up, before this thread's next program.
pub(crate) fn defer(node: Rc<Node>, at: Loc) {
    WAITING.with_borrow_mut(|w| w.get_or_insert_with(|| Waiting { nodes: Vec::new(), first: at }).nodes.push(node));
}

/// Compute the waiting set-up values, if any, in one program (set-up that strict mode lets through), at the line
/// that asked for the first of them: its event and any error name that line.
pub(crate) fn compute_waiting() -> Result<()> {
    let Some(Waiting { nodes, first }) = WAITING.take() else { return Ok(()) };
    unchecked(|| super::materialize(&nodes, Cause::Explicit, first))
}
