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

/// How a row-major `[rows, cols]` tensor is cut into blocks of `block_rows × block_cols` (powers of two): at most
/// `max_cols` columns and about `elements` elements a block, fewer rows where the tensor has fewer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Blocking {
    pub rows: usize,
    pub cols: usize,
    pub block_rows: usize,
    pub block_cols: usize,
}

impl Blocking {
    pub fn new(rows: usize, cols: usize, max_cols: usize, elements: usize) -> Blocking {
        let block_cols = cols.next_power_of_two().min(max_cols);
        let block_rows = (elements / block_cols).min(rows.next_power_of_two()).max(1);
        Blocking { rows, cols, block_rows, block_cols }
    }

    pub fn row_blocks(&self) -> usize {
        self.rows.div_ceil(self.block_rows)
    }

    pub fn col_blocks(&self) -> usize {
        self.cols.div_ceil(self.block_cols)
    }

    /// Why a kernel cannot walk the tensor so (`None`: it can): it is empty, its offsets pass 32 bits, or its column
    /// blocks are more than a grid's second axis takes.
    pub fn unsupported(&self) -> Option<String> {
        if self.rows == 0 || self.cols == 0 {
            return Some("an empty tensor".into());
        }
        if self.rows.checked_mul(self.cols).is_none_or(|n| n > i32::MAX as usize) {
            return Some(format!("{} × {} elements do not fit 32-bit offsets", self.rows, self.cols));
        }
        (self.col_blocks() > 65535).then(|| format!("{} columns are more than the kernel's grid takes", self.cols))
    }

    /// The tile of row block `rb` and column block `cb` (i32 scalars).
    pub(crate) fn tile(&self, k: &mut Kernel, rb: &Value, cb: &Value) -> Tile {
        let (r, c) = (self.block_rows, self.block_cols);
        let first_row = first_of(k, rb, r);
        let first_col = first_of(k, cb, c);
        Tile::at(k, (&first_row, r, self.rows), (&first_col, c, self.cols))
    }
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
