//! Windowed ops: `reduce_window` (sum and max pooling) and `select_and_scatter` (max pooling's gradient), plus the
//! window arithmetic they share with `convolution` (`conv.rs`).
//!
//! Every windowed op solves one index equation per dimension: output `o`, window position `w` and input `i` meet
//! where `i * base_dilation + pad_low == o * stride + w * window_dilation`. Gradients are the same equation solved
//! for another operand, which is why they are windowed ops again (with strides and dilations swapped).

use crate::infer_error::InferError;
use ndarray::{ArrayD, IxDyn};

use crate::builder::Builder;
use crate::dtype::{DType, TensorType};
use crate::emit::{i64_array, LowerCx};
use crate::op::{arity, Op, OpRules};
use crate::ops::elementwise::Convert;

/// `(n - 1) * dilation + 1`: the span of `n` elements `dilation` apart (0 for none).
pub(crate) fn dilated(n: usize, dilation: usize) -> i64 {
    if n == 0 {
        0
    } else {
        (n as i64 - 1) * dilation as i64 + 1
    }
}

/// The number of window positions of a sweep over an input of `input` elements (already dilated), padded by
/// `pad`, with a window spanning `window` elements moved by `stride`; `None` if the window does not fit once.
pub(crate) fn sweep_len(input: i64, pad: (i64, i64), window: i64, stride: usize) -> Option<usize> {
    let room = input + pad.0 + pad.1 - window;
    if room < 0 || window < 1 {
        None
    } else {
        Some((room / stride as i64) as usize + 1)
    }
}

/// The high padding that makes a sweep produce exactly `out` positions, given everything else.
pub(crate) fn fit_high(out: usize, stride: usize, input: i64, window: i64, low: i64) -> i64 {
    (out as i64 - 1) * stride as i64 + window - input - low
}

/// `padding = dense<[[lo, hi], …]> : tensor<Nx2xi64>`.
pub(crate) fn padding_attr(padding: &[(i64, i64)]) -> String {
    let pairs: Vec<String> = padding.iter().map(|(lo, hi)| format!("[{lo}, {hi}]")).collect();
    format!("padding = dense<[{}]> : tensor<{}x2xi64>", pairs.join(", "), padding.len())
}

/// Call `f` with every multi-index of `dims` in row-major order.
pub(crate) fn for_each_index(dims: &[usize], mut f: impl FnMut(&[usize])) {
    if dims.contains(&0) {
        return;
    }
    let mut ix = vec![0usize; dims.len()];
    loop {
        f(&ix);
        let mut d = dims.len();
        loop {
            if d == 0 {
                return;
            }
            d -= 1;
            ix[d] += 1;
            if ix[d] < dims[d] {
                break;
            }
            ix[d] = 0;
        }
    }
}

/// The input index that window position `w` of output `o` reads, or `None` for padding and dilation holes.
pub(crate) fn source_index(
    o: usize,
    w: usize,
    stride: usize,
    w_dil: usize,
    base_dil: usize,
    low: i64,
    len: usize,
) -> Option<usize> {
    let q = (o * stride + w * w_dil) as i64 - low;
    if q < 0 || q % base_dil as i64 != 0 || (q / base_dil as i64) as usize >= len {
        None
    } else {
        Some((q / base_dil as i64) as usize)
    }
}

/// A scalar region `^bb0(%a, %b)` returning `op(%a, %b)`.
fn region(op: &str, dt: DType) -> String {
    let s = TensorType::scalar(dt).mlir();
    format!(
        "{{\n    ^bb0(%a: {s}, %b: {s}):\n      %r = \"{op}\"(%a, %b) : ({s}, {s}) -> {s}\n      \"stablehlo.return\"(%r) : ({s}) -> ()\n    }}"
    )
}

