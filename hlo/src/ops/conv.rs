//! `convolution`: N-d convolution (cross-correlation, as deep learning means it) with strides, padding, input and
//! window dilation, optional window reversal, and arbitrary dimension layouts (the gradients need permuted ones).
//! One feature group and one batch group.
//!
//! Per spatial dimension, input `i`, window position `w` and output `o` meet where
//! `i * lhs_dilation + pad_low == o * stride + w * rhs_dilation` (window index `n - 1 - w` when reversed). Both
//! gradients solve that equation for another operand, so they are convolutions again; see [`Convolution::vjp`].

use crate::infer_error::InferError;
use ndarray::{ArrayD, IxDyn};

use crate::builder::Builder;
use crate::dtype::TensorType;
use crate::emit::{i64_array, LowerCx};
use crate::op::{arity, Op, OpRules};
use crate::ops::dot::Precision;
use crate::ops::layout::is_permutation;
use crate::ops::window::{dilated, fit_high, for_each_index, padding_attr, source_index, sweep_len};

/// Dimension numbers are given as positions: `lhs_spec = [batch, feature, spatial…]` (dimensions of the input),
/// `rhs_spec = [output feature, input feature, spatial…]` (of the kernel), `out_spec = [batch, feature, spatial…]`
/// (of the result). Swapping the first two entries of a spec is how the gradients reuse an operand in another role.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Convolution {
    pub lhs_spec: Vec<usize>,
    pub rhs_spec: Vec<usize>,
    pub out_spec: Vec<usize>,
    pub strides: Vec<usize>,
    pub padding: Vec<(i64, i64)>,
    pub lhs_dilation: Vec<usize>,
    pub rhs_dilation: Vec<usize>,
    /// Read the window back to front in every spatial dimension (StableHLO's `window_reversal`).
    pub reverse: bool,
    /// As a product's ([`Precision`]); the gradients' convolutions keep it.
    pub precision: Precision,
}

/// `[a, b, c…] → [b, a, c…]`
fn swap_roles(spec: &[usize]) -> Vec<usize> {
    let mut s = spec.to_vec();
    s.swap(0, 1);
    s
}

impl Convolution {
    /// PyTorch's layout: input `[N, C, spatial…]`, kernel `[O, C, spatial…]`, result `[N, O, spatial…]`.
    pub fn channels_first(strides: Vec<usize>, padding: Vec<(i64, i64)>, dilation: Vec<usize>) -> Self {
        let identity: Vec<usize> = (0..strides.len() + 2).collect();
        Convolution {
            lhs_spec: identity.clone(),
            rhs_spec: identity.clone(),
            out_spec: identity,
            lhs_dilation: vec![1; strides.len()],
            strides,
            padding,
            rhs_dilation: dilation,
            reverse: false,
            precision: Precision::Default,
        }
    }

    fn spatial(&self) -> usize {
        self.strides.len()
    }

    /// `[b, f, 0, 1]` for a spec and its two role letters.
    fn labels(spec: &[usize], first: &str, second: &str) -> String {
        let mut v = vec![String::new(); spec.len()];
        v[spec[0]] = first.to_string();
        v[spec[1]] = second.to_string();
        for (k, &d) in spec[2..].iter().enumerate() {
            v[d] = k.to_string();
        }
        format!("[{}]", v.join(", "))
    }
}

