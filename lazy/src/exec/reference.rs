//! Evaluate pending tensors on the host with the IR's reference rules (ndarray, f64), without XLA. Tests compare
//! XLA's results with this; users can use it to check a suspicious numeric result.

use ndarray::{ArrayD, IxDyn};

use crate::error::{Error, Result};
use crate::graph::element::bytes_to_f64;
use crate::graph::tensor::Tensor;
use crate::graph::walk::trace;

impl Tensor {
    /// This tensor computed by the host reference interpreter (values as f64, rounded to the dtype after every op).
    /// Runs nothing on the device; reads device-resident inputs back if needed.
    pub fn evaluate_reference(&self) -> Result<ArrayD<f64>> {
        let node = &self.node;
        let traced = trace(std::slice::from_ref(node));
        if traced.graph.outputs.is_empty() {
            // Not pending (or computed by another thread's `sync()` before the walk): its value is the answer.
            let v = self.to_f64_vec()?;
            return Ok(ArrayD::from_shape_vec(IxDyn(self.dims()), v).expect("buffer matches type"));
        }
        fits_on_the_host(&traced.graph)?;
        let mut params = Vec::with_capacity(traced.leaves.len());
        for leaf in &traced.leaves {
            let data = leaf.lock().data.clone();
            let bytes = match data {
                Some(d) => d.to_host(&leaf.ty)?,
                None => return Err(crate::error::Error::Internal("a pending node was bound to a parameter".into())),
            };
            let v = bytes_to_f64(leaf.ty.dtype, &bytes);
            params.push(ArrayD::from_shape_vec(IxDyn(&leaf.ty.dims), v).expect("buffer matches type"));
        }
        let mut outs = traced.graph.evaluate(&params).map_err(crate::error::Error::Internal)?;
        Ok(outs.remove(0))
    }
}

/// The interpreter holds every value of the graph as f64 at once; a graph with one larger than the host's available
/// memory is refused (naming the line that recorded it) instead of aborting on a failed allocation.
fn fits_on_the_host(graph: &lazuli_hlo::Graph) -> Result<()> {
    let f64_bytes = |n: &lazuli_hlo::Node| n.ty.elements().saturating_mul(8);
    let Some(largest) = graph.nodes.iter().max_by_key(|n| f64_bytes(n)) else { return Ok(()) };
    match crate::runtime::host_shortfall(f64_bytes(largest)) {
        None => Ok(()),
        Some(short) => Err(Error::OutOfMemory(format!(
            "the reference interpreter would hold {} recorded at {} as f64: {short}",
            largest.ty, largest.loc
        ))),
    }
}
