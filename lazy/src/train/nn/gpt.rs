//! A GPT (decoder-only transformer, GPT-2 layout): token and position embeddings, pre-norm blocks of causal
//! self-attention and an MLP, a final layer norm, and an output head tied to the token embedding.

use lazuli_hlo::DType;

use super::init::{normal, HostRng};
use super::layers::{Dropout, Embedding, LayerNorm, Linear};
use super::scanned::ScannedBlocks;
use super::{join, Module, Param};
use crate::graph::constants::constant_like;
use crate::graph::tensor::Tensor;
use crate::ops::attention::{scaled_dot_product_attention, AttentionLayout, AttentionOptions};

/// A GPT's shape: vocabulary, context, depth, width, dropout and dtype.
#[derive(Clone, Debug, PartialEq)]
pub struct GptConfig {
    /// Vocabulary size (rows of the token embedding, width of the logits).
    pub vocab: usize,
    /// Longest sequence (positions).
    pub block_size: usize,
    /// Transformer blocks.
    pub n_layer: usize,
    /// Attention heads per block (`d_model` must divide by it).
    pub n_head: usize,
    /// Width of the residual stream.
    pub d_model: usize,
    /// Dropout after attention weights, attention output, MLP output and embeddings (GPT-2: 0.1).
    pub dropout: f64,
    /// Dtype of the weights and activations.
    pub dtype: DType,
    /// Store the blocks' parameters stacked and run them with one `scan` ([`ScannedBlocks`]): one block's ops
    /// in the graph instead of `n_layer` copies. Checkpoints keep the unrolled model's names. Needs `dropout`
    /// 0 while training.
    pub scan_blocks: bool,
    /// Recompute each block in the backward pass instead of keeping its activations ([`crate::checkpoint`]):
    /// less memory for about one more forward pass of compute. With `scan_blocks`, the scan saves only each
    /// block's input and recomputes the block from it ([`crate::Scan::remat`]); without, its activations.
    pub checkpoint_blocks: bool,
}

impl GptConfig {
    /// GPT-2 small: 12 layers, 12 heads, d = 768, 1024 positions.
    pub fn gpt2_small(vocab: usize) -> GptConfig {
        GptConfig {
            vocab,
            block_size: 1024,
            n_layer: 12,
            n_head: 12,
            d_model: 768,
            dropout: 0.0,
            dtype: DType::F32,
            scan_blocks: false,
            checkpoint_blocks: false,
        }
    }

    /// Training FLOPs per token at sequence length `seq`: 6 per parameter (the position table excluded; the
    /// tied head counted once) plus attention's 12·L·d·T (PaLM's appendix B, as nanoGPT's MFU). The numerator
    /// of model FLOPs utilization.
    pub fn train_flops_per_token(&self, seq: usize) -> f64 {
        let (l, d, v) = (self.n_layer as f64, self.d_model as f64, self.vocab as f64);
        let per_layer = 12.0 * d * d + 13.0 * d;
        let n = l * per_layer + v * d + 2.0 * d;
        6.0 * n + 12.0 * l * d * seq as f64
    }
}

/// GPT-2's initialisation: weights N(0, 0.02²), residual projections N(0, (0.02/√(2·layers))²), biases 0.
fn gpt_linear(rng: &mut HostRng, d_in: usize, d_out: usize, std: f64, dtype: DType) -> Linear {
    let zeros = super::init::host_zeros(&[d_out], dtype);
    Linear::from_tensors(normal(rng, &[d_in, d_out], std, dtype), Some(zeros))
}

/// Multi-head causal self-attention with one fused q/k/v projection; fused attention (`scaled_dot_product_attention`:
/// on NVIDIA GPUs lazuli's Triton kernels, which read q, k and v in place from the projection) unless
/// attention-weight dropout is on.
pub struct CausalSelfAttention {
    /// The fused query, key and value projection, `d_model` → `3 · d_model`.
    pub qkv: Linear,
    /// The output projection.
    pub proj: Linear,
    /// Attention heads.
    pub n_head: usize,
    /// Dropout on the attention weights (when on, attention is written out instead of fused).
    pub attn_drop: Dropout,
    /// Dropout on the output.
    pub resid_drop: Dropout,
}

