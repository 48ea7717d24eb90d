//! Slicing several axes in one call (`slice_axes`, with the `s!` macro), and thin aliases under the names NumPy,
//! JAX and PyTorch users reach for (`gather`, `swapaxes`, `transpose`, `expand_dims`/`unsqueeze`, `squeeze`,
//! `index_add`): each is one line over an existing op, documented as such.

use std::ops::{Range, RangeFrom, RangeFull, RangeInclusive, RangeTo, RangeToInclusive};

use lazuli_hlo::{Loc, Op, Reshape, Reverse, Slice};

use crate::error::{Error, Result};
use crate::graph::record::{raise, try_apply, try_axis};
use crate::graph::tensor::Tensor;

/// One axis of [`Tensor::slice_axes`]: a range with a step. Negative bounds count from the end and bounds past
/// either end clamp to it (no error), as in NumPy. The range is always written low to high, as Rust ranges are;
/// a negative step takes its elements from its end backwards (ndarray's `s!` convention): `1..4` with step -1 is
/// elements 3, 2, 1 (NumPy's `3:0:-1`), `..` with step -1 reverses the axis. Made from Rust ranges of `isize`
/// (`..`, `1..5`, `-3..`, `..=2`) and [`AxisSlice::step`], or by [`s!`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AxisSlice {
    pub start: Option<isize>,
    pub end: Option<isize>,
    pub step: isize,
}

impl AxisSlice {
    /// The whole axis.
    pub const ALL: AxisSlice = AxisSlice { start: None, end: None, step: 1 };

    /// This range taking every `step`-th element (negative: from its end backwards).
    pub fn step(self, step: isize) -> AxisSlice {
        AxisSlice { step, ..self }
    }

    /// `(start, limit, stride, reversed)` of the forward slice that, reversed if `reversed`, selects this range
    /// of an axis of size `n`; `None` for a step of 0.
    fn resolve(&self, n: usize) -> Option<(usize, usize, usize, bool)> {
        let n = n as isize;
        let wrap = |i: isize| if i < 0 { i + n } else { i };
        let start = self.start.map_or(0, wrap).clamp(0, n) as usize;
        let end = (self.end.map_or(n, wrap).clamp(0, n) as usize).max(start);
        let stride = self.step.unsigned_abs();
        if stride == 0 {
            return None;
        }
        if self.step > 0 || start == end {
            return Some((start, end, stride, false));
        }
        // From the range's last element down: end-1, end-1-stride, … ≥ start, taken forward from the lowest.
        let count = (end - start).div_ceil(stride);
        Some((end - 1 - (count - 1) * stride, end, stride, true))
    }
}

impl From<RangeFull> for AxisSlice {
    fn from(_: RangeFull) -> Self {
        AxisSlice::ALL
    }
}

impl From<Range<isize>> for AxisSlice {
    fn from(r: Range<isize>) -> Self {
        AxisSlice { start: Some(r.start), end: Some(r.end), step: 1 }
    }
}

impl From<RangeFrom<isize>> for AxisSlice {
    fn from(r: RangeFrom<isize>) -> Self {
        AxisSlice { start: Some(r.start), end: None, step: 1 }
    }
}

impl From<RangeTo<isize>> for AxisSlice {
    fn from(r: RangeTo<isize>) -> Self {
        AxisSlice { start: None, end: Some(r.end), step: 1 }
    }
}

/// `a..=b` is `a..b+1`, except `..=-1`, which runs to the end.
fn inclusive_end(end: isize) -> Option<isize> {
    (end != -1).then_some(end + 1)
}

impl From<RangeInclusive<isize>> for AxisSlice {
    fn from(r: RangeInclusive<isize>) -> Self {
        AxisSlice { start: Some(*r.start()), end: inclusive_end(*r.end()), step: 1 }
    }
}

impl From<RangeToInclusive<isize>> for AxisSlice {
    fn from(r: RangeToInclusive<isize>) -> Self {
        AxisSlice { start: None, end: inclusive_end(r.end), step: 1 }
    }
}

/// The slices of [`Tensor::slice_axes`], one per leading axis: `s![.., 1..5;2, ..;-1]` is NumPy's
/// `x[:, 1:5:2, ::-1]`. Each item is a range of `isize` (`..`, `a..b`, `a..`, `..b`, `a..=b`), optionally
/// followed by `;step`.
#[macro_export]
macro_rules! s {
    ($($range:expr $(; $step:expr)?),* $(,)?) => {
        [$($crate::AxisSlice::from($range)$(.step($step))?),*]
    };
}

impl Tensor {
    /// NumPy's basic slicing over several axes in one op: `x.slice_axes(&s![.., 1..5;2])` is `x[:, 1:5:2]`.
    /// Axes past the slices given are kept whole; see [`AxisSlice`] for negative bounds, clamping and negative
    /// steps (written as ndarray's `s!` writes them). One `slice` op (and a `reverse` for negative steps), so the gradient is theirs: the cotangent padded
    /// back into place.
    #[track_caller]
    pub fn slice_axes(&self, slices: &[AxisSlice]) -> Tensor {
        self.slice_axes_at(slices, Loc::caller()).unwrap_or_else(|e| raise(e))
    }

