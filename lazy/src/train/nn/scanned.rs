//! [`ScannedBlocks`]: N transformer blocks of one shape with their parameters stacked along a new leading axis
//! and run with one [`scan`](crate::ops::control::scan): the graph holds one block's ops instead of N copies,
//! so a deep model records, walks and compiles as fast as a shallow one.
//!
//! Its parameters are named `blocks.*.ln1.weight` and so on, `[N, …]` each; a checkpoint writes and reads them
//! as the unrolled model's `blocks.0.ln1.weight`, `blocks.1.ln1.weight`, … (`checkpoint/mod.rs`), so the two
//! forms load each other's files, optimizer state included.

use lazuli_hlo::{DType, Loc, TensorType};

use super::gpt::{Block, CausalSelfAttention, GptConfig};
use super::layers::{Dropout, LayerNorm, Linear};
use super::{join, Module, Param};
use crate::graph::tensor::{Data, Tensor};
use crate::ops::control::Scan;

/// The segment that stands for the layer index in a stacked parameter's name.
pub const STACKED: &str = "*";

/// Blocks of one shape, stacked and scanned. Dropout inside the blocks is not supported (each step would draw
/// the same mask): a `GptConfig` with dropout keeps its blocks unrolled while training. The backward pass reads
/// each block's activations saved by the forward scan, or with `remat` (`GptConfig::checkpoint_blocks`)
/// recomputes each block from its input ([`Scan::remat`]).
pub struct ScannedBlocks {
    /// Each parameter of a block, by its name within the block, stacked over the blocks: `[N, …]`.
    pub stacked: Vec<(String, Param)>,
    /// Attention heads per block.
    pub n_head: usize,
    /// Recompute each block in the backward pass instead of saving its activations.
    pub remat: bool,
    /// Write the blocks out in the compiled program instead of looping over them ([`Scan::unroll`]); `None`: as
    /// `LAZULI_SCANNED_BLOCKS` says (written out on GPUs, a loop elsewhere).
    pub unroll: Option<bool>,
    /// The dtype of the blocks' products (`Linear::matmul_dtype`): their weights enter the scan as the copies the
    /// optimizer keeps ([`Param::get_as`]), converted once for all layers.
    pub matmul_dtype: Option<DType>,
}

impl ScannedBlocks {
    /// The blocks' parameters stacked in order (block 0 first), as values: on the host where the blocks' are
    /// (a new model's), else computed now in one program, whose error (the device's memory exhausted, say) panics
    /// naming the caller's line. Left pending, the stacks would be part of the first step's program only, and the
    /// second step would compile again.
    #[track_caller]
    pub fn from_blocks(blocks: &[Block], cfg: &GptConfig) -> ScannedBlocks {
        let at = Loc::caller();
        let per_block: Vec<Vec<(String, Param)>> = blocks.iter().map(|b| b.named_params()).collect();
        let stacked: Vec<(String, Param)> = per_block
            .first()
            .map(|first| {
                (0..first.len())
                    .map(|k| {
                        let values: Vec<Tensor> = per_block.iter().map(|ps| ps[k].1.get()).collect();
                        (first[k].0.clone(), Param::new(stack(&values, at)))
                    })
                    .collect()
            })
            .unwrap_or_default();
        let pending: Vec<_> = stacked.iter().map(|(_, p)| p.get().node.clone()).filter(|n| n.is_pending()).collect();
        if !pending.is_empty() {
            if let Err(e) = crate::exec::materialize(&pending, crate::diagnostics::Cause::Explicit, at) {
                crate::graph::record::raise(e);
            }
        }
        ScannedBlocks { stacked, n_head: cfg.n_head, remat: cfg.checkpoint_blocks, unroll: None, matmul_dtype: None }
    }

    /// How many blocks.
    pub fn len(&self) -> usize {
        self.stacked.first().map_or(0, |(_, p)| p.get().dims()[0])
    }

    /// Whether there are no blocks.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The block whose parameters are `w`, one layer's slices of [`Self::stacked`] in its order: for a forward
    /// function of one's own inside [`Self::scan`] (mixed precision, say), as `forward` runs `Block::forward`.
    pub fn block(&self, w: &[Tensor]) -> Block {
        block_of(w, self.n_head, self.matmul_dtype)
    }

