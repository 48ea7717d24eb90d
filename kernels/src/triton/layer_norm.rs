//! Layer normalization with scale and shift over the last axis of `x: [N, D]` (any leading shape, flattened) as
//! two Triton kernels, generated per shape signature:
//!
//! - the forward normalizes a block of rows per program and writes `y = (x - mean) · rstd · w + b` in the output
//!   type (the bf16 a following matmul reads, say) and each row's `mean` and `rstd = 1/√(var + eps)` in f32, which
//!   is all the backward needs: no normalized copy of `x` is kept;
//! - the backward walks a strided set of row blocks per program, writes `dx` and accumulates the program's share
//!   of `dw = Σ dy · x̂` and `db = Σ dy` in registers, written once as one row of `[programs, 2, D]` partial
//!   sums that the caller adds up in one reduction: the two column sums cost no pass of their own over `[N, D]`.
//!
//! With an added tensor (`LayerNormSpec::added`, and perhaps a bias along the last axis added with it), the
//! forward first adds it to `x` and also writes that sum, in `x`'s type: a residual stream's `x + f(x)` and the
//! layer norm after it in one pass (the sum is what the next residual add reads). Its backward is the plain one on
//! the sum that also adds the sum's own cotangent to `dx`, writes the total in `x`'s type and the addend's, and
//! sums the bias's columns beside `dw`'s and `db`'s.
//!
//! Everything is computed in f32. Rows are padded to the next power of two and masked, so any `D` up to
//! [`MAX_D`] works; row blocks past `N` are masked too.

use super::tile::{first_of, indices, load_vector, store_row, strided_blocks, Tile};
use super::ttir::{Kernel, Reduction, Scalar, Value};
use super::TritonCall;

/// The widest row a program holds in registers.
pub const MAX_D: usize = 16384;

/// One layer-norm signature: what a generated kernel is specialized to.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct LayerNormSpec {
    /// Rows (the product of the leading dimensions) and the normalized width.
    pub rows: usize,
    pub width: usize,
    /// Element types of `x` (and `dx`), of `w` and `b`, and of `y` (and `dy`).
    pub x: Scalar,
    pub params: Scalar,
    pub y: Scalar,
    /// `f64::to_bits` of epsilon.
    pub eps_bits: u64,
    /// The element type of a tensor of `x`'s shape that the forward adds to `x` before normalizing (and writes the
    /// sum of, in `x`'s type); `None` for the plain layer norm.
    pub added: Option<Scalar>,
    /// The element type of a bias `[D]` added with it (a linear layer's, whose product is the added tensor).
    pub added_bias: Option<Scalar>,
}

impl LayerNormSpec {
    pub fn eps(&self) -> f64 {
        f64::from_bits(self.eps_bits)
    }

    /// The row padded to a power of two.
    pub fn block_d(&self) -> usize {
        self.width.next_power_of_two()
    }

    /// Rows per block, in both kernels: a block of about 1,024 elements, one row at GPT-2's width. In the GPT-2 step
    /// on an H200 (perf log #45), one row on one warp took the added form's forward from 22 to 19 µs a call against
    /// four rows on four warps, and its backward from 37 to 28.5 µs against one row on four warps; two rows, two
    /// warps, or 512 and 4,096 backward programs were slower.
    pub fn block_rows(&self) -> usize {
        (1024 / self.block_d()).clamp(1, 16)
    }

    /// Row blocks: one program each in the forward; the backward's programs each walk every `programs`-th block.
    pub fn blocks(&self) -> usize {
        self.rows.div_ceil(self.block_rows())
    }

    pub fn backward_programs(&self) -> usize {
        self.blocks().min(BACKWARD_PROGRAMS)
    }

    /// Column sums the backward's programs write a share of: `dw`, `db` and, in the added form with a bias, the
    /// bias's.
    pub fn backward_sums(&self) -> usize {
        if self.added_bias.is_some() {
            3
        } else {
            2
        }
    }

    /// Warps per program: about 32 elements of a block per thread (one warp at GPT-2's width), at most 8.
    fn num_warps(&self) -> u32 {
        (self.block_d() * self.block_rows() / 1024).clamp(1, 8) as u32
    }

