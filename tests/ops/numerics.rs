//! The numeric edge cases of `docs/numerics.md` on the real CPU plugin: NaN through max/min (reductions,
//! elementwise, clamp, pooling) and their gradients, float → integer conversion, integer division and overflow,
//! comparisons with NaN, and argmax/argmin with NaN. Each result is checked against values written here and
//! against the reference interpreter. CI runs this file on both CPU plugins.

use lazuli::{DType, Tensor};

const FLOATS: [DType; 4] = [DType::F32, DType::F64, DType::F16, DType::BF16];
const NAN: f64 = f64::NAN;
const INF: f64 = f64::INFINITY;

/// Results of one program, each with the values it must have.
#[derive(Default)]
struct Checks(Vec<(String, Tensor, Vec<f64>, Vec<f64>)>);

impl Checks {
    /// Record `got`, which must equal `want` on the device and in the reference interpreter (evaluated now: it
    /// needs the pending graph).
    fn push(&mut self, name: impl Into<String>, got: Tensor, want: &[f64]) {
        let name = name.into();
        let reference = got.evaluate_reference().unwrap_or_else(|e| panic!("{name}: reference: {e}"));
        self.0.push((name, got, want.to_vec(), reference.iter().copied().collect()));
    }

    /// Run everything as one program and compare: bit-for-bit as f64, NaN equal to NaN.
    #[track_caller]
    fn run(self) {
        lazuli::sync().unwrap();
        for (name, got, want, reference) in self.0 {
            let device = got.to_f64_vec().unwrap();
            assert_same(&format!("{name} ({}) on the device", got.dtype()), &device, &want);
            assert_same(&format!("{name} ({}) in the reference", got.dtype()), &reference, &want);
        }
    }
}

#[track_caller]
fn assert_same(what: &str, got: &[f64], want: &[f64]) {
    let same = got.len() == want.len() && got.iter().zip(want).all(|(g, w)| g == w || (g.is_nan() && w.is_nan()));
    assert!(same, "{what}:\n got {got:?}\nwant {want:?}");
}

/// A tensor of `dtype` holding `v` (rounded to it; NaN and ±inf stay).
fn of(dtype: DType, v: &[f64], dims: &[usize]) -> Tensor {
    Tensor::from_slice(v, dims).to_dtype(dtype)
}

#[test]
fn max_and_min_reductions_propagate_nan() {
    let mut c = Checks::default();
    for dt in FLOATS {
        let x = of(dt, &[1.0, NAN, 3.0, -2.0, 5.0, 0.5, 7.0, 1.0, NAN, NAN, -INF, INF], &[3, 4]);
        c.push(format!("max rows {dt}"), x.max(&[1]), &[NAN, 7.0, NAN]);
        c.push(format!("min rows {dt}"), x.min(&[1]), &[NAN, 0.5, NAN]);
        c.push(format!("max columns {dt}"), x.max(&[0]), &[NAN, NAN, 7.0, INF]);
        c.push(format!("min columns {dt}"), x.min(&[0]), &[NAN, NAN, -INF, -2.0]);
        c.push(format!("max all {dt}"), x.max(&[0, 1]), &[NAN]);
        c.push(format!("max kept {dt}"), x.max_keepdim(&[1]), &[NAN, 7.0, NAN]);
        // 2×2 windows of a 4×4 image with one NaN: only its window is NaN.
        let img: Vec<f64> = (0..16).map(|i| if i == 6 { NAN } else { i as f64 }).collect();
        c.push(
            format!("max_pool2d {dt}"),
            of(dt, &img, &[1, 1, 4, 4]).max_pool2d([2, 2], [2, 2]),
            &[5.0, NAN, 13.0, 15.0],
        );
    }
    // Rows long enough for a vectorized loop, one NaN in one row.
    let long: Vec<f64> = (0..8 * 1000).map(|i| if i == 3 * 1000 + 517 { NAN } else { (i % 1000) as f64 }).collect();
    let x = of(DType::F32, &long, &[8, 1000]);
    let mut want = vec![999.0; 8];
    want[3] = NAN;
    c.push("max long rows", x.max(&[1]), &want);
    let mut want = vec![0.0; 8];
    want[3] = NAN;
    c.push("min long rows", x.min(&[1]), &want);
    c.run();
}