    /// The stacked parameters as the scan reads them, in [`Self::stacked`]'s order: with `matmul_dtype`, the
    /// linear layers' weights as the copies the optimizer keeps in that dtype ([`Param::get_as`]), converted
    /// once for all layers instead of in every step.
    pub fn weights(&self, matmul_dtype: Option<DType>) -> Vec<Tensor> {
        (self.stacked.iter().enumerate())
            .map(|(i, (_, p))| match matmul_dtype {
                Some(dt) if LINEAR_WEIGHTS.contains(&i) => p.get_as(dt),
                _ => p.get(),
            })
            .collect()
    }

    /// `x: [batch, seq, d_model]` through every block in order.
    #[track_caller]
    pub fn forward(&self, x: &Tensor) -> Tensor {
        if self.is_empty() {
            return x.clone();
        }
        let weights = self.weights(self.matmul_dtype);
        let (n_head, matmul_dtype) = (self.n_head, self.matmul_dtype);
        let (carry, _) = self.scan().run(
            |h, w| (vec![block_of(w, n_head, matmul_dtype).forward(&h[0])], vec![]),
            std::slice::from_ref(x),
            &weights,
        );
        carry[0].clone()
    }

    /// The scan the blocks run with: recomputing in the backward pass with [`Self::remat`], written out with
    /// [`Self::unroll`].
    pub fn scan(&self) -> Scan {
        let unroll =
            self.unroll.unwrap_or_else(|| crate::runtime::runtime().is_ok_and(|rt| rt.config.unrolls_blocks()));
        Scan::new().remat(self.remat).unroll(unroll)
    }
}

/// `values` (of one type) stacked along a new leading axis: their bytes joined on the host where each is host data,
/// else the lazy `stack`.
fn stack(values: &[Tensor], at: Loc) -> Tensor {
    let host: Option<Vec<std::sync::Arc<Vec<u8>>>> = values
        .iter()
        .map(|v| match &v.node.lock().data {
            Some(Data::Host(bytes)) if v.tensor_type() == values[0].tensor_type() => Some(bytes.clone()),
            _ => None,
        })
        .collect();
    match host {
        Some(parts) if !parts.is_empty() => {
            let first = values[0].tensor_type();
            let dims: Vec<usize> = std::iter::once(values.len()).chain(first.dims.iter().copied()).collect();
            let bytes = parts.iter().flat_map(|b| b.iter().copied()).collect();
            Tensor::host(TensorType::new(first.dtype, dims), bytes, at)
        }
        _ => {
            let refs: Vec<&Tensor> = values.iter().collect();
            crate::graph::autodiff::no_grad(|| Tensor::stack(&refs, 0))
        }
    }
}

/// Where the linear layers' weights are in `Block::visit_params`'s order (each followed by its bias).
const LINEAR_WEIGHTS: [usize; 4] = [2, 4, 8, 10];

/// A block whose parameters are `w`, in the order `Block::visit_params` names them, without dropout.
fn block_of(w: &[Tensor], n_head: usize, matmul_dtype: Option<DType>) -> Block {
    let p = |i: usize| Param::new(w[i].clone());
    let norm = |i: usize| LayerNorm { weight: p(i), bias: p(i + 1), eps: 1e-5 };
    let linear = |i: usize| Linear { weight: p(i), bias: Some(p(i + 1)), matmul_dtype };
    Block {
        ln1: norm(0),
        attn: CausalSelfAttention {
            qkv: linear(2),
            proj: linear(4),
            n_head,
            attn_drop: Dropout::new(0.0),
            resid_drop: Dropout::new(0.0),
        },
        ln2: norm(6),
        fc: linear(8),
        fc_proj: linear(10),
        mlp_drop: Dropout::new(0.0),
    }
}

impl Module for ScannedBlocks {
    fn visit_params(&self, prefix: &str, f: &mut dyn FnMut(String, &Param)) {
        for (name, p) in &self.stacked {
            f(join(&join(prefix, STACKED), name), p);
        }
    }
}