/// Max pooling's select region: keep the current pick `%a` over the candidate `%b` while `a >= b` or `a` is NaN.
/// A NaN candidate replaces a number (`a >= NaN` is false) and then stays, so a window with NaNs picks its first,
/// where its NaN result came from.
fn select_region(dt: DType) -> String {
    let (s, p) = (TensorType::scalar(dt).mlir(), TensorType::scalar(DType::Bool).mlir());
    let cmp = |dir: &str, b: &str| {
        format!(
            "\"stablehlo.compare\"(%a, %{b}) {{comparison_direction = #stablehlo<comparison_direction {dir}>, compare_type = #stablehlo<comparison_type {}>}} : ({s}, {s}) -> {p}",
            dt.compare_type()
        )
    };
    let body = if dt.is_float() {
        format!(
            "%ge = {}\n      %nan = {}\n      %r = \"stablehlo.or\"(%ge, %nan) : ({p}, {p}) -> {p}",
            cmp("GE", "b"),
            cmp("NE", "a")
        )
    } else {
        format!("%r = {}", cmp("GE", "b"))
    };
    format!("{{\n    ^bb0(%a: {s}, %b: {s}):\n      {body}\n      \"stablehlo.return\"(%r) : ({p}) -> ()\n    }}")
}

fn scalar_constant(cx: &mut LowerCx<'_>, value: f64, dt: DType) -> String {
    let scalar = TensorType::scalar(dt);
    let attrs = format!("value = dense<{}> : {}", dt.literal(value), scalar.mlir());
    cx.op("stablehlo.constant", &[], &[], &attrs, None, &scalar)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WindowKind {
    Sum,
    Max,
}

/// Reduce every window of the operand (one window dimension per operand dimension). Padding holds the
/// reduction's identity (0 for sum, the lowest value for max), so it never wins a max.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ReduceWindow {
    pub kind: WindowKind,
    pub window: Vec<usize>,
    pub strides: Vec<usize>,
    /// Spread the operand's elements this far apart first (the gradient of a strided sum uses it).
    pub base_dilation: Vec<usize>,
    pub padding: Vec<(i64, i64)>,
}

impl ReduceWindow {
    /// A window over `window` with `strides` and `padding`, no dilation.
    pub fn new(kind: WindowKind, window: Vec<usize>, strides: Vec<usize>, padding: Vec<(i64, i64)>) -> Self {
        let base_dilation = vec![1; window.len()];
        ReduceWindow { kind, window, strides, base_dilation, padding }
    }

    fn identity(&self, dt: DType) -> f64 {
        match self.kind {
            WindowKind::Sum => 0.0,
            WindowKind::Max => dt.lowest(),
        }
    }

    /// The result dims for an operand of `dims`, or why the window does not fit.
    fn out_dims(&self, name: &str, dims: &[usize]) -> Result<Vec<usize>, InferError> {
        let r = dims.len();
        let lens = [self.window.len(), self.strides.len(), self.base_dilation.len(), self.padding.len()];
        if lens.iter().any(|&l| l != r) {
            return Err(InferError::Attribute(format!(
                "{name}: window, strides, dilation and padding need {r} entries, got {lens:?}"
            )));
        }
        if self.window.iter().chain(&self.strides).chain(&self.base_dilation).any(|&v| v == 0) {
            return Err(InferError::Attribute(format!("{name}: window sizes, strides and dilations must be positive")));
        }
        (0..r)
            .map(|d| {
                // A dimension the window leaves alone (a pool's batch and channels) keeps its size, 0 included:
                // pooling an empty batch gives an empty batch.
                let alone = self.window[d] == 1 && self.strides[d] == 1 && self.base_dilation[d] == 1;
                if alone && self.padding[d] == (0, 0) {
                    return Ok(dims[d]);
                }
                let input = dilated(dims[d], self.base_dilation[d]);
                sweep_len(input, self.padding[d], self.window[d] as i64, self.strides[d]).ok_or_else(|| {
                    InferError::Shape(format!(
                        "{name}: a window of {} does not fit dimension {d} of size {} padded by {:?}",
                        self.window[d], dims[d], self.padding[d]
                    ))
                })
            })
            .collect()
    }
}

