//! Structural constants shared per thread: the counts, coefficients and zeros the library records for itself.

use std::collections::HashMap;
use std::rc::Rc;

use lazuli_hlo::{Constant, DType, Loc, Op, TensorType};

use crate::graph::tensor::{Node, Tensor};

/// `value` of `dtype` broadcast to `dims`, as structure (a count, a fixed coefficient, a zero to select): one node
/// per value, dtype and shape, shared by every use on this thread, so a model that scales by the same constant
/// in every layer records it once instead of a constant and a broadcast per use. The shared node is never a
/// step's output (it has no handle outside one op's recording), so it stays a constant in every program.
pub(crate) fn constant_like(value: f64, dtype: DType, dims: &[usize], loc: Loc) -> Tensor {
    Tensor::structural(shared_constant(value, dtype, dims, loc))
}

/// The node behind [`constant_like`] (autodiff's constants share it too).
pub(crate) fn shared_constant(value: f64, dtype: DType, dims: &[usize], loc: Loc) -> Rc<Node> {
    type Key = (u64, DType, lazuli_hlo::Dims);
    thread_local! {
        static SHARED: std::cell::RefCell<HashMap<Key, Rc<Node>>> = std::cell::RefCell::new(HashMap::new());
    }
    let key = (value.to_bits(), dtype, lazuli_hlo::Dims::from_slice(dims));
    SHARED.with(|m| {
        let mut m = m.borrow_mut();
        if let Some(n) = m.get(&key) {
            return n.clone();
        }
        // Shapes a long-running process saw once stay in the graphs that use them, not here.
        if m.len() >= 512 {
            m.clear();
        }
        // Made without a handle, so it is never registered as a candidate output of `sync()`.
        let ty = TensorType::new(dtype, dims);
        let op = Op::Constant(Constant::new(value, ty.clone()));
        let n = Tensor::record_node(op, Default::default(), ty, loc);
        m.insert(key, n.clone());
        n
    })
}
