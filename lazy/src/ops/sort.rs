//! Sorting: `sort`, `argsort` and `topk` along one axis (`lazuli_hlo::Sort`). The sort is stable; NaN counts as
//! the largest value (last ascending, first descending), as in NumPy and PyTorch. Values and indices of one
//! tensor sorted one way lower to a single device sort, so asking for both costs no second sort.

use lazuli_hlo::{Loc, Op, Slice, Sort, SortResult};

use crate::error::{Error, Result};
use crate::graph::record::{raise, try_apply, try_axis};
use crate::graph::tensor::Tensor;

/// `t` sorted along `ax`: its values or the permutation (i64) that sorts it.
fn sort_at(t: &Tensor, ax: isize, descending: bool, result: SortResult, loc: Loc) -> Result<Tensor> {
    let name = match result {
        SortResult::Values => "sort",
        SortResult::Indices => "argsort",
    };
    let axis = try_axis(ax, t.rank(), name, loc)?;
    try_apply(Op::Sort(Sort { axis, descending, result }), &[t], loc)
}

/// The first `k` along `axis` of an already sorted tensor.
fn first_k(t: &Tensor, axis: usize, k: usize, loc: Loc) -> Result<Tensor> {
    try_apply(Op::Slice(Slice::along(t.dims(), axis, 0, k, 1)), &[t], loc)
}

impl Tensor {
    /// The values along `axis` in ascending order (`descending`: largest first). Stable: equal values keep
    /// their order. NaN counts as the largest value: last ascending, first descending (NumPy's and PyTorch's
    /// order). The gradient sends each sorted value's cotangent back to where the value came from.
    #[track_caller]
    pub fn sort(&self, axis: isize, descending: bool) -> Tensor {
        sort_at(self, axis, descending, SortResult::Values, Loc::caller()).unwrap_or_else(|e| raise(e))
    }

    /// [`Tensor::sort`], with [`Error::BadAxis`] or [`Error::WrongDType`] (a bool tensor) instead of a panic.
    #[track_caller]
    pub fn try_sort(&self, axis: isize, descending: bool) -> Result<Tensor> {
        sort_at(self, axis, descending, SortResult::Values, Loc::caller())
    }

    /// The positions (i64) along `axis` that put it in [`Tensor::sort`]'s order: `x.take_along_axis(&x.argsort(a,
    /// d), a)` is `x.sort(a, d)`. Stable, NaN as the largest value; integer, so no gradient. Sorting and
    /// arg-sorting one tensor the same way lower to one device sort.
    #[track_caller]
    pub fn argsort(&self, axis: isize, descending: bool) -> Tensor {
        sort_at(self, axis, descending, SortResult::Indices, Loc::caller()).unwrap_or_else(|e| raise(e))
    }

    /// [`Tensor::argsort`], with [`Error::BadAxis`] or [`Error::WrongDType`] instead of a panic.
    #[track_caller]
    pub fn try_argsort(&self, axis: isize, descending: bool) -> Result<Tensor> {
        sort_at(self, axis, descending, SortResult::Indices, Loc::caller())
    }

    /// `torch.topk(x, k, axis)`: the `k` largest values along `axis`, largest first, and their positions (i64).
    /// Ties go to the lower position; NaN counts as larger than any number. The values' gradient flows back to
    /// the positions they came from. A descending sort sliced to `k`, so its rules are the sort's and the slice's.
    #[track_caller]
    pub fn topk(&self, k: usize, axis: isize) -> (Tensor, Tensor) {
        self.topk_at(k, axis, Loc::caller()).unwrap_or_else(|e| raise(e))
    }

    /// [`Tensor::topk`], with [`Error::InvalidArgument`] when `k` is larger than the axis, [`Error::BadAxis`] or
    /// [`Error::WrongDType`] instead of a panic.
    #[track_caller]
    pub fn try_topk(&self, k: usize, axis: isize) -> Result<(Tensor, Tensor)> {
        self.topk_at(k, axis, Loc::caller())
    }

    fn topk_at(&self, k: usize, ax: isize, loc: Loc) -> Result<(Tensor, Tensor)> {
        let axis = try_axis(ax, self.rank(), "topk", loc)?;
        let n = self.dims()[axis];
        if k > n {
            let why = format!("topk: k = {k} is larger than axis {ax} of {}", self.tensor_type());
            return Err(Error::InvalidArgument { op: "topk", why, at: loc });
        }
        let values = sort_at(self, ax, true, SortResult::Values, loc)?;
        let indices = sort_at(self, ax, true, SortResult::Indices, loc)?;
        Ok((first_k(&values, axis, k, loc)?, first_k(&indices, axis, k, loc)?))
    }
}
