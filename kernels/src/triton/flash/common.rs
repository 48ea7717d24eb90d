//! Steps the three flash kernels share: the spec's constants, addressing one (batch, head) of a tensor, masked
//! tile loads and stores, the visibility mask, and the split of a loop over blocks into masked and unmasked parts.

use super::{FlashDtype, FlashLayout, FlashSpec, FlashTuning};
use crate::triton::ttir::{Cmp, DotPrecision, Kernel, Scalar, Value};

pub(super) const LOG2_E: f64 = std::f64::consts::LOG2_E;
pub(super) const LN_2: f64 = std::f64::consts::LN_2;

/// What a kernel's text is specialized to, read off the spec and the blocks once.
pub(super) struct Ctx {
    /// Element type of q, k, v, o and the gradients.
    pub elem: Scalar,
    pub heads: usize,
    pub seq_q: usize,
    pub seq_kv: usize,
    pub head_dim: usize,
    pub causal: bool,
    pub window: Option<usize>,
    /// Query rows and key rows per block, and the head dim padded to a power of two.
    pub bm: usize,
    pub bn: usize,
    pub bd: usize,
    pub layout: FlashLayout,
    /// q, k, v in one packed operand (`FlashSpec::packed`).
    pub packed: bool,
    pub scale: f64,
    /// `tt.dot`'s precision for f32 operands.
    pub precision: DotPrecision,
}

impl Ctx {
    pub fn new(spec: &FlashSpec, tuning: &FlashTuning) -> Ctx {
        let elem = match spec.dtype {
            FlashDtype::F32 => Scalar::F32,
            FlashDtype::F16 => Scalar::F16,
            FlashDtype::BF16 => Scalar::BF16,
        };
        Ctx {
            elem,
            heads: spec.heads,
            seq_q: spec.seq_q,
            seq_kv: spec.seq_kv,
            head_dim: spec.head_dim,
            causal: spec.causal,
            // A window of seq_q or more hides nothing (i - j < seq_q always): no window.
            window: spec.window.filter(|&w| spec.causal && w < spec.seq_q),
            bm: tuning.block_m,
            bn: tuning.block_n,
            bd: spec.block_d(),
            layout: spec.layout,
            packed: spec.packed,
            scale: spec.scale(),
            precision: if spec.tf32 { DotPrecision::Tf32 } else { DotPrecision::Ieee },
        }
    }

    /// Where q (0), k (1) or v (2) and their gradients are: slot `i` of the packed operand, or a tensor of its own.
    pub fn slot(&self, i: usize) -> Slot {
        if self.packed {
            Slot::Packed(i)
        } else {
            Slot::Own
        }
    }

    /// The factor taking `q . k` to base-2 scores.
    pub fn qk_scale_log2(&self) -> f64 {
        self.scale * LOG2_E
    }
}

/// Small integer constants of the IR (sizes are checked to fit i32 by `unsupported`).
pub(super) fn c32(k: &mut Kernel, v: usize) -> Value {
    k.const_i32(i32::try_from(v).unwrap_or(i32::MAX))
}

/// `[x, x + len)` as a 1-D i32 tensor named `name`, for a scalar `x`.
pub(super) fn offsets(k: &mut Kernel, x: &Value, len: usize, name: &str) -> Value {
    let range = k.make_range(0, len as u32);
    let start = k.splat(x, &[len]);
    k.named(name).add(&start, &range)
}

/// One (batch, head) of a [.., seq, .., head_dim] tensor: a pointer to its row 0 and the stride between rows.
pub(super) struct Head {
    pub ptr: Value,
    pub stride: usize,
    pub seq: usize,
}

/// The pointer arguments of q, k and v, declared in that order: the one packed operand (the same pointer thrice)
/// when `ctx.packed`, else three.
pub(super) fn qkv_args(k: &mut Kernel, ctx: &Ctx) -> [Value; 3] {
    if ctx.packed {
        let qkv = k.ptr_arg("qkv", ctx.elem);
        [qkv.clone(), qkv.clone(), qkv]
    } else {
        ["q", "k", "v"].map(|n| k.ptr_arg(n, ctx.elem))
    }
}

