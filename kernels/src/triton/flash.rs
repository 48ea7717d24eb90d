//! lazuli's own flash attention as Triton IR: a forward kernel and the two backward kernels (dq; dk and dv),
//! generated per shape signature as TTIR text for XLA's Triton custom call.
//!
//! Attention here is `o = softmax(scale * q kᵀ + mask) v` per (batch, head), with an optional causal mask
//! (key `j` visible to query `i` iff `j <= i`, top-left aligned like PyTorch's `is_causal`) narrowed by an
//! optional window (`i - j < window`). The kernels follow FlashAttention-2:
//! - the forward walks one block of queries over blocks of keys with an online softmax (running max `m`, running
//!   sum `l`, f32 accumulator), in base 2 (`exp2` of scores prescaled by `scale * log2(e)`), and writes `o` and
//!   the natural-log `lse = m + ln(l)` of each row;
//! - the backward recomputes `p = exp(s - lse)` blockwise: one kernel walks a block of queries over keys for
//!   `dq = scale * Σ ds k`, the other a block of keys over queries for `dv = Σ pᵀ do` and `dk = scale * Σ dsᵀ q`,
//!   with `ds = p (dp - delta)`, `dp = do vᵀ` and the caller's `delta = rowsum(do * o)`.
//!
//! Under a causal mask the blocks' work differs by up to their count (the last query block sees every key, the
//! first key block every query): the grid then runs batch · heads along x and blocks along y, heaviest first, so
//! that the programs that start last are the shortest and the launch does not end on a few long ones.
//!
//! Every loop over blocks is split by its bounds into blocks that no pair sees (skipped), blocks that every pair
//! sees (no elementwise mask) and the rest (the diagonal, the window's edge, ragged tails: masked). Shapes,
//! strides, block sizes and the scale are constants of the IR; the kernel arguments are pointers only.
//! `kernels/python/flash_twin.py` is the same algorithm in Triton-Python, checked against numpy on the CPU.

mod backward;
mod common;
mod forward;

use super::TritonCall;
use crate::triton::ttir::{Kernel, Value};

/// Element type of q, k, v, o and the gradients (lse and delta are always f32).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FlashDtype {
    F32,
    F16,
    BF16,
}

impl FlashDtype {
    fn tag(self) -> &'static str {
        match self {
            FlashDtype::F32 => "f32",
            FlashDtype::F16 => "f16",
            FlashDtype::BF16 => "bf16",
        }
    }
}

/// Order of dims of q, k, v, o (each contiguous, row-major): Bhtd = [batch, heads, seq, head_dim];
/// Bthd = [batch, seq, heads, head_dim].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FlashLayout {
    Bhtd,
    Bthd,
}

/// One attention shape signature: what a generated kernel is specialized to.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct FlashSpec {
    pub batch: usize,
    pub heads: usize,
    pub seq_q: usize,
    pub seq_kv: usize,
    pub head_dim: usize,
    pub dtype: FlashDtype,
    pub layout: FlashLayout,
    /// Key j visible to query i iff j <= i (top-left aligned, like PyTorch is_causal).
    pub causal: bool,
    /// Only with causal: additionally i - j < window.
    pub window: Option<usize>,
    /// f64::to_bits of the softmax scale (scores = scale * q.k).
    pub scale_bits: u64,
    /// f32 only: tt.dot inputPrecision tf32 (true) or ieee (false).
    pub tf32: bool,
    /// q, k and v are slots 0, 1 and 2 of one `[batch, seq, 3, heads, head_dim]` operand (a fused projection
    /// reshaped), read in place; the backward writes their gradients into one tensor of that shape, in one launch.
    /// Needs [`FlashLayout::Bthd`] and `seq_q == seq_kv`.
    pub packed: bool,
}

impl FlashSpec {
    /// A spec without mask, scale `1/sqrt(head_dim)`, tf32 products for f32.
    pub fn new(
        batch: usize,
        heads: usize,
        seq_q: usize,
        seq_kv: usize,
        head_dim: usize,
        dtype: FlashDtype,
        layout: FlashLayout,
    ) -> FlashSpec {
        let scale = 1.0 / (head_dim.max(1) as f64).sqrt();
        FlashSpec {
            batch,
            heads,
            seq_q,
            seq_kv,
            head_dim,
            dtype,
            layout,
            causal: false,
            window: None,
            scale_bits: scale.to_bits(),
            tf32: true,
            packed: false,
        }
    }

    /// The softmax scale.
    pub fn scale(&self) -> f64 {
        f64::from_bits(self.scale_bits)
    }

    pub fn with_causal(mut self, causal: bool) -> FlashSpec {
        self.causal = causal;
        self
    }

    /// A sliding window (needs `causal`).
    pub fn with_window(mut self, window: Option<usize>) -> FlashSpec {
        self.window = window;
        self
    }

