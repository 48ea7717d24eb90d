//! Softmax cross-entropy of logits `x: [N, C]` against class ids `t: [N]`, as Triton kernels generated per shape
//! signature, computing in f32. XLA's program for the same loss read the logits three times (the row max, the sum
//! of exponentials, then the gradient with the picked logit), which at a language model's vocabulary is the largest
//! memory-bound piece of a step. Here:
//!
//! - the forward walks each row once, keeping a running max (one cross-thread reduction a block) and the sum of
//!   exponentials per column rescaled to it (the online softmax), summed after the walk; it loads the logit at the
//!   row's class by itself and writes each row's `lse = log Σ exp x` and its loss `lse - x[t]` (0 for a class id
//!   outside `0..C`), f32 `[N]`;
//! - the backward reads the logits once more with `lse` and a per-row scale `s` (the loss's cotangent over `N`, 0
//!   on rows whose id is out of range) and writes `dx = (exp(x - lse) - onehot(t)) · s` in the logits' type;
//! - the forward with the gradient does both in one program a row block: the forward's walk, then a second walk
//!   writing `dx` at `s = 1 / N`, which the gradient rule scales by the real cotangent.
//!
//! A program of the forward takes `R` rows and walks their columns in blocks of `BC`; the backward's programs
//! each take one `[R, BC]` block. Exponentials are written with `exp2`, which every Triton lowers.

use super::pointers;
use super::tile::{Blocking, Tile};
use super::ttir::{Cmp, Kernel, Reduction, Scalar, Value};
use super::TritonCall;

/// One cross-entropy signature.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CrossEntropySpec {
    pub rows: usize,
    pub classes: usize,
    /// Element type of the logits (and of their gradient).
    pub x: Scalar,
    /// Element type of the class ids: i32 or i64.
    pub ids: Scalar,
}

/// Columns per block, at most.
const BLOCK_COLS: usize = 2048;
/// Elements per block, about.
const BLOCK_ELEMENTS: usize = 4096;
/// Below every logit a row can hold and finite, so that a masked element's `exp(x - max)` is 0 without NaNs.
const FLOOR: f64 = -1e30;

impl CrossEntropySpec {
    pub fn blocking(&self) -> Blocking {
        Blocking::new(self.rows, self.classes, BLOCK_COLS, BLOCK_ELEMENTS)
    }

    /// Why the kernels do not take this signature (`None`: they do).
    pub fn unsupported(&self) -> Option<String> {
        if let Some(why) = self.blocking().unsupported() {
            return Some(why);
        }
        if !self.x.is_float() {
            return Some("the cross-entropy kernels take float logits".into());
        }
        (!matches!(self.ids, Scalar::I32 | Scalar::I64)).then(|| "class ids must be i32 or i64".into())
    }

    fn name(&self, what: &str) -> String {
        format!("lazuli_cross_entropy_{what}_{}x{}_{}_{}", self.rows, self.classes, self.x.mlir(), self.ids.mlir())
    }
}

/// The tile's rows' class ids, in their own type (0 past the last row).
fn row_ids(k: &mut Kernel, tile: &Tile, ids_arg: &Value) -> Value {
    let ptrs = pointers(k, ids_arg, &tile.rows);
    let ty = ids_arg.ty().scalar_of();
    let zero = k.full_int(ty, tile.rows.shape(), 0);
    k.named("t").load(&ptrs, Some(&tile.row_ok), Some(&zero))
}

/// `[R, BC]`: whether each element's column is its row's class.
fn is_class(k: &mut Kernel, tile: &Tile, ids: &Value, cols: usize) -> Value {
    let col = k.convert(&tile.cols, ids.ty().scalar_of());
    let col = k.as_row(&col, ids.shape()[0]);
    let id = k.as_column(ids, cols);
    k.named("hot").cmp(Cmp::Eq, &col, &id)
}

