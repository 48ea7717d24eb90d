//! The backward kernels. Both recompute the probabilities blockwise from the forward's lse,
//! `p = exp2(s2 - lse * log2(e))`, and use `ds = p (dp - delta)` with `dp = do vᵀ`:
//! - dq: one program per (block of `bm` queries, batch * head), over the key blocks its queries see;
//! - dk, dv: one program per (block of `bn` keys, batch * head), over the query blocks that see its keys,
//!   with the block transposed (keys as rows) so that `pᵀ` and `dsᵀ` come out of the products directly.
//!
//! A row that sees no key has lse = -inf; it only occurs in masked blocks, where its p is set to 0.

use super::common::{self, key_ranges, offsets, query_ranges, sweep, visible, Ctx, Head, LOG2_E};
use super::forward::scores;
use super::{blocks, kernel_name, launch_grid, FlashSpec, FlashTuning, Heaviest, Programs};
use crate::triton::ttir::{Cmp, Kernel, Scalar, Value};
use crate::triton::TritonCall;

/// The backward's inputs: q, k, v (the one packed operand thrice, when packed), do (element type), lse, delta
/// (f32), declared in that order.
struct Inputs {
    q: Value,
    k: Value,
    v: Value,
    d_o: Value,
    lse: Value,
    delta: Value,
}

fn inputs(k: &mut Kernel, ctx: &Ctx) -> Inputs {
    let [q, key, v] = common::qkv_args(k, ctx);
    let d_o = k.ptr_arg("do", ctx.elem);
    let lse = k.ptr_arg("lse", Scalar::F32);
    let delta = k.ptr_arg("delta", Scalar::F32);
    Inputs { q, k: key, v, d_o, lse, delta }
}

/// Loads lse (as base 2) and delta of `rows`.
fn row_stats(k: &mut Kernel, ctx: &Ctx, lse: &Value, delta: &Value, rows: &Value, check: bool) -> (Value, Value) {
    let lse = common::load_rows(k, ctx, lse, rows, check, "lse");
    let log2e = k.full_float(Scalar::F32, rows.shape(), LOG2_E);
    let lse2 = k.named("lse2").mul(&lse, &log2e);
    (lse2, common::load_rows(k, ctx, delta, rows, check, "delta"))
}

/// `x * scale` for an f32 tile.
fn scaled(k: &mut Kernel, ctx: &Ctx, x: &Value) -> Value {
    let scale = k.full_float(Scalar::F32, x.shape(), ctx.scale);
    k.mul(x, &scale)
}

// ---- dq -------------------------------------------------------------------------------------------------------

/// What dq's loop body reads besides the carried dq.
struct Dq<'a> {
    ctx: &'a Ctx,
    k: Head,
    v: Head,
    /// The query block's q, do ([bm, bd]), row indices, base-2 lse and delta ([bm]).
    q: Value,
    d_o: Value,
    rows: Value,
    lse2: Value,
    delta: Value,
}

pub(super) fn generate_dq(spec: &FlashSpec, tuning: &FlashTuning) -> TritonCall {
    let ctx = Ctx::new(spec, tuning);
    let name = kernel_name("bwd_dq", spec);
    let mut k = Kernel::new(&name);
    let inputs = inputs(&mut k, &ctx);
    let dq_arg = k.ptr_arg("dq", ctx.elem);
    let n = blocks(spec.seq_q, ctx.bm);
    let programs = Programs::new(&mut k, spec, n, 1);
    let pid_m = programs.block_index(&mut k, n, Heaviest::Last);
    dq_program(&mut k, &ctx, &inputs, &dq_arg, (&pid_m, &programs.head));
    launch_grid(name, k, programs.grid, tuning)
}