/// Sums of f16 and bf16 accumulate in f32 and round once: 4,096 ones give 4,096, where a running sum in the
/// element type stops at 2,048 (f16) or 256 (bf16). The gradient of a broadcast (a bias's) is such a sum, and
/// so is each output of a cumulative sum.
#[test]
fn sixteen_bit_sums_accumulate_in_f32() {
    let mut c = Checks::default();
    for dt in [DType::F16, DType::BF16] {
        let ones = of(dt, &[1.0; 4096], &[4096]);
        c.push(format!("sum {dt}"), ones.sum(&[0]), &[4096.0]);
        // A running sum in the element type loses the half: `-big - 0.5` rounds to `-big`, then `+ big` gives 0.
        let big = if dt == DType::BF16 { 256.0 } else { 2048.0 };
        let x = of(dt, &[-big, -0.5, big], &[3]);
        c.push(format!("cumsum {dt}"), x.cumsum(0), &[-big, -big, -0.5]);
        // A pool's window sum too: the window [-big, -0.5, big] averages to -0.5 / 3.
        let x = of(dt, &[-big, -0.5, big], &[1, 1, 1, 3]);
        c.push(format!("avg_pool2d {dt}"), x.avg_pool2d([1, 3], [1, 3]), &[dt.round(-0.5 / 3.0)]);
        // The gradient of a cumulative sum is the running sum of the cotangent from the end.
        let x = of(dt, &[1.0, 2.0, 3.0], &[3]).requires_grad();
        let w = of(dt, &[big, -0.5, -big], &[3]);
        let dx = lazuli::grad(&(x.cumsum(0) * &w).to_dtype(DType::F32).sum_all(), &[&x]).remove(0);
        c.push(format!("cumsum's gradient {dt}"), dx, &[-0.5, -big, -big]);
        c.push(format!("sum kept {dt}"), of(dt, &[1.0; 4096], &[2048, 2]).sum_keepdim(&[0]), &[2048.0, 2048.0]);
        let bias = of(dt, &[0.5, -0.5], &[2]).requires_grad();
        let y = of(dt, &[0.25; 8192], &[4096, 2]) + &bias;
        let db = lazuli::grad(&y.to_dtype(DType::F32).sum_all(), &[&bias]).remove(0);
        c.push(format!("d bias {dt}"), db, &[4096.0, 4096.0]);
    }
    c.run();
}

#[test]
fn maximum_minimum_clamp_and_relu_propagate_nan() {
    let mut c = Checks::default();
    for dt in FLOATS {
        let a = of(dt, &[NAN, 1.0, NAN, 2.0, -INF], &[5]);
        let b = of(dt, &[1.0, NAN, NAN, 3.0, NAN], &[5]);
        c.push(format!("maximum {dt}"), a.maximum(&b), &[NAN, NAN, NAN, 3.0, NAN]);
        c.push(format!("minimum {dt}"), a.minimum(&b), &[NAN, NAN, NAN, 2.0, NAN]);
        c.push(format!("clamp {dt}"), a.clamp(0.0, 1.5), &[NAN, 1.0, NAN, 1.5, 0.0]);
        c.push(format!("clamp to NaN {dt}"), b.clamp(NAN, 2.0), &[NAN; 5]);
        c.push(format!("relu {dt}"), a.relu(), &[NAN, 1.0, NAN, 2.0, 0.0]);
    }
    c.run();
}

