//! Fused attention for users: [`scaled_dot_product_attention`]. One op (`lazuli_kernels::attention`) whose
//! implementation is chosen when it is recorded, from the device the runtime runs on and `LAZULI_ATTENTION`:
//! cuDNN's flash attention on NVIDIA GPUs for bf16/f16, lazuli's Triton flash kernel for what cuDNN does not
//! take, and the composite (lazuli's own ops) everywhere else. Which one ran, and why, is in the program's event.
//!
//! When q, k and v are the three slots of one pending `[B, T, 3, H, D]` tensor (a fused projection reshaped and
//! narrowed, as GPT code writes it) and lazuli's Triton kernels apply, the op takes that tensor itself: the kernels
//! read the slots in place and write the gradient of the packed tensor, so neither the split nor the join is a
//! pass of its own. cuDNN, which needs q, k, v apart, is passed over for this (the event says so); forcing it
//! records the three slices as before.

use lazuli_hlo::{BinaryKind, Convert, DType, KernelOp, Loc, Op, Select};
use std::cell::Cell;
use std::rc::Rc;

use lazuli_kernels::attention::{attention, AttentionSpec};
use lazuli_kernels::Implementation;

pub use lazuli_kernels::attention::Layout as AttentionLayout;

use crate::error::{Error, Result};
use crate::graph::constants::constant_like;
use crate::graph::record::{apply, fail, raise, try_apply};
use crate::graph::tensor::{Node, Tensor};
use crate::runtime::runtime;

/// Options of [`scaled_dot_product_attention`]: no mask, scale `1/√D` and the `[B, H, T, D]` layout unless set.
#[derive(Clone, Default)]
pub struct AttentionOptions {
    causal: bool,
    scale: Option<f64>,
    window: Option<usize>,
    bias: Option<Tensor>,
    mask: Option<Tensor>,
    layout: AttentionLayout,
    dropout: f64,
    implementation: Option<Implementation>,
}

impl AttentionOptions {
    /// Every key visible to every query.
    pub fn new() -> AttentionOptions {
        AttentionOptions::default()
    }

    /// Key `j` visible to query `i` only if `j ≤ i` (top-left aligned, as PyTorch's `is_causal`).
    pub fn causal() -> AttentionOptions {
        AttentionOptions { causal: true, ..AttentionOptions::default() }
    }

    /// The softmax scale (default `1/√D`).
    pub fn scale(mut self, scale: f64) -> AttentionOptions {
        self.scale = Some(scale);
        self
    }

    /// With causal attention, each query sees at most its last `keys` keys (itself included).
    pub fn window(mut self, keys: usize) -> AttentionOptions {
        self.window = Some(keys);
        self
    }

    /// An additive bias broadcastable to `[B, H, Tq, Tk]` (size-1 dimensions broadcast), with a gradient.
    pub fn bias(mut self, bias: &Tensor) -> AttentionOptions {
        self.bias = Some(bias.clone());
        self
    }

    /// A boolean mask broadcastable to `[B, H, Tq, Tk]`: `true` where a key is visible.
    pub fn mask(mut self, mask: &Tensor) -> AttentionOptions {
        self.mask = Some(mask.clone());
        self
    }

    /// The order of the dimensions of q, k, v and the result.
    pub fn layout(mut self, layout: AttentionLayout) -> AttentionOptions {
        self.layout = layout;
        self
    }

    /// Force an implementation for this call (over [`with_attention`] and `LAZULI_ATTENTION`).
    pub fn implementation(mut self, implementation: Implementation) -> AttentionOptions {
        self.implementation = Some(implementation);
        self
    }

    /// Dropout on the attention weights. Only 0 is supported: apply `nn::Dropout` to the output instead.
    pub fn dropout(mut self, p: f64) -> AttentionOptions {
        self.dropout = p;
        self
    }
}

/// `softmax(scale · q kᵀ + bias, masked) v` per batch and head. With the default layout `q: [B, H, Tq, D]`,
/// `k: [B, H, Tk, D]`, `v: [B, H, Tk, Dv]` → `[B, H, Tq, Dv]`; with [`AttentionLayout::Bthd`] the sequence comes
/// before the heads in all four. On NVIDIA GPUs it runs as one fused kernel where one applies (cuDNN for
/// bf16/f16, lazuli's Triton kernel otherwise); elsewhere as lazuli's ops. `LAZULI_ATTENTION=auto|cudnn|triton|
/// composite` forces a choice. Panics at the caller's line when the shapes do not fit, or when a forced
/// implementation cannot apply; [`try_scaled_dot_product_attention`] returns those as errors.
#[track_caller]
pub fn scaled_dot_product_attention(q: &Tensor, k: &Tensor, v: &Tensor, opts: &AttentionOptions) -> Tensor {
    attention_at(q, k, v, opts, Loc::caller()).unwrap_or_else(|e| raise(e))
}