    pub fn with_scale(mut self, scale: f64) -> FlashSpec {
        self.scale_bits = scale.to_bits();
        self
    }

    pub fn with_tf32(mut self, tf32: bool) -> FlashSpec {
        self.tf32 = tf32;
        self
    }

    /// q, k, v read from one packed `[B, T, 3, H, D]` operand (see [`FlashSpec::packed`]).
    pub fn with_packed(mut self, packed: bool) -> FlashSpec {
        self.packed = packed;
        self
    }

    /// Tensors side by side in each row of q's, k's and v's operand: 3 when packed, else 1.
    fn slots(&self) -> usize {
        if self.packed {
            3
        } else {
            1
        }
    }

    /// The head dim padded for the kernels' blocks: the next power of two, at least 16 (`tt.dot`'s minimum).
    pub fn block_d(&self) -> usize {
        self.head_dim.next_power_of_two().max(16)
    }
}

/// Block sizes and launch parameters of one kernel. `block_m` counts query rows and `block_n` key rows, in
/// every kernel; powers of two from 16 to 256.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FlashTuning {
    pub block_m: usize,
    pub block_n: usize,
    pub num_warps: u32,
    pub num_stages: u32,
}

/// How a spec's products run, which decides how large blocks can be: 16-bit inputs on tensor cores, f32 as
/// tf32 on tensor cores (twice the bytes), or f32 as exact f32 FMAs (no tensor cores: blocks held in registers).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Arith {
    Half,
    Tf32,
    Ieee,
}

fn arith(spec: &FlashSpec) -> Arith {
    match (spec.dtype, spec.tf32) {
        (FlashDtype::F32, true) => Arith::Tf32,
        (FlashDtype::F32, false) => Arith::Ieee,
        _ => Arith::Half,
    }
}

impl FlashTuning {
    /// The forward's blocks. Chosen on an H200 at B=8, H=12, T=1024, causal (`examples/dump_ttir.rs --tune`)
    /// and by ptxas's spill counts for larger head dims: wider heads take fewer rows or more warps, so that the
    /// f32 accumulator stays in registers.
    pub fn forward(spec: &FlashSpec) -> FlashTuning {
        match (arith(spec), spec.block_d()) {
            (Arith::Half, d) if d <= 128 => tuning(64, 64, 4, 3),
            (Arith::Half, _) => tuning(64, 32, 4, 2),
            (Arith::Tf32, d) if d <= 64 => tuning(128, 64, 4, 3),
            (Arith::Tf32, 128) => tuning(64, 32, 4, 2),
            (Arith::Tf32, _) => tuning(64, 32, 8, 2),
            (Arith::Ieee, d) if d <= 64 => tuning(64, 32, 8, 2),
            (Arith::Ieee, _) => tuning(16, 16, 8, 2),
        }
    }

    /// dq's blocks (queries per program, keys per step).
    pub fn backward_dq(spec: &FlashSpec) -> FlashTuning {
        match (arith(spec), spec.block_d()) {
            (Arith::Half, d) if d <= 128 => tuning(64, 32, 4, 3),
            (Arith::Half, _) => tuning(32, 32, 4, 2),
            (Arith::Tf32, d) if d <= 64 => tuning(64, 64, 4, 3),
            (Arith::Tf32, 128) => tuning(32, 32, 4, 2),
            (Arith::Tf32, _) => tuning(16, 32, 8, 2),
            (Arith::Ieee, d) if d <= 64 => tuning(32, 32, 8, 2),
            (Arith::Ieee, _) => tuning(16, 16, 8, 2),
        }
    }

    /// dk and dv's blocks (queries per step, keys per program).
    pub fn backward_dkdv(spec: &FlashSpec) -> FlashTuning {
        match (arith(spec), spec.block_d()) {
            (Arith::Half, d) if d <= 64 => tuning(32, 64, 4, 3),
            (Arith::Half, 128) => tuning(64, 64, 8, 2),
            (Arith::Half, _) => tuning(32, 64, 8, 2),
            (Arith::Tf32, d) if d <= 64 => tuning(64, 64, 4, 3),
            (Arith::Tf32, 128) => tuning(32, 32, 8, 2),
            (Arith::Tf32, _) => tuning(32, 16, 8, 2),
            (Arith::Ieee, d) if d <= 64 => tuning(32, 32, 8, 2),
            (Arith::Ieee, _) => tuning(16, 16, 8, 2),
        }
    }

