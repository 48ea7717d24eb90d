//! Scaled dot-product attention: `softmax(scale · q kᵀ + bias, masked) v`, one kernel with three
//! implementations. On NVIDIA GPUs (compute capability 8.0+): cuDNN's flash attention for bf16/f16 (`cudnn.rs`),
//! lazuli's Triton flash kernel for what cuDNN does not take (f32, sliding windows, …; `triton.rs`); everywhere
//! else, and for what neither takes (an additive bias), the composite (`composite.rs`), which is also the
//! reference the others are tested against.
//!
//! Shapes: `q: [B, H, Tq, D]`, `k: [B, H, Tk, D]`, `v: [B, H, Tk, Dv]` → `[B, H, Tq, Dv]` in [`Layout::Bhtd`]
//! (PyTorch's order), or with the sequence before the heads in [`Layout::Bthd`] (`[B, T, H, D]`: a transformer's
//! projection reshaped, with no transposes). In that layout q, k and v may also come as one packed operand
//! `[B, T, 3, H, D]` (a fused q, k, v projection reshaped, [`AttentionSpec::packed`]): lazuli's Triton kernels read
//! them in place and write their gradients as one tensor of that shape, so that neither the split nor the join of
//! the projection is a pass over memory of its own. The kernel has two results: the output and the softmax
//! statistics (`f32[B, H, Tq]`, the log-sum-exp of each row), which only the backward reads.

mod composite;
mod cudnn;
mod triton;

use std::sync::{Arc, Mutex};

use lazuli_hlo::{Builder, Choice, DType, Gradient, KernelDef, KernelOp, Op, OpRules, Precision, Program, TensorType};

use crate::choice::{made_once, Made};
use crate::{Implementation, Target};

/// The order of the dimensions of `q`, `k`, `v` and the output.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Layout {
    /// `[batch, heads, seq, head_dim]` (PyTorch's `scaled_dot_product_attention`).
    #[default]
    Bhtd,
    /// `[batch, seq, heads, head_dim]` (JAX's `dot_product_attention`; a projection reshaped, untransposed).
    Bthd,
}

impl Layout {
    /// The axes of (heads, seq) in a tensor of this layout.
    pub fn heads_seq(self) -> (usize, usize) {
        match self {
            Layout::Bhtd => (1, 2),
            Layout::Bthd => (2, 1),
        }
    }
}

/// One attention call's signature: everything its kernel depends on.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct AttentionSpec {
    pub q: TensorType,
    pub k: TensorType,
    pub v: TensorType,
    /// An additive bias broadcastable to `[B, H, Tq, Tk]` (size-1 dimensions broadcast), any float type.
    pub bias: Option<TensorType>,
    /// Key `j` is visible to query `i` only if `j ≤ i` (top-left aligned, as PyTorch's `is_causal`).
    pub causal: bool,
    /// With `causal`: also only if `i - j < window` (a sliding window of `window` keys ending at the query).
    pub window: Option<usize>,
    /// The softmax scale's bits (`f64::to_bits`); `None` is `1/√D`.
    pub scale_bits: Option<u64>,
    pub layout: Layout,
    /// The precision of f32 products (TF32 on NVIDIA GPUs by default, as for any product).
    pub precision: Precision,
    /// `q`, `k` and `v` (the types above) are slots 0, 1 and 2 of one operand `[B, T, 3, H, D]`; needs
    /// [`Layout::Bthd`] and one type for the three.
    pub packed: bool,
}

/// The sizes of an attention call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dims {
    pub batch: usize,
    pub heads: usize,
    pub seq_q: usize,
    pub seq_kv: usize,
    pub head_dim: usize,
    pub value_dim: usize,
}

impl AttentionSpec {
    /// The attention spec of `q`, `k`, `v` with everything else at its default (no mask, `1/√D`, `Bhtd`).
    pub fn new(q: TensorType, k: TensorType, v: TensorType) -> AttentionSpec {
        AttentionSpec {
            q,
            k,
            v,
            bias: None,
            causal: false,
            window: None,
            scale_bits: None,
            layout: Layout::Bhtd,
            precision: Precision::Default,
            packed: false,
        }
    }