    /// Why the kernels do not take this signature (`None`: they do).
    pub fn unsupported(&self) -> Option<String> {
        if self.width == 0 || self.rows == 0 {
            return Some("an empty tensor".into());
        }
        if self.width > MAX_D {
            return Some(format!("rows of {} elements are wider than the kernel's {MAX_D}", self.width));
        }
        if self.rows.checked_mul(self.width).is_none_or(|n| n > i32::MAX as usize) {
            return Some(format!("{} × {} elements do not fit 32-bit offsets", self.rows, self.width));
        }
        let floats =
            [self.x, self.params, self.y].iter().chain(&self.added).chain(&self.added_bias).all(|s| s.is_float());
        (!floats).then(|| "the layer-norm kernels take float tensors".into())
    }

    fn name(&self, what: &str) -> String {
        let op = if self.added.is_some() { "add_layer_norm" } else { "layer_norm" };
        let added = match (self.added, self.added_bias) {
            (Some(a), Some(c)) => format!("_{}_bias_{}", a.mlir(), c.mlir()),
            (Some(a), None) => format!("_{}", a.mlir()),
            _ => String::new(),
        };
        let (x, p, y) = (self.x.mlir(), self.params.mlir(), self.y.mlir());
        format!("lazuli_{op}_{what}_{}x{}_{x}{added}_{p}_{y}", self.rows, self.width)
    }

    /// The same signature without the added tensor: the backward's (it reads the sum as its `x`).
    pub fn plain(&self) -> LayerNormSpec {
        LayerNormSpec { added: None, added_bias: None, ..self.clone() }
    }
}

/// Programs of the backward: each walks eight one-row blocks at GPT-2's size. Measured on an H200 against 512 and
/// 2,048, and against software pipelining (`num_stages` 2 and 3), which did not pay (perf logs, 2026-12-02).
const BACKWARD_PROGRAMS: usize = 1024;

/// The block of `rows` rows starting at row `first` (an i32 scalar), whole rows padded to a power of two.
fn rows_at(k: &mut Kernel, spec: &LayerNormSpec, first: &Value, rows: usize) -> Tile {
    let zero = k.const_i32(0);
    Tile::at(k, (first, rows, spec.rows), (&zero, spec.block_d(), spec.width))
}

/// `w` or `b` as f32 `[D']` (0 past the width).
fn load_params(k: &mut Kernel, spec: &LayerNormSpec, arg: &Value, name: &str) -> Value {
    let zero = k.const_i32(0);
    let (cols, col_ok) = indices(k, &zero, spec.block_d(), spec.width, "cols");
    load_vector(k, arg, &cols, &col_ok, name)
}

/// Each row's sum divided by the width: `[R, D'] → [R]`.
fn row_mean(k: &mut Kernel, spec: &LayerNormSpec, v: &Value) -> Value {
    let s = k.reduce(v, 1, Reduction::Sum);
    let n = k.full_float(Scalar::F32, s.shape(), spec.width as f64);
    k.div(&s, &n)
}