/// [`scaled_dot_product_attention`], with [`Error::ShapeMismatch`] when `q`, `k`, `v` (or the mask or bias) do
/// not fit, [`Error::Unsupported`] when a forced implementation cannot run here (cuDNN on the CPU, say).
#[track_caller]
pub fn try_scaled_dot_product_attention(q: &Tensor, k: &Tensor, v: &Tensor, opts: &AttentionOptions) -> Result<Tensor> {
    attention_at(q, k, v, opts, Loc::caller())
}

fn attention_at(q: &Tensor, k: &Tensor, v: &Tensor, opts: &AttentionOptions, loc: Loc) -> Result<Tensor> {
    const OP: &str = "attention";
    if opts.dropout != 0.0 {
        let why = "attention: dropout inside attention is not supported; apply nn::Dropout to its output".into();
        return Err(Error::InvalidArgument { op: OP, why, at: loc });
    }
    let mut spec = AttentionSpec {
        q: q.tensor_type().clone(),
        k: k.tensor_type().clone(),
        v: v.tensor_type().clone(),
        bias: None,
        causal: opts.causal,
        window: opts.window,
        scale_bits: opts.scale.map(f64::to_bits),
        layout: opts.layout,
        precision: crate::graph::precision::precision_at(loc),
        packed: false,
    };
    let shapes = || [q, k, v].iter().map(|t| t.dims().to_vec()).collect();
    let d = spec.dims().map_err(|why| Error::ShapeMismatch { op: OP, shapes: shapes(), why, at: loc })?;
    let bias = combined_bias(opts, &[d.batch, d.heads, d.seq_q, d.seq_kv], loc);
    spec.bias = bias.as_ref().map(|b| b.tensor_type().clone());
    let rt = runtime().map_err(|e| Error::Config(format!("attention recorded at {loc}: {e}")))?;
    let (want, by) = match (opts.implementation, SCOPED.get()) {
        (Some(i), _) => (i, "AttentionOptions::implementation"),
        (None, Some(i)) => (i, "with_attention"),
        (None, None) => (rt.config.attention, "LAZULI_ATTENTION"),
    };
    let def = attention(&spec, &rt.target, want).map_err(|e| {
        let why = format!("{e} (asked for by {by})");
        match want {
            // The shapes fit (checked above): a forced kernel that cannot run on this device.
            Implementation::Cudnn | Implementation::Triton => {
                Error::Unsupported { op: OP, backend: rt.target.to_string(), why, at: loc }
            }
            Implementation::Auto | Implementation::Composite => {
                Error::ShapeMismatch { op: OP, shapes: shapes(), why, at: loc }
            }
        }
    })?;
    if bias.is_none() {
        if let Some(packed) = packed_kernel(&spec, [q, k, v], (&rt.target, want), loc) {
            return packed;
        }
    }
    let mut operands = vec![q, k, v];
    operands.extend(bias.as_ref());
    try_apply(Op::Kernel(KernelOp::new(def, 0)), &operands, loc)
}

/// The attention op on the packed tensor `q`, `k` and `v` are slots of, where there is one and lazuli's Triton
/// kernels take it; `None` to record the op on the three as they are.
fn packed_kernel(
    spec: &AttentionSpec,
    qkv: [&Tensor; 3],
    (target, want): (&lazuli_kernels::Target, Implementation),
    loc: Loc,
) -> Option<Result<Tensor>> {
    let forced_elsewhere = matches!(want, Implementation::Cudnn | Implementation::Composite);
    // Without a GPU nothing is packed: no look at the graph, no kernel lookup on the recording path.
    if spec.layout != AttentionLayout::Bthd || forced_elsewhere || target.no_gpu_kernels().is_some() {
        return None;
    }
    let source = packed_source(qkv)?;
    let packed = AttentionSpec { packed: true, ..spec.clone() };
    let def = attention(&packed, target, want).ok()?;
    (def.choice.implementation == "triton").then(|| try_apply(Op::Kernel(KernelOp::new(def, 0)), &[&source], loc))
}

/// The tensor `[B, T, 3, H, D]` whose slots 0, 1, 2 along its third axis `q`, `k` and `v` are (each a pending
/// slice of it reshaped to `[B, T, H, D]`, neither a gradient leaf: `Node::looked_through`), or `None`.
fn packed_source(qkv: [&Tensor; 3]) -> Option<Tensor> {
    let mut source: Option<Rc<Node>> = None;
    for (slot, t) in qkv.into_iter().enumerate() {
        let sliced = t.node.looked_through(|op| matches!(op, Op::Reshape(_)))?;
        let from = sliced.looked_through(|op| match op {
            Op::Slice(s) => {
                let want = lazuli_hlo::Slice::along(&s.limit, 2, slot, slot + 1, 1);
                s.start == want.start && s.limit == want.limit && s.stride == want.stride
            }
            _ => false,
        })?;
        let d = t.dims();
        if from.ty.dims[..] != [d[0], d[1], 3, d[2], d[3]] {
            return None;
        }
        match &source {
            Some(s) if !Rc::ptr_eq(s, &from) => return None,
            Some(_) => {}
            None => source = Some(from),
        }
    }
    source.map(Tensor::from_node)
}

thread_local! {
    static SCOPED: Cell<Option<Implementation>> = const { Cell::new(None) };
}

