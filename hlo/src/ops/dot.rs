//! dot_general: batched matrix products and contractions. Result dimensions: batch, then the lhs's free
//! dimensions, then the rhs's free dimensions (StableHLO's order).

use ndarray::{ArrayD, IxDyn};

use crate::dtype::{DType, TensorType};
use crate::emit::LowerCx;
use crate::op::{arity, OpRules};

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct DotGeneral {
    pub lhs_batch: Vec<usize>,
    pub rhs_batch: Vec<usize>,
    pub lhs_contract: Vec<usize>,
    pub rhs_contract: Vec<usize>,
}

impl DotGeneral {
    /// Dimensions of `rank` that are neither batch nor contracting, in order.
    fn free(rank: usize, batch: &[usize], contract: &[usize]) -> Vec<usize> {
        (0..rank).filter(|d| !batch.contains(d) && !contract.contains(d)).collect()
    }
}

fn dims_list(name: &str, v: &[usize]) -> Option<String> {
    if v.is_empty() {
        return None; // the attribute omits empty lists
    }
    let items: Vec<String> = v.iter().map(|x| x.to_string()).collect();
    Some(format!("{name} = [{}]", items.join(", ")))
}

impl OpRules for DotGeneral {
    fn name(&self) -> &'static str {
        "dot_general"
    }
    fn infer(&self, operands: &[&TensorType]) -> Result<TensorType, String> {
        arity("dot_general", operands, 2)?;
        let (l, r) = (operands[0], operands[1]);
        if l.dtype != r.dtype || l.dtype == DType::Bool {
            return Err(format!("dot_general: operands must share a numeric type, got {l} and {r}"));
        }
        let valid = |dims: &[usize], rank: usize| {
            let mut seen = vec![false; rank];
            dims.iter().all(|&d| d < rank && !std::mem::replace(&mut seen[d], true))
        };
        let mut all_l = self.lhs_batch.clone();
        all_l.extend(&self.lhs_contract);
        let mut all_r = self.rhs_batch.clone();
        all_r.extend(&self.rhs_contract);
        if self.lhs_batch.len() != self.rhs_batch.len()
            || self.lhs_contract.len() != self.rhs_contract.len()
            || !valid(&all_l, l.rank())
            || !valid(&all_r, r.rank())
        {
            return Err(format!("dot_general: invalid dimension numbers {self:?} for {l} and {r}"));
        }
        for (a, b) in self.lhs_batch.iter().zip(&self.rhs_batch).chain(self.lhs_contract.iter().zip(&self.rhs_contract))
        {
            if l.dims[*a] != r.dims[*b] {
                return Err(format!(
                    "dot_general: dimension {a} of {l} ({}) does not match dimension {b} of {r} ({})",
                    l.dims[*a], r.dims[*b]
                ));
            }
        }
        let mut dims: Vec<usize> = self.lhs_batch.iter().map(|&d| l.dims[d]).collect();
        dims.extend(Self::free(l.rank(), &self.lhs_batch, &self.lhs_contract).iter().map(|&d| l.dims[d]));
        dims.extend(Self::free(r.rank(), &self.rhs_batch, &self.rhs_contract).iter().map(|&d| r.dims[d]));
        Ok(TensorType::new(l.dtype, dims))
    }
    fn lower(&self, cx: &mut LowerCx<'_>) -> String {
        let fields: Vec<String> = [
            dims_list("lhs_batching_dimensions", &self.lhs_batch),
            dims_list("rhs_batching_dimensions", &self.rhs_batch),
            dims_list("lhs_contracting_dimensions", &self.lhs_contract),
            dims_list("rhs_contracting_dimensions", &self.rhs_contract),
        ]
        .into_iter()
        .flatten()
        .collect();
        cx.op_on_args(
            "stablehlo.dot_general",
            &format!("dot_dimension_numbers = #stablehlo.dot<{}>", fields.join(", ")),
        )
    }
    fn reference(&self, out: &TensorType, x: &[&ArrayD<f64>]) -> ArrayD<f64> {
        let (l, r) = (x[0], x[1]);
        let lfree = Self::free(l.ndim(), &self.lhs_batch, &self.lhs_contract);
        let rfree = Self::free(r.ndim(), &self.rhs_batch, &self.rhs_contract);
        let csizes: Vec<usize> = self.lhs_contract.iter().map(|&d| l.shape()[d]).collect();
        let ccount: usize = csizes.iter().product();
        let nb = self.lhs_batch.len();
        ArrayD::from_shape_fn(IxDyn(&out.dims), |ix| {
            let mut li = vec![0usize; l.ndim()];
            let mut ri = vec![0usize; r.ndim()];
            for k in 0..nb {
                li[self.lhs_batch[k]] = ix[k];
                ri[self.rhs_batch[k]] = ix[k];
            }
            for (k, &d) in lfree.iter().enumerate() {
                li[d] = ix[nb + k];
            }
            for (k, &d) in rfree.iter().enumerate() {
                ri[d] = ix[nb + lfree.len() + k];
            }
            let mut acc = 0.0;
            for mut c in 0..ccount {
                for (k, &size) in csizes.iter().enumerate().rev() {
                    li[self.lhs_contract[k]] = c % size;
                    ri[self.rhs_contract[k]] = c % size;
                    c /= size;
                }
                acc += l[IxDyn(&li)] * r[IxDyn(&ri)];
            }
            acc
        })
    }
}