impl CausalSelfAttention {
    /// GPT-2's initialisation for `cfg`'s sizes (see `GptConfig`).
    pub fn new(rng: &mut HostRng, cfg: &GptConfig) -> Self {
        let d = cfg.d_model;
        let resid_std = 0.02 / (2.0 * cfg.n_layer as f64).sqrt();
        CausalSelfAttention {
            qkv: gpt_linear(rng, d, 3 * d, 0.02, cfg.dtype),
            proj: gpt_linear(rng, d, d, resid_std, cfg.dtype),
            n_head: cfg.n_head,
            attn_drop: Dropout::new(cfg.dropout),
            resid_drop: Dropout::new(cfg.dropout),
        }
    }

    /// `x: [B, T, d]` → `[B, T, d]`.
    #[track_caller]
    pub fn forward(&self, x: &Tensor) -> Tensor {
        let (b, t, d) = (x.dims()[0] as isize, x.dims()[1] as isize, x.dims()[2] as isize);
        let h = self.n_head as isize;
        let hd = d / h;
        // [B, T, 3d] → [B, T, 3, H, hd]: q, k and v are [B, T, H, hd] slices, the layout fused attention takes.
        // With products in a lower precision (`Linear::matmul_dtype`), attention takes q, k and v in it too.
        let qkv = self.qkv.forward_in_product_dtype(x).reshape(&[b, t, 3, h, hd]);
        let part = |i: usize| qkv.narrow(2, i, 1).reshape(&[b, t, h, hd]);
        let (q, k, v) = (part(0), part(1), part(2));
        let y = if self.attn_drop.is_training() && self.attn_drop.p > 0.0 {
            self.attention_with_dropout(&q, &k, &v)
        } else {
            let opts = AttentionOptions::causal().layout(AttentionLayout::Bthd);
            scaled_dot_product_attention(&q, &k, &v, &opts)
        };
        self.resid_drop.forward(&self.proj.forward(&y.to_dtype(x.dtype()).reshape(&[b, t, d])))
    }

    /// Attention written out, for dropout on the attention weights (which the fused kernel does not apply):
    /// `[B, T, H, hd]` in and out.
    #[track_caller]
    fn attention_with_dropout(&self, q: &Tensor, k: &Tensor, v: &Tensor) -> Tensor {
        let heads_first = |x: &Tensor| x.permute(&[0, 2, 1, 3]);
        let (q, k, v) = (heads_first(q), heads_first(k), heads_first(v));
        let (t, hd) = (q.dims()[2], q.dims()[3]);
        // The scale and the mask value are part of the model: constants, not per-step uploads.
        let (dt, at) = (q.dtype(), crate::Loc::caller());
        let scores = q.matmul(&k.t());
        let scores = &scores * &constant_like(1.0 / (hd as f64).sqrt(), dt, scores.dims(), at);
        let causal = Tensor::tril_mask(t, 0);
        let scores = causal.select(&scores, constant_like(f64::NEG_INFINITY, dt, scores.dims(), at));
        heads_first(&self.attn_drop.forward(&scores.softmax(-1)).matmul(&v))
    }
}

impl Module for CausalSelfAttention {
    fn visit_params(&self, prefix: &str, f: &mut dyn FnMut(String, &Param)) {
        self.qkv.visit_params(&join(prefix, "qkv"), f);
        self.proj.visit_params(&join(prefix, "proj"), f);
    }
    fn set_training(&self, training: bool) {
        self.attn_drop.set_training(training);
        self.resid_drop.set_training(training);
    }
}

/// Pre-norm transformer block: x + attn(ln1(x)), then + mlp(ln2(x)) with a 4× GELU MLP.
pub struct Block {
    /// Normalization before attention.
    pub ln1: LayerNorm,
    /// Causal self-attention.
    pub attn: CausalSelfAttention,
    /// Normalization before the MLP.
    pub ln2: LayerNorm,
    /// The MLP's first layer, `d_model` → `4 · d_model`.
    pub fc: Linear,
    /// The MLP's second layer, back to `d_model`.
    pub fc_proj: Linear,
    /// Dropout on the MLP's output.
    pub mlp_drop: Dropout,
}