    /// The shape and dtype rule: sizes of a well-formed call, or what does not fit.
    pub fn dims(&self) -> Result<Dims, String> {
        let (q, k, v) = (&self.q, &self.k, &self.v);
        if !q.dtype.is_float() || k.dtype != q.dtype || v.dtype != q.dtype {
            return Err(format!("attention: q, k and v must share one float dtype, got {q}, {k}, {v}"));
        }
        if q.rank() != 4 || k.rank() != 4 || v.rank() != 4 {
            let order = match self.layout {
                Layout::Bhtd => "[batch, heads, seq, head_dim]",
                Layout::Bthd => "[batch, seq, heads, head_dim]",
            };
            return Err(format!("attention: q, k and v must be {order}, got {q}, {k}, {v}"));
        }
        let (h, t) = self.layout.heads_seq();
        let d = Dims {
            batch: q.dims[0],
            heads: q.dims[h],
            seq_q: q.dims[t],
            seq_kv: k.dims[t],
            head_dim: q.dims[3],
            value_dim: v.dims[3],
        };
        if k.dims[0] != d.batch || v.dims[0] != d.batch || k.dims[h] != d.heads || v.dims[h] != d.heads {
            return Err(format!("attention: q, k and v must have the same batch and heads, got {q}, {k}, {v}"));
        }
        if k.dims[3] != d.head_dim {
            return Err(format!("attention: q and k must have the same head dim, got {q} and {k}"));
        }
        if v.dims[t] != d.seq_kv {
            return Err(format!("attention: k and v must have the same sequence length, got {k} and {v}"));
        }
        // No queries (or no batch, no heads) is an empty result; queries without keys have nothing to attend to.
        if d.batch * d.heads * d.seq_q > 0 && d.seq_kv * d.head_dim == 0 {
            return Err(format!("attention: queries without keys or head dims to attend with: {q}, {k}, {v}"));
        }
        if let Some(b) = &self.bias {
            let full = [d.batch, d.heads, d.seq_q, d.seq_kv];
            let fits = b.rank() == 4 && b.dims.iter().zip(full).all(|(&x, f)| x == f || x == 1);
            if !fits || !b.dtype.is_float() {
                return Err(format!("attention: the bias must be a float tensor broadcastable to {full:?}, got {b}"));
            }
        }
        if self.packed && (self.layout != Layout::Bthd || k != q || v != q) {
            return Err(format!(
                "attention: packed q, k and v must be three [batch, seq, heads, head_dim] slots of one type and shape, \
                 got {q}, {k}, {v}"
            ));
        }
        match self.window {
            Some(0) => return Err("attention: a window of 0 keys sees nothing".into()),
            Some(_) if !self.causal => return Err("attention: a sliding window needs causal attention".into()),
            _ => {}
        }
        Ok(d)
    }

    pub fn scale(&self) -> f64 {
        self.scale_bits.map(f64::from_bits).unwrap_or_else(|| 1.0 / (self.q.dims[3] as f64).sqrt())
    }

    /// `[B, H, Tq, Dv]` in this spec's layout.
    fn output(&self, d: &Dims) -> TensorType {
        let dims = match self.layout {
            Layout::Bhtd => [d.batch, d.heads, d.seq_q, d.value_dim],
            Layout::Bthd => [d.batch, d.seq_q, d.heads, d.value_dim],
        };
        TensorType::new(self.q.dtype, dims)
    }

    /// The softmax statistics' type, `f32[B, H, Tq]`.
    fn stats(d: &Dims) -> TensorType {
        TensorType::new(DType::F32, [d.batch, d.heads, d.seq_q])
    }

    /// The operands' types in the kernel's order: q, k, v (or the packed qkv), then the bias if any.
    fn operands(&self) -> Vec<TensorType> {
        let mut ops = self.qkv_operands();
        ops.extend(self.bias.clone());
        ops
    }

    /// q, k and v's operands: the three, or the one packed `[B, T, 3, H, D]`.
    fn qkv_operands(&self) -> Vec<TensorType> {
        if self.packed {
            let d = &self.q.dims;
            vec![TensorType::new(self.q.dtype, [d[0], d[1], 3, d[2], d[3]])]
        } else {
            vec![self.q.clone(), self.k.clone(), self.v.clone()]
        }
    }

    /// The operands `x` with a packed qkv split into q, k and v (slices of the one operand).
    fn unpacked<B: Builder>(&self, b: &mut B, x: &[B::V]) -> Vec<B::V> {
        if !self.packed {
            return x.to_vec();
        }
        let dims = self.qkv_operands().remove(0).dims;
        let mut parts: Vec<B::V> = (0..3)
            .map(|i| {
                let slot = b.op(Op::Slice(lazuli_hlo::Slice::along(&dims, 2, i, i + 1, 1)), &[&x[0]]);
                b.reshape(&slot, &self.q.dims)
            })
            .collect();
        parts.extend(x[1..].iter().cloned());
        parts
    }