impl OpRules for ReduceWindow {
    fn name(&self) -> &'static str {
        match self.kind {
            WindowKind::Sum => "sum_pool",
            WindowKind::Max => "max_pool",
        }
    }
    fn infer(&self, operands: &[&TensorType]) -> Result<TensorType, InferError> {
        let name = self.name();
        arity(name, operands, 1)?;
        let t = operands[0];
        if self.kind == WindowKind::Sum && t.dtype == DType::Bool {
            return Err(InferError::DType(format!("{name} is not defined for {t}")));
        }
        if self.kind == WindowKind::Max && self.base_dilation.iter().any(|&d| d != 1) {
            // Its gradient, select_and_scatter, has no base dilation.
            return Err(InferError::Attribute(format!("{name}: base dilation is only supported for sums")));
        }
        Ok(TensorType::new(t.dtype, self.out_dims(name, &t.dims)?))
    }
    fn lower(&self, cx: &mut LowerCx<'_>) -> String {
        let (in_ty, out_ty) = (cx.arg_ty(0).clone(), cx.out_ty().clone());
        // 16-bit window sums accumulate in f32, as `Reduce`'s and `CumSum`'s do.
        let acc = match (self.kind, in_ty.dtype) {
            (WindowKind::Sum, DType::BF16 | DType::F16) => DType::F32,
            (_, dt) => dt,
        };
        let (x, out) = (in_ty.with_dtype(acc), out_ty.with_dtype(acc));
        let mut operand = cx.arg(0).to_string();
        if acc != in_ty.dtype {
            let convert = Op::Convert(Convert { from: in_ty.dtype, to: acc });
            operand = cx.lower_op(&convert, vec![(operand, &in_ty)], &x);
        }
        let scalar = TensorType::scalar(x.dtype);
        let init = scalar_constant(cx, self.identity(x.dtype), x.dtype);
        let body = match self.kind {
            WindowKind::Sum => "stablehlo.add",
            WindowKind::Max => "stablehlo.maximum",
        };
        let mut attrs = format!(
            "window_dimensions = {}, window_strides = {}, {}",
            i64_array(&self.window),
            i64_array(&self.strides),
            padding_attr(&self.padding)
        );
        if self.base_dilation.iter().any(|&d| d != 1) {
            attrs.push_str(&format!(", base_dilations = {}", i64_array(&self.base_dilation)));
        }
        let region = region(body, x.dtype);
        let sums = cx.op("stablehlo.reduce_window", &[operand, init], &[&x, &scalar], &attrs, Some(&region), &out);
        if acc == in_ty.dtype {
            return sums;
        }
        cx.lower_op(&Op::Convert(Convert { from: acc, to: in_ty.dtype }), vec![(sums, &out)], &out_ty)
    }
    fn reference(&self, out: &TensorType, x: &[&ArrayD<f64>]) -> ArrayD<f64> {
        let x = x[0];
        let shape = x.shape();
        let identity = self.identity(out.dtype);
        let mut src = vec![0usize; shape.len()];
        ArrayD::from_shape_fn(IxDyn(&out.dims), |o| {
            let mut acc = identity;
            for_each_index(&self.window, |w| {
                for d in 0..shape.len() {
                    let at = (o[d], self.strides[d], self.base_dilation[d], self.padding[d].0);
                    match source_index(at.0, w[d], at.1, 1, at.2, at.3, shape[d]) {
                        Some(i) => src[d] = i,
                        None => return, // padding or a dilation hole: the identity
                    }
                }
                let v = x[IxDyn(&src)];
                acc = match self.kind {
                    WindowKind::Sum => acc + v,
                    WindowKind::Max if v.is_nan() || acc.is_nan() => f64::NAN,
                    WindowKind::Max => acc.max(v),
                };
            });
            acc
        })
    }
    fn vjp<B: Builder>(&self, b: &mut B, x: &[B::V], out: &B::V, g: &B::V) -> Vec<Option<B::V>> {
        if !b.ty(&x[0]).dtype.is_float() {
            return vec![None];
        }
        let dx = match self.kind {
            // Input i receives g[o] for every window (o, w) that reads it: a sum window over g with strides and
            // dilations swapped. The window of ones is symmetric, so no reversal is needed.
            WindowKind::Sum => {
                let in_dims = b.ty(&x[0]).dims.clone();
                let g_dims = b.ty(g).dims.clone();
                let padding = (0..in_dims.len())
                    .map(|d| {
                        let low = self.window[d] as i64 - 1 - self.padding[d].0;
                        let g_span = dilated(g_dims[d], self.strides[d]);
                        (low, fit_high(in_dims[d], self.base_dilation[d], g_span, self.window[d] as i64, low))
                    })
                    .collect();
                let transposed = ReduceWindow {
                    kind: WindowKind::Sum,
                    window: self.window.clone(),
                    strides: self.base_dilation.clone(),
                    base_dilation: self.strides.clone(),
                    padding,
                };
                b.op(Op::ReduceWindow(Box::new(transposed)), &[g])
            }
            // A NaN window's cotangent becomes NaN, and goes to the NaN the window picks (its first).
            WindowKind::Max => {
                let scatter = SelectAndScatter {
                    window: self.window.clone(),
                    strides: self.strides.clone(),
                    padding: self.padding.clone(),
                };
                let source = crate::ops::elementwise::nan_where_nan(b, out, g);
                b.op(Op::SelectAndScatter(Box::new(scatter)), &[&x[0], &source])
            }
        };
        vec![Some(dx)]
    }
    fn shard(&self, x: &[crate::shard::ShardIn<'_>], out: &TensorType) -> Option<crate::shard::DimShards> {
        crate::shard::keep_unchanged(&x[0], out)
    }
}

