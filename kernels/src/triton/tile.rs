//! A block of a row-major `[rows, cols]` tensor as lazuli's row-wise kernels (layer norm, bias + GELU,
//! cross-entropy) walk it: `R` rows by `C` columns (powers of two), their indices, the mask of what lies inside the
//! tensor, and the element offsets. Loads give f32 with 0 (or a given fill) where masked; stores round to the
//! argument's type.

use super::pointers;
use super::ttir::{Cmp, Kernel, Scalar, Value};

/// `[start, start + len)` as an i32 vector named `name`, and which of those indices lie below `bound`.
pub(crate) fn indices(k: &mut Kernel, start: &Value, len: usize, bound: usize, name: &str) -> (Value, Value) {
    let start = k.splat(start, &[len]);
    let range = k.make_range(0, len as u32);
    let idx = k.named(name).add(&start, &range);
    let limit = k.full_int(Scalar::I32, &[len], bound as i64);
    let ok = k.cmp(Cmp::Lt, &idx, &limit);
    (idx, ok)
}

/// `index · size` for an i32 scalar `index`: the first row or column of a block.
pub(crate) fn first_of(k: &mut Kernel, index: &Value, size: usize) -> Value {
    let size = k.const_i32(size as i32);
    k.mul(index, &size)
}

/// A `[C]` argument (a bias, a scale) at the tile's columns, as f32 (0 past the tensor's columns).
pub(crate) fn load_vector(k: &mut Kernel, arg: &Value, cols: &Value, col_ok: &Value, name: &str) -> Value {
    let ptrs = pointers(k, arg, cols);
    let zero = k.full_float(arg.ty().scalar_of(), cols.shape(), 0.0);
    let v = k.named(name).load(&ptrs, Some(col_ok), Some(&zero));
    k.convert(&v, Scalar::F32)
}

pub(crate) struct Tile {
    pub rows: Value,
    pub row_ok: Value,
    pub cols: Value,
    pub col_ok: Value,
    /// `[R, C]`: inside the tensor.
    pub ok: Value,
    pub offsets: Value,
}

impl Tile {
    /// Rows `first_row..+r` and columns `first_col..+c` of a `[rows, cols]` tensor.
    pub fn at(
        k: &mut Kernel,
        (first_row, r, rows): (&Value, usize, usize),
        (first_col, c, cols): (&Value, usize, usize),
    ) -> Tile {
        let (row_idx, row_ok) = indices(k, first_row, r, rows, "rows");
        let (col_idx, col_ok) = indices(k, first_col, c, cols, "cols");
        let ok_r = k.as_column(&row_ok, c);
        let ok_c = k.as_row(&col_ok, r);
        let ok = k.named("ok").and(&ok_r, &ok_c);
        let stride = k.full_int(Scalar::I32, &[r], cols as i64);
        let row_start = k.mul(&row_idx, &stride);
        let row_start = k.as_column(&row_start, c);
        let col_offsets = k.as_row(&col_idx, r);
        let offsets = k.named("offs").add(&row_start, &col_offsets);
        Tile { rows: row_idx, row_ok, cols: col_idx, col_ok, ok, offsets }
    }

    /// The tile of a `[rows, cols]` argument, as f32 (0 where masked).
    pub fn load(&self, k: &mut Kernel, arg: &Value, name: &str) -> Value {
        self.load_or(k, arg, 0.0, name)
    }

    /// The tile of a `[rows, cols]` argument, as f32 (`fill` where masked).
    pub fn load_or(&self, k: &mut Kernel, arg: &Value, fill: f64, name: &str) -> Value {
        let ptrs = pointers(k, arg, &self.offsets);
        let fill = k.full_float(arg.ty().scalar_of(), self.offsets.shape(), fill);
        let v = k.named(name).load(&ptrs, Some(&self.ok), Some(&fill));
        k.convert(&v, Scalar::F32)
    }

    /// `v` (f32) stored where the tile lies inside the tensor, rounded to the argument's type.
    pub fn store(&self, k: &mut Kernel, arg: &Value, v: &Value) {
        let ptrs = pointers(k, arg, &self.offsets);
        let v = k.convert(v, arg.ty().scalar_of());
        k.store(&ptrs, &v, Some(&self.ok));
    }

    /// One f32 value per row of the tile from a `[rows]` argument (0 past the last row).
    pub fn load_rows(&self, k: &mut Kernel, arg: &Value, name: &str) -> Value {
        let ptrs = pointers(k, arg, &self.rows);
        let zero = k.full_float(Scalar::F32, self.rows.shape(), 0.0);
        k.named(name).load(&ptrs, Some(&self.row_ok), Some(&zero))
    }

    pub fn store_rows(&self, k: &mut Kernel, arg: &Value, v: &Value) {
        let ptrs = pointers(k, arg, &self.rows);
        k.store(&ptrs, v, Some(&self.row_ok));
    }

    /// A `[C]` argument at the tile's columns, as f32.
    pub fn load_vector(&self, k: &mut Kernel, arg: &Value, name: &str) -> Value {
        load_vector(k, arg, &self.cols, &self.col_ok, name)
    }
}

/// `v: [C]` stored at columns `cols` (where `col_ok`) of row `row` (an i32 scalar) of a row-major argument whose
/// rows are `row_len` long: one program's partial sums.
pub(crate) fn store_row(
    k: &mut Kernel,
    arg: &Value,
    (row, row_len): (&Value, usize),
    (cols, col_ok): (&Value, &Value),
    v: &Value,
) {
    let start = first_of(k, row, row_len);
    let start = k.splat(&start, cols.shape());
    let offsets = k.add(&start, cols);
    let ptrs = pointers(k, arg, &offsets);
    k.store(&ptrs, v, Some(col_ok));
}

/// A backward's walk: program `pid` takes row blocks `pid`, `pid + programs`, … for `rounds` rounds (so that
/// neighbouring programs read neighbouring rows at the same time), carrying `inits` (its partial sums); `body` gets
/// the row block's index and the carried values and returns the next ones. Returns the final values.
pub(crate) fn strided_blocks(
    k: &mut Kernel,
    (pid, programs, rounds): (&Value, usize, usize),
    inits: &[Value],
    body: impl FnOnce(&mut Kernel, &Value, &[Value]) -> Vec<Value>,
) -> Vec<Value> {
    let (lo, hi, one) = (k.const_i32(0), k.const_i32(rounds as i32), k.const_i32(1));
    k.for_loop((&lo, &hi, &one), inits, |k, round, acc| {
        let stride = k.const_i32(programs as i32);
        let step = k.mul(round, &stride);
        let block = k.named("block").add(pid, &step);
        body(k, &block, acc)
    })
}
