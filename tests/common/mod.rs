//! Shared helpers of the integration tests: deterministic data per dtype and dtype-aware comparison.
#![allow(dead_code)]

pub mod child;
pub mod gradcheck;

use lazuli::{DType, Tensor};
use ndarray::{ArrayD, IxDyn};

/// The message of the panic `f` must raise (lazuli's panics carry text).
pub fn panic_message(f: impl FnOnce()) -> String {
    let err = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).expect_err("expected a panic");
    err.downcast_ref::<String>()
        .cloned()
        .or_else(|| err.downcast_ref::<&str>().map(|s| s.to_string()))
        .expect("a panic with a text message")
}

/// splitmix64: deterministic, dependency-free test data.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E3779B97F4A7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58476D1CE4E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D049BB133111EB);
        z ^ (z >> 31)
    }
    /// Uniform in [lo, hi).
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Values in [lo, hi) rounded to what `dtype` holds (integers for integer types, 0/1 for bool).
pub fn values(rng: &mut Rng, dtype: DType, n: usize, lo: f64, hi: f64) -> Vec<f64> {
    (0..n)
        .map(|_| {
            let x = rng.uniform(lo, hi);
            match dtype {
                DType::Bool => (x > (lo + hi) / 2.0) as u8 as f64,
                d if d.is_int() => d.round(x.floor()),
                d => d.round(x),
            }
        })
        .collect()
}

/// A host tensor of any dtype holding exactly `vals` (already representable).
pub fn tensor_of(dtype: DType, vals: &[f64], dims: &[usize]) -> Tensor {
    use half::{bf16, f16};
    match dtype {
        DType::F32 => Tensor::from_slice(&vals.iter().map(|&x| x as f32).collect::<Vec<_>>(), dims),
        DType::F64 => Tensor::from_slice(vals, dims),
        DType::F16 => Tensor::from_slice(&vals.iter().map(|&x| f16::from_f64(x)).collect::<Vec<_>>(), dims),
        DType::BF16 => Tensor::from_slice(&vals.iter().map(|&x| bf16::from_f64(x)).collect::<Vec<_>>(), dims),
        DType::I32 => Tensor::from_slice(&vals.iter().map(|&x| x as i32).collect::<Vec<_>>(), dims),
        DType::I64 => Tensor::from_slice(&vals.iter().map(|&x| x as i64).collect::<Vec<_>>(), dims),
        DType::U8 => Tensor::from_slice(&vals.iter().map(|&x| x as u8).collect::<Vec<_>>(), dims),
        DType::U32 => Tensor::from_slice(&vals.iter().map(|&x| x as u32).collect::<Vec<_>>(), dims),
        DType::U64 => Tensor::from_slice(&vals.iter().map(|&x| x as u64).collect::<Vec<_>>(), dims),
        DType::Bool => Tensor::from_slice(&vals.iter().map(|&x| x != 0.0).collect::<Vec<_>>(), dims),
    }
}

/// Relative tolerance of one dtype: a few units in the last place after a handful of ops.
pub fn tolerance(dtype: DType) -> f64 {
    match dtype {
        DType::F64 => 1e-12,
        DType::F32 => 2e-6,
        DType::F16 => 4e-3,
        DType::BF16 => 3e-2,
        _ => 0.0,
    }
}

/// Assert `got` equals `want` elementwise within the dtype's tolerance (NaN equals NaN; ±inf exact).
#[track_caller]
pub fn assert_close(what: &str, dtype: DType, got: &[f64], want: &[f64]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let tol = tolerance(dtype);
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let ok = (g.is_nan() && w.is_nan()) || g == w || (g - w).abs() <= tol * (1.0 + w.abs().max(g.abs()));
        assert!(
            ok,
            "{what} ({dtype}): element {i}: got {g}, want {w} (tolerance {tol})\n got: {got:?}\nwant: {want:?}"
        );
    }
}

/// proptest's settings for `cases` cases per property, with the failing cases it finds kept next to the test's
/// source file, `<module>.proptest-regressions`, and run first every time. (By default they would be in
/// `tests/proptest-regressions/`, since each test binary is a folder with a `main.rs`.)
pub fn proptest_config(cases: u32) -> proptest::test_runner::Config {
    use proptest::test_runner::{Config, FileFailurePersistence};
    let next_to_the_source = FileFailurePersistence::WithSource("proptest-regressions");
    Config { cases, failure_persistence: Some(Box::new(next_to_the_source)), ..Config::default() }
}

pub fn array(v: Vec<f64>, dims: &[usize]) -> ArrayD<f64> {
    ArrayD::from_shape_vec(IxDyn(dims), v).unwrap()
}

/// The largest difference between `got` and `want`, relative to the largest reference value or to `floor`,
/// whichever is larger (a floor of 1 compares values below 1 absolutely). Equal values count 0, ±inf included.
pub fn rel_err(got: &[f64], want: &[f64], floor: f64) -> f64 {
    assert_eq!(got.len(), want.len(), "lengths");
    let scale = want.iter().fold(floor, |m, v| m.max(v.abs()));
    got.iter().zip(want).fold(0f64, |m, (g, w)| m.max(if g == w { 0.0 } else { (g - w).abs() })) / scale
}