/// `exp(v)` as `exp2(v · log2 e)`.
fn exp(k: &mut Kernel, v: &Value) -> Value {
    let log2e = k.full_float(Scalar::F32, v.shape(), std::f64::consts::LOG2_E);
    let scaled = k.mul(v, &log2e);
    k.math("exp2", &scaled)
}

/// The forward: operands `x, t`, results `loss` and `lse`, f32 `[N]` each.
pub fn forward(spec: &CrossEntropySpec) -> TritonCall {
    let name = spec.name("fwd");
    let mut k = Kernel::new(&name);
    let x_arg = k.ptr_arg("x", spec.x);
    let t_arg = k.ptr_arg("t", spec.ids);
    let loss_arg = k.ptr_arg("loss", Scalar::F32);
    let lse_arg = k.ptr_arg("lse", Scalar::F32);
    let blocking = spec.blocking();
    let rb = k.named("rb").program_id(0);
    let rows = row_statistics(&mut k, spec, &blocking, &rb, (&x_arg, &t_arg));
    rows.tile.store_rows(&mut k, &loss_arg, &rows.loss);
    rows.tile.store_rows(&mut k, &lse_arg, &rows.lse);
    TritonCall { name, ir: k.finish(), grid: [blocking.row_blocks() as u32, 1, 1], num_warps: 4, num_stages: 1 }
}

/// How the forward that also writes the gradient walks the logits: rows per program, columns per block, warps and
/// software-pipelining stages of its loops. A program takes one row block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GradTiling {
    pub rows: usize,
    pub cols: usize,
    pub warps: u32,
    pub stages: u32,
}

impl GradTiling {
    /// The fastest of a sweep at GPT-2's shape on an H200
    /// (`docs/perf-log/2026-12-02-cross-entropy-gradient-in-forward.md`).
    pub const DEFAULT: GradTiling = GradTiling { rows: 1, cols: 2048, warps: 4, stages: 2 };

    /// Why the kernel cannot be walked so (`None`: it can): blocks are powers of two, and Triton takes 1 to 32
    /// warps (a power of two) and 1 to 8 stages.
    pub fn unsupported(&self) -> Option<String> {
        let GradTiling { rows, cols, warps, stages } = *self;
        let blocks = rows.is_power_of_two() && cols.is_power_of_two();
        let launch = warps.is_power_of_two() && warps <= 32 && (1..=8).contains(&stages);
        let what = format!("{rows} rows × {cols} columns, {warps} warps, {stages} stages");
        let rule = "rows and columns are powers of two, warps a power of two up to 32, stages 1 to 8";
        (!blocks || !launch).then(|| format!("{what}: {rule}"))
    }
}

/// The forward of a step that will take the loss's gradient: the forward's two results, then a second walk over
/// each row (while it may still be in the L2 cache) writing `dx = (exp(x - lse) - onehot(t)) / N` (0 on rows whose
/// id is out of range) in the logits' type: the gradient at a unit cotangent, which the gradient rule scales by the
/// real one. The logits are read once by this kernel instead of once by each of two.
pub fn forward_with_grad(spec: &CrossEntropySpec, tiling: GradTiling) -> TritonCall {
    let GradTiling { rows, cols, warps, stages } = tiling;
    let name = format!("{}_{rows}x{cols}_w{warps}_s{stages}", spec.name("fwd_grad"));
    let mut k = Kernel::new(&name);
    let x_arg = k.ptr_arg("x", spec.x);
    let t_arg = k.ptr_arg("t", spec.ids);
    let outs = [k.ptr_arg("loss", Scalar::F32), k.ptr_arg("lse", Scalar::F32), k.ptr_arg("dx", spec.x)];
    let blocking = Blocking::new(spec.rows, spec.classes, cols, rows * cols);
    let rb = k.named("rb").program_id(0);
    row_block_with_grad(&mut k, spec, &blocking, &rb, (&x_arg, &t_arg), &outs);
    let grid = [blocking.row_blocks() as u32, 1, 1];
    TritonCall { name, ir: k.finish(), grid, num_warps: warps, num_stages: stages }
}