/// One dq program: query block `pid_m` of head `bh`, over the key blocks its queries see; dq is stored where q is
/// (slot 0 of the packed gradient, when packed).
fn dq_program(k: &mut Kernel, ctx: &Ctx, inputs: &Inputs, dq_arg: &Value, (pid_m, bh): (&Value, &Value)) {
    let bm = common::c32(k, ctx.bm);
    let m0 = k.named("m0").mul(pid_m, &bm);
    let rows = offsets(k, &m0, ctx.bm, "rows");
    let offs = common::HeadOffsets::new(k, ctx, bh);
    let q_head = Head::new(k, &inputs.q, &offs.q, ctx.seq_q);
    let do_head = Head::new(k, &inputs.d_o, &offs.o, ctx.seq_q);
    let dq_head = Head::new(k, dq_arg, &offs.q, ctx.seq_q);
    let q = q_head.load(k, ctx, &rows, true, "q");
    let d_o = do_head.load(k, ctx, &rows, true, "do");
    let lse_head = common::row_values(k, ctx, &inputs.lse, bh);
    let delta_head = common::row_values(k, ctx, &inputs.delta, bh);
    let (lse2, delta) = row_stats(k, ctx, &lse_head, &delta_head, &rows, true);
    let dq = Dq {
        ctx,
        k: Head::new(k, &inputs.k, &offs.k, ctx.seq_kv),
        v: Head::new(k, &inputs.v, &offs.v, ctx.seq_kv),
        q,
        d_o,
        rows,
        lse2,
        delta,
    };

    let acc = k.named("dq").full_float(Scalar::F32, &[ctx.bm, ctx.bd], 0.0);
    let ranges = key_ranges(k, ctx, &m0);
    let state = sweep(k, &ranges, ctx.bn, vec![acc], |k, n0, s, masked| dq.step(k, n0, s, masked));
    let result = scaled(k, ctx, &state[0]);
    dq_head.store(k, ctx, &dq.rows, &result);
}

impl Dq<'_> {
    /// One key block at `n0`: dq += ds k.
    fn step(&self, k: &mut Kernel, n0: &Value, state: &[Value], masked: bool) -> Vec<Value> {
        let ctx = self.ctx;
        let cols = offsets(k, n0, ctx.bn, "cols");
        let kt = self.k.load(k, ctx, &cols, masked, "k");
        let vt = self.v.load(k, ctx, &cols, masked, "v");

        let s = scores(k, ctx, &self.q, &kt, "s");
        let lse_col = k.as_column(&self.lse2, ctx.bn);
        let shifted = k.sub(&s, &lse_col);
        let p = k.named("p").math("exp2", &shifted);
        let p = if masked {
            let qi = k.as_column(&self.rows, ctx.bn);
            let kj = k.as_row(&cols, ctx.bm);
            let vis = visible(k, ctx, &qi, &kj);
            let zero = k.full_float(Scalar::F32, &[ctx.bm, ctx.bn], 0.0);
            k.named("p_masked").select(&vis, &p, &zero)
        } else {
            p
        };
        let v_t = k.trans(&vt);
        let zero = k.full_float(Scalar::F32, &[ctx.bm, ctx.bn], 0.0);
        let dp = k.named("dp").dot(&self.d_o, &v_t, &zero, ctx.precision);
        let delta_col = k.as_column(&self.delta, ctx.bn);
        let dp_centered = k.sub(&dp, &delta_col);
        let ds = k.named("ds").mul(&p, &dp_centered);
        let ds_in = k.convert(&ds, ctx.elem);
        vec![k.named("dq_new").dot(&ds_in, &kt, &state[0], ctx.precision)]
    }
}

// ---- dk, dv ---------------------------------------------------------------------------------------------------

/// What dk and dv's loop body reads besides the carried dk, dv.
struct DkDv<'a> {
    ctx: &'a Ctx,
    q: Head,
    d_o: Head,
    /// Pointers to this head's lse and delta.
    lse: Value,
    delta: Value,
    /// The key block's k, v ([bn, bd]) and row indices ([bn]).
    kt: Value,
    vt: Value,
    cols: Value,
}