    /// A short description for the choice's reason: `bf16, head dim 64, causal`.
    fn describe(&self, d: &Dims) -> String {
        let mut s = format!("{}, head dim {}", self.q.dtype, d.head_dim);
        if self.causal {
            s.push_str(", causal");
        }
        if let Some(w) = self.window {
            s.push_str(&format!(", window {w}"));
        }
        if self.packed {
            s.push_str(", q, k, v packed");
        }
        s
    }
}

/// A device implementation: the forward program (q, k, v → output, stats) and the backward program
/// (q, k, v, output, cotangent, stats → dq, dk, dv), each around custom calls.
struct Device {
    forward: Program,
    backward: Program,
}

/// The attention kernel for `spec` on `target`, with the implementation `want` asks for. Kernels are made once
/// per (spec, target, setting) and shared. `Err` says why the spec is ill-formed, or why a forced
/// implementation does not apply.
pub fn attention(spec: &AttentionSpec, target: &Target, want: Implementation) -> Result<Arc<KernelDef>, String> {
    static MADE: Made<(AttentionSpec, Target, Implementation)> = Mutex::new(None);
    made_once(&MADE, (spec.clone(), target.clone(), want), || make(spec, target, want))
}

fn make(spec: &AttentionSpec, target: &Target, want: Implementation) -> Result<Arc<KernelDef>, String> {
    let d = spec.dims()?;
    let (device, choice) = choose(spec, &d, target, want)?;
    let operands = spec.operands();
    let results = vec![spec.output(&d), AttentionSpec::stats(&d)];
    let composite = Program::record(&operands, |b, x| {
        let x = spec.unpacked(b, x);
        let (o, stats) = composite::attention(b, spec, &d, composite::product_dtype(spec.q.dtype, target), &x);
        vec![Some(o), Some(stats)]
    })?;
    let (device, gradient) = match device {
        Some(Device { forward, backward }) => {
            let composite_def = attention(spec, target, Implementation::Composite)?;
            let backward = backward_kernel(spec, &d, backward, &composite_def, choice.clone())?;
            (Some(forward), Gradient::Program(gradient(spec, &d, &backward)?))
        }
        None => (None, Gradient::Composite),
    };
    KernelDef::new("attention", operands, results, device, composite, vec![gradient, Gradient::None], choice)
}

/// The backward as a kernel of its own: operands (q, k, v, output, cotangent, stats), results (dq, dk, dv) (or
/// qkv and dqkv, packed); its device program the fused backward, its composite the composite forward's gradient.
fn backward_kernel(
    spec: &AttentionSpec,
    d: &Dims,
    device: Program,
    composite_def: &Arc<KernelDef>,
    choice: Choice,
) -> Result<Arc<KernelDef>, String> {
    let out = spec.output(d);
    let results = spec.qkv_operands();
    let n = results.len();
    let mut operands = results.clone();
    operands.extend([out.clone(), out, AttentionSpec::stats(d)]);
    let composite =
        Program::record(&operands, |b, x| KernelOp::new(composite_def.clone(), 0).vjp(b, &x[..n], &x[n], &x[n + 1]))?;
    let gradients = vec![Gradient::Composite; n];
    KernelDef::new("attention_grad", operands, results, Some(device), composite, gradients, choice)
}

/// The forward output's gradient: the backward kernel on the operands, the output, its cotangent and the
/// forward's statistics (its second result).
fn gradient(spec: &AttentionSpec, d: &Dims, backward: &Arc<KernelDef>) -> Result<Program, String> {
    let out = spec.output(d);
    let mut inputs = spec.qkv_operands();
    let n = inputs.len();
    inputs.extend([out.clone(), out]);
    Program::record(&inputs, |b, x| {
        let stats = b.sibling(1, AttentionSpec::stats(d));
        let mut args: Vec<&_> = x.iter().collect();
        args.push(&stats);
        (0..n).map(|i| Some(b.op(Op::Kernel(KernelOp::new(backward.clone(), i)), &args))).collect()
    })
}