    /// [`Tensor::slice_axes`], with [`Error::InvalidArgument`] for more slices than axes or a step of 0.
    #[track_caller]
    pub fn try_slice_axes(&self, slices: &[AxisSlice]) -> Result<Tensor> {
        self.slice_axes_at(slices, Loc::caller())
    }

    fn slice_axes_at(&self, slices: &[AxisSlice], loc: Loc) -> Result<Tensor> {
        let op = "slice_axes";
        if slices.len() > self.rank() {
            let why =
                format!("{op}: {} slices for {}, which has {} axes", slices.len(), self.tensor_type(), self.rank());
            return Err(Error::InvalidArgument { op, why, at: loc });
        }
        let dims = self.dims().to_vec();
        let mut slice = Slice { start: vec![0; dims.len()], limit: dims.clone(), stride: vec![1; dims.len()] };
        let mut reversed = Vec::new();
        for (d, s) in slices.iter().enumerate() {
            let Some((start, limit, stride, rev)) = s.resolve(dims[d]) else {
                let why = format!("{op}: step 0 for axis {d} of {}", self.tensor_type());
                return Err(Error::InvalidArgument { op, why, at: loc });
            };
            (slice.start[d], slice.limit[d], slice.stride[d]) = (start, limit, stride);
            if rev {
                reversed.push(d);
            }
        }
        let whole = slice.start.iter().all(|&s| s == 0) && slice.limit == dims && slice.stride.iter().all(|&s| s == 1);
        let sliced = if whole { self.clone() } else { try_apply(Op::Slice(slice), &[self], loc)? };
        if reversed.is_empty() {
            return Ok(sliced);
        }
        try_apply(Op::Reverse(Reverse { dims: reversed }), &[&sliced], loc)
    }

    /// Alias of [`Tensor::take_along_axis`] under PyTorch's name and argument order (`torch.gather(x, dim,
    /// index)`); its indices follow `take_along_axis`'s rules (negative from the end, the rest clamped).
    #[track_caller]
    pub fn gather(&self, axis: isize, indices: &Tensor) -> Tensor {
        self.take_along_axis_at(indices, axis, Loc::caller()).unwrap_or_else(|e| raise(e))
    }

    /// Alias of [`Tensor::permute`] under NumPy's and JAX's name: `x.transpose(&[1, 0, 2])` (a permutation of
    /// every axis; negative axes count from the end). For PyTorch's two-axis `transpose` see
    /// [`Tensor::swapaxes`].
    #[track_caller]
    pub fn transpose(&self, perm: &[isize]) -> Tensor {
        self.permute_at(perm, Loc::caller())
    }

    /// Exchange two axes (NumPy's `swapaxes`, PyTorch's `transpose(a, b)`): a [`Tensor::permute`].
    #[track_caller]
    pub fn swapaxes(&self, a: isize, b: isize) -> Tensor {
        let loc = Loc::caller();
        let r = self.rank();
        let axis = |ax| try_axis(ax, r, "swapaxes", loc).unwrap_or_else(|e| raise(e));
        let (a, b) = (axis(a), axis(b));
        let mut perm: Vec<isize> = (0..r as isize).collect();
        perm.swap(a, b);
        self.permute_at(&perm, loc)
    }

    /// A new axis of size 1 at `axis` (NumPy's `expand_dims`; `-1` appends it last): a reshape.
    #[track_caller]
    pub fn expand_dims(&self, axis: isize) -> Tensor {
        let loc = Loc::caller();
        let a = try_axis(axis, self.rank() + 1, "expand_dims", loc).unwrap_or_else(|e| raise(e));
        let mut dims = self.dims().to_vec();
        dims.insert(a, 1);
        try_apply(Op::Reshape(Reshape { dims }), &[self], loc).unwrap_or_else(|e| raise(e))
    }

    /// Alias of [`Tensor::expand_dims`] under PyTorch's name.
    #[track_caller]
    pub fn unsqueeze(&self, axis: isize) -> Tensor {
        self.expand_dims(axis)
    }

    /// Remove the size-1 axis `axis` (a reshape); panics naming the caller's line if its size is not 1.
    #[track_caller]
    pub fn squeeze(&self, axis: isize) -> Tensor {
        let loc = Loc::caller();
        let a = try_axis(axis, self.rank(), "squeeze", loc).unwrap_or_else(|e| raise(e));
        if self.dims()[a] != 1 {
            let why = format!("squeeze: axis {axis} of {} has size {}, not 1", self.tensor_type(), self.dims()[a]);
            raise(Error::ShapeMismatch { op: "squeeze", shapes: vec![self.dims().to_vec()], why, at: loc });
        }
        let mut dims = self.dims().to_vec();
        dims.remove(a);
        try_apply(Op::Reshape(Reshape { dims }), &[self], loc).unwrap_or_else(|e| raise(e))
    }

    /// Alias of [`Tensor::scatter_add`] under PyTorch's name (`index_add(dim, index, source)`: rows of `source`
    /// added at `index` along `dim`, repeated indices accumulating).
    #[track_caller]
    pub fn index_add(&self, axis: isize, indices: &Tensor, updates: &Tensor) -> Tensor {
        self.scatter_add_at(axis, indices, updates, Loc::caller())
    }
}