pub(super) fn generate_dkdv(spec: &FlashSpec, tuning: &FlashTuning) -> TritonCall {
    let ctx = Ctx::new(spec, tuning);
    let name = kernel_name("bwd_dkdv", spec);
    let mut k = Kernel::new(&name);
    let inputs = inputs(&mut k, &ctx);
    let dk_arg = k.ptr_arg("dk", ctx.elem);
    let dv_arg = k.ptr_arg("dv", ctx.elem);
    let n = blocks(spec.seq_kv, ctx.bn);
    let programs = Programs::new(&mut k, spec, n, 1);
    let pid_n = programs.block_index(&mut k, n, Heaviest::First);
    dkdv_program(&mut k, &ctx, &inputs, (&dk_arg, &dv_arg), (&pid_n, &programs.head));
    launch_grid(name, k, programs.grid, tuning)
}

/// One dk, dv program: key block `pid_n` of head `bh`, over the query blocks that see its keys; dk and dv are
/// stored where k and v are (slots 1 and 2 of the packed gradient, when packed).
fn dkdv_program(
    k: &mut Kernel,
    ctx: &Ctx,
    inputs: &Inputs,
    (dk_arg, dv_arg): (&Value, &Value),
    (pid_n, bh): (&Value, &Value),
) {
    let bn = common::c32(k, ctx.bn);
    let n0 = k.named("n0").mul(pid_n, &bn);
    let cols = offsets(k, &n0, ctx.bn, "cols");
    let offs = common::HeadOffsets::new(k, ctx, bh);
    let k_head = Head::new(k, &inputs.k, &offs.k, ctx.seq_kv);
    let v_head = Head::new(k, &inputs.v, &offs.v, ctx.seq_kv);
    let dk_head = Head::new(k, dk_arg, &offs.k, ctx.seq_kv);
    let dv_head = Head::new(k, dv_arg, &offs.v, ctx.seq_kv);
    let kt = k_head.load(k, ctx, &cols, true, "k");
    let vt = v_head.load(k, ctx, &cols, true, "v");
    let body = DkDv {
        ctx,
        q: Head::new(k, &inputs.q, &offs.q, ctx.seq_q),
        d_o: Head::new(k, &inputs.d_o, &offs.o, ctx.seq_q),
        lse: common::row_values(k, ctx, &inputs.lse, bh),
        delta: common::row_values(k, ctx, &inputs.delta, bh),
        kt,
        vt,
        cols,
    };

    let dk = k.named("dk").full_float(Scalar::F32, &[ctx.bn, ctx.bd], 0.0);
    let dv = k.named("dv").full_float(Scalar::F32, &[ctx.bn, ctx.bd], 0.0);
    let ranges = query_ranges(k, ctx, &n0);
    let state = sweep(k, &ranges, ctx.bm, vec![dk, dv], |k, m0, s, masked| body.step(k, m0, s, masked));
    let dk = scaled(k, ctx, &state[0]);
    dk_head.store(k, ctx, &body.cols, &dk);
    dv_head.store(k, ctx, &body.cols, &state[1]);
}

// ---- packed: dq, dk and dv in one launch ----------------------------------------------------------------------