#[test]
fn gradients_of_max_and_min_are_nan_at_a_nan() {
    let mut c = Checks::default();
    for dt in [DType::F32, DType::F64] {
        // A reduction: a NaN element's derivative is NaN; a NaN result does not depend on the numbers (0).
        let x = of(dt, &[1.0, NAN, 3.0, NAN, 2.0, 4.0, 0.0, 4.0], &[2, 4]).requires_grad();
        let w = of(dt, &[2.0, 3.0], &[2]);
        for (name, out) in [("max", x.max(&[1])), ("min", x.min(&[1]))] {
            let loss = (&out * &w).sum_all();
            let dx = lazuli::grad(&loss, &[&x]).remove(0);
            let tie = if name == "max" { [0.0, 1.5, 0.0, 1.5] } else { [0.0, 0.0, 3.0, 0.0] };
            c.push(format!("d {name} {dt}"), dx, &[0.0, NAN, 0.0, NAN, tie[0], tie[1], tie[2], tie[3]]);
        }
        // Elementwise: to the operand the result came from, the left one on ties; NaN for a NaN operand.
        let a = of(dt, &[NAN, 1.0, NAN, 2.0, 5.0], &[5]).requires_grad();
        let b = of(dt, &[1.0, NAN, NAN, 2.0, 3.0], &[5]).requires_grad();
        let w = of(dt, &[1.0, 2.0, 3.0, 4.0, 5.0], &[5]);
        for (name, out) in [("maximum", a.maximum(&b)), ("minimum", a.minimum(&b))] {
            let loss = (&out * &w).sum_all();
            let d = lazuli::grad(&loss, &[&a, &b]);
            let (da, db) = if name == "maximum" {
                ([NAN, 0.0, NAN, 4.0, 5.0], [0.0, NAN, NAN, 0.0, 0.0])
            } else {
                ([NAN, 0.0, NAN, 4.0, 0.0], [0.0, NAN, NAN, 0.0, 5.0])
            };
            c.push(format!("d {name}/da {dt}"), d[0].clone(), &da);
            c.push(format!("d {name}/db {dt}"), d[1].clone(), &db);
        }
        // clamp is maximum then minimum: NaN at a NaN.
        let x = of(dt, &[NAN, -1.0, 0.5, 2.0], &[4]).requires_grad();
        let loss = (&x.clamp(0.0, 1.0) * &of(dt, &[1.0, 2.0, 3.0, 4.0], &[4])).sum_all();
        c.push(format!("d clamp {dt}"), lazuli::grad(&loss, &[&x]).remove(0), &[NAN, 0.0, 3.0, 0.0]);
        // relu keeps a NaN, but its gradient there is 0, as in JAX and PyTorch.
        let loss = (&x.relu() * &of(dt, &[1.0, 2.0, 3.0, 4.0], &[4])).sum_all();
        c.push(format!("d relu {dt}"), lazuli::grad(&loss, &[&x]).remove(0), &[0.0, 0.0, 3.0, 4.0]);
        // Max pooling: a NaN window's gradient is NaN at its first NaN.
        let img = of(dt, &[1.0, NAN, NAN, 0.0, 5.0, 4.0, 3.0, 2.0], &[1, 1, 2, 4]).requires_grad();
        let loss = (&img.max_pool2d([2, 2], [2, 2]) * &of(dt, &[2.0, 3.0], &[1, 1, 1, 2])).sum_all();
        let d = lazuli::grad(&loss, &[&img]).remove(0);
        c.push(format!("d max_pool2d {dt}"), d, &[0.0, NAN, NAN, 0.0, 0.0, 0.0, 0.0, 0.0]);
    }
    c.run();
}

