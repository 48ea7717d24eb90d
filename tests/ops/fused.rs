//! Fused elementwise expressions (`Tensor::fused`): one node that computes what the same chain of elementwise ops
//! computes. Checked against ndarray, the reference interpreter, the unfused chain run by XLA, and finite
//! differences for the gradient.

use crate::common;

use common::gradcheck::check_grad;
use common::{array, assert_close, Rng};
use lazuli::ir::{BinaryKind, Fused, FusedBuilder, UnaryKind};
use lazuli::{DType, Tensor};
use ndarray::{ArrayD, Zip};

/// `w·d − a / (√v·k + e)` over four tensors `w, a, v` of one shape and scalars `d, k, e` (AdamW's update form).
fn update_expr() -> Fused {
    let mut e = FusedBuilder::new("test_update", 6);
    let (w, a, v, d, k, eps) = (e.arg(0), e.arg(1), e.arg(2), e.arg(3), e.arg(4), e.arg(5));
    let r = e.unary(UnaryKind::Sqrt, v);
    let rk = e.mul(r, k);
    let den = e.add(rk, eps);
    let q = e.div(a, den);
    let wd = e.mul(w, d);
    e.sub(wd, q);
    e.finish()
}

fn data(rng: &mut Rng, dims: &[usize], lo: f64, hi: f64) -> ArrayD<f64> {
    let n = dims.iter().product();
    array((0..n).map(|_| rng.uniform(lo, hi)).collect(), dims)
}

#[test]
fn fused_matches_ndarray_the_interpreter_and_the_unfused_ops() {
    let mut rng = Rng::new(7);
    let dims = [3, 5];
    let (w, a, v) =
        (data(&mut rng, &dims, -2.0, 2.0), data(&mut rng, &dims, -1.0, 1.0), data(&mut rng, &dims, 0.1, 3.0));
    let (d, k, eps) = (0.99, 1.7, 1e-3);
    let want = Zip::from(&w).and(&a).and(&v).map_collect(|&w, &a, &v| w * d - a / (v.sqrt() * k + eps));
    for dt in [DType::F32, DType::F64] {
        let t = |x: &ArrayD<f64>| Tensor::from_ndarray(x).to_dtype(dt);
        let s = |x: f64| Tensor::scalar_of(dt, x);
        let (tw, ta, tv, sd, sk, se) = (t(&w), t(&a), t(&v), s(d), s(k), s(eps));
        let got = Tensor::fused(&update_expr(), &[&tw, &ta, &tv, &sd, &sk, &se]);
        let unfused = &tw * &sd - &ta / (tv.sqrt() * &sk + &se);
        assert_eq!(got.dims(), &dims);
        let reference = got.evaluate_reference().unwrap();
        lazuli::sync().unwrap();
        let got = got.to_f64_vec().unwrap();
        let name = format!("fused update {dt:?}");
        assert_close(&format!("{name} vs ndarray"), dt, &got, &want.iter().copied().collect::<Vec<_>>());
        assert_close(&format!("{name} vs interpreter"), dt, &got, &reference.iter().copied().collect::<Vec<_>>());
        // The same ops in the same order (XLA may still contract a multiply-add differently in either, so not
        // always the same bits).
        assert_close(&format!("{name} vs unfused"), dt, &got, &unfused.to_f64_vec().unwrap());
    }
}

#[test]
fn fused_gradients_match_finite_differences() {
    let mut rng = Rng::new(11);
    let dims = [2, 3];
    let inputs = [
        data(&mut rng, &dims, -2.0, 2.0),
        data(&mut rng, &dims, -1.0, 1.0),
        data(&mut rng, &dims, 0.5, 3.0),
        array(vec![0.9], &[]),
        array(vec![1.3], &[]),
        array(vec![0.1], &[]),
    ];
    check_grad("fused update", &inputs, |x| Tensor::fused(&update_expr(), &[&x[0], &x[1], &x[2], &x[3], &x[4], &x[5]]));
    // An operand used twice, a unary step on a step, and a max (its own subgradient rule).
    let mut e = FusedBuilder::new("test_reuse", 2);
    let (x, y) = (e.arg(0), e.arg(1));
    let xx = e.mul(x, x);
    let t = e.unary(UnaryKind::Tanh, xx);
    let m = e.binary(BinaryKind::Max, t, y);
    e.mul(m, x);
    let expr = e.finish();
    let inputs = [data(&mut rng, &dims, -1.5, 1.5), data(&mut rng, &dims, -0.9, 0.9)];
    check_grad("fused reuse", &inputs, |x| Tensor::fused(&expr, &[&x[0], &x[1]]));
}

#[test]
fn fused_operands_that_do_not_fit_panic_at_the_callers_line() {
    let expr = update_expr();
    let (a, b) = (Tensor::from_slice(&[1.0f32; 6], &[2, 3]), Tensor::from_slice(&[1.0f32; 3], &[3]));
    let s = Tensor::scalar(1.0f32);
    let line = line!() + 1;
    let bad = || Tensor::fused(&expr, &[&a, &b, &a, &s, &s, &s]);
    let err = std::panic::catch_unwind(std::panic::AssertUnwindSafe(bad)).unwrap_err();
    let msg = err.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(msg.contains("operand shapes differ"), "{msg}");
    assert!(msg.contains(&format!("tests/ops/fused.rs:{line}")), "{msg}");
    let f64s = Tensor::scalar(1.0f64);
    let err =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| Tensor::fused(&expr, &[&a, &a, &a, &f64s, &s, &s])))
            .unwrap_err();
    let msg = err.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(msg.contains("test_update") && msg.contains("differ"), "{msg}");
    let err = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| Tensor::fused(&expr, &[&a, &a]))).unwrap_err();
    let msg = err.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(msg.contains("takes 6 operand(s), got 2"), "{msg}");
}