/// Row block `rb` of [`forward_with_grad`]: its loss and `lse` stored, then its gradient, a column block at a time.
fn row_block_with_grad(
    k: &mut Kernel,
    spec: &CrossEntropySpec,
    blocking: &Blocking,
    rb: &Value,
    (x_arg, t_arg): (&Value, &Value),
    [loss_arg, lse_arg, dx_arg]: &[Value; 3],
) {
    let (r, c) = (blocking.block_rows, blocking.block_cols);
    let stats = row_statistics(k, spec, blocking, rb, (x_arg, t_arg));
    stats.tile.store_rows(k, loss_arg, &stats.loss);
    stats.tile.store_rows(k, lse_arg, &stats.lse);
    let inv_n = k.full_float(Scalar::F32, &[r], 1.0 / spec.rows as f64);
    let zero = k.full_float(Scalar::F32, &[r], 0.0);
    let scale = k.named("s").select(&stats.valid, &inv_n, &zero);
    let scale = k.as_column(&scale, c);
    let lse = k.as_column(&stats.lse, c);
    let (lo, hi, one) = (k.const_i32(0), k.const_i32(blocking.col_blocks() as i32), k.const_i32(1));
    k.for_loop((&lo, &hi, &one), &[], |k, cb, _| {
        let blk = blocking.tile(k, rb, cb);
        let x = blk.load(k, x_arg, "x");
        let dx = unit_gradient(k, (&blk, &x, &stats.ids), &lse, &scale);
        blk.store(k, dx_arg, &dx);
        vec![]
    });
}

/// A forward program's rows: their tile, class ids, whether each id is in range, `lse` and loss (`[R]` each).
struct RowStatistics {
    tile: Tile,
    ids: Value,
    valid: Value,
    lse: Value,
    loss: Value,
}

/// One walk over the columns of row block `rb`, the online softmax: the running max (one reduction a block), and
/// the sum of exponentials kept per column and rescaled to it, summed once at the end; then `lse = max + ln(sum)`
/// and the loss `lse - x[t]`, the class's logit loaded by itself (0 where the id is out of range). A block's only
/// cross-thread step is its max, which its exponentials wait for.
fn row_statistics(
    k: &mut Kernel,
    spec: &CrossEntropySpec,
    blocking: &Blocking,
    rb: &Value,
    (x_arg, t_arg): (&Value, &Value),
) -> RowStatistics {
    let (r, c) = (blocking.block_rows, blocking.block_cols);
    let first = k.const_i32(0);
    let tile = blocking.tile(k, rb, &first);
    let ids = row_ids(k, &tile, t_arg);
    let valid = valid_ids(k, &ids, spec.classes);
    let inits =
        [k.named("max").full_float(Scalar::F32, &[r], FLOOR), k.named("sums").full_float(Scalar::F32, &[r, c], 0.0)];
    let (lo, hi, one) = (k.const_i32(0), k.const_i32(blocking.col_blocks() as i32), k.const_i32(1));
    let done = k.for_loop((&lo, &hi, &one), &inits, |k, cb, acc| {
        let (max, sums) = (&acc[0], &acc[1]);
        let blk = blocking.tile(k, rb, cb);
        let x = blk.load_or(k, x_arg, FLOOR, "x");
        let block_max = k.reduce(&x, 1, Reduction::Max);
        let new_max = k.named("max").max(max, &block_max);
        let shift = k.sub(max, &new_max);
        let rescale = exp(k, &shift);
        let rescale = k.as_column(&rescale, c);
        let kept = k.mul(sums, &rescale);
        let centered = k.as_column(&new_max, c);
        let centered = k.sub(&x, &centered);
        let terms = exp(k, &centered);
        let new_sums = k.named("sums").add(&kept, &terms);
        vec![new_max, new_sums]
    });
    let (max, sum) = (&done[0], k.reduce(&done[1], 1, Reduction::Sum));
    // lse = max + ln(sum) = max + log2(sum) · ln 2.
    let log2 = k.math("log2", &sum);
    let ln2 = k.full_float(Scalar::F32, &[r], std::f64::consts::LN_2);
    let ln = k.mul(&log2, &ln2);
    let lse = k.named("lse").add(max, &ln);
    let picked = class_logits(k, spec, (&tile, &ids, &valid), x_arg);
    let loss = k.sub(&lse, &picked);
    let zero = k.full_float(Scalar::F32, &[r], 0.0);
    let loss = k.named("loss").select(&valid, &loss, &zero);
    RowStatistics { tile, ids, valid, lse, loss }
}

