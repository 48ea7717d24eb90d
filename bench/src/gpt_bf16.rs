//! `nn::Gpt`'s forward pass with bf16 matmuls: every matmul's operands are converted to bf16 and its result
//! back to f32 (layer norms and the MLP's bias + GELU compute in f32 and write their results in bf16, the next
//! matmul's operand type; fused attention's q, k and v stay bf16, their bias added in bf16); weights, softmax,
//! residuals and the optimizer stay f32. Same layout and order of operations as `lazuli::nn::gpt` (and as the
//! Python worker's model), so only the matmul precision differs.
//! Attention is written out ([`attention`]) or one fused op on bf16 q, k, v ([`attention_fused`]). The blocks run
//! unrolled, each recomputed in the backward pass (`GptConfig::checkpoint_blocks`), or as one scanned body over
//! stacked weights (`GptConfig::scan_blocks`; with `checkpoint_blocks` too, the scan recomputes each block).
//! Each residual add is recorded with the layer norm that reads its sum as one op (`LayerNorm::forward_added_as`,
//! one kernel on a GPU): across blocks when they run unrolled, inside each block otherwise.

use std::cell::Cell;

use lazuli::nn::scanned::ScannedBlocks;
use lazuli::nn::{Block, CausalSelfAttention, Gpt, LayerNorm, Linear, Param};
use lazuli::{DType, Tensor};

use crate::workloads::Attention;
use crate::BenchResult;

thread_local! {
    /// Whether matmuls read the optimizer's bf16 copies of the weights (`Param::get_as`): on for unrolled blocks
    /// unless `LAZULI_BENCH_WEIGHT_COPIES=0`; off inside a scanned body, whose stacked weights enter the scan as
    /// their copies (`ScannedBlocks::weights`) under the same setting.
    static COPIES: Cell<bool> = const { Cell::new(false) };
}

fn copies_wanted() -> bool {
    std::env::var("LAZULI_BENCH_WEIGHT_COPIES").map_or(true, |v| v != "0")
}

/// A weight as a matmul reads it: its bf16 copy, or the f32 value (converted by the matmul).
fn weight(p: &Param) -> Tensor {
    if COPIES.get() {
        p.get_as(DType::BF16)
    } else {
        p.get()
    }
}

/// `a @ b` on bf16 operands, result in f32.
fn mm(a: &Tensor, b: &Tensor) -> Tensor {
    mm_bf16(a, b).to_dtype(DType::F32)
}

/// `a @ b` on bf16 operands, result in bf16 (the product's own type).
fn mm_bf16(a: &Tensor, b: &Tensor) -> Tensor {
    a.to_dtype(DType::BF16).matmul(&b.to_dtype(DType::BF16))
}

/// The MLP's first layer and GELU: the bf16 product, then its bias and GELU in f32 as one op (one kernel on a GPU;
/// with `LAZULI_BIAS_GELU=composite`, the f32 conversion, the add and GELU, as `linear(..).gelu()` records them),
/// rounded to bf16 for the next matmul.
fn linear_gelu(l: &Linear, x: &Tensor) -> Tensor {
    let y = mm_bf16(x, &weight(&l.weight));
    match &l.bias {
        Some(b) => y.bias_gelu(&b.get(), DType::BF16),
        None => y.to_dtype(DType::F32).gelu(),
    }
}

fn linear(l: &Linear, x: &Tensor) -> Tensor {
    joined(linear_parts(l, x))
}

/// A linear layer as its bf16 product and its bias, for an op that adds them itself (`forward_added_as`).
fn linear_parts(l: &Linear, x: &Tensor) -> (Tensor, Option<Tensor>) {
    (mm_bf16(x, &weight(&l.weight)), l.bias.as_ref().map(Param::get))
}

/// A linear layer whose result a bf16 consumer reads (fused attention's q, k, v): the bias added to the bf16
/// product in bf16, as `Linear::forward_in_product_dtype` does (on a GPU, in the GEMM's own epilogue).
fn linear_in_bf16(l: &Linear, x: &Tensor) -> Tensor {
    match linear_parts(l, x) {
        (y, Some(b)) => y + b.to_dtype(DType::BF16),
        (y, None) => y,
    }
}

/// The product widened to f32 and its bias added: the linear layer's result.
fn joined((product, bias): (Tensor, Option<Tensor>)) -> Tensor {
    let y = product.to_dtype(DType::F32);
    match bias {
        Some(b) => y + b,
        None => y,
    }
}

/// The normalization with its result in bf16, the matmul's operand type: one kernel on a GPU (with
/// `LAZULI_LAYER_NORM=composite`, the f32 formula and a conversion, as the matmul would convert it).
fn layer_norm(ln: &LayerNorm, x: &Tensor) -> Tensor {
    ln.forward_as(x, DType::BF16)
}