#[test]
fn float_to_integer_conversion_truncates_saturates_and_maps_nan_to_zero() {
    let (i32_max, i32_min) = (i32::MAX as f64, i32::MIN as f64);
    let (i64_max, i64_min, u32_max, u64_max) = (i64::MAX as f64, i64::MIN as f64, u32::MAX as f64, u64::MAX as f64);
    let mut c = Checks::default();
    // Values that truncate alike in f32 and f64 (3e9 is exactly an f32).
    let x = [2.9, -2.9, 255.5, 256.0, -1.0, 3e9, -3e9, 1e20, -1e20, INF, -INF, NAN, -0.0];
    let table: [(DType, [f64; 13]); 6] = [
        (DType::U8, [2.0, 0.0, 255.0, 255.0, 0.0, 255.0, 0.0, 255.0, 0.0, 255.0, 0.0, 0.0, 0.0]),
        (DType::I32, [2.0, -2.0, 255.0, 256.0, -1.0, i32_max, i32_min, i32_max, i32_min, i32_max, i32_min, 0.0, 0.0]),
        (DType::U32, [2.0, 0.0, 255.0, 256.0, 0.0, 3e9, 0.0, u32_max, 0.0, u32_max, 0.0, 0.0, 0.0]),
        (DType::I64, [2.0, -2.0, 255.0, 256.0, -1.0, 3e9, -3e9, i64_max, i64_min, i64_max, i64_min, 0.0, 0.0]),
        (DType::U64, [2.0, 0.0, 255.0, 256.0, 0.0, 3e9, 0.0, u64_max, 0.0, u64_max, 0.0, 0.0, 0.0]),
        (DType::Bool, [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0]),
    ];
    for from in [DType::F32, DType::F64] {
        let t = of(from, &x, &[x.len()]);
        for (to, want) in &table {
            c.push(format!("{from} -> {to}"), t.to_dtype(*to), want);
        }
    }
    // The bounds a float type cannot hold exactly: f32 has no 2^31 - 1, f64 no 2^63 - 1.
    let t = of(DType::F32, &[2147483520.0, 2147483648.0, -2147483648.0, -2147483904.0], &[4]);
    c.push("f32 -> i32 at the bounds", t.to_dtype(DType::I32), &[2147483520.0, i32_max, i32_min, i32_min]);
    let below = 9223372036854774784.0; // 2^63 - 1024, the largest f64 below 2^63
    let t = of(DType::F64, &[below, 9223372036854775808.0, -9223372036854775808.0], &[3]);
    c.push("f64 -> i64 at the bounds", t.to_dtype(DType::I64), &[below, i64_max, i64_min]);
    let t = of(DType::F64, &[2147483647.9, -2147483648.9, 18446744073709549568.0], &[3]);
    c.push("f64 -> i32 near the bounds", t.to_dtype(DType::I32), &[i32_max, i32_min, i32_max]);
    // f16 reaches only ±65504, so i32's bounds come from ±inf alone; bf16 holds 2^31 exactly.
    let t = of(DType::F16, &[300.0, -1.0, 65504.0, -65504.0, INF, -INF, NAN, 2.5], &[8]);
    c.push("f16 -> u8", t.to_dtype(DType::U8), &[255.0, 0.0, 255.0, 0.0, 255.0, 0.0, 0.0, 2.0]);
    c.push("f16 -> i32", t.to_dtype(DType::I32), &[300.0, -1.0, 65504.0, -65504.0, i32_max, i32_min, 0.0, 2.0]);
    c.push("f16 -> u64", t.to_dtype(DType::U64), &[300.0, 0.0, 65504.0, 0.0, u64_max, 0.0, 0.0, 2.0]);
    let t = of(DType::BF16, &[300.0, -1.0, 3e38, -3e38, INF, -INF, NAN, 2147483648.0], &[8]);
    c.push("bf16 -> u8", t.to_dtype(DType::U8), &[255.0, 0.0, 255.0, 0.0, 255.0, 0.0, 0.0, 255.0]);
    c.push("bf16 -> i32", t.to_dtype(DType::I32), &[300.0, -1.0, i32_max, i32_min, i32_max, i32_min, 0.0, i32_max]);
    c.push(
        "bf16 -> i64",
        t.to_dtype(DType::I64),
        &[300.0, -1.0, i64_max, i64_min, i64_max, i64_min, 0.0, 2147483648.0],
    );
    c.run();
}