/// `[R]`: each row's logit at its class, as f32 (0 where the id is out of range or the row past the last).
fn class_logits(
    k: &mut Kernel,
    spec: &CrossEntropySpec,
    (tile, ids, valid): (&Tile, &Value, &Value),
    x_arg: &Value,
) -> Value {
    let r = ids.shape()[0];
    let id = k.convert(ids, Scalar::I32);
    let zero_id = k.full_int(Scalar::I32, &[r], 0);
    let id = k.select(valid, &id, &zero_id);
    let stride = k.full_int(Scalar::I32, &[r], spec.classes as i64);
    let row_start = k.mul(&tile.rows, &stride);
    let offsets = k.add(&row_start, &id);
    let ptrs = pointers(k, x_arg, &offsets);
    let load = k.and(valid, &tile.row_ok);
    let zero = k.full_float(spec.x, &[r], 0.0);
    let picked = k.named("picked").load(&ptrs, Some(&load), Some(&zero));
    k.convert(&picked, Scalar::F32)
}

/// `(exp(x - lse) - onehot(t)) · s` for a tile's logits `x` (f32), with `lse` and `s` as `[R, C]` columns.
fn unit_gradient(k: &mut Kernel, (blk, x, ids): (&Tile, &Value, &Value), lse: &Value, scale: &Value) -> Value {
    let c = x.shape()[1];
    let centered = k.sub(x, lse);
    let p = exp(k, &centered);
    let hot = is_class(k, blk, ids, c);
    let one = k.full_float(Scalar::F32, x.shape(), 1.0);
    let zero = k.full_float(Scalar::F32, x.shape(), 0.0);
    let hot = k.select(&hot, &one, &zero);
    let d = k.sub(&p, &hot);
    k.named("dx").mul(&d, scale)
}

/// `[R]`: `0 <= id < classes`.
fn valid_ids(k: &mut Kernel, ids: &Value, classes: usize) -> Value {
    let ty = ids.ty().scalar_of();
    let zero = k.full_int(ty, ids.shape(), 0);
    let top = k.full_int(ty, ids.shape(), classes as i64);
    let above = k.cmp(Cmp::Ge, ids, &zero);
    let below = k.cmp(Cmp::Lt, ids, &top);
    k.named("valid").and(&above, &below)
}