/// Where a tensor's heads are: a tensor of its own (`[B, H, T, D]` or `[B, T, H, D]`), or slot `i` of a packed
/// `[B, T, 3, H, D]` operand (q 0, k 1, v 2).
#[derive(Clone, Copy)]
pub(super) enum Slot {
    Own,
    Packed(usize),
}

/// The element offset (i64) of row 0 of head `bh` in a tensor of `seq` rows per head held as `slot` says, and the
/// row stride.
pub(super) fn head_offset(k: &mut Kernel, ctx: &Ctx, bh: &Value, seq: usize, slot: Slot) -> (Value, usize) {
    let d = ctx.head_dim;
    match ctx.layout {
        FlashLayout::Bhtd => {
            let bh = k.convert(bh, Scalar::I64);
            let per_head = k.const_i64((seq * d) as i64);
            (k.named("head_offset").mul(&bh, &per_head), d)
        }
        FlashLayout::Bthd => {
            let (slots, first_head) = match slot {
                Slot::Own => (1, None),
                Slot::Packed(i) => (3, Some(i * ctx.heads)),
            };
            let h_count = c32(k, ctx.heads);
            let b = k.div(bh, &h_count);
            let mut h = k.rem(bh, &h_count);
            if let Some(first) = first_head {
                let first = c32(k, first);
                h = k.add(&h, &first);
            }
            let b = k.convert(&b, Scalar::I64);
            let per_batch = k.const_i64((seq * slots * ctx.heads * d) as i64);
            let batch_offset = k.mul(&b, &per_batch);
            let d32 = c32(k, d);
            let head_offset = k.mul(&h, &d32);
            let head_offset = k.convert(&head_offset, Scalar::I64);
            (k.named("head_offset").add(&batch_offset, &head_offset), slots * ctx.heads * d)
        }
    }
}

/// The offsets of head `bh` in q, k, v and in the tensors shaped like q without packing (o, do): computed once
/// and shared where they coincide (k and v, or every tensor of one sequence length, unpacked).
pub(super) struct HeadOffsets {
    pub q: (Value, usize),
    pub k: (Value, usize),
    pub v: (Value, usize),
    pub o: (Value, usize),
}

impl HeadOffsets {
    pub fn new(k: &mut Kernel, ctx: &Ctx, bh: &Value) -> HeadOffsets {
        let q = head_offset(k, ctx, bh, ctx.seq_q, ctx.slot(0));
        if !ctx.packed {
            let kv = head_offset(k, ctx, bh, ctx.seq_kv, Slot::Own);
            return HeadOffsets { o: q.clone(), k: kv.clone(), v: kv, q };
        }
        let key = head_offset(k, ctx, bh, ctx.seq_kv, Slot::Packed(1));
        let v = head_offset(k, ctx, bh, ctx.seq_kv, Slot::Packed(2));
        let o = head_offset(k, ctx, bh, ctx.seq_q, Slot::Own);
        HeadOffsets { q, k: key, v, o }
    }
}

impl Head {
    pub fn new(k: &mut Kernel, arg: &Value, (offset, stride): &(Value, usize), seq: usize) -> Head {
        Head { ptr: k.named("head").addptr(arg, offset), stride: *stride, seq }
    }

    /// Pointers to rows `rows` ([r] i32) and columns `0..bd` of this head: [r, bd].
    fn tile_ptrs(&self, k: &mut Kernel, ctx: &Ctx, rows: &Value) -> Value {
        let r = rows.shape()[0];
        let stride = k.full_int(Scalar::I32, &[r], self.stride as i64);
        let row_offsets = k.mul(rows, &stride);
        let row_offsets = k.expand_dims(&row_offsets, 1);
        let base = k.splat(&self.ptr, &[r, 1]);
        let row_ptrs = k.addptr(&base, &row_offsets);
        let row_ptrs = k.broadcast(&row_ptrs, &[r, ctx.bd]);
        let cols = k.make_range(0, ctx.bd as u32);
        let cols = k.as_row(&cols, r);
        k.addptr(&row_ptrs, &cols)
    }