/// The heads' output `[B, T, D]`, before the output projection.
fn attention(a: &CausalSelfAttention, x: &Tensor) -> Tensor {
    let (b, t, d) = (x.dims()[0] as isize, x.dims()[1] as isize, x.dims()[2] as isize);
    let h = a.n_head as isize;
    let hd = d / h;
    let qkv = linear(&a.qkv, x).reshape(&[b, t, 3, h, hd]).permute(&[2, 0, 3, 1, 4]);
    let part = |i: usize| qkv.narrow(0, i, 1).reshape(&[b, h, t, hd]);
    let (q, k, v) = (part(0), part(1), part(2));
    let scores = mm(&q, &k.t()) * (1.0 / (hd as f64).sqrt());
    let scores = Tensor::tril_mask(t as usize, 0).select(&scores, f64::NEG_INFINITY);
    let y = mm(&scores.softmax(-1), &v);
    y.permute(&[0, 2, 1, 3]).reshape(&[b, t, d])
}

/// [`attention`] as one fused op (on a GPU, lazuli's Triton flash kernels reading q, k, v in place from the
/// projection; cuDNN's with `LAZULI_ATTENTION=cudnn`): q, k, v in bf16 with their bias added in bf16, [B, T, H, hd]
/// as the projection lays them out (no transposes), the heads' output back to f32.
fn attention_fused(a: &CausalSelfAttention, x: &Tensor) -> Tensor {
    let (b, t, d) = (x.dims()[0] as isize, x.dims()[1] as isize, x.dims()[2] as isize);
    let h = a.n_head as isize;
    let hd = d / h;
    let qkv = linear_in_bf16(&a.qkv, x).reshape(&[b, t, 3, h, hd]);
    let part = |i: usize| qkv.narrow(2, i, 1).reshape(&[b, t, h, hd]);
    let (q, k, v) = (part(0), part(1), part(2));
    let y = lazuli::scaled_dot_product_attention(
        &q,
        &k,
        &v,
        &lazuli::AttentionOptions::causal().layout(lazuli::AttentionLayout::Bthd),
    );
    y.to_dtype(DType::F32).reshape(&[b, t, d])
}

/// An op applied to one block's MLP branch before it joins the residual stream: `(block, op)`. The planted-NaN
/// benchmark (`nan_gpt`) puts an op there that goes non-finite at a step of its choosing.
pub type Plant<'a> = (usize, &'a dyn Fn(&Tensor) -> Tensor);

fn block(blk: &Block, x: &Tensor, attn: Attention, plant: Option<&dyn Fn(&Tensor) -> Tensor>) -> Tensor {
    let (x, m) = block_branches(blk, x, &layer_norm(&blk.ln1, x), attn, plant);
    x + joined(m)
}

/// Whether each residual add runs with the layer norm after it as one op (`LayerNorm::forward_added_as`): on
/// unless `LAZULI_BENCH_FUSED_ADDS=0`.
fn fused_adds() -> bool {
    std::env::var("LAZULI_BENCH_FUSED_ADDS").map_or(true, |v| v != "0")
}

/// A block from its input `x` and `h = ln1(x)`: the residual after attention, and the MLP's branch as its output
/// projection's product and bias (or, with a planted op, the branch with the op applied), for the caller to add,
/// with the next layer norm when it fuses the two.
fn block_branches(
    blk: &Block,
    x: &Tensor,
    h: &Tensor,
    attn: Attention,
    plant: Option<&dyn Fn(&Tensor) -> Tensor>,
) -> (Tensor, (Tensor, Option<Tensor>)) {
    let heads = match attn {
        Attention::Written => attention(&blk.attn, h),
        Attention::Fused => attention_fused(&blk.attn, h),
    };
    let (product, bias) = linear_parts(&blk.attn.proj, &heads);
    let (x, h) = if fused_adds() {
        blk.ln2.forward_added_as(x, &product, bias.as_ref(), DType::BF16)
    } else {
        let x = x + joined((product, bias));
        let h = layer_norm(&blk.ln2, &x);
        (x, h)
    };
    let m = linear_parts(&blk.fc_proj, &linear_gelu(&blk.fc, &h));
    match plant {
        Some(op) => (x, (op(&joined(m)), None)),
        None => (x, m),
    }
}

