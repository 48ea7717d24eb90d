//! `y = gelu(x + b)` (GELU's tanh form) over `x: [N, C]` (any leading shape, flattened) with `b: [C]`, as two
//! Triton kernels generated per shape signature, computing in f32:
//!
//! - the forward reads `x` in its own type (the bf16 a matmul wrote, say) and writes `y` in the output type (the
//!   bf16 the next matmul reads): nothing else is kept for the backward, which recomputes `x + b`;
//! - the backward reads `x` and `dy`, writes `dx = dy · gelu'(x + b)` in `x`'s type and keeps each program's
//!   share of `db = Σ dx` (before rounding) in registers, written once as a row of `[programs, C]` partial sums
//!   that the caller adds up.
//!
//! A program takes a block of `R` rows by `BC` columns; the backward's programs each walk a strided set of row
//! blocks of one column block. tanh is written with `exp2`, which every Triton lowers.

use lazuli_hlo::{GELU_A, GELU_K};

use super::tile::{store_row, strided_blocks, Blocking, Tile};
use super::ttir::{Kernel, Scalar, Value};
use super::TritonCall;

/// One bias-GELU signature.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct BiasGeluSpec {
    pub rows: usize,
    pub cols: usize,
    /// Element types of `x` (and `dx`), of `b`, and of `y` (and `dy`).
    pub x: Scalar,
    pub bias: Scalar,
    pub y: Scalar,
}

/// Columns per block, at most; a block holds about 4,096 elements.
const BLOCK_COLS: usize = 256;
/// Programs of the backward, about: at GPT-2's MLP each walks two blocks of rows. Measured on an H200 against
/// 1,024 and 6,144, and against software pipelining, which did not pay (perf log, 2026-12-02).
const BACKWARD_PROGRAMS: usize = 3072;

impl BiasGeluSpec {
    pub fn blocking(&self) -> Blocking {
        Blocking::new(self.rows, self.cols, BLOCK_COLS, 4096)
    }

    /// Rounds each backward program walks, and the backward's programs per column block.
    fn rounds(&self) -> usize {
        let b = self.blocking();
        (b.row_blocks() * b.col_blocks()).div_ceil(BACKWARD_PROGRAMS).max(1)
    }

    pub fn backward_programs(&self) -> usize {
        self.blocking().row_blocks().div_ceil(self.rounds())
    }

    /// Why the kernels do not take this signature (`None`: they do).
    pub fn unsupported(&self) -> Option<String> {
        let floats = [self.x, self.bias, self.y].iter().all(|s| s.is_float());
        self.blocking().unsupported().or_else(|| (!floats).then(|| "the bias-GELU kernels take float tensors".into()))
    }

    fn name(&self, what: &str) -> String {
        let (x, b, y) = (self.x.mlir(), self.bias.mlir(), self.y.mlir());
        format!("lazuli_bias_gelu_{what}_{}x{}_{x}_{b}_{y}", self.rows, self.cols)
    }
}

/// `x + b` as f32 `[R, BC]`.
fn biased(k: &mut Kernel, tile: &Tile, x_arg: &Value, b_arg: &Value) -> Value {
    let x = tile.load(k, x_arg, "x");
    let b = tile.load_vector(k, b_arg, "b");
    let b = k.as_row(&b, x.shape()[0]);
    k.named("u").add(&x, &b)
}

/// `c · v` elementwise, for a float constant `c`.
fn times(k: &mut Kernel, v: &Value, c: f64) -> Value {
    let c = k.full_float(Scalar::F32, v.shape(), c);
    k.mul(v, &c)
}

fn plus(k: &mut Kernel, v: &Value, c: f64) -> Value {
    let c = k.full_float(Scalar::F32, v.shape(), c);
    k.add(v, &c)
}

/// `tanh(√(2/π) (u + 0.044715 u³))`, as `1 - 2 / (e^{2z} + 1)`: ±1 where `e^{2z}` overflows or vanishes.
fn inner_tanh(k: &mut Kernel, u: &Value) -> Value {
    let u2 = k.mul(u, u);
    let u3 = k.mul(&u2, u);
    let cubic = times(k, &u3, GELU_A);
    let inner = k.add(u, &cubic);
    let two_z_log2e = times(k, &inner, 2.0 * GELU_K * std::f64::consts::LOG2_E);
    let e = k.math("exp2", &two_z_log2e);
    let e1 = plus(k, &e, 1.0);
    let two = k.full_float(Scalar::F32, u.shape(), 2.0);
    let frac = k.div(&two, &e1);
    let one = k.full_float(Scalar::F32, u.shape(), 1.0);
    k.named("t").sub(&one, &frac)
}

/// The forward: operands `x, b`, result `y`.
pub fn forward(spec: &BiasGeluSpec) -> TritonCall {
    let name = spec.name("fwd");
    let mut k = Kernel::new(&name);
    let x_arg = k.ptr_arg("x", spec.x);
    let b_arg = k.ptr_arg("b", spec.bias);
    let y_arg = k.ptr_arg("y", spec.y);
    let rb = k.named("rb").program_id(0);
    let cb = k.named("cb").program_id(1);
    let blk = spec.blocking().tile(&mut k, &rb, &cb);
    let u = biased(&mut k, &blk, &x_arg, &b_arg);
    let t = inner_tanh(&mut k, &u);
    let half_u = times(&mut k, &u, 0.5);
    let one_t = plus(&mut k, &t, 1.0);
    let y = k.named("y").mul(&half_u, &one_t);
    blk.store(&mut k, &y_arg, &y);
    TritonCall {
        name,
        ir: k.finish(),
        grid: [spec.blocking().row_blocks() as u32, spec.blocking().col_blocks() as u32, 1],
        num_warps: 4,
        num_stages: 1,
    }
}

