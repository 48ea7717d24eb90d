//! dot_general: batched matrix products and contractions. Result dimensions: batch, then the lhs's free
//! dimensions, then the rhs's free dimensions (StableHLO's order).

use crate::infer_error::InferError;
use ndarray::{ArrayD, IxDyn};

use crate::builder::Builder;
use crate::dtype::{DType, TensorType};
use crate::emit::LowerCx;
use crate::op::Op;
use crate::op::{arity, OpRules};

/// A list of dimension numbers: inline up to two (a matmul's), so recording a product allocates none.
pub type Axes = smallvec::SmallVec<[usize; 2]>;

/// How exactly a product of floats is computed (StableHLO's `precision_config`, for both operands). Backends read
/// it per element type: on NVIDIA GPUs since Ampere, XLA computes `Default` f32 products with TF32 inputs (10
/// mantissa bits: 1e-4 to 1e-3 relative error); `Highest` keeps f32. CPUs compute every level in full precision.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Precision {
    /// The backend's fastest (JAX's default too).
    #[default]
    Default,
    /// More than the fastest: on GPUs, f32 products from three bf16 products.
    High,
    /// The operands' own precision.
    Highest,
}

impl Precision {
    /// `, precision_config = [...]` for both operands, or nothing for the default.
    pub(crate) fn config_attr(self) -> String {
        let p = match self {
            Precision::Default => return String::new(),
            Precision::High => "HIGH",
            Precision::Highest => "HIGHEST",
        };
        format!(", precision_config = [#stablehlo<precision {p}>, #stablehlo<precision {p}>]")
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct DotGeneral {
    pub lhs_batch: Axes,
    pub rhs_batch: Axes,
    pub lhs_contract: Axes,
    pub rhs_contract: Axes,
    /// Part of the program's structure: a product at another precision is another program.
    pub precision: Precision,
}

impl DotGeneral {
    /// Batch dimensions paired in order, then contracting dimensions paired in order; the backend's default
    /// precision.
    pub fn new(lhs_batch: &[usize], rhs_batch: &[usize], lhs_contract: &[usize], rhs_contract: &[usize]) -> Self {
        DotGeneral {
            lhs_batch: Axes::from_slice(lhs_batch),
            rhs_batch: Axes::from_slice(rhs_batch),
            lhs_contract: Axes::from_slice(lhs_contract),
            rhs_contract: Axes::from_slice(rhs_contract),
            precision: Precision::Default,
        }
    }

    /// The same product at `precision`.
    pub fn with_precision(self, precision: Precision) -> Self {
        DotGeneral { precision, ..self }
    }

    /// Dimensions of `rank` that are neither batch nor contracting, in order.
    fn free<'a>(rank: usize, batch: &'a [usize], contract: &'a [usize]) -> impl Iterator<Item = usize> + 'a {
        (0..rank).filter(move |d| !batch.contains(d) && !contract.contains(d))
    }
}

fn dims_list(name: &str, v: &[usize]) -> Option<String> {
    if v.is_empty() {
        return None; // the attribute omits empty lists
    }
    let items: Vec<String> = v.iter().map(|x| x.to_string()).collect();
    Some(format!("{name} = [{}]", items.join(", ")))
}

impl DotGeneral {
    /// The cotangent of one side: contract `g` with the other side over the other side's free dimensions, then
    /// permute the result back into this side's dimension order. The product is taken as `(g, other)` or as
    /// `(other, g)`, whichever leaves this side's dimensions in order, so the usual `x·W` records no transpose
    /// for either gradient (one node each, where a transpose made the weight's two).
    fn side_vjp<B: Builder>(
        &self,
        b: &mut B,
        g: &B::V,
        other: &B::V,
        g_other_free: std::ops::Range<usize>,
        (this_batch, this_contract, this_rank): (&[usize], &[usize], usize),
        (other_batch, other_contract, other_rank): (&[usize], &[usize], usize),
    ) -> B::V {
        let nb = this_batch.len();
        let this_free: Axes = Self::free(this_rank, this_batch, this_contract).collect();
        let other_free: Axes = Self::free(other_rank, other_batch, other_contract).collect();
        // The product's dimensions: batch, then the first operand's remaining ones, then the second's. `g`'s
        // remaining ones are this side's free dims; the other side's are its contracting dims in index order,
        // each standing for the dimension of this side it contracted with.
        let mut sorted = Axes::from(other_contract);
        sorted.sort_unstable();
        let layout = |g_first: bool| {
            let mut pos: smallvec::SmallVec<[usize; 4]> = smallvec::smallvec![0; this_rank];
            for (i, &d) in this_batch.iter().enumerate() {
                pos[d] = i;
            }
            let (free_at, contract_at) = if g_first { (nb, nb + this_free.len()) } else { (nb + sorted.len(), nb) };
            for (i, &d) in this_free.iter().enumerate() {
                pos[d] = free_at + i;
            }
            for (j, &d) in this_contract.iter().enumerate() {
                pos[d] = contract_at + sorted.iter().position(|&s| s == other_contract[j]).expect("a contracting dim");
            }
            pos
        };
        let in_order = |pos: &[usize]| pos.iter().enumerate().all(|(i, &p)| i == p);
        let (pos_g, pos_other) = (layout(true), layout(false));
        let g_first = in_order(&pos_g) || !in_order(&pos_other);
        let g_dims = (0..nb).collect();
        let (dot, operands, pos) = if g_first {
            let dot = DotGeneral {
                lhs_batch: g_dims,
                rhs_batch: other_batch.into(),
                lhs_contract: g_other_free.collect(),
                rhs_contract: other_free,
                precision: self.precision,
            };
            (dot, [g, other], pos_g)
        } else {
            let dot = DotGeneral {
                lhs_batch: other_batch.into(),
                rhs_batch: g_dims,
                lhs_contract: other_free,
                rhs_contract: g_other_free.collect(),
                precision: self.precision,
            };
            (dot, [other, g], pos_other)
        };
        let r = b.op(Op::DotGeneral(dot), &operands);
        b.transpose(&r, &pos)
    }
}

impl OpRules for DotGeneral {
    fn name(&self) -> &'static str {
        "dot_general"
    }
    fn infer(&self, operands: &[&TensorType]) -> Result<TensorType, InferError> {
        arity("dot_general", operands, 2)?;
        let (l, r) = (operands[0], operands[1]);
        if l.dtype != r.dtype || l.dtype == DType::Bool {
            return Err(InferError::DType(format!("dot_general: operands must share a numeric type, got {l} and {r}")));
        }
        // Each side's batch and contracting dimensions: in range, none named twice (a bit per dimension: this
        // runs for every product and gradient product recorded).
        let valid = |batch: &[usize], contract: &[usize], rank: usize| {
            let mut seen = 0u128;
            batch.iter().chain(contract).all(|&d| {
                let fresh = d < rank.min(128) && seen & (1 << d) == 0;
                seen |= 1u128.checked_shl(d as u32).unwrap_or(0);
                fresh
            })
        };
        if self.lhs_batch.len() != self.rhs_batch.len()
            || self.lhs_contract.len() != self.rhs_contract.len()
            || !valid(&self.lhs_batch, &self.lhs_contract, l.rank())
            || !valid(&self.rhs_batch, &self.rhs_contract, r.rank())
        {
            return Err(InferError::Attribute(format!(
                "dot_general: invalid dimension numbers {self:?} for {l} and {r}"
            )));
        }
        for (a, b) in self.lhs_batch.iter().zip(&self.rhs_batch).chain(self.lhs_contract.iter().zip(&self.rhs_contract))
        {
            if l.dims[*a] != r.dims[*b] {
                return Err(InferError::Shape(format!(
                    "dot_general: dimension {a} of {l} ({}) does not match dimension {b} of {r} ({})",
                    l.dims[*a], r.dims[*b]
                )));
            }
        }
        let mut dims: crate::Dims = self.lhs_batch.iter().map(|&d| l.dims[d]).collect();
        dims.extend(Self::free(l.rank(), &self.lhs_batch, &self.lhs_contract).map(|d| l.dims[d]));
        dims.extend(Self::free(r.rank(), &self.rhs_batch, &self.rhs_contract).map(|d| r.dims[d]));
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
        let attrs =
            format!("dot_dimension_numbers = #stablehlo.dot<{}>{}", fields.join(", "), self.precision.config_attr());
        cx.op_on_args("stablehlo.dot_general", &attrs)
    }
    fn reference(&self, out: &TensorType, x: &[&ArrayD<f64>]) -> ArrayD<f64> {
        let (l, r) = (x[0], x[1]);
        let lfree: Axes = Self::free(l.ndim(), &self.lhs_batch, &self.lhs_contract).collect();
        let rfree: Axes = Self::free(r.ndim(), &self.rhs_batch, &self.rhs_contract).collect();
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
    fn vjp<B: Builder>(&self, b: &mut B, x: &[B::V], _: &B::V, g: &B::V) -> Vec<Option<B::V>> {
        let (l, r) = (&x[0], &x[1]);
        let (lr, rr) = (b.ty(l).rank(), b.ty(r).rank());
        let nb = self.lhs_batch.len();
        let nlf = lr - nb - self.lhs_contract.len();
        let nrf = rr - nb - self.rhs_contract.len();
        let lhs = (&self.lhs_batch[..], &self.lhs_contract[..], lr);
        let rhs = (&self.rhs_batch[..], &self.rhs_contract[..], rr);
        // Only the wanted sides: a first layer's input (the batch) needs no cotangent.
        let dl = b.needs_grad(l).then(|| self.side_vjp(b, g, r, nb + nlf..nb + nlf + nrf, lhs, rhs));
        let dr = b.needs_grad(r).then(|| self.side_vjp(b, g, l, nb..nb + nlf, rhs, lhs));
        vec![dl, dr]
    }
    fn shard(&self, x: &[crate::shard::ShardIn<'_>], out: &TensorType) -> Option<crate::shard::DimShards> {
        let (l, r) = (&x[0], &x[1]);
        let ld = l.dims.cloned().unwrap_or_else(|| vec![Vec::new(); l.ty.rank()]);
        let rd = r.dims.cloned().unwrap_or_else(|| vec![Vec::new(); r.ty.rank()]);
        // Batch dims split like the lhs (or the rhs), then each side's free dims keep their split.
        let mut out_d: Vec<Vec<usize>> = self
            .lhs_batch
            .iter()
            .zip(&self.rhs_batch)
            .map(|(&a, &b)| if ld[a].is_empty() { rd[b].clone() } else { ld[a].clone() })
            .collect();
        out_d.extend(Self::free(l.ty.rank(), &self.lhs_batch, &self.lhs_contract).map(|d| ld[d].clone()));
        out_d.extend(Self::free(r.ty.rank(), &self.rhs_batch, &self.rhs_contract).map(|d| rd[d].clone()));
        if out_d.len() != out.rank() {
            return None;
        }
        crate::shard::dedupe(out_d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::composite::{check_vjp, data};

    fn dot(lb: &[usize], rb: &[usize], lc: &[usize], rc: &[usize]) -> Op {
        Op::DotGeneral(DotGeneral::new(lb, rb, lc, rc))
    }

    #[test]
    fn gradients_match_finite_differences() {
        // x·W, x·Wᵀ, xᵀ·W, a batched product, and two contracting dimensions paired out of order.
        check_vjp(&dot(&[], &[], &[1], &[0]), &[data(&[3, 4], 1), data(&[4, 5], 2)]);
        check_vjp(&dot(&[], &[], &[1], &[1]), &[data(&[3, 4], 3), data(&[5, 4], 4)]);
        check_vjp(&dot(&[], &[], &[0], &[0]), &[data(&[4, 3], 5), data(&[4, 5], 6)]);
        check_vjp(&dot(&[0], &[0], &[2], &[1]), &[data(&[2, 3, 4], 7), data(&[2, 4, 5], 8)]);
        check_vjp(&dot(&[], &[], &[1, 2], &[2, 0]), &[data(&[3, 4, 2], 9), data(&[2, 5, 4], 10)]);
    }

    /// A precision other than the default is written for both operands, and the gradient's products keep it.
    #[test]
    fn precision_is_lowered_and_kept_by_the_gradient() {
        use crate::{emit, EmitOptions, Graph, Loc};
        let at = Loc { file: "m.rs", line: 1, col: 1 };
        for (p, attr) in
            [(Precision::Default, None), (Precision::High, Some("HIGH")), (Precision::Highest, Some("HIGHEST"))]
        {
            let mut g = Graph::new();
            let x = g.parameter(TensorType::new(DType::F32, [2, 3]), at);
            let w = g.parameter(TensorType::new(DType::F32, [3, 4]), at);
            let dot = DotGeneral::new(&[], &[], &[1], &[0]).with_precision(p);
            let y = g.push(Op::DotGeneral(dot), vec![x, w], at).unwrap();
            g.outputs = vec![y];
            let text = emit(&g, &EmitOptions::default());
            match attr {
                None => assert!(!text.contains("precision_config"), "{text}"),
                Some(a) => {
                    let want = format!("precision_config = [#stablehlo<precision {a}>, #stablehlo<precision {a}>]");
                    assert!(text.contains(&want), "{text}")
                }
            }
        }
        struct Precisions(Vec<Precision>);
        impl Builder for Precisions {
            type V = TensorType;
            fn ty<'a>(&'a self, v: &'a TensorType) -> &'a TensorType {
                v
            }
            fn op(&mut self, op: Op, operands: &[&TensorType]) -> TensorType {
                if let Op::DotGeneral(d) = &op {
                    self.0.push(d.precision);
                }
                op.infer(operands).expect("well-typed")
            }
        }
        let (x, w) = (TensorType::new(DType::F32, vec![2, 5, 3]), TensorType::new(DType::F32, vec![2, 3, 4]));
        let g = TensorType::new(DType::F32, vec![2, 5, 4]);
        let mut b = Precisions(Vec::new());
        let dot = Op::DotGeneral(DotGeneral::new(&[0], &[0], &[2], &[1]).with_precision(Precision::Highest));
        dot.vjp(&mut b, &[x, w], &g, &g);
        assert_eq!(b.0, [Precision::Highest, Precision::Highest]);
    }

    /// The gradients of `x·W` are one product each, with no transpose after them.
    #[test]
    fn the_usual_product_records_no_transpose() {
        struct Count(Vec<&'static str>);
        impl Builder for Count {
            type V = TensorType;
            fn ty<'a>(&'a self, v: &'a TensorType) -> &'a TensorType {
                v
            }
            fn op(&mut self, op: Op, operands: &[&TensorType]) -> TensorType {
                self.0.push(op.name());
                op.infer(operands).expect("well-typed")
            }
        }
        let (x, w) = (TensorType::new(DType::F32, vec![8, 32]), TensorType::new(DType::F32, vec![32, 64]));
        let g = TensorType::new(DType::F32, vec![8, 64]);
        let mut b = Count(Vec::new());
        let grads = dot(&[], &[], &[1], &[0]).vjp(&mut b, &[x.clone(), w.clone()], &g, &g);
        assert_eq!(b.0, ["dot_general", "dot_general"]);
        assert_eq!(grads.into_iter().map(|v| v.expect("both sides")).collect::<Vec<_>>(), [x, w]);
    }
}
