//! Evaluate pending tensors on the host with the IR's reference rules (ndarray, f64), without XLA. Tests compare
//! XLA's results with this; users can use it to check a suspicious numeric result.

use ndarray::{ArrayD, IxDyn};

use crate::element::bytes_to_f64;
use crate::error::Result;
use crate::tensor::Tensor;
use crate::walk::trace;

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