/// The backward: operands `x, t, lse, s` (`lse` and `s` f32 `[N]`), result `dx` in the logits' type.
pub fn backward(spec: &CrossEntropySpec) -> TritonCall {
    let name = spec.name("bwd");
    let mut k = Kernel::new(&name);
    let x_arg = k.ptr_arg("x", spec.x);
    let t_arg = k.ptr_arg("t", spec.ids);
    let lse_arg = k.ptr_arg("lse", Scalar::F32);
    let s_arg = k.ptr_arg("s", Scalar::F32);
    let dx_arg = k.ptr_arg("dx", spec.x);
    let blocking = spec.blocking();
    let c = blocking.block_cols;
    let rb = k.named("rb").program_id(0);
    let cb = k.named("cb").program_id(1);
    let blk = blocking.tile(&mut k, &rb, &cb);
    let x = blk.load(&mut k, &x_arg, "x");
    let lse = blk.load_rows(&mut k, &lse_arg, "lse");
    let scale = blk.load_rows(&mut k, &s_arg, "s");
    let ids = row_ids(&mut k, &blk, &t_arg);
    let lse = k.as_column(&lse, c);
    let scale = k.as_column(&scale, c);
    let dx = unit_gradient(&mut k, (&blk, &x, &ids), &lse, &scale);
    blk.store(&mut k, &dx_arg, &dx);
    TritonCall {
        name,
        ir: k.finish(),
        grid: [blocking.row_blocks() as u32, blocking.col_blocks() as u32, 1],
        num_warps: 4,
        num_stages: 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpt2() -> CrossEntropySpec {
        CrossEntropySpec { rows: 8192, classes: 50304, x: Scalar::BF16, ids: Scalar::I32 }
    }

    #[test]
    fn the_calls_are_well_formed_for_the_gpt2_shape() {
        let spec = gpt2();
        let b = spec.blocking();
        assert_eq!((b.block_rows, b.block_cols, b.row_blocks(), b.col_blocks()), (2, 2048, 4096, 25));
        let f = forward(&spec);
        f.validate(2, 2).expect("forward");
        assert_eq!(f.grid, [4096, 1, 1]);
        assert!(f.ir.contains("scf.for") && f.ir.contains("math.log2") && f.ir.contains("math.exp2"), "{}", f.ir);
        let b = backward(&spec);
        b.validate(4, 1).expect("backward");
        assert_eq!(b.grid, [4096, 25, 1]);
        assert!(b.ir.contains("arith.truncf"), "the gradient is written in bf16: {}", b.ir);
    }

    #[test]
    fn the_forward_with_the_gradient_walks_each_row_twice_and_writes_it_in_the_logits_type() {
        let f = forward_with_grad(&gpt2(), GradTiling::DEFAULT);
        f.validate(2, 3).expect("forward with the gradient");
        assert_eq!((f.grid, f.num_warps, f.num_stages), ([8192, 1, 1], 4, 2));
        assert_eq!(f.ir.matches("scf.for").count(), 2, "{}", f.ir);
        assert!(f.ir.contains("arith.truncf"), "the gradient is written in bf16: {}", f.ir);
        let odd = CrossEntropySpec { rows: 3, classes: 5, x: Scalar::F16, ids: Scalar::I64 };
        let tiling = GradTiling { rows: 2, cols: 4, warps: 1, stages: 1 };
        let small = forward_with_grad(&odd, tiling);
        small.validate(2, 3).expect("small");
        assert_eq!(small.grid, [2, 1, 1], "two rows a program over three rows");
    }

    #[test]
    fn small_and_odd_shapes_are_masked_or_refused() {
        let spec = CrossEntropySpec { rows: 3, classes: 5, x: Scalar::F32, ids: Scalar::I64 };
        let b = spec.blocking();
        assert_eq!((b.block_rows, b.block_cols, b.row_blocks(), b.col_blocks()), (4, 8, 1, 1));
        let f = forward(&spec);
        f.validate(2, 2).expect("forward");
        assert!(f.ir.contains("arith.trunci"), "i64 ids as i32 offsets of the class's logit: {}", f.ir);
        let b = backward(&spec);
        b.validate(4, 1).expect("backward");
        assert!(b.ir.contains("arith.extsi"), "i32 columns compared with i64 ids: {}", b.ir);
        let huge = CrossEntropySpec { rows: 1 << 16, classes: 1 << 16, ..spec.clone() };
        assert!(huge.unsupported().expect("too many").contains("32-bit"));
        let narrow = CrossEntropySpec { ids: Scalar::I1, ..spec };
        assert!(narrow.unsupported().expect("ids").contains("i32 or i64"));
    }
}