/// The backward: operands `x, b, dy`, results `dx` and the partial sums of `db`, f32 `[programs, C]`.
pub fn backward(spec: &BiasGeluSpec) -> TritonCall {
    let name = spec.name("bwd");
    let mut k = Kernel::new(&name);
    let x_arg = k.ptr_arg("x", spec.x);
    let b_arg = k.ptr_arg("b", spec.bias);
    let dy_arg = k.ptr_arg("dy", spec.y);
    let dx_arg = k.ptr_arg("dx", spec.x);
    let db_arg = k.ptr_arg("db_part", Scalar::F32);
    let programs = spec.backward_programs();
    let pid = k.named("pid").program_id(0);
    let cb = k.named("cb").program_id(1);
    let db0 = k.named("db_acc").full_float(Scalar::F32, &[spec.blocking().block_cols], 0.0);
    let acc = strided_blocks(&mut k, (&pid, programs, spec.rounds()), &[db0], |k, rb, acc| {
        let blk = spec.blocking().tile(k, rb, &cb);
        let u = biased(k, &blk, &x_arg, &b_arg);
        let dy = blk.load(k, &dy_arg, "dy");
        // gelu'(u) = 0.5 (1 + t) + 0.5 u (1 - t²) √(2/π) (1 + 3 · 0.044715 u²)
        let t = inner_tanh(k, &u);
        let one_t = plus(k, &t, 1.0);
        let left = times(k, &one_t, 0.5);
        let t2 = k.mul(&t, &t);
        let one = k.full_float(Scalar::F32, t.shape(), 1.0);
        let sech2 = k.sub(&one, &t2);
        let u2 = k.mul(&u, &u);
        let dinner = times(k, &u2, 3.0 * GELU_A * GELU_K);
        let dinner = plus(k, &dinner, GELU_K);
        let half_u = times(k, &u, 0.5);
        let right = k.mul(&half_u, &sech2);
        let right = k.mul(&right, &dinner);
        let slope = k.add(&left, &right);
        let dx = k.named("dx").mul(&dy, &slope);
        blk.store(k, &dx_arg, &dx);
        // Masked elements loaded dy = 0, so they add nothing.
        let db_rows = k.reduce(&dx, 0, super::ttir::Reduction::Sum);
        vec![k.add(&acc[0], &db_rows)]
    });
    // Row `pid` of the partial sums, at this column block.
    let blk = spec.blocking().tile(&mut k, &pid, &cb);
    store_row(&mut k, &db_arg, (&pid, spec.cols), (&blk.cols, &blk.col_ok), &acc[0]);
    TritonCall {
        name,
        ir: k.finish(),
        grid: [programs as u32, spec.blocking().col_blocks() as u32, 1],
        num_warps: 4,
        num_stages: 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpt2() -> BiasGeluSpec {
        BiasGeluSpec { rows: 8192, cols: 3072, x: Scalar::BF16, bias: Scalar::F32, y: Scalar::BF16 }
    }

    #[test]
    fn the_calls_are_well_formed_for_the_gpt2_shape() {
        let spec = gpt2();
        let b = spec.blocking();
        assert_eq!((b.block_rows, b.block_cols, b.row_blocks(), b.col_blocks()), (16, 256, 512, 12));
        assert_eq!((spec.rounds(), spec.backward_programs()), (2, 256));
        let f = forward(&spec);
        f.validate(2, 1).expect("forward");
        assert_eq!(f.grid, [512, 12, 1]);
        assert!(f.ir.contains("math.exp2") && f.ir.contains("arith.truncf"), "{}", f.ir);
        let b = backward(&spec);
        b.validate(3, 2).expect("backward");
        assert_eq!(b.grid, [256, 12, 1]);
        assert!(b.ir.contains("scf.for") && b.ir.contains("\"tt.reduce\""), "{}", b.ir);
    }

    #[test]
    fn small_and_ragged_shapes_are_masked_or_refused() {
        let spec = BiasGeluSpec { rows: 3, cols: 100, x: Scalar::F32, bias: Scalar::F32, y: Scalar::F32 };
        let b = spec.blocking();
        assert_eq!((b.block_rows, b.block_cols, b.row_blocks(), b.col_blocks()), (4, 128, 1, 1));
        forward(&spec).validate(2, 1).expect("forward");
        backward(&spec).validate(3, 2).expect("backward");
        let huge = BiasGeluSpec { rows: 1 << 20, cols: 4096, ..spec.clone() };
        assert!(huge.unsupported().expect("too many").contains("32-bit"));
        let ints = BiasGeluSpec { x: Scalar::I32, ..spec };
        assert!(ints.unsupported().expect("ints").contains("float"));
    }
}