/// Unrolled blocks whose every residual add is one op with the layer norm after it (the next block's `ln1`, or
/// `ln_f` after the last): the final layer norm's result.
fn blocks_with_fused_adds(g: &Gpt, x: Tensor, attn: Attention, plant: Option<Plant>) -> Tensor {
    let (mut x, mut h) = match g.blocks.first() {
        Some(first) => (x.clone(), layer_norm(&first.ln1, &x)),
        None => return layer_norm(&g.ln_f, &x),
    };
    for (i, blk) in g.blocks.iter().enumerate() {
        let op = plant.filter(|&(at, _)| at == i).map(|(_, op)| op);
        let (residual, (product, bias)) = block_branches(blk, &x, &h, attn, op);
        let next = g.blocks.get(i + 1).map_or(&g.ln_f, |b| &b.ln1);
        (x, h) = next.forward_added_as(&residual, &product, bias.as_ref(), DType::BF16);
    }
    h
}

/// [`blocks_with_fused_adds`] as one scanned body: the carry is the residual stream and its normalization for the
/// next block, and each step also reads the layer norm after it (the next block's `ln1`, `ln_f` after the last)
/// from the `ln1` parameters shifted by one block.
fn scanned_with_fused_adds(g: &Gpt, s: &ScannedBlocks, x: Tensor, attn: Attention) -> Tensor {
    let Some(first) = s.stacked.first().map(|(_, p)| p.get().narrow(0, 0, 1).reshape(&[-1])) else {
        return layer_norm(&g.ln_f, &x);
    };
    let first_bias = s.stacked[1].1.get().narrow(0, 0, 1).reshape(&[-1]);
    let ln1 = LayerNorm { weight: Param::new(first), bias: Param::new(first_bias), eps: g.ln_f.eps };
    let h = layer_norm(&ln1, &x);
    let n = s.len();
    let shifted = |k: usize, last: &Param| {
        let rest = s.stacked[k].1.get().narrow(0, 1, n - 1);
        let last = last.get().reshape(&[1, -1]);
        Tensor::concat(&[&rest, &last], 0)
    };
    let mut xs = s.weights(copies_wanted().then_some(DType::BF16));
    xs.push(shifted(0, &g.ln_f.weight));
    xs.push(shifted(1, &g.ln_f.bias));
    let body = |c: &[Tensor], w: &[Tensor]| {
        let (blk_w, next) = w.split_at(w.len() - 2);
        let (residual, (product, bias)) = block_branches(&s.block(blk_w), &c[0], &c[1], attn, None);
        let next =
            LayerNorm { weight: Param::new(next[0].clone()), bias: Param::new(next[1].clone()), eps: g.ln_f.eps };
        let (x, h) = next.forward_added_as(&residual, &product, bias.as_ref(), DType::BF16);
        (vec![x, h], vec![])
    };
    s.scan().run(body, &[x, h], &xs).0.remove(1)
}

/// Mean next-token cross-entropy of `ids: [B, T]` against `targets: [B, T]` (no dropout).
pub fn loss(g: &Gpt, ids: &Tensor, targets: &Tensor, attn: Attention) -> BenchResult<Tensor> {
    loss_planted(g, ids, targets, attn, None)
}

/// [`loss`] with `plant` applied in its block (unrolled blocks only).
pub fn loss_planted(
    g: &Gpt,
    ids: &Tensor,
    targets: &Tensor,
    attn: Attention,
    plant: Option<Plant>,
) -> BenchResult<Tensor> {
    let t = ids.dims()[1];
    let pos = Tensor::arange(t, DType::I32);
    let mut x = g.wte.forward(ids) + g.wpe.forward(&pos);
    COPIES.set(g.scanned.is_none() && copies_wanted());
    let h = match &g.scanned {
        // One block's ops in the graph, run once per layer on that layer's slice of the stacked weights.
        Some(_) if plant.is_some() => return Err("a planted op needs unrolled blocks".into()),
        Some(s) if !g.config.checkpoint_blocks && fused_adds() => scanned_with_fused_adds(g, s, x, attn),
        Some(s) => {
            let weights = s.weights(copies_wanted().then_some(DType::BF16));
            let body = |h: &[Tensor], w: &[Tensor]| (vec![block(&s.block(w), &h[0], attn, None)], vec![]);
            x = s.scan().run(body, std::slice::from_ref(&x), &weights).0.remove(0);
            layer_norm(&g.ln_f, &x)
        }
        None if !g.config.checkpoint_blocks && fused_adds() => blocks_with_fused_adds(g, x, attn, plant),
        None => {
            for (i, blk) in g.blocks.iter().enumerate() {
                let op = plant.filter(|&(at, _)| at == i).map(|(_, op)| op);
                x = if g.config.checkpoint_blocks {
                    x.checkpoint(|x| block(blk, x, attn, op))
                } else {
                    block(blk, &x, attn, op)
                };
            }
            layer_norm(&g.ln_f, &x)
        }
    };
    let logits = mm(&h, &weight(&g.wte.weight).t());
    let v = g.config.vocab as isize;
    Ok(logits.reshape(&[-1, v]).cross_entropy(&targets.reshape(&[-1])))
}
