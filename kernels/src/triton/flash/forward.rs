//! The forward kernel: one program per (block of `bm` queries, batch * head), an online softmax over the key
//! blocks the block's queries can see; causal, the last query block first.

use super::common::{self, key_ranges, offsets, sweep, visible, Ctx, Head, LN_2};
use super::{blocks, kernel_name, launch_grid, FlashSpec, FlashTuning, Heaviest, Programs};
use crate::triton::ttir::{Cmp, Kernel, Reduction, Scalar, Value};
use crate::triton::TritonCall;

/// What the forward's loop body reads besides its carried state.
struct Fwd<'a> {
    ctx: &'a Ctx,
    k: Head,
    v: Head,
    /// The query block, [bm, bd], and its row indices, [bm].
    q: Value,
    rows: Value,
}

pub(super) fn generate(spec: &FlashSpec, tuning: &FlashTuning) -> TritonCall {
    let ctx = Ctx::new(spec, tuning);
    let name = kernel_name("fwd", spec);
    let mut k = Kernel::new(&name);
    let [q_arg, k_arg, v_arg] = common::qkv_args(&mut k, &ctx);
    let o_arg = k.ptr_arg("o", ctx.elem);
    let lse_arg = k.ptr_arg("lse", Scalar::F32);

    let n = blocks(spec.seq_q, ctx.bm);
    let programs = Programs::new(&mut k, spec, n, 1);
    let (pid_m, bh) = (programs.block_index(&mut k, n, Heaviest::Last), programs.head.clone());
    let bm = common::c32(&mut k, ctx.bm);
    let m0 = k.named("m0").mul(&pid_m, &bm);
    let rows = offsets(&mut k, &m0, ctx.bm, "rows");
    let offsets = common::HeadOffsets::new(&mut k, &ctx, &bh);
    let q_head = Head::new(&mut k, &q_arg, &offsets.q, ctx.seq_q);
    let o_head = Head::new(&mut k, &o_arg, &offsets.o, ctx.seq_q);
    let q = q_head.load(&mut k, &ctx, &rows, true, "q");
    let fwd = Fwd {
        ctx: &ctx,
        k: Head::new(&mut k, &k_arg, &offsets.k, ctx.seq_kv),
        v: Head::new(&mut k, &v_arg, &offsets.v, ctx.seq_kv),
        q,
        rows,
    };

    // Running max m (base 2, -inf until a row sees a key), running sum l, and the unnormalized output.
    let m_i = k.named("m_i").full_float(Scalar::F32, &[ctx.bm], f64::NEG_INFINITY);
    let l_i = k.named("l_i").full_float(Scalar::F32, &[ctx.bm], 0.0);
    let acc = k.named("acc").full_float(Scalar::F32, &[ctx.bm, ctx.bd], 0.0);
    let ranges = key_ranges(&mut k, &ctx, &m0);
    let state = sweep(&mut k, &ranges, ctx.bn, vec![m_i, l_i, acc], |k, n0, s, masked| fwd.step(k, n0, s, masked));
    let (o, lse) = finish_rows(&mut k, &state);
    o_head.store(&mut k, &ctx, &fwd.rows, &o);
    let lse_head = common::row_values(&mut k, &ctx, &lse_arg, &bh);
    common::store_rows(&mut k, &ctx, &lse_head, &fwd.rows, &lse);

    launch_grid(name, k, programs.grid, tuning)
}