/// The forward: operands `x, w, b`, results `y, mean, rstd` (`mean` and `rstd` f32 `[N]`). With an added tensor:
/// operands `x, a, [c,] w, b`, results `y, mean, rstd, x + a [+ c]` (the sum in `x`'s type, and normalized as
/// rounded to it).
pub fn forward(spec: &LayerNormSpec) -> TritonCall {
    let name = spec.name("fwd");
    let mut k = Kernel::new(&name);
    let x_arg = k.ptr_arg("x", spec.x);
    let added_arg = spec.added.map(|a| k.ptr_arg("a", a));
    let bias_arg = spec.added_bias.map(|c| k.ptr_arg("c", c));
    let w_arg = k.ptr_arg("w", spec.params);
    let b_arg = k.ptr_arg("b", spec.params);
    let y_arg = k.ptr_arg("y", spec.y);
    let mean_arg = k.ptr_arg("mean", Scalar::F32);
    let rstd_arg = k.ptr_arg("rstd", Scalar::F32);
    let sum_arg = spec.added.map(|_| k.ptr_arg("sum", spec.x));
    let (r, d) = (spec.block_rows(), spec.block_d());

    let pid = k.program_id(0);
    let block_rows = k.const_i32(r as i32);
    let first = k.named("first").mul(&pid, &block_rows);
    let blk = rows_at(&mut k, spec, &first, r);
    let mut x = blk.load(&mut k, &x_arg, "x");
    if let (Some(a_arg), Some(sum_arg)) = (&added_arg, &sum_arg) {
        let mut a = blk.load(&mut k, a_arg, "a");
        if let Some(c_arg) = &bias_arg {
            let c = load_params(&mut k, spec, c_arg, "c");
            let c = k.as_row(&c, r);
            a = k.add(&a, &c);
        }
        let sum = k.named("sum").add(&x, &a);
        blk.store(&mut k, sum_arg, &sum);
        // Normalize the sum as stored, so that the backward (which reads it) sees the same values.
        let rounded = k.convert(&sum, spec.x);
        x = k.convert(&rounded, Scalar::F32);
    }
    let mean = row_mean(&mut k, spec, &x);
    let mean_col = k.as_column(&mean, d);
    let centered = k.sub(&x, &mean_col);
    let zero = k.full_float(Scalar::F32, &[r, d], 0.0);
    let centered = k.named("xc").select(&blk.ok, &centered, &zero);
    let squares = k.mul(&centered, &centered);
    let var = row_mean(&mut k, spec, &squares);
    let eps = k.full_float(Scalar::F32, &[r], spec.eps());
    let var_eps = k.add(&var, &eps);
    let rstd = k.named("rstd").math("rsqrt", &var_eps);
    let rstd_col = k.as_column(&rstd, d);
    let xhat = k.named("xhat").mul(&centered, &rstd_col);
    let w = load_params(&mut k, spec, &w_arg, "w");
    let b = load_params(&mut k, spec, &b_arg, "b");
    let w = k.as_row(&w, r);
    let b = k.as_row(&b, r);
    let scaled = k.mul(&xhat, &w);
    let y = k.named("y").add(&scaled, &b);
    blk.store(&mut k, &y_arg, &y);
    blk.store_rows(&mut k, &mean_arg, &mean);
    blk.store_rows(&mut k, &rstd_arg, &rstd);

    TritonCall { name, ir: k.finish(), grid: [spec.blocks() as u32, 1, 1], num_warps: spec.num_warps(), num_stages: 1 }
}