    /// Where a [r, bd] tile of rows `rows` is in bounds: rows below `seq` (when `check_rows`) and columns below
    /// the head dim (when it was padded). None when everything is.
    fn tile_mask(&self, k: &mut Kernel, ctx: &Ctx, rows: &Value, check_rows: bool) -> Option<Value> {
        let r = rows.shape()[0];
        let row_mask = check_rows.then(|| {
            let seq = k.full_int(Scalar::I32, &[r], self.seq as i64);
            let in_rows = k.cmp(Cmp::Lt, rows, &seq);
            k.as_column(&in_rows, ctx.bd)
        });
        let col_mask = (ctx.bd != ctx.head_dim).then(|| {
            let cols = k.make_range(0, ctx.bd as u32);
            let d = k.full_int(Scalar::I32, &[ctx.bd], ctx.head_dim as i64);
            let in_cols = k.cmp(Cmp::Lt, &cols, &d);
            k.as_row(&in_cols, r)
        });
        match (row_mask, col_mask) {
            (Some(a), Some(b)) => Some(k.and(&a, &b)),
            (a, b) => a.or(b),
        }
    }

    /// The [r, bd] tile of rows `rows`, zero where out of bounds, named `name`.
    pub fn load(&self, k: &mut Kernel, ctx: &Ctx, rows: &Value, check_rows: bool, name: &str) -> Value {
        let ptrs = self.tile_ptrs(k, ctx, rows);
        match self.tile_mask(k, ctx, rows, check_rows) {
            Some(mask) => {
                let zero = k.full_float(ctx.elem, &[rows.shape()[0], ctx.bd], 0.0);
                k.named(name).load(&ptrs, Some(&mask), Some(&zero))
            }
            None => k.named(name).load(&ptrs, None, None),
        }
    }

    /// Stores an f32 [r, bd] tile to rows `rows`, converted to the element type, skipping out-of-bounds ones.
    pub fn store(&self, k: &mut Kernel, ctx: &Ctx, rows: &Value, tile: &Value) {
        let ptrs = self.tile_ptrs(k, ctx, rows);
        let mask = self.tile_mask(k, ctx, rows, true);
        let tile = k.convert(tile, ctx.elem);
        k.store(&ptrs, &tile, mask.as_ref());
    }
}

/// One f32 value per query row of head `bh` ([batch, heads, seq_q] contiguous: lse, delta): a pointer to the
/// head's first.
pub(super) fn row_values(k: &mut Kernel, ctx: &Ctx, arg: &Value, bh: &Value) -> Value {
    let bh = k.convert(bh, Scalar::I64);
    let seq = k.const_i64(ctx.seq_q as i64);
    let offset = k.mul(&bh, &seq);
    k.addptr(arg, &offset)
}

/// Loads the row values of `rows` ([r] i32) from `head_ptr`, named `name`; 0 for rows past seq_q when
/// `check_rows`.
pub(super) fn load_rows(
    k: &mut Kernel,
    ctx: &Ctx,
    head_ptr: &Value,
    rows: &Value,
    check_rows: bool,
    name: &str,
) -> Value {
    let r = rows.shape()[0];
    let base = k.splat(head_ptr, &[r]);
    let ptrs = k.addptr(&base, rows);
    if !check_rows {
        return k.named(name).load(&ptrs, None, None);
    }
    let seq = k.full_int(Scalar::I32, &[r], ctx.seq_q as i64);
    let mask = k.cmp(Cmp::Lt, rows, &seq);
    let zero = k.full_float(Scalar::F32, &[r], 0.0);
    k.named(name).load(&ptrs, Some(&mask), Some(&zero))
}