impl Block {
    /// A block of `cfg`'s sizes with GPT-2's initialisation.
    pub fn new(rng: &mut HostRng, cfg: &GptConfig) -> Block {
        let d = cfg.d_model;
        let resid_std = 0.02 / (2.0 * cfg.n_layer as f64).sqrt();
        Block {
            ln1: LayerNorm::new(d, 1e-5, cfg.dtype),
            attn: CausalSelfAttention::new(rng, cfg),
            ln2: LayerNorm::new(d, 1e-5, cfg.dtype),
            fc: gpt_linear(rng, d, 4 * d, 0.02, cfg.dtype),
            fc_proj: gpt_linear(rng, 4 * d, d, resid_std, cfg.dtype),
            mlp_drop: Dropout::new(cfg.dropout),
        }
    }

    /// `x: [batch, seq, d_model]` → the same shape.
    #[track_caller]
    pub fn forward(&self, x: &Tensor) -> Tensor {
        // The residual add and the layer norm after it as one op (one kernel on a GPU).
        let (x, h) = self.ln2.forward_added_as(x, &self.attn.forward(&self.ln1.forward(x)), None, x.dtype());
        // The first layer's bias and GELU as one op (one kernel on a GPU).
        let h = match &self.fc.bias {
            Some(b) => self.fc.product(&h).bias_gelu(&b.get(), h.dtype()),
            None => self.fc.forward(&h).gelu(),
        };
        x + self.mlp_drop.forward(&self.fc_proj.forward(&h))
    }
}

impl Module for Block {
    fn visit_params(&self, prefix: &str, f: &mut dyn FnMut(String, &Param)) {
        self.ln1.visit_params(&join(prefix, "ln1"), f);
        self.attn.visit_params(&join(prefix, "attn"), f);
        self.ln2.visit_params(&join(prefix, "ln2"), f);
        self.fc.visit_params(&join(prefix, "fc"), f);
        self.fc_proj.visit_params(&join(prefix, "fc_proj"), f);
    }
    fn set_training(&self, training: bool) {
        self.attn.set_training(training);
        self.mlp_drop.set_training(training);
    }
}

/// A GPT-2-style decoder-only transformer: token and position embeddings, pre-norm blocks, a final normalization and a
/// head tied to the token embedding.
pub struct Gpt {
    /// Its sizes.
    pub config: GptConfig,
    /// Token embedding, `[vocab, d_model]` (also the output head).
    pub wte: Embedding,
    /// Position embedding, `[block_size, d_model]`.
    pub wpe: Embedding,
    /// The transformer blocks, in order (none with `scan_blocks`: they are in `scanned`).
    pub blocks: Vec<Block>,
    /// The blocks stacked and scanned, with `GptConfig::scan_blocks`.
    pub scanned: Option<ScannedBlocks>,
    /// The final normalization.
    pub ln_f: LayerNorm,
    /// Dropout on the embeddings.
    pub emb_drop: Dropout,
    /// Mixed precision: every product (the blocks' linear layers, attention, the head) on operands in this dtype,
    /// the weights' copies kept by the optimizer ([`Param::get_as`]); set by [`Gpt::with_matmul_dtype`].
    pub matmul_dtype: Option<DType>,
}

impl Gpt {
    /// A GPT of `config`'s sizes with GPT-2's initialisation, drawn from `rng`.
    pub fn new(rng: &mut HostRng, config: GptConfig) -> Gpt {
        let c = &config;
        let wte = Embedding::new(rng, c.vocab, c.d_model, 0.02, c.dtype);
        let wpe = Embedding::new(rng, c.block_size, c.d_model, 0.01, c.dtype);
        let mut blocks: Vec<Block> = (0..c.n_layer).map(|_| Block::new(rng, c)).collect();
        // Drawn as the unrolled model's, then stacked: the same seed gives the same weights either way.
        let scanned = c.scan_blocks.then(|| ScannedBlocks::from_blocks(&std::mem::take(&mut blocks), c));
        let ln_f = LayerNorm::new(c.d_model, 1e-5, c.dtype);
        let emb_drop = Dropout::new(c.dropout);
        Gpt { wte, wpe, blocks, scanned, ln_f, emb_drop, config, matmul_dtype: None }
    }