/// The packed backward: the grid's third axis picks the job (dq with `dq_tuning`'s blocks, or dk and dv with
/// `dkdv_tuning`'s; dk and dv's first under a causal mask), both writing into the one packed gradient; the launch
/// takes dk and dv's warps and stages.
pub(super) fn generate_packed(spec: &FlashSpec, dq_tuning: &FlashTuning, dkdv_tuning: &FlashTuning) -> TritonCall {
    let (dq_ctx, kv_ctx) = (Ctx::new(spec, dq_tuning), Ctx::new(spec, dkdv_tuning));
    let name = kernel_name("bwd", spec);
    let mut k = Kernel::new(&name);
    let inputs = inputs(&mut k, &kv_ctx);
    let dqkv = k.ptr_arg("dqkv", kv_ctx.elem);
    let (dq_blocks, kv_blocks) = (blocks(spec.seq_q, dq_ctx.bm), blocks(spec.seq_kv, kv_ctx.bn));
    let grid_x = dq_blocks.max(kv_blocks);
    let programs = Programs::new(&mut k, spec, grid_x, 2);
    let (pid, bh) = (&programs.block, &programs.head);
    let job = k.named("job").program_id(2);
    // Heaviest first: dk and dv's programs (four products a step against dq's three) before dq's.
    let dq_job = k.const_i32(if programs.heavy_first { 1 } else { 0 });
    let is_dq = k.cmp(Cmp::Eq, &job, &dq_job);
    k.if_else(
        &is_dq,
        &[],
        |k| {
            within(k, pid, (dq_blocks, grid_x), |k| {
                let pid_m = programs.block_index(k, dq_blocks, Heaviest::Last);
                dq_program(k, &dq_ctx, &inputs, &dqkv, (&pid_m, bh))
            });
            vec![]
        },
        |k| {
            within(k, pid, (kv_blocks, grid_x), |k| {
                let pid_n = programs.block_index(k, kv_blocks, Heaviest::First);
                dkdv_program(k, &kv_ctx, &inputs, (&dqkv, &dqkv), (&pid_n, bh))
            });
            vec![]
        },
    );
    let grid = programs.grid;
    TritonCall { name, ir: k.finish(), grid, num_warps: dkdv_tuning.num_warps, num_stages: dkdv_tuning.num_stages }
}

/// `body` for programs `pid < blocks` of a grid `grid_x` wide (no test when they are all).
fn within(k: &mut Kernel, pid: &Value, (blocks, grid_x): (u32, u32), body: impl FnOnce(&mut Kernel)) {
    if blocks >= grid_x {
        return body(k);
    }
    let limit = common::c32(k, blocks as usize);
    let inside = k.cmp(Cmp::Lt, pid, &limit);
    k.if_else(
        &inside,
        &[],
        |k| {
            body(k);
            vec![]
        },
        |_| vec![],
    );
}

impl DkDv<'_> {
    /// One query block at `m0`, transposed ([bn, bm]): dv += pᵀ do, dk += dsᵀ q.
    fn step(&self, k: &mut Kernel, m0: &Value, state: &[Value], masked: bool) -> Vec<Value> {
        let ctx = self.ctx;
        let rows = offsets(k, m0, ctx.bm, "rows");
        let q = self.q.load(k, ctx, &rows, masked, "q");
        let d_o = self.d_o.load(k, ctx, &rows, masked, "do");
        let (lse2, delta) = row_stats(k, ctx, &self.lse, &self.delta, &rows, masked);

        let st = scores(k, ctx, &self.kt, &q, "st");
        let lse_row = k.as_row(&lse2, ctx.bn);
        let shifted = k.sub(&st, &lse_row);
        let pt = k.named("pt").math("exp2", &shifted);
        let pt = if masked {
            let qi = k.as_row(&rows, ctx.bn);
            let kj = k.as_column(&self.cols, ctx.bm);
            let vis = visible(k, ctx, &qi, &kj);
            let zero = k.full_float(Scalar::F32, &[ctx.bn, ctx.bm], 0.0);
            k.named("pt_masked").select(&vis, &pt, &zero)
        } else {
            pt
        };
        let pt_in = k.convert(&pt, ctx.elem);
        let dv = k.named("dv_new").dot(&pt_in, &d_o, &state[1], ctx.precision);

        let do_t = k.trans(&d_o);
        let zero = k.full_float(Scalar::F32, &[ctx.bn, ctx.bm], 0.0);
        let dpt = k.named("dpt").dot(&self.vt, &do_t, &zero, ctx.precision);
        let delta_row = k.as_row(&delta, ctx.bn);
        let dpt_centered = k.sub(&dpt, &delta_row);
        let dst = k.named("dst").mul(&pt, &dpt_centered);
        let dst_in = k.convert(&dst, ctx.elem);
        let dk = k.named("dk_new").dot(&dst_in, &q, &state[0], ctx.precision);
        vec![dk, dv]
    }
}