/// Run `f` with attention recorded by `implementation` on this thread (over `LAZULI_ATTENTION`; a call's own
/// [`AttentionOptions::implementation`] still wins): to compare a model with and without fused kernels.
pub fn with_attention<R>(implementation: Implementation, f: impl FnOnce() -> R) -> R {
    struct Restore(Option<Implementation>);
    impl Drop for Restore {
        fn drop(&mut self) {
            SCOPED.set(self.0);
        }
    }
    let _restore = Restore(SCOPED.replace(Some(implementation)));
    f()
}

/// The bias and the mask as one additive bias (the mask as 0 where visible and -inf where hidden, in f32), or
/// `None`; both are broadcast to `full` (`[B, H, Tq, Tk]`) only when there are two to add.
fn combined_bias(opts: &AttentionOptions, full: &[usize], loc: Loc) -> Option<Tensor> {
    let masked = opts.mask.as_ref().map(|m| {
        if m.dtype() != DType::Bool {
            fail(loc, format!("attention: the mask must be bool (true where visible), got {}", m.tensor_type()));
        }
        let visible = constant_like(0.0, DType::F32, m.dims(), loc);
        let hidden = constant_like(f64::NEG_INFINITY, DType::F32, m.dims(), loc);
        apply(Op::Select(Select), &[m, &visible, &hidden], loc)
    });
    let fits = |t: &Tensor| t.rank() == 4 && t.dims().iter().zip(full).all(|(&a, &f)| a == f || a == 1);
    for t in opts.bias.iter().chain(&masked) {
        if !fits(t) {
            fail(loc, format!("attention: a bias or mask must broadcast to {full:?}, got {}", t.tensor_type()));
        }
    }
    match (&opts.bias, masked) {
        (Some(b), Some(m)) => {
            let b = apply(Op::Convert(Convert { from: b.dtype(), to: DType::F32 }), &[b], loc).broadcast_at(full, loc);
            Some(b.binary_at(m.broadcast_at(full, loc), BinaryKind::Add, loc))
        }
        (Some(b), None) => Some(b.clone()),
        (None, m) => m,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOPPER: lazuli_kernels::Target = lazuli_kernels::Target::Cuda { compute_capability: Some((9, 0)) };

    fn slots(qkv: &Tensor, order: [usize; 3]) -> [Tensor; 3] {
        order.map(|i| qkv.narrow(2, i, 1).reshape(&[2, 8, 2, 16]))
    }

    fn spec(q: &Tensor) -> AttentionSpec {
        let ty = q.tensor_type().clone();
        AttentionSpec { causal: true, layout: AttentionLayout::Bthd, ..AttentionSpec::new(ty.clone(), ty.clone(), ty) }
    }

    /// The op takes the packed tensor only when q, k, v are its slots 0, 1, 2 and Triton runs it.
    #[test]
    fn slots_of_one_packed_tensor_are_given_to_the_kernel_whole() {
        let qkv = Tensor::from_slice(&vec![0.5f32; 2 * 8 * 3 * 2 * 16], &[2, 8, 3, 2, 16]).to_dtype(DType::BF16);
        let [q, k, v] = slots(&qkv, [0, 1, 2]);
        let at = Loc::caller();
        let y = packed_kernel(&spec(&q), [&q, &k, &v], (&HOPPER, Implementation::Auto), at).expect("packed");
        let y = y.expect("recorded");
        {
            let state = y.node.lock();
            let recipe = state.recipe.as_ref().expect("pending");
            assert_eq!(recipe.operands.len(), 1);
            assert!(Rc::ptr_eq(&recipe.operands[0], &qkv.node), "the op reads the packed tensor itself");
        }
        assert_eq!(y.dims(), &[2, 8, 2, 16]);
        let [q2, k2, v2] = slots(&qkv, [1, 0, 2]);
        assert!(packed_kernel(&spec(&q), [&q2, &k2, &v2], (&HOPPER, Implementation::Auto), at).is_none(), "order");
        let other = Tensor::from_slice(&vec![0.25f32; 2 * 8 * 3 * 2 * 16], &[2, 8, 3, 2, 16]).to_dtype(DType::BF16);
        let [_, k3, _] = slots(&other, [0, 1, 2]);
        assert!(packed_kernel(&spec(&q), [&q, &k3, &v], (&HOPPER, Implementation::Auto), at).is_none(), "two tensors");
        for (target, want) in [(&HOPPER, Implementation::Cudnn), (&lazuli_kernels::Target::Cpu, Implementation::Auto)] {
            assert!(packed_kernel(&spec(&q), [&q, &k, &v], (target, want), at).is_none(), "{target} {want}");
        }
        // A slot that is a gradient leaf of its own keeps the three apart, so that its gradient is its own.
        let [q4, k4, v4] = slots(&qkv, [0, 1, 2]);
        let q4 = q4.requires_grad();
        assert!(packed_kernel(&spec(&q), [&q4, &k4, &v4], (&HOPPER, Implementation::Auto), at).is_none(), "leaf");
    }
}