/// Stores f32 row values to `rows`, skipping rows past seq_q.
pub(super) fn store_rows(k: &mut Kernel, ctx: &Ctx, head_ptr: &Value, rows: &Value, values: &Value) {
    let r = rows.shape()[0];
    let base = k.splat(head_ptr, &[r]);
    let ptrs = k.addptr(&base, rows);
    let seq = k.full_int(Scalar::I32, &[r], ctx.seq_q as i64);
    let mask = k.cmp(Cmp::Lt, rows, &seq);
    k.store(&ptrs, values, Some(&mask));
}

/// Which (query, key) pairs are visible, given the query index `qi` and key index `kj` of each element of a
/// block (both 2-D, same shape, in whichever orientation the block has): in bounds, and when causal `j <= i`
/// and with a window `i - j < window`.
pub(super) fn visible(k: &mut Kernel, ctx: &Ctx, qi: &Value, kj: &Value) -> Value {
    let shape = qi.shape().to_vec();
    let seq_q = k.full_int(Scalar::I32, &shape, ctx.seq_q as i64);
    let seq_kv = k.full_int(Scalar::I32, &shape, ctx.seq_kv as i64);
    let mut conditions = vec![k.cmp(Cmp::Lt, qi, &seq_q), k.cmp(Cmp::Lt, kj, &seq_kv)];
    if ctx.causal {
        conditions.push(k.cmp(Cmp::Le, kj, qi));
    }
    if let Some(w) = ctx.window {
        let dist = k.sub(qi, kj);
        let w = k.full_int(Scalar::I32, &shape, w as i64);
        conditions.push(k.cmp(Cmp::Lt, &dist, &w));
    }
    let mut vis = conditions[0].clone();
    for (i, c) in conditions.iter().enumerate().skip(1) {
        if i + 1 == conditions.len() {
            k.named("visible");
        }
        vis = k.and(&vis, c);
    }
    vis
}

/// The bounds of one loop over blocks: blocks starting in `[lo, f0)` and `[f1, hi)` need the elementwise mask,
/// those in `[f0, f1)` are seen whole. `first` / `last` say whether the masked parts can be non-empty at all
/// (when not, their loops are not written).
pub(super) struct Ranges {
    pub lo: Value,
    pub f0: Value,
    pub f1: Value,
    pub hi: Value,
    pub first: bool,
    pub last: bool,
}

/// The largest multiple of `block` not above `x` (`x >= 0`, where `divsi`'s truncation is a floor).
fn floor_to(k: &mut Kernel, x: &Value, block: usize) -> Value {
    let b = c32(k, block);
    let q = k.div(x, &b);
    k.mul(&q, &b)
}

/// The smallest multiple of `block` not below `x` (`x >= 0`).
fn ceil_to(k: &mut Kernel, x: &Value, block: usize) -> Value {
    let up = c32(k, block - 1);
    let x = k.add(x, &up);
    floor_to(k, &x, block)
}

/// `max(x + delta, 0)` for a scalar `x` and a constant `delta`.
fn plus_clamped(k: &mut Kernel, x: &Value, delta: i64) -> Value {
    let d = k.const_i32(delta as i32);
    let y = k.add(x, &d);
    let zero = k.const_i32(0);
    k.max(&y, &zero)
}

/// `x + delta`.
fn plus(k: &mut Kernel, x: &Value, delta: usize) -> Value {
    let d = c32(k, delta);
    k.add(x, &d)
}

/// `min(x + delta, limit)`.
fn plus_capped(k: &mut Kernel, x: &Value, delta: usize, limit: usize) -> Value {
    let d = c32(k, delta);
    let y = k.add(x, &d);
    let limit = c32(k, limit);
    k.min(&y, &limit)
}

/// Orders the bounds `lo <= f0 <= f1 <= hi`, so that an empty whole part leaves the masked ones covering all.
fn ordered(k: &mut Kernel, lo: Value, f0: Value, f1: Value, hi: Value, first: bool, last: bool) -> Ranges {
    let f0 = k.max(&f0, &lo);
    let f0 = k.named("f0").min(&f0, &hi);
    let f1 = k.max(&f1, &f0);
    let f1 = k.named("f1").min(&f1, &hi);
    Ranges { lo, f0, f1, hi, first, last }
}