/// Max pooling's gradient: for each window of `operand`, add the window's `source` value at the window's maximum
/// (the first one on ties, the first NaN if there is one; padding is never selected). Operands: operand, source
/// (shaped like the pooled result).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SelectAndScatter {
    pub window: Vec<usize>,
    pub strides: Vec<usize>,
    pub padding: Vec<(i64, i64)>,
}

impl SelectAndScatter {
    fn pool(&self) -> ReduceWindow {
        ReduceWindow::new(WindowKind::Max, self.window.clone(), self.strides.clone(), self.padding.clone())
    }
}

impl OpRules for SelectAndScatter {
    fn name(&self) -> &'static str {
        "select_and_scatter"
    }
    fn infer(&self, operands: &[&TensorType]) -> Result<TensorType, InferError> {
        arity("select_and_scatter", operands, 2)?;
        let (x, s) = (operands[0], operands[1]);
        let pooled = self.pool().out_dims("select_and_scatter", &x.dims)?;
        if s.dtype != x.dtype || s.dims[..] != pooled[..] || x.dtype == DType::Bool {
            return Err(InferError::Shape(format!("select_and_scatter: source {s} does not match the windows of {x}")));
        }
        Ok(x.clone())
    }
    fn lower(&self, cx: &mut LowerCx<'_>) -> String {
        let (x, s) = (cx.arg_ty(0).clone(), cx.arg_ty(1).clone());
        let scalar = TensorType::scalar(x.dtype);
        let zero = scalar_constant(cx, 0.0, x.dtype);
        let regions = format!("{}, {}", select_region(x.dtype), region("stablehlo.add", x.dtype));
        let attrs = format!(
            "window_dimensions = {}, window_strides = {}, {}",
            i64_array(&self.window),
            i64_array(&self.strides),
            padding_attr(&self.padding)
        );
        let operands = [cx.arg(0).to_string(), cx.arg(1).to_string(), zero];
        cx.op("stablehlo.select_and_scatter", &operands, &[&x, &s, &scalar], &attrs, Some(&regions), &x)
    }
    fn reference(&self, _: &TensorType, x: &[&ArrayD<f64>]) -> ArrayD<f64> {
        let (operand, source) = (x[0], x[1]);
        let shape = operand.shape().to_vec();
        let mut out = ArrayD::zeros(IxDyn(&shape));
        let mut src = vec![0usize; shape.len()];
        for_each_index(source.shape(), |o| {
            let mut best: Option<(Vec<usize>, f64)> = None;
            for_each_index(&self.window, |w| {
                for d in 0..shape.len() {
                    match source_index(o[d], w[d], self.strides[d], 1, 1, self.padding[d].0, shape[d]) {
                        Some(i) => src[d] = i,
                        None => return,
                    }
                }
                let v = operand[IxDyn(&src)];
                // XLA keeps the current pick while `select(current, candidate)`: `current >= candidate`, or
                // `current` is NaN (`select_region`).
                if !matches!(&best, Some((_, cur)) if *cur >= v || cur.is_nan()) {
                    best = Some((src.clone(), v));
                }
            });
            if let Some((at, _)) = best {
                out[IxDyn(&at)] += source[IxDyn(o)];
            }
        });
        out
    }
    /// Not provided: lazuli records gradients with gradient tracking off, so the gradient of a gradient op is
    /// never taken. (The result is piecewise constant in the operand; in the source it is a gather at the maxima.)
    fn vjp<B: Builder>(&self, _: &mut B, _: &[B::V], _: &B::V, _: &B::V) -> Vec<Option<B::V>> {
        vec![None, None]
    }
    fn shard(&self, x: &[crate::shard::ShardIn<'_>], out: &TensorType) -> Option<crate::shard::DimShards> {
        crate::shard::keep_unchanged(&x[0], out)
    }
}