    /// Why these blocks cannot be generated (None if they can).
    pub fn unsupported(&self) -> Option<String> {
        let block = |b: usize| b.is_power_of_two() && (SMALLEST_BLOCK..=256).contains(&b);
        if !block(self.block_m) || !block(self.block_n) {
            return Some(format!("blocks {}x{}: each must be a power of two in 16..=256", self.block_m, self.block_n));
        }
        if !self.num_warps.is_power_of_two() || self.num_warps > 16 || self.num_stages == 0 {
            return Some(format!("num_warps {} / num_stages {}", self.num_warps, self.num_stages));
        }
        None
    }
}

fn tuning(block_m: usize, block_n: usize, num_warps: u32, num_stages: u32) -> FlashTuning {
    FlashTuning { block_m, block_n, num_warps, num_stages }
}

/// Forward. Operands (q, k, v), or (qkv) when packed; results (o: same dtype and layout as q, [.., seq_q, .., head_dim];
/// lse: f32, [batch, heads, seq_q] contiguous: the natural-log logsumexp of each row's scaled, masked scores,
/// -inf for a row that sees no key, whose o is 0).
///
/// The spec must pass [`unsupported`]; the text for one that does not is unspecified.
pub fn forward(spec: &FlashSpec) -> TritonCall {
    forward::generate(spec, &FlashTuning::forward(spec))
}

/// dQ. Operands (q, k, v, do, lse, delta) with delta: f32 [batch, heads, seq_q] = rowsum(do * o) computed by the
/// caller in f32; result dq (dtype/layout of q).
pub fn backward_dq(spec: &FlashSpec) -> TritonCall {
    backward::generate_dq(spec, &FlashTuning::backward_dq(spec))
}

/// dK and dV. Operands (q, k, v, do, lse, delta); results (dk, dv) (dtype/layout of k, v).
pub fn backward_dkdv(spec: &FlashSpec) -> TritonCall {
    backward::generate_dkdv(spec, &FlashTuning::backward_dkdv(spec))
}

/// The backward of a packed spec in one launch: operands (qkv, do, lse, delta), result dqkv (`[B, T, 3, H, D]`).
/// The grid's third axis picks the job: dq (slot 0) as [`backward_dq`]'s programs compute it, or dk and dv
/// (slots 1 and 2) as [`backward_dkdv`]'s, with their blocks and the dk/dv kernel's warps and stages. dq's
/// programs are at 0 and dk and dv's at 1, or under a causal mask the other way round (the heavier job first).
pub fn backward_packed(spec: &FlashSpec) -> TritonCall {
    backward::generate_packed(spec, &FlashTuning::backward_dq(spec), &FlashTuning::backward_dkdv(spec))
}

/// [`forward`] with other blocks (for tuning).
pub fn forward_tuned(spec: &FlashSpec, tuning: &FlashTuning) -> Result<TritonCall, String> {
    check(spec, tuning)?;
    Ok(forward::generate(spec, tuning))
}

/// [`backward_dq`] with other blocks (for tuning).
pub fn backward_dq_tuned(spec: &FlashSpec, tuning: &FlashTuning) -> Result<TritonCall, String> {
    check(spec, tuning)?;
    Ok(backward::generate_dq(spec, tuning))
}

/// [`backward_dkdv`] with other blocks (for tuning).
pub fn backward_dkdv_tuned(spec: &FlashSpec, tuning: &FlashTuning) -> Result<TritonCall, String> {
    check(spec, tuning)?;
    Ok(backward::generate_dkdv(spec, tuning))
}

fn check(spec: &FlashSpec, tuning: &FlashTuning) -> Result<(), String> {
    match unsupported(spec).or_else(|| tuning.unsupported()) {
        Some(why) => Err(why),
        None => Ok(()),
    }
}

/// Largest grid y (and z) CUDA launches.
const MAX_GRID_Y: usize = 65_535;
/// Largest grid x CUDA launches.
const MAX_GRID_X: usize = i32::MAX as usize;
/// The smallest block of queries or keys a tuning takes.
const SMALLEST_BLOCK: usize = 16;