/// Integer → integer conversion keeps the low bits (two's complement), as numpy, JAX and PyTorch do. The reference
/// interpreter sees values, not the operand's type, so it agrees only where the value fits the target type
/// (`docs/numerics.md`); out-of-range values are checked on the device alone.
#[test]
fn integer_narrowing_wraps() {
    let mut c = Checks::default();
    c.push("i32 -> u8 in range", Tensor::from_slice(&[0i32, 7, 255], &[3]).to_dtype(DType::U8), &[0.0, 7.0, 255.0]);
    c.push("u64 -> i32 in range", Tensor::from_slice(&[5u64], &[1]).to_dtype(DType::I32), &[5.0]);
    // Out of range: the low bits, on the device and in the reference (the conversion knows its operand's type).
    let to_u8 = Tensor::from_slice(&[300i32, -1, 256, -129], &[4]).to_dtype(DType::U8);
    c.push("i32 -> u8 wraps", to_u8, &[44.0, 255.0, 0.0, 127.0]);
    let to_i32 = Tensor::from_slice(&[(1i64 << 32) + 5, -1, -(1i64 << 40) - 3], &[3]).to_dtype(DType::I32);
    c.push("i64 -> i32 wraps", to_i32, &[5.0, -1.0, -3.0]);
    let u32_to_i32 = Tensor::from_slice(&[u32::MAX, 1 << 31], &[2]).to_dtype(DType::I32);
    c.push("u32 -> i32 wraps", u32_to_i32, &[-1.0, i32::MIN as f64]);
    c.push("i64 -> u64 wraps", Tensor::from_slice(&[-1i64], &[1]).to_dtype(DType::U64), &[u64::MAX as f64]);
    c.run();
    // i64::MAX is beyond f64's 2^53 in the reference (docs/numerics.md): checked on the device alone.
    let got = Tensor::from_slice(&[i64::MAX], &[1]).to_dtype(DType::I32).to_f64_vec().unwrap();
    assert_same("i64::MAX -> i32 on the device", &got, &[-1.0]);
}

#[test]
fn integer_division_by_zero_and_overflow() {
    let mut c = Checks::default();
    let (i32_max, i32_min) = (i32::MAX as f64, i32::MIN as f64);
    let a = Tensor::from_slice(&[7i32, -7, 0, i32::MIN, i32::MIN, 5, i32::MAX, -7], &[8]);
    let b = Tensor::from_slice(&[0i32, 0, 0, -1, 1, 2, -1, 2], &[8]);
    c.push("i32 div", &a / &b, &[-1.0, -1.0, -1.0, i32_min, i32_min, 2.0, -i32_max, -3.0]);
    let a = Tensor::from_slice(&[7i64, -7, i64::MIN, i64::MAX, -9], &[5]);
    let b = Tensor::from_slice(&[0i64, 0, -1, -1, 4], &[5]);
    c.push("i64 div", &a / &b, &[-1.0, -1.0, i64::MIN as f64, -(i64::MAX as f64), -2.0]);
    let a = Tensor::from_slice(&[7u8, 0, 250, 255], &[4]);
    let b = Tensor::from_slice(&[0u8, 0, 10, 255], &[4]);
    c.push("u8 div", &a / &b, &[255.0, 255.0, 25.0, 1.0]);
    let a = Tensor::from_slice(&[7u32, 9], &[2]);
    c.push("u32 div", &a / &Tensor::from_slice(&[0u32, 4], &[2]), &[u32::MAX as f64, 2.0]);
    let a = Tensor::from_slice(&[7u64, 9], &[2]);
    c.push("u64 div", &a / &Tensor::from_slice(&[0u64, 4], &[2]), &[u64::MAX as f64, 2.0]);
    // Division by a host scalar zero, and inside a longer expression.
    let x = Tensor::from_slice(&[3i32, -3], &[2]);
    c.push("i32 div by scalar 0", &(&x / 0.0) + 1.0, &[0.0, 0.0]);
    c.run();
}

