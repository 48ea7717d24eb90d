//! Attention written with lazuli's ops: what the kernel computes, the fallback on every device, and the
//! reference the fused implementations are tested against. Products take the operands' dtype (so bf16 attention
//! multiplies in bf16, with f32 accumulation on GPUs), the softmax runs in f32, and the probabilities go back to
//! the operands' dtype for the second product, as flash attention does.

use lazuli_hlo::{Builder, CompareDir, DType, DotGeneral, Iota, Op, Softmax, TensorType};

use super::{AttentionSpec, Dims, Layout};

/// `(output, stats)` for operands `x` = q, k, v (, bias): the output in the spec's layout and the natural-log
/// log-sum-exp of each row of the scaled, masked scores, `f32[B, H, Tq]`.
pub(super) fn attention<B: Builder>(b: &mut B, spec: &AttentionSpec, d: &Dims, x: &[B::V]) -> (B::V, B::V) {
    let (q, k, v) = (&x[0], &x[1], &x[2]);
    let dt = spec.q.dtype;
    // The softmax runs in f32, or in f64 for f64 operands.
    let wide = DType::computing([dt]);
    let scores = scores(b, spec, q, k, wide); // [B, H, Tq, Tk]
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
    let o = weighted_values(b, spec, &p, v); // [B, H, Tq, Dv]
    let o = match spec.layout {
        Layout::Bhtd => o,
        Layout::Bthd => b.transpose(&o, &[0, 2, 1, 3]),
    };
    (o, stats)
}

/// `q kᵀ` per batch and head as `[B, H, Tq, Tk]` of dtype `wide`.
fn scores<B: Builder>(b: &mut B, spec: &AttentionSpec, q: &B::V, k: &B::V, wide: DType) -> B::V {
    let (h, _) = spec.layout.heads_seq();
    let dot = DotGeneral { precision: spec.precision, ..DotGeneral::new(&[0, h], &[0, h], &[3], &[3]) };
    let s = b.op(Op::DotGeneral(dot), &[q, k]);
    b.convert(&s, wide)
}

/// `p v` as `[B, H, Tq, Dv]`, `p` in the operands' dtype.
fn weighted_values<B: Builder>(b: &mut B, spec: &AttentionSpec, p: &B::V, v: &B::V) -> B::V {
    let (h, t) = spec.layout.heads_seq();
    let dot = DotGeneral { precision: spec.precision, ..DotGeneral::new(&[0, 1], &[0, h], &[3], &[t]) };
    b.op(Op::DotGeneral(dot), &[p, v])
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