    /// With every product computed in `dtype` (bf16 for f32 weights, as mixed-precision training does): the
    /// weights enter as the copies the optimizer writes with each update ([`Param::get_as`]), each product's
    /// result returns to the model's dtype, and the rest (normalizations, softmax, residuals, the optimizer)
    /// stays in it. Panics at the caller's line for a dtype that is not floating-point.
    #[track_caller]
    pub fn with_matmul_dtype(mut self, dtype: DType) -> Gpt {
        super::param::check_copy_dtype("Gpt::with_matmul_dtype", dtype, crate::Loc::caller());
        for b in &mut self.blocks {
            for l in [&mut b.attn.qkv, &mut b.attn.proj, &mut b.fc, &mut b.fc_proj] {
                l.matmul_dtype = Some(dtype);
            }
        }
        if let Some(s) = &mut self.scanned {
            s.matmul_dtype = Some(dtype);
        }
        self.matmul_dtype = Some(dtype);
        self
    }

    /// `ids: [B, T]` integers → logits `[B, T, vocab]` (the head shares the token embedding's weights).
    #[track_caller]
    pub fn forward(&self, ids: &Tensor) -> Tensor {
        let t = ids.dims()[1];
        if t > self.config.block_size {
            crate::graph::record::fail(
                crate::Loc::caller(),
                format!("Gpt::forward: sequence length {t} exceeds block_size {}", self.config.block_size),
            );
        }
        let pos = Tensor::arange(t, DType::I32);
        let mut x = self.emb_drop.forward(&(self.wte.forward(ids) + self.wpe.forward(&pos)));
        for block in &self.blocks {
            x = if self.config.checkpoint_blocks { x.checkpoint(|x| block.forward(x)) } else { block.forward(&x) };
        }
        if let Some(scanned) = &self.scanned {
            if self.config.dropout > 0.0 && self.emb_drop.is_training() {
                crate::graph::record::fail(
                    crate::Loc::caller(),
                    "Gpt::forward: scanned blocks (GptConfig::scan_blocks) cannot apply dropout; set dropout to 0 \
                     or switch to evaluation mode",
                );
            }
            x = scanned.forward(&x);
        }
        let h = self.ln_f.forward(&x);
        match self.matmul_dtype {
            Some(dt) => h.to_dtype(dt).matmul(&self.wte.weight.get_as(dt).t()).to_dtype(h.dtype()),
            None => h.matmul(&self.wte.weight.get().t()),
        }
    }

    /// Mean next-token cross-entropy of `ids: [B, T]` against `targets: [B, T]`.
    #[track_caller]
    pub fn loss(&self, ids: &Tensor, targets: &Tensor) -> Tensor {
        let logits = self.forward(ids);
        let v = self.config.vocab as isize;
        logits.reshape(&[-1, v]).cross_entropy(&targets.reshape(&[-1]))
    }
}

impl Module for Gpt {
    fn visit_params(&self, prefix: &str, f: &mut dyn FnMut(String, &Param)) {
        self.wte.visit_params(&join(prefix, "wte"), f);
        self.wpe.visit_params(&join(prefix, "wpe"), f);
        for (i, b) in self.blocks.iter().enumerate() {
            b.visit_params(&join(prefix, &format!("blocks.{i}")), f);
        }
        if let Some(s) = &self.scanned {
            s.visit_params(&join(prefix, "blocks"), f);
        }
        self.ln_f.visit_params(&join(prefix, "ln_f"), f);
    }
    fn set_training(&self, training: bool) {
        self.emb_drop.set_training(training);
        self.blocks.iter().for_each(|b| b.set_training(training));
    }
}