impl Fwd<'_> {
    /// One key block at `n0`: scores, the new running max, rescaled sum and output, and `p v` added.
    fn step(&self, k: &mut Kernel, n0: &Value, state: &[Value], masked: bool) -> Vec<Value> {
        let ctx = self.ctx;
        let (m_i, l_i, acc) = (&state[0], &state[1], &state[2]);
        let cols = offsets(k, n0, ctx.bn, "cols");
        let kt = self.k.load(k, ctx, &cols, masked, "k");
        let vt = self.v.load(k, ctx, &cols, masked, "v");

        let s = scores(k, ctx, &self.q, &kt, "s");
        let s = if masked {
            let qi = k.as_column(&self.rows, ctx.bn);
            let kj = k.as_row(&cols, ctx.bm);
            let vis = visible(k, ctx, &qi, &kj);
            let neg_inf = k.full_float(Scalar::F32, &[ctx.bm, ctx.bn], f64::NEG_INFINITY);
            k.named("s_masked").select(&vis, &s, &neg_inf)
        } else {
            s
        };
        let block_max = k.reduce(&s, 1, Reduction::Max);
        let m_new = k.named("m_new").max(m_i, &block_max);
        // A row that has seen no key yet keeps m = -inf: subtract 0 instead, so that exp2 gives 0, not NaN.
        let m_sub = if masked {
            let neg_inf = k.full_float(Scalar::F32, &[ctx.bm], f64::NEG_INFINITY);
            let none = k.cmp(Cmp::Eq, &m_new, &neg_inf);
            let zero = k.full_float(Scalar::F32, &[ctx.bm], 0.0);
            k.named("m_sub").select(&none, &zero, &m_new)
        } else {
            m_new.clone()
        };
        let m_col = k.as_column(&m_sub, ctx.bn);
        let shifted = k.sub(&s, &m_col);
        let p = k.named("p").math("exp2", &shifted);
        let drop = k.sub(m_i, &m_sub);
        let alpha = k.named("alpha").math("exp2", &drop);

        let l_scaled = k.mul(l_i, &alpha);
        let p_sum = k.reduce(&p, 1, Reduction::Sum);
        let l_new = k.named("l_new").add(&l_scaled, &p_sum);
        let alpha_col = k.as_column(&alpha, ctx.bd);
        let acc = k.mul(acc, &alpha_col);
        // p in the input type for the tensor-core product, as flash attention does.
        let p_in = k.convert(&p, ctx.elem);
        let acc = k.named("acc_new").dot(&p_in, &vt, &acc, ctx.precision);
        vec![m_new, l_new, acc]
    }
}

/// `q kᵀ` of a [r, bd] and a [c, bd] block, scaled to base 2: [r, c] f32 named `name`.
pub(super) fn scores(k: &mut Kernel, ctx: &Ctx, a: &Value, b: &Value, name: &str) -> Value {
    let (r, c) = (a.shape()[0], b.shape()[0]);
    let bt = k.trans(b);
    let zero = k.full_float(Scalar::F32, &[r, c], 0.0);
    let s = k.dot(a, &bt, &zero, ctx.precision);
    let factor = k.full_float(Scalar::F32, &[r, c], ctx.qk_scale_log2());
    k.named(name).mul(&s, &factor)
}

/// o = acc / l and the natural-log lse = (m + log2 l) ln 2 of each row; a row that saw no key (l = 0) gets
/// o = 0 (its acc is 0; divide by 1) and lse = -inf.
fn finish_rows(k: &mut Kernel, state: &[Value]) -> (Value, Value) {
    let (m_i, l_i, acc) = (&state[0], &state[1], &state[2]);
    let (bm, bd) = (acc.shape()[0], acc.shape()[1]);
    let zero = k.full_float(Scalar::F32, &[bm], 0.0);
    let empty = k.cmp(Cmp::Eq, l_i, &zero);
    let one = k.full_float(Scalar::F32, &[bm], 1.0);
    let l_safe = k.select(&empty, &one, l_i);
    let l_col = k.as_column(&l_safe, bd);
    let o = k.named("o").div(acc, &l_col);
    let log_l = k.math("log2", &l_safe);
    let lse2 = k.add(m_i, &log_l);
    let ln2 = k.full_float(Scalar::F32, &[bm], LN_2);
    let lse = k.mul(&lse2, &ln2);
    let neg_inf = k.full_float(Scalar::F32, &[bm], f64::NEG_INFINITY);
    let lse = k.named("lse").select(&empty, &neg_inf, &lse);
    (o, lse)
}