#[test]
fn integer_arithmetic_wraps() {
    let mut c = Checks::default();
    let (i32_max, i32_min) = (i32::MAX as f64, i32::MIN as f64);
    let a = Tensor::from_slice(&[i32::MAX, i32::MIN, i32::MAX, 65536, 46341], &[5]);
    let b = Tensor::from_slice(&[1i32, 1, i32::MAX, 65536, 46341], &[5]);
    c.push("i32 add", &a + &b, &[i32_min, -2147483647.0, -2.0, 131072.0, 92682.0]);
    c.push("i32 sub", &a - &b, &[2147483646.0, i32_max, 0.0, 0.0, 0.0]);
    c.push("i32 mul", &a * &b, &[i32_max, i32_min, 1.0, 0.0, -2147479015.0]);
    c.push("i32 neg", -&a, &[-i32_max, i32_min, -i32_max, -65536.0, -46341.0]);
    c.push("i32 abs", Tensor::from_slice(&[i32::MIN, -3], &[2]).abs(), &[i32_min, 3.0]);
    c.push("i32 sum", Tensor::from_slice(&[i32::MAX, 1, 0], &[3]).sum(&[0]), &[i32_min]);
    let (i64_max, i64_min) = (i64::MAX as f64, i64::MIN as f64);
    let a = Tensor::from_slice(&[i64::MAX, i64::MIN, (1 << 32) + 1], &[3]);
    let b = Tensor::from_slice(&[1i64, 1, (1 << 32) + 1], &[3]);
    c.push("i64 add", &a + &b, &[i64_min, i64_min + 1.0, 8589934594.0]);
    c.push("i64 sub", &a - &b, &[i64_max, i64_max, 0.0]);
    c.push("i64 mul", &a * &b, &[i64_max, i64_min, 8589934593.0]);
    c.push("i64 neg", -&Tensor::from_slice(&[i64::MIN, 5], &[2]), &[i64_min, -5.0]);
    let a = Tensor::from_slice(&[250u8, 0, 16], &[3]);
    let b = Tensor::from_slice(&[10u8, 1, 16], &[3]);
    c.push("u8 add", &a + &b, &[4.0, 1.0, 32.0]);
    c.push("u8 sub", &a - &b, &[240.0, 255.0, 0.0]);
    c.push("u8 mul", &a * &b, &[196.0, 0.0, 0.0]);
    let a = Tensor::from_slice(&[0u32, u32::MAX], &[2]);
    c.push("u32 sub", &a - &Tensor::from_slice(&[1u32, 0], &[2]), &[u32::MAX as f64, u32::MAX as f64]);
    c.push("u32 mul", &a * &Tensor::from_slice(&[3u32, 3], &[2]), &[0.0, 4294967293.0]);
    let a = Tensor::from_slice(&[0u64, 1 << 32], &[2]);
    c.push("u64 sub", &a - &Tensor::from_slice(&[1u64, 0], &[2]), &[u64::MAX as f64, 4294967296.0]);
    c.push("u64 mul", &a * &Tensor::from_slice(&[3u64, 1 << 32], &[2]), &[0.0, 0.0]);
    c.run();
}