impl OpRules for Convolution {
    fn name(&self) -> &'static str {
        "convolution"
    }
    fn infer(&self, operands: &[&TensorType]) -> Result<TensorType, InferError> {
        arity("convolution", operands, 2)?;
        let (l, r) = (operands[0], operands[1]);
        if l.dtype != r.dtype || !l.dtype.is_float() {
            return Err(InferError::DType(format!(
                "convolution: operands must share a floating-point type, got {l} and {r}"
            )));
        }
        let ns = self.spatial();
        let rank = ns + 2;
        let lens = [self.padding.len(), self.lhs_dilation.len(), self.rhs_dilation.len()];
        let specs_ok = [&self.lhs_spec, &self.rhs_spec, &self.out_spec].iter().all(|s| is_permutation(s, rank));
        if ns == 0 || lens.iter().any(|&n| n != ns) || !specs_ok {
            return Err(InferError::Attribute(format!("convolution: inconsistent configuration {self:?}")));
        }
        if l.rank() != rank || r.rank() != rank {
            return Err(InferError::Shape(format!(
                "convolution: {ns} spatial dimensions need rank-{rank} operands, got {l} and {r}"
            )));
        }
        if self.strides.iter().chain(&self.lhs_dilation).chain(&self.rhs_dilation).any(|&v| v == 0) {
            return Err(InferError::Attribute("convolution: strides and dilations must be positive".to_string()));
        }
        let (features, kernel_features) = (l.dims[self.lhs_spec[1]], r.dims[self.rhs_spec[1]]);
        if features != kernel_features {
            return Err(InferError::Shape(format!(
                "convolution: the input has {features} features (channels) but the kernel expects {kernel_features}: \
                 {l} and {r}"
            )));
        }
        let mut dims = vec![0; rank];
        dims[self.out_spec[0]] = l.dims[self.lhs_spec[0]];
        dims[self.out_spec[1]] = r.dims[self.rhs_spec[0]];
        for k in 0..ns {
            let (len, n) = (l.dims[self.lhs_spec[2 + k]], r.dims[self.rhs_spec[2 + k]]);
            let input = dilated(len, self.lhs_dilation[k]);
            let window = dilated(n, self.rhs_dilation[k]);
            if len == 0 {
                // Every output would read padding alone (PyTorch refuses it too).
                return Err(InferError::Shape(format!("convolution: spatial dimension {k} of {l} is empty")));
            }
            if n == 0 {
                // Every output would be an empty sum: 0, whatever the input.
                return Err(InferError::Shape(format!(
                    "convolution: spatial dimension {k} of the kernel {r} is empty"
                )));
            }
            dims[self.out_spec[2 + k]] =
                sweep_len(input, self.padding[k], window, self.strides[k]).ok_or_else(|| {
                    InferError::Shape(format!(
                        "convolution: a window of {n} (dilation {}) does not fit spatial dimension {k} of size {len} \
                         padded by {:?} in {l}",
                        self.rhs_dilation[k], self.padding[k]
                    ))
                })?;
        }
        Ok(TensorType::new(l.dtype, dims))
    }
    fn lower(&self, cx: &mut LowerCx<'_>) -> String {
        let numbers = format!(
            "#stablehlo.conv<{}x{}->{}>",
            Self::labels(&self.lhs_spec, "b", "f"),
            Self::labels(&self.rhs_spec, "o", "i"),
            Self::labels(&self.out_spec, "b", "f")
        );
        let mut attrs = format!(
            "dimension_numbers = {numbers}, window_strides = {}, {}, lhs_dilation = {}, rhs_dilation = {}",
            i64_array(&self.strides),
            padding_attr(&self.padding),
            i64_array(&self.lhs_dilation),
            i64_array(&self.rhs_dilation)
        );
        if self.reverse {
            let flags = vec!["true"; self.spatial()].join(", ");
            attrs.push_str(&format!(", window_reversal = array<i1: {flags}>"));
        }
        attrs.push_str(", feature_group_count = 1 : i64, batch_group_count = 1 : i64");
        attrs.push_str(&self.precision.config_attr());
        cx.op_on_args("stablehlo.convolution", &attrs)
    }
    fn reference(&self, out: &TensorType, x: &[&ArrayD<f64>]) -> ArrayD<f64> {
        let (lhs, rhs) = (x[0], x[1]);
        let ns = self.spatial();
        let features = lhs.shape()[self.lhs_spec[1]];
        let window: Vec<usize> = (0..ns).map(|k| rhs.shape()[self.rhs_spec[2 + k]]).collect();
        let mut li = vec![0usize; ns + 2];
        let mut ri = vec![0usize; ns + 2];
        ArrayD::from_shape_fn(IxDyn(&out.dims), |o| {
            li[self.lhs_spec[0]] = o[self.out_spec[0]];
            ri[self.rhs_spec[0]] = o[self.out_spec[1]];
            let mut acc = 0.0;
            for_each_index(&window, |w| {
                for k in 0..ns {
                    let len = lhs.shape()[self.lhs_spec[2 + k]];
                    let at = o[self.out_spec[2 + k]];
                    let pad = self.padding[k].0;
                    match source_index(at, w[k], self.strides[k], self.rhs_dilation[k], self.lhs_dilation[k], pad, len)
                    {
                        Some(i) => li[self.lhs_spec[2 + k]] = i,
                        None => return, // padding or an input-dilation hole
                    }
                    ri[self.rhs_spec[2 + k]] = if self.reverse { window[k] - 1 - w[k] } else { w[k] };
                }
                for c in 0..features {
                    li[self.lhs_spec[1]] = c;
                    ri[self.rhs_spec[1]] = c;
                    acc += lhs[IxDyn(&li)] * rhs[IxDyn(&ri)];
                }
            });
            acc
        })
    }
    /// Both cotangents are convolutions (as JAX's `_conv_general_dilated_transpose_lhs/rhs`, extended to reversed
    /// windows). Writing `L`, `n`, `M` for input, window and output lengths:
    /// - input: `g` as the input, the kernel with its feature roles swapped and its window reversed (toggled),
    ///   input dilation `stride`, stride `lhs_dilation`, low padding `(n-1)·rhs_dilation − pad_low`;
    /// - kernel, window read forwards: the input (batch and feature roles swapped) swept by `g`, stride
    ///   `rhs_dilation`, window dilation `stride`;
    /// - kernel, window reversed: `g` swept by the input instead, input dilation `stride`, window dilation
    ///   `lhs_dilation`, low padding `(n-1)·rhs_dilation − pad_low` (the reversal turns the sweep around).
    ///
    /// High paddings are whatever makes the result exactly as long as the operand it is the gradient of.
    fn vjp<B: Builder>(&self, b: &mut B, x: &[B::V], _: &B::V, g: &B::V) -> Vec<Option<B::V>> {
        let (lhs, rhs) = (&x[0], &x[1]);
        let (lt, rt, gt) = (b.ty(lhs).clone(), b.ty(rhs).clone(), b.ty(g).clone());
        let ns = self.spatial();
        let len = |k: usize| lt.dims[self.lhs_spec[2 + k]];
        let win = |k: usize| rt.dims[self.rhs_spec[2 + k]];
        let outl = |k: usize| gt.dims[self.out_spec[2 + k]];
        let window_span = |k: usize| dilated(win(k), self.rhs_dilation[k]);
        let flipped_low = |k: usize| window_span(k) - 1 - self.padding[k].0;

        let d_lhs = Convolution {
            lhs_spec: self.out_spec.clone(),
            rhs_spec: swap_roles(&self.rhs_spec),
            out_spec: self.lhs_spec.clone(),
            strides: self.lhs_dilation.clone(),
            padding: (0..ns)
                .map(|k| {
                    let input = dilated(outl(k), self.strides[k]);
                    let low = flipped_low(k);
                    (low, fit_high(len(k), self.lhs_dilation[k], input, window_span(k), low))
                })
                .collect(),
            lhs_dilation: self.strides.clone(),
            rhs_dilation: self.rhs_dilation.clone(),
            reverse: !self.reverse,
            precision: self.precision,
        };
        let dx = b.op(Op::Convolution(Box::new(d_lhs)), &[g, rhs]);

        let dk = if self.reverse {
            let conv = Convolution {
                lhs_spec: swap_roles(&self.out_spec),
                rhs_spec: swap_roles(&self.lhs_spec),
                out_spec: self.rhs_spec.clone(),
                strides: self.rhs_dilation.clone(),
                padding: (0..ns)
                    .map(|k| {
                        let (input, window) =
                            (dilated(outl(k), self.strides[k]), dilated(len(k), self.lhs_dilation[k]));
                        let low = flipped_low(k);
                        (low, fit_high(win(k), self.rhs_dilation[k], input, window, low))
                    })
                    .collect(),
                lhs_dilation: self.strides.clone(),
                rhs_dilation: self.lhs_dilation.clone(),
                reverse: false,
                precision: self.precision,
            };
            b.op(Op::Convolution(Box::new(conv)), &[g, lhs])
        } else {
            let conv = Convolution {
                lhs_spec: swap_roles(&self.lhs_spec),
                rhs_spec: swap_roles(&self.out_spec),
                out_spec: swap_roles(&self.rhs_spec),
                strides: self.rhs_dilation.clone(),
                padding: (0..ns)
                    .map(|k| {
                        let (input, window) =
                            (dilated(len(k), self.lhs_dilation[k]), dilated(outl(k), self.strides[k]));
                        let low = self.padding[k].0;
                        (low, fit_high(win(k), self.rhs_dilation[k], input, window, low))
                    })
                    .collect(),
                lhs_dilation: self.lhs_dilation.clone(),
                rhs_dilation: self.strides.clone(),
                reverse: false,
                precision: self.precision,
            };
            b.op(Op::Convolution(Box::new(conv)), &[lhs, g])
        };
        vec![Some(dx), Some(dk)]
    }
    fn shard(&self, x: &[crate::shard::ShardIn<'_>], out: &TensorType) -> Option<crate::shard::DimShards> {
        // Only the batch dimension's split survives a convolution.
        let d = x[0].dims?;
        let mut r = vec![Vec::new(); out.rank()];
        r[self.out_spec[0]] = d[self.lhs_spec[0]].clone();
        crate::shard::dedupe(r)
    }
}