/// Key blocks (of `bn`) for the query block `[m0, m0 + bm)`: the forward's and dq's loop.
pub(super) fn key_ranges(k: &mut Kernel, ctx: &Ctx, m0: &Value) -> Ranges {
    let (bm, bn) = (ctx.bm, ctx.bn);
    // Visible keys: j <= i (causal) and j > i - window, within seq_kv.
    let (lo, f0) = match ctx.window {
        Some(w) => {
            let lo = plus_clamped(k, m0, 1 - w as i64);
            let f0 = plus_clamped(k, m0, bm as i64 - w as i64);
            (floor_to(k, &lo, bn), ceil_to(k, &f0, bn))
        }
        None => (k.const_i32(0), k.const_i32(0)),
    };
    let (f1, hi) = if ctx.causal {
        // Whole blocks end by the block's first query; the last visible key is its last query.
        let first_row = plus_capped(k, m0, 1, ctx.seq_kv);
        (floor_to(k, &first_row, bn), plus_capped(k, m0, bm, ctx.seq_kv))
    } else {
        (c32(k, ctx.seq_kv / bn * bn), c32(k, ctx.seq_kv))
    };
    let last = ctx.causal || !ctx.seq_kv.is_multiple_of(bn);
    ordered(k, lo, f0, f1, hi, ctx.window.is_some(), last)
}

/// Query blocks (of `bm`) for the key block `[n0, n0 + bn)`: dk and dv's loop.
pub(super) fn query_ranges(k: &mut Kernel, ctx: &Ctx, n0: &Value) -> Ranges {
    let (bm, bn) = (ctx.bm, ctx.bn);
    // Visible queries: i >= j (causal) and i < j + window, within seq_q.
    let (lo, f0) = if ctx.causal {
        let diagonal_end = plus(k, n0, bn - 1);
        (floor_to(k, n0, bm), ceil_to(k, &diagonal_end, bm))
    } else {
        (k.const_i32(0), k.const_i32(0))
    };
    let (last_whole, hi) = match ctx.window {
        Some(w) => (plus_capped(k, n0, w, ctx.seq_q), plus_capped(k, n0, bn - 1 + w, ctx.seq_q)),
        None => (c32(k, ctx.seq_q), c32(k, ctx.seq_q)),
    };
    let mut f1 = floor_to(k, &last_whole, bm);
    if !ctx.seq_kv.is_multiple_of(bn) {
        // The ragged last key block is never seen whole.
        let end = plus(k, n0, bn);
        let seq_kv = c32(k, ctx.seq_kv);
        let ragged = k.cmp(Cmp::Gt, &end, &seq_kv);
        let zero = k.const_i32(0);
        f1 = k.select(&ragged, &zero, &f1);
    }
    let last = ctx.window.is_some() || !ctx.seq_q.is_multiple_of(bm) || !ctx.seq_kv.is_multiple_of(bn);
    ordered(k, lo, f0, f1, hi, ctx.causal, last)
}

/// Writes the loops over `ranges` in steps of `step`, carrying `state`: `step_fn(kernel, block_start, state,
/// masked)` writes one block's update and returns the new state. Returns the final state.
pub(super) fn sweep(
    k: &mut Kernel,
    ranges: &Ranges,
    step: usize,
    state: Vec<Value>,
    mut step_fn: impl FnMut(&mut Kernel, &Value, &[Value], bool) -> Vec<Value>,
) -> Vec<Value> {
    let step = c32(k, step);
    let mut state = state;
    let parts = [
        (&ranges.lo, &ranges.f0, true, ranges.first),
        (&ranges.f0, &ranges.f1, false, true),
        (&ranges.f1, &ranges.hi, true, ranges.last),
    ];
    for (from, to, masked, needed) in parts {
        if needed {
            state = k.for_loop((from, to, &step), &state, |k, start, carried| step_fn(k, start, carried, masked));
        }
    }
    state
}