#[test]
fn comparisons_with_nan_are_false_except_ne() {
    let mut c = Checks::default();
    for dt in FLOATS {
        let a = of(dt, &[NAN, 1.0, NAN, INF, -INF, 2.0], &[6]);
        let b = of(dt, &[1.0, NAN, NAN, NAN, NAN, 2.0], &[6]);
        c.push(format!("eq {dt}"), a.eq(&b), &[0.0, 0.0, 0.0, 0.0, 0.0, 1.0]);
        c.push(format!("ne {dt}"), a.ne(&b), &[1.0, 1.0, 1.0, 1.0, 1.0, 0.0]);
        c.push(format!("lt {dt}"), a.lt(&b), &[0.0; 6]);
        c.push(format!("le {dt}"), a.le(&b), &[0.0, 0.0, 0.0, 0.0, 0.0, 1.0]);
        c.push(format!("gt {dt}"), a.gt(&b), &[0.0; 6]);
        c.push(format!("ge {dt}"), a.ge(&b), &[0.0, 0.0, 0.0, 0.0, 0.0, 1.0]);
        c.push(format!("NaN ne itself {dt}"), a.ne(&a), &[1.0, 0.0, 1.0, 0.0, 0.0, 0.0]);
    }
    c.run();
}

#[test]
fn argmax_and_argmin_pick_the_first_nan() {
    let mut c = Checks::default();
    for dt in FLOATS {
        let rows = [
            [1.0, NAN, 3.0, NAN],
            [NAN, 1.0, 2.0, 3.0],
            [1.0, 5.0, 5.0, 2.0],
            [INF, -INF, 2.0, NAN],
            [NAN, NAN, NAN, NAN],
            [-INF, -INF, -INF, -INF],
        ];
        let x = of(dt, &rows.concat(), &[6, 4]);
        c.push(format!("argmax rows {dt}"), x.argmax(1), &[1.0, 0.0, 1.0, 3.0, 0.0, 0.0]);
        c.push(format!("argmin rows {dt}"), x.argmin(1), &[1.0, 0.0, 0.0, 3.0, 0.0, 0.0]);
        c.push(format!("argmax columns {dt}"), x.argmax(0), &[1.0, 0.0, 4.0, 0.0]);
        c.push(format!("argmin columns {dt}"), x.argmin(0), &[1.0, 0.0, 4.0, 0.0]);
    }
    let long: Vec<f64> = (0..1000).map(|i| if i == 517 || i == 900 { NAN } else { i as f64 }).collect();
    let x = of(DType::F32, &long, &[1000]);
    c.push("argmax long", x.argmax(0), &[517.0]);
    c.push("argmin long", x.argmin(0), &[517.0]);
    c.run();
}

#[test]
fn argmax_and_argmin_keepdim_keep_the_axis_as_size_one() {
    // Values with distinct entries along every axis: the expected indices are computed here on the host.
    let dims = [2usize, 3, 4];
    let values: Vec<f32> = (0..24).map(|i| ((i * 7 + 3) % 24) as f32 - 11.5).collect();
    let x = lazuli::Tensor::from_slice(&values, &dims);
    let at = |i: usize, j: usize, k: usize| values[(i * 3 + j) * 4 + k];
    let (mut want_max, mut want_min) = (Vec::new(), Vec::new());
    for i in 0..2 {
        for k in 0..4 {
            let col: Vec<f32> = (0..3).map(|j| at(i, j, k)).collect();
            let best = |better: fn(f32, f32) -> bool| (0..3).fold(0, |b, j| if better(col[j], col[b]) { j } else { b });
            want_max.push(best(|a, b| a > b) as i64);
            want_min.push(best(|a, b| a < b) as i64);
        }
    }
    let got_max = x.argmax_keepdim(-2);
    let got_min = x.argmin_keepdim(1);
    assert_eq!(got_max.dims(), &[2, 1, 4]);
    assert_eq!(got_min.dims(), &[2, 1, 4]);
    assert_eq!(got_max.to_vec::<i64>().unwrap(), want_max);
    assert_eq!(got_min.to_vec::<i64>().unwrap(), want_min);
    assert_eq!(x.argmax(1).to_vec::<i64>().unwrap(), want_max);
}