/// Why a spec cannot be generated (None if it can): e.g. head_dim > 256, zero sizes, window without causal.
pub fn unsupported(spec: &FlashSpec) -> Option<String> {
    let FlashSpec { batch, heads, seq_q, seq_kv, head_dim, .. } = *spec;
    if [batch, heads, seq_q, seq_kv, head_dim].contains(&0) {
        return Some(format!("zero size in batch {batch}, heads {heads}, seq {seq_q}/{seq_kv}, head_dim {head_dim}"));
    }
    if !head_dim.is_multiple_of(8) || head_dim > 256 {
        return Some(format!("head_dim {head_dim}: must be a multiple of 8 up to 256"));
    }
    if spec.packed && (spec.layout != FlashLayout::Bthd || seq_q != seq_kv) {
        return Some("packed q, k, v need the [batch, seq, heads, head_dim] layout and one sequence length".into());
    }
    match spec.window {
        Some(_) if !spec.causal => return Some("a window needs causal".to_string()),
        Some(0) => return Some("window 0 hides every key".to_string()),
        _ => {}
    }
    if !spec.scale().is_finite() {
        return Some(format!("scale {} is not finite", spec.scale()));
    }
    // Causal kernels run batch · heads along the grid's x (`Programs`) when their blocks fit along y, as blocks of
    // any tuning do up to 16 · 65,535 positions; other kernels run batch · heads along y.
    let blocks_fit_y = [seq_q, seq_kv].iter().all(|s| s.div_ceil(SMALLEST_BLOCK) <= MAX_GRID_Y);
    let (most, axis) = if spec.causal && blocks_fit_y { (MAX_GRID_X, "x") } else { (MAX_GRID_Y, "y") };
    if batch.saturating_mul(heads) > most {
        return Some(format!("batch * heads = {batch} * {heads} is over the grid's {most} along {axis}"));
    }
    // Offsets inside one batch element are i32 (the batch offset is i64), with room for a ragged last block.
    let per_batch = |seq: usize| seq.checked_mul(heads * spec.slots()).and_then(|n| n.checked_mul(head_dim));
    let fits = |n: Option<usize>| n.is_some_and(|n| n < i32::MAX as usize / 2);
    if !fits(per_batch(seq_q)) || !fits(per_batch(seq_kv)) {
        return Some(format!("seq * heads * head_dim of {seq_q}/{seq_kv} x {heads} x {head_dim} overflows i32"));
    }
    None
}

/// The kernel's name: what it computes and for which dtype, layout, mask and head dim.
fn kernel_name(kind: &str, spec: &FlashSpec) -> String {
    let layout = match (spec.layout, spec.packed) {
        (_, true) => "bt3hd",
        (FlashLayout::Bhtd, false) => "bhtd",
        (FlashLayout::Bthd, false) => "bthd",
    };
    let mask = match (spec.causal, spec.window) {
        (false, _) => "full".to_string(),
        (true, None) => "causal".to_string(),
        (true, Some(w)) => format!("causal_w{w}"),
    };
    format!("lazuli_flash_{kind}_{}_{layout}_{mask}_d{}", spec.dtype.tag(), spec.head_dim)
}

fn blocks(n: usize, block: usize) -> u32 {
    u32::try_from(n.div_ceil(block)).unwrap_or(u32::MAX)
}

fn batch_heads(spec: &FlashSpec) -> u32 {
    u32::try_from(spec.batch * spec.heads).unwrap_or(u32::MAX)
}

/// Which block of a kernel's loop does the most work under a causal mask: the last query block sees every key,
/// the first key block every query.
#[derive(Clone, Copy)]
enum Heaviest {
    First,
    Last,
}

/// A kernel's program ids on its grid. Under a causal mask the blocks' work differs by up to their count: the grid
/// then runs batch · heads along x and blocks along y, so that every head's heaviest block starts before any lighter
/// one and the last programs to start are the shortest (`heavy_first`). Otherwise blocks run along x.
struct Programs {
    /// The program's block along the grid (before [`Programs::block_index`] orders it).
    block: Value,
    /// Its batch · head.
    head: Value,
    heavy_first: bool,
    grid: [u32; 3],
}

impl Programs {
    /// The programs of a kernel of `spec` over `n` blocks a head, for each of `jobs` jobs (the third axis).
    fn new(k: &mut Kernel, spec: &FlashSpec, n: u32, jobs: u32) -> Programs {
        let heavy_first = spec.causal && (n as usize) <= MAX_GRID_Y;
        let (block, head, grid) = if heavy_first {
            let head = k.named("head_pid").program_id(0);
            (k.named("block_pid").program_id(1), head, [batch_heads(spec), n, jobs])
        } else {
            let block = k.named("block_pid").program_id(0);
            (block, k.named("head_pid").program_id(1), [n, batch_heads(spec), jobs])
        };
        Programs { block, head, heavy_first, grid }
    }

    /// The index of the block this program works on, of a loop over `n` blocks (`n` at most the grid's): the
    /// grid's own, or reversed when the heaviest is the last and the grid runs heaviest first.
    fn block_index(&self, k: &mut Kernel, n: u32, heaviest: Heaviest) -> Value {
        match heaviest {
            Heaviest::Last if self.heavy_first => {
                let last = common::c32(k, n as usize - 1);
                k.named("reversed").sub(&last, &self.block)
            }
            _ => self.block.clone(),
        }
    }
}

/// The finished kernel `k` named `name` on `grid`, with `tuning`'s warps and stages.
fn launch_grid(name: String, k: Kernel, grid: [u32; 3], tuning: &FlashTuning) -> TritonCall {
    TritonCall { name, ir: k.finish(), grid, num_warps: tuning.num_warps, num_stages: tuning.num_stages }
}

#[cfg(test)]
mod tests;
