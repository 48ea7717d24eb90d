//! Attention written with lazuli's ops: what the kernel computes, the fallback on every device, and the
//! reference the fused implementations are tested against. On GPUs the products take the operands' dtype (so bf16
//! attention multiplies in bf16, with f32 accumulation), on the CPU f32 ([`product_dtype`]); the softmax runs in
//! f32, and the probabilities go back to the operands' dtype for the second product, as flash attention does.

use lazuli_hlo::{Builder, CompareDir, DType, DotGeneral, Iota, Op, Softmax, TensorType};

use super::{AttentionSpec, Dims, Layout};
use crate::Target;

/// The dtype attention's two products multiply in on `target`, for operands of dtype `dt`. On XLA's CPU backend
/// the gradient's bf16 products (autodiff's, in other dimension orders) run several times slower than f32 ones,
/// and widening bf16 or f16 to f32 is exact, so on the CPU the products multiply in f32
/// (`docs/perf-log/2026-12-03-cpu-bf16-attention.md`). GPUs multiply in the operands' dtype on tensor cores.
pub(super) fn product_dtype(dt: DType, target: &Target) -> DType {
    match target {
        Target::Cpu => DType::computing([dt]),
        Target::Cuda { .. } | Target::Other(_) => dt,
    }
}

/// `(output, stats)` for operands `x` = q, k, v (, bias): the output in the spec's layout and the natural-log
/// log-sum-exp of each row of the scaled, masked scores, `f32[B, H, Tq]`. The products multiply in `products`
/// (see [`product_dtype`]).
pub(super) fn attention<B: Builder>(
    b: &mut B,
    spec: &AttentionSpec,
    d: &Dims,
    products: DType,
    x: &[B::V],
) -> (B::V, B::V) {
    let (q, k, v) = (&x[0], &x[1], &x[2]);
    let dt = spec.q.dtype;
    // The softmax runs in f32, or in f64 for f64 operands.
    let wide = DType::computing([dt]);
    let scores = scores(b, spec, q, k, products, wide); // [B, H, Tq, Tk]
    let scores = b.scale(&scores, spec.scale());
    let scores = match x.get(3) {
        Some(bias) => {
            let bias = b.convert(bias, wide);
            let bias = b.expand(&bias, &[d.batch, d.heads, d.seq_q, d.seq_kv]);
            b.add(&scores, &bias)
        }
        None => scores,
    };
    let scores = masked(b, spec, d, &scores);
    let stats = b.logsumexp(&scores, 3);
    let stats = b.convert(&stats, DType::F32);
    let p = b.op(Op::Softmax(Softmax { axis: 3, log: false }), &[&scores]);
    let p = b.convert(&p, dt);
    let o = weighted_values(b, spec, &p, v, products); // [B, H, Tq, Dv]
    let o = match spec.layout {
        Layout::Bhtd => o,
        Layout::Bthd => b.transpose(&o, &[0, 2, 1, 3]),
    };
    (o, stats)
}

/// `q kᵀ` per batch and head as `[B, H, Tq, Tk]` of dtype `wide`, multiplied in `products`.
fn scores<B: Builder>(b: &mut B, spec: &AttentionSpec, q: &B::V, k: &B::V, products: DType, wide: DType) -> B::V {
    let (h, _) = spec.layout.heads_seq();
    let dot = DotGeneral { precision: spec.precision, ..DotGeneral::new(&[0, h], &[0, h], &[3], &[3]) };
    let (q, k) = (b.convert(q, products), b.convert(k, products));
    let s = b.op(Op::DotGeneral(dot), &[&q, &k]);
    b.convert(&s, wide)
}

/// `p v` as `[B, H, Tq, Dv]` in v's dtype (`p` already back in the operands' dtype), multiplied in `products`.
fn weighted_values<B: Builder>(b: &mut B, spec: &AttentionSpec, p: &B::V, v: &B::V, products: DType) -> B::V {
    let (h, t) = spec.layout.heads_seq();
    let dot = DotGeneral { precision: spec.precision, ..DotGeneral::new(&[0, 1], &[0, h], &[3], &[t]) };
    let dt = spec.v.dtype;
    let (p, v) = (b.convert(p, products), b.convert(v, products));
    let o = b.op(Op::DotGeneral(dot), &[&p, &v]);
    b.convert(&o, dt)
}

/// Scores with invisible keys set to -inf: key `j` is visible to query `i` if `j ≤ i` (causal) and
/// `i - j < window`.
fn masked<B: Builder>(b: &mut B, spec: &AttentionSpec, d: &Dims, scores: &B::V) -> B::V {
    if !spec.causal {
        return scores.clone();
    }
    let grid = TensorType::new(DType::I32, [d.batch, d.heads, d.seq_q, d.seq_kv]);
    let row = b.op(Op::Iota(Iota { dim: 2, ty: grid.clone() }), &[]);
    let col = b.op(Op::Iota(Iota { dim: 3, ty: grid }), &[]);
    let mut visible = b.compare(CompareDir::Le, &col, &row);
    if let Some(w) = spec.window {
        let behind = b.sub(&row, &col);
        let limit = b.full_like(&behind, w as f64);
        let near = b.compare(CompareDir::Lt, &behind, &limit);
        visible = b.op(Op::Binary(lazuli_hlo::Binary { kind: lazuli_hlo::BinaryKind::And }), &[&visible, &near]);
    }
    let hidden = b.full_like(scores, f64::NEG_INFINITY);
    b.select(&visible, scores, &hidden)
}
