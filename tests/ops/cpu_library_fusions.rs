//! Programs that the default CPU plugin's XLA (jaxlib 0.11.2) computes wrongly when it hands the elementwise ops
//! and reductions around a product to YNNPACK: the values came back off by up to 1e242, with no error, and
//! differently from run to run. lazuli lets YNNPACK run single products only (`Config::backend_xla_options`).
//! These tests hold the results to host references, so they fail if those fusions come back on (the first one
//! did before).

use crate::common;

use common::{assert_close, values, Rng};
use lazuli::{DType, Tensor};
use ndarray::{Array3, Axis};

/// `b` matrices `n × n`, E = A·Aᵀ each (symmetric, entries of a few units).
fn batch(b: usize, n: usize, seed: u64) -> Array3<f64> {
    let mut rng = Rng::new(seed);
    let a = Array3::from_shape_vec((b, n, n), values(&mut rng, DType::F64, b * n * n, -0.5, 0.5)).unwrap();
    let mut e = Array3::zeros((b, n, n));
    for k in 0..b {
        let ak = a.index_axis(Axis(0), k);
        e.index_axis_mut(Axis(0), k).assign(&ak.dot(&ak.t()));
    }
    e
}

fn batched_matmul(a: &Array3<f64>, b: &Array3<f64>) -> Array3<f64> {
    let mut out = Array3::zeros((a.dim().0, a.dim().1, b.dim().2));
    for k in 0..a.dim().0 {
        out.index_axis_mut(Axis(0), k).assign(&a.index_axis(Axis(0), k).dot(&b.index_axis(Axis(0), k)));
    }
    out
}

fn tensor(a: &Array3<f64>, dtype: DType) -> Tensor {
    common::tensor_of(dtype, a.as_slice().unwrap(), &[a.dim().0, a.dim().1, a.dim().2])
}

fn read(t: &Tensor) -> Vec<f64> {
    t.to_f64_vec().unwrap()
}

/// sum((E · full(c)) * E, last axis) for `b` matrices, or one matrix without a batch dimension.
fn broadcast_product_then_multiply_and_reduce(b: Option<usize>) {
    let (n, c) = (60, 0.37);
    let e = batch(b.unwrap_or(1), n, 1);
    let want = (batched_matmul(&e, &Array3::from_elem(e.dim(), c)) * &e).sum_axis(Axis(2));
    for dtype in [DType::F64, DType::F32] {
        let et = match b {
            Some(_) => tensor(&e, dtype),
            None => tensor(&e, dtype).reshape(&[n as isize, n as isize]),
        };
        let got = read(&(et.matmul(&Tensor::full(et.dims(), c, dtype)) * &et).sum(&[-1]));
        // f32 sums 60 products of entries up to ~5 twice over: relative error ~1e-6 of the largest value.
        let worst = common::rel_err(&got, want.as_slice().unwrap(), 0.0);
        let tol = if dtype == DType::F64 { 1e-13 } else { 1e-5 };
        assert!(worst <= tol, "{dtype}, batch {b:?}: largest error {worst:e} of the largest value (tolerance {tol:e})");
    }
}

/// The miscompiled program: a batched product with a broadcast operand, multiplied and reduced.
#[test]
fn batched_product_with_a_broadcast_operand_then_multiply_and_reduce() {
    broadcast_product_then_multiply_and_reduce(Some(5));
}

/// The same without a batch dimension.
#[test]
fn single_product_with_a_broadcast_operand_then_multiply_and_reduce() {
    broadcast_product_then_multiply_and_reduce(None);
}

/// The same shape of program arises from autodiff: the gradient of sum(E·X) is Eᵀ · broadcast(1).
#[test]
fn gradient_of_a_summed_batched_product() {
    let (b, n) = (4, 48);
    let e = batch(b, n, 2);
    let x = batch(b, n, 3);
    let xt = tensor(&x, DType::F64).requires_grad();
    let et = tensor(&e, DType::F64);
    let e_t = e.clone().permuted_axes([0, 2, 1]).as_standard_layout().to_owned();
    // d/dX sum(E·X) = Eᵀ · 1, and d/dX sum((E·X) ∘ E) = Eᵀ · E.
    let g = lazuli::grad(&et.matmul(&xt).sum_all(), &[&xt]).remove(0);
    let want = batched_matmul(&e_t, &Array3::ones((b, n, n)));
    // Used further in the same program (as a gradient-times-value term does), the product meets a multiply and a
    // reduction: the pattern above, made by autodiff.
    let gx = (&g * &xt).sum(&[-1]);
    let want_gx = (&want * &x).sum_axis(Axis(2));
    assert_close("gradient times X, summed", DType::F64, &read(&gx), want_gx.as_slice().unwrap());
    assert_close("gradient of sum(E·X)", DType::F64, &read(&g), want.as_slice().unwrap());
    let g = lazuli::grad(&(et.matmul(&xt) * &et).sum_all(), &[&xt]).remove(0);
    let want = batched_matmul(&e_t, &e);
    assert_close("gradient of sum((E·X) ∘ E)", DType::F64, &read(&g), want.as_slice().unwrap());
    let y = et.matmul(&xt).sum(&[-1]) * &et.sum(&[-1]);
    let want_y = batched_matmul(&e, &x).sum_axis(Axis(2)) * e.sum_axis(Axis(2));
    assert_close("forward", DType::F64, &read(&y), want_y.as_slice().unwrap());
}