/// Pick the implementation: the one `want` forces (or an error saying why it does not apply), or for `Auto` the
/// faster of cuDNN and Triton where both apply ([`triton_before_cudnn`]), then the one that applies, then the
/// composite, with the reasons the others were passed over.
fn choose(
    spec: &AttentionSpec,
    d: &Dims,
    target: &Target,
    want: Implementation,
) -> Result<(Option<Device>, Choice), String> {
    let what = spec.describe(d);
    // An empty result is the composite's: a kernel has nothing to launch.
    let empty = || (d.batch * d.heads * d.seq_q == 0).then(|| "an empty result".to_string());
    let cudnn_no = || target.no_gpu_kernels().or_else(empty).or_else(|| cudnn::unsupported(spec, d, target));
    let triton_no = || target.no_gpu_kernels().or_else(empty).or_else(|| triton::unsupported(spec, d));
    let chose = |implementation: &'static str, reason: String| Choice { implementation, reason };
    match want {
        Implementation::Composite => Ok((None, chose("composite", "asked for".into()))),
        Implementation::Cudnn => match cudnn_no() {
            Some(why) => Err(format!("attention: cuDNN was asked for but {why}")),
            None => Ok((Some(cudnn::device(spec, d)?), chose("cudnn", what))),
        },
        Implementation::Triton => match triton_no() {
            Some(why) => Err(format!("attention: Triton was asked for but {why}")),
            None => Ok((Some(triton::device(spec, d)?), chose("triton", what))),
        },
        Implementation::Auto => {
            let Some(not_cudnn) = cudnn_no() else {
                if let (Some(faster), None) = (triton_before_cudnn(spec, d, target), triton_no()) {
                    return Ok((Some(triton::device(spec, d)?), chose("triton", format!("{what}; {faster}"))));
                }
                return Ok((Some(cudnn::device(spec, d)?), chose("cudnn", what)));
            };
            let Some(not_triton) = triton_no() else {
                return Ok((
                    Some(triton::device(spec, d)?),
                    chose("triton", format!("{what}; not cuDNN: {not_cudnn}")),
                ));
            };
            let reason = if not_cudnn == not_triton {
                format!("{what}; {not_cudnn}")
            } else {
                format!("{what}; not cuDNN: {not_cudnn}; not Triton: {not_triton}")
            };
            Ok((None, chose("composite", reason)))
        }
    }
}

/// Where lazuli's Triton kernels were measured faster than cuDNN's on q, k and v apart, why (`None`: cuDNN first).
/// On an H200 (bf16, forward and backward, `lazuli-bench attention --shapes … --masks causal,none`,
/// `docs/perf-log/2026-12-05-attention-by-shape-and-mask.md`) Triton was clearly faster for causal attention with
/// head dim 64 and 512 or 1,024 keys; cuDNN was as fast or faster at 4,096 keys, without a mask, and at head dims
/// 96 and 128. Other GPUs were not measured.
fn triton_before_cudnn(spec: &AttentionSpec, d: &Dims, target: &Target) -> Option<String> {
    let hopper = target.compute_capability().is_some_and(|(major, _)| major == 9);
    let measured_faster = spec.causal && d.head_dim <= 64 && d.seq_kv <= 1024;
    (hopper && measured_faster).then(|| {
        "Triton before cuDNN: measured faster on Hopper for causal attention with head dim up to 64 and up to \
         1,024 keys"
            .to_string()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::{ArrayD, Axis, IxDyn};

    /// The packed kernel's composite is the plain one on the three slots (to f32 rounding).
    #[test]
    fn a_packed_call_computes_what_the_three_slots_give() {
        let (b, t, h, d) = (2, 5, 2, 8);
        let ty = TensorType::new(DType::F32, [b, t, h, d]);
        let plain =
            AttentionSpec { causal: true, layout: Layout::Bthd, ..AttentionSpec::new(ty.clone(), ty.clone(), ty) };
        let packed = AttentionSpec { packed: true, ..plain.clone() };
        let qkv = ArrayD::from_shape_fn(IxDyn(&[b, t, 3, h, d]), |i| {
            ((i[0] * 97 + i[1] * 31 + i[2] * 7 + i[3] * 3 + i[4]) as f64 * 0.37).sin()
        });
        let slot = |i: usize| qkv.index_axis(Axis(2), i).to_owned();
        let (q, k, v) = (slot(0), slot(1), slot(2));
        let plain_def = attention(&plain, &Target::Cpu, Implementation::Auto).expect("plain");
        let packed_def = attention(&packed, &Target::Cpu, Implementation::Auto).expect("packed");
        let want = plain_def.composite.evaluate(&[&q, &k, &v]);
        let got = packed_def.composite.evaluate(&[&qkv]);
        for r in 0..2 {
            let (w, g) = (want[r].as_ref().expect("result"), got[r].as_ref().expect("result"));
            let diff = w.iter().zip(g).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
            assert!(w.shape() == g.shape() && diff < 1e-6, "result {r}: {:?} {:?} {diff}", w.shape(), g.shape());
        }
    }
}