/// The backward: operands `x, w, dy, mean, rstd`, results `dx` and the partial sums of `dw` and `db`, f32
/// `[programs, 2, D]` (`[p, 0]` is program `p`'s share of `dw`, `[p, 1]` of `db`; the caller sums over `p`, in
/// one reduction for both).
///
/// The added form's (a spec with `added`): the joint gradient of the sum and the layer norm of it. Operands `x`
/// (the sum), `w, dy, mean, rstd` and `ds`, the sum's own cotangent (in `x`'s type); results `dx + ds` (the
/// cotangent of `x` and of the addend, in `x`'s type), the same in the addend's type, and the partial sums
/// `[programs, 2 or 3, D]`, the third row the addend's bias's (the column sums of `dx + ds`). The add, the
/// rounding and the bias's sums are then not passes of their own over the cotangent.
pub fn backward(spec: &LayerNormSpec) -> TritonCall {
    let name = spec.name("bwd");
    let mut k = Kernel::new(&name);
    let x_arg = k.ptr_arg("x", spec.x);
    let w_arg = k.ptr_arg("w", spec.params);
    let dy_arg = k.ptr_arg("dy", spec.y);
    let mean_arg = k.ptr_arg("mean", Scalar::F32);
    let rstd_arg = k.ptr_arg("rstd", Scalar::F32);
    let ds_arg = spec.added.map(|_| k.ptr_arg("ds", spec.x));
    let dx_arg = k.ptr_arg("dx", spec.x);
    let da_arg = spec.added.map(|a| k.ptr_arg("da", a));
    let part_arg = k.ptr_arg("dw_db_part", Scalar::F32);
    let sums = spec.backward_sums();
    let (r, d) = (spec.block_rows(), spec.block_d());
    let programs = spec.backward_programs();
    let rounds = spec.blocks().div_ceil(programs);

    let pid = k.program_id(0);
    let w = load_params(&mut k, spec, &w_arg, "w");
    let w = k.as_row(&w, r);
    let names = ["dw_acc", "db_acc", "dc_acc"];
    let inits: Vec<Value> = names[..sums].iter().map(|n| k.named(n).full_float(Scalar::F32, &[d], 0.0)).collect();
    let acc = strided_blocks(&mut k, (&pid, programs, rounds), &inits, |k, block, acc| {
        let first = first_of(k, block, r);
        let blk = rows_at(k, spec, &first, r);
        let x = blk.load(k, &x_arg, "x");
        let dy = blk.load(k, &dy_arg, "dy");
        let mean = blk.load_rows(k, &mean_arg, "mean");
        let rstd = blk.load_rows(k, &rstd_arg, "rstd");
        let mean_col = k.as_column(&mean, d);
        let rstd_col = k.as_column(&rstd, d);
        let centered = k.sub(&x, &mean_col);
        let xhat = k.mul(&centered, &rstd_col);
        let zero = k.full_float(Scalar::F32, &[r, d], 0.0);
        let xhat = k.named("xhat").select(&blk.ok, &xhat, &zero);
        let wdy = k.named("wdy").mul(&dy, &w);
        // dx = rstd · (w·dy − x̂ · mean(x̂ · w·dy) − mean(w·dy)) per row.
        let xw = k.mul(&xhat, &wdy);
        let c1 = row_mean(k, spec, &xw);
        let c2 = row_mean(k, spec, &wdy);
        let c1 = k.as_column(&c1, d);
        let c2 = k.as_column(&c2, d);
        let along = k.mul(&xhat, &c1);
        let along = k.add(&along, &c2);
        let inner = k.sub(&wdy, &along);
        let mut dx = k.named("dx").mul(&inner, &rstd_col);
        if let Some(ds_arg) = &ds_arg {
            let ds = blk.load(k, ds_arg, "ds");
            dx = k.named("dxs").add(&dx, &ds);
        }
        blk.store(k, &dx_arg, &dx);
        if let Some(da_arg) = &da_arg {
            blk.store(k, da_arg, &dx);
        }
        let dyx = k.mul(&dy, &xhat);
        let mut rows = vec![k.reduce(&dyx, 0, Reduction::Sum), k.reduce(&dy, 0, Reduction::Sum)];
        if sums == 3 {
            rows.push(k.reduce(&dx, 0, Reduction::Sum));
        }
        acc.iter().zip(&rows).map(|(a, v)| k.add(a, v)).collect()
    });
    // Row `pid` of the partial sums, `[sums, D]`: dw's, db's, then the addend's bias's.
    let row = first_of(&mut k, &pid, sums);
    let zero = k.const_i32(0);
    let (cols, col_ok) = indices(&mut k, &zero, spec.block_d(), spec.width, "cols");
    for (which, v) in acc.iter().enumerate() {
        let offset = k.const_i32(which as i32);
        let row = k.add(&row, &offset);
        store_row(&mut k, &part_arg, (&row, spec.width), (&cols, &col_ok), v);
    }
    TritonCall { name, ir: k.finish(), grid: [programs as u32, 1, 1], num_warps: spec.num_warps(), num_stages: 1 }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpt2() -> LayerNormSpec {
        LayerNormSpec {
            rows: 8192,
            width: 768,
            x: Scalar::F32,
            params: Scalar::F32,
            y: Scalar::BF16,
            eps_bits: 1e-5f64.to_bits(),
            added: None,
            added_bias: None,
        }
    }

    #[test]
    fn the_calls_are_well_formed_for_the_gpt2_shape() {
        let spec = gpt2();
        assert_eq!((spec.block_d(), spec.block_rows(), spec.blocks()), (1024, 1, 8192));
        assert_eq!((spec.backward_programs(), spec.num_warps()), (1024, 1));
        let f = forward(&spec);
        f.validate(3, 3).expect("forward");
        assert_eq!((f.grid, f.num_warps), ([8192, 1, 1], 1));
        let b = backward(&spec);
        b.validate(5, 2).expect("backward");
        assert_eq!(b.grid, [1024, 1, 1]);
        // The output is rounded to bf16 in the kernel; statistics are f32; the row is padded to 1024 and masked.
        assert!(f.ir.contains("arith.truncf") && f.ir.contains("!tt.ptr<bf16>"), "{}", f.ir);
        assert!(f.ir.contains("math.rsqrt"), "{}", f.ir);
        assert!(f.ir.contains("tt.make_range {end = 1024 : i32, start = 0 : i32}"), "{}", f.ir);
        assert!(f.ir.contains("arith.constant dense<768> : tensor<1024xi32>"), "{}", f.ir);
        // Eight rounds of 1,024 programs over 8,192 one-row blocks, two column sums carried.
        assert!(b.ir.contains("scf.for") && b.ir.contains("arith.constant 8 : i32"), "{}", b.ir);
        assert_eq!(b.ir.matches("\"tt.reduce\"").count(), 4, "{}", b.ir);
    }

    #[test]
    fn the_added_form_writes_the_sum_and_normalizes_it() {
        let spec = LayerNormSpec { added: Some(Scalar::BF16), ..gpt2() };
        let f = forward(&spec);
        f.validate(4, 4).expect("forward");
        assert_eq!(f.name, "lazuli_add_layer_norm_fwd_8192x768_f32_bf16_f32_bf16");
        // The bf16 increment is widened and added; the sum is stored as f32, then normalized.
        let add = f.ir.find("= arith.addf").expect("the sum");
        assert!(f.ir[..add].contains("%sum_") && f.ir[..add].contains("tt.load"), "{}", f.ir);
        assert!(f.ir[add..].contains("tt.reduce"), "{}", f.ir);
        assert_eq!(f.ir.matches("tt.store").count(), 4, "{}", f.ir);
        // The plain backward's text does not change; the added form's reads the sum's cotangent, adds it to dx
        // and writes the total twice (in x's and the addend's types).
        assert_eq!(backward(&spec.plain()).ir, backward(&gpt2()).ir);
        let joint = backward(&spec);
        joint.validate(6, 3).expect("joint backward");
        assert!(joint.ir.contains("%ds_") && joint.ir.contains("%dxs_"), "{}", joint.ir);
        assert_eq!(joint.ir.matches("tt.store").count(), backward(&gpt2()).ir.matches("tt.store").count() + 1);
        let with_bias = backward(&LayerNormSpec { added_bias: Some(Scalar::F32), ..spec.clone() });
        with_bias.validate(6, 3).expect("joint backward with a bias");
        // A third column sum carried (the bias's), and a third row of partial sums written.
        assert_eq!(with_bias.ir.matches("\"tt.reduce\"").count(), 5, "{}", with_bias.ir);
        assert!(with_bias.ir.contains("%dc_acc"), "{}", with_bias.ir);
        assert!(!forward(&gpt2()).ir.contains("%sum_"));
        // A linear layer's bias is added with its product.
        let biased = forward(&LayerNormSpec { added_bias: Some(Scalar::F32), ..spec.clone() });
        biased.validate(5, 4).expect("biased");
        assert_eq!(biased.name, "lazuli_add_layer_norm_fwd_8192x768_f32_bf16_bias_f32_f32_bf16");
        assert_eq!(biased.ir.matches("arith.addf").count(), f.ir.matches("arith.addf").count() + 1, "{}", biased.ir);
        // An f16 residual stream is normalized as rounded: a round trip after the add.
        let f16 = forward(&LayerNormSpec { x: Scalar::F16, ..spec });
        let add = f16.ir.find("= arith.addf").expect("the sum");
        assert!(f16.ir[add..].contains("arith.truncf") && f16.ir[add..].contains("arith.extf"), "{}", f16.ir);
    }

    #[test]
    fn ragged_and_wide_rows_get_masks_or_are_refused() {
        let mut spec = gpt2();
        spec.rows = 7;
        spec.width = 100;
        assert_eq!((spec.block_d(), spec.block_rows(), spec.blocks()), (128, 8, 1));
        forward(&spec).validate(3, 3).expect("forward");
        backward(&spec).validate(5, 2).expect("backward");
        spec.width = MAX_D + 1;
        assert!(spec.unsupported().expect("too wide").contains("wider"));
        spec.width = 4096;
        spec.rows = 1 << 20;
        assert!(spec.unsupported().expect("too many").contains("32-bit"));
        spec.rows = 4;
        spec.x = Scalar::I32;
        assert!(spec.unsupported().expect("ints").contains("float"));
    }
}
