//! Every differentiable op's gradient against central finite differences in f64, plus the autodiff API.

// `&[x.clone()]` reads as "one input"; `slice::from_ref` would only hide that.
#![allow(clippy::cloned_ref_to_slice_refs)]

use crate::common;

use common::gradcheck::check_grad;
use common::{array, values, Rng};
use lazuli::{DType, Tensor};
use ndarray::ArrayD;

fn data(seed: u64, dims: &[usize], lo: f64, hi: f64) -> ArrayD<f64> {
    let n = dims.iter().product();
    array(values(&mut Rng::new(seed), DType::F64, n, lo, hi), dims)
}

#[test]
fn unary_gradients() {
    let x = data(1, &[2, 3], -2.0, 2.0);
    let pos = data(2, &[2, 3], 0.2, 3.0);
    check_grad("neg", &[x.clone()], |t| -&t[0]);
    check_grad("abs", &[pos.clone()], |t| t[0].abs());
    check_grad("exp", &[x.clone()], |t| t[0].exp());
    check_grad("log", &[pos.clone()], |t| t[0].log());
    check_grad("sqrt", &[pos.clone()], |t| t[0].sqrt());
    check_grad("rsqrt", &[pos.clone()], |t| t[0].rsqrt());
    check_grad("tanh", &[x.clone()], |t| t[0].tanh());
    check_grad("sin", &[x.clone()], |t| t[0].sin());
    check_grad("cos", &[x.clone()], |t| t[0].cos());
    check_grad("sigmoid", &[x.clone()], |t| t[0].sigmoid());
}

#[test]
fn binary_gradients_with_broadcasting() {
    let a = data(3, &[2, 3, 4], -2.0, 2.0);
    let b = data(4, &[3, 1], -2.0, 2.0);
    let pos = data(5, &[4], 0.5, 2.0);
    check_grad("add", &[a.clone(), b.clone()], |t| &t[0] + &t[1]);
    check_grad("sub", &[a.clone(), b.clone()], |t| &t[0] - &t[1]);
    check_grad("mul", &[a.clone(), b.clone()], |t| &t[0] * &t[1]);
    check_grad("div", &[a.clone(), pos.clone()], |t| &t[0] / &t[1]);
    check_grad("max", &[a.clone(), b.clone()], |t| t[0].maximum(&t[1]));
    check_grad("min", &[a.clone(), b.clone()], |t| t[0].minimum(&t[1]));
    check_grad("pow", &[pos.clone(), data(6, &[4], -1.5, 1.5)], |t| t[0].pow(&t[1]));
    check_grad("scalar ops", &[a.clone()], |t| (2.0 - &t[0]) * 3.0 / 4.0 + 1.0);
}

#[test]
fn select_convert_layout_gradients() {
    let a = data(7, &[3, 4], -2.0, 2.0);
    let b = data(8, &[4], -2.0, 2.0);
    check_grad("select", &[a.clone(), b.clone()], |t| t[0].gt(0.0).select(&t[0], &t[1]));
    check_grad("where_", &[a.clone(), b.clone()], |t| lazuli::where_(&t[0].gt(0.0), &t[1], &t[0]));
    // Through f32, finite differences drown in rounding; the gradient of a conversion is the cotangent converted
    // back, so d/dx sum(f32(x) * w) = w exactly.
    let x = Tensor::from_slice(&[0.25f64, -1.5, 3.0], &[3]).requires_grad();
    let w = Tensor::from_slice(&[2.0f32, -0.5, 4.0], &[3]);
    let g = lazuli::grad(&(x.to_dtype(DType::F32) * &w).sum_all(), &[&x]);
    assert_eq!(g[0].dtype(), DType::F64);
    assert_eq!(g[0].to_vec::<f64>().unwrap(), vec![2.0, -0.5, 4.0]);
    check_grad("reshape", &[a.clone()], |t| t[0].reshape(&[2, 6]));
    check_grad("permute", &[data(9, &[2, 3, 4], -1.0, 1.0)], |t| t[0].permute(&[2, 0, 1]));
    check_grad("t", &[a.clone()], |t| t[0].t());
    check_grad("broadcast", &[data(10, &[3, 1], -1.0, 1.0)], |t| t[0].broadcast_to(&[2, 3, 5]));
}

#[test]
fn reduction_gradients() {
    let x = data(11, &[3, 4, 5], -2.0, 2.0);
    for axes in [&[0isize][..], &[1], &[2], &[0, 2], &[0, 1, 2]] {
        check_grad(&format!("sum {axes:?}"), &[x.clone()], |t| t[0].sum(axes));
        check_grad(&format!("mean {axes:?}"), &[x.clone()], |t| t[0].mean(axes));
        check_grad(&format!("max {axes:?}"), &[x.clone()], |t| t[0].max(axes));
        check_grad(&format!("min {axes:?}"), &[x.clone()], |t| t[0].min(axes));
    }
    check_grad("sum_keepdim", &[x.clone()], |t| t[0].sum_keepdim(&[1]) * &t[0]);
    check_grad("max_keepdim", &[x.clone()], |t| t[0].max_keepdim(&[1]) * &t[0]);
}

#[test]
fn matmul_gradients() {
    check_grad("matmul 2d", &[data(12, &[3, 4], -1.0, 1.0), data(13, &[4, 2], -1.0, 1.0)], |t| t[0].matmul(&t[1]));
    check_grad("matmul batched", &[data(14, &[2, 3, 4], -1.0, 1.0), data(15, &[2, 4, 2], -1.0, 1.0)], |t| {
        t[0].matmul(&t[1])
    });
    check_grad("matmul batch broadcast", &[data(16, &[2, 3, 4], -1.0, 1.0), data(17, &[4, 5], -1.0, 1.0)], |t| {
        t[0].matmul(&t[1])
    });
    check_grad("matvec", &[data(18, &[3, 4], -1.0, 1.0), data(19, &[4], -1.0, 1.0)], |t| t[0].matmul(&t[1]));
    check_grad("vecmat", &[data(20, &[3], -1.0, 1.0), data(21, &[3, 4], -1.0, 1.0)], |t| t[0].matmul(&t[1]));
    // A general contraction: [2,3,4] x [4,3] contracting both 3 and 4 via permute + reshape + matmul.
    check_grad("contract two dims", &[data(22, &[2, 3, 4], -1.0, 1.0), data(23, &[4, 3], -1.0, 1.0)], |t| {
        t[0].reshape(&[2, 12]).matmul(&t[1].t().reshape(&[12, 1]))
    });
}

#[test]
fn two_layer_mlp_matches_hand_derived_gradients() {
    // y = relu-free MLP: h = tanh(x W1 + b1), out = h W2, loss = mean((out - t)^2).
    let (x, w1, b1, w2, t) = (
        data(30, &[4, 3], -1.0, 1.0),
        data(31, &[3, 5], -1.0, 1.0),
        data(32, &[5], -0.5, 0.5),
        data(33, &[5, 2], -1.0, 1.0),
        data(34, &[4, 2], -1.0, 1.0),
    );
    let p: Vec<Tensor> = [&w1, &b1, &w2].iter().map(|a| Tensor::from_ndarray(*a).requires_grad()).collect();
    let h = (Tensor::from_ndarray(&x).matmul(&p[0]) + &p[1]).tanh();
    let out = h.matmul(&p[2]);
    let loss = (&out - Tensor::from_ndarray(&t)).pow(2.0).mean_all();
    loss.backward();
    lazuli::sync().unwrap();

    // By hand, in ndarray.
    let x2 = x.clone().into_dimensionality::<ndarray::Ix2>().unwrap();
    let w1m = w1.clone().into_dimensionality::<ndarray::Ix2>().unwrap();
    let w2m = w2.clone().into_dimensionality::<ndarray::Ix2>().unwrap();
    let tm = t.clone().into_dimensionality::<ndarray::Ix2>().unwrap();
    let b1v = b1.clone().into_dimensionality::<ndarray::Ix1>().unwrap();
    let hm = (x2.dot(&w1m) + &b1v).mapv(f64::tanh);
    let om = hm.dot(&w2m);
    let d_out = (&om - &tm) * (2.0 / om.len() as f64);
    let d_w2 = hm.t().dot(&d_out);
    let d_h = d_out.dot(&w2m.t());
    let d_pre = &d_h * &hm.mapv(|v| 1.0 - v * v);
    let d_w1 = x2.t().dot(&d_pre);
    let d_b1 = d_pre.sum_axis(ndarray::Axis(0));
    for (name, got, want) in [
        ("W1", p[0].grad().unwrap(), d_w1.into_dyn()),
        ("b1", p[1].grad().unwrap(), d_b1.clone().into_dyn()),
        ("W2", p[2].grad().unwrap(), d_w2.into_dyn()),
    ] {
        let g = got.to_vec::<f64>().unwrap();
        for (a, b) in g.iter().zip(want.iter()) {
            assert!((a - b).abs() < 1e-12, "{name}: {a} vs {b}");
        }
    }
    // A second backward accumulates.
    let loss2 = (&p[1] * 3.0).sum_all();
    loss2.backward();
    let b1_grad = p[1].grad().unwrap().to_vec::<f64>().unwrap();
    for (a, b) in b1_grad.iter().zip(d_b1.iter()) {
        assert!((a - (b + 3.0)).abs() < 1e-12, "accumulated b1 grad {a} vs {}", b + 3.0);
    }
}

#[test]
fn no_grad_and_api_errors() {
    let w = Tensor::from_slice(&[1.0f64, 2.0], &[2]).requires_grad();
    let y = lazuli::no_grad(|| (&w * 2.0).sum_all());
    let g = lazuli::grad(&(&y + (&w * 3.0).sum_all()), &[&w]);
    assert_eq!(g[0].to_vec::<f64>().unwrap(), vec![3.0, 3.0], "ops under no_grad carry no gradient");
    let err = std::panic::catch_unwind(|| Tensor::from_slice(&[1i32], &[1]).requires_grad()).unwrap_err();
    assert!(err.downcast_ref::<String>().unwrap().contains("floating-point"));
    let err = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (&w * 1.0).backward())).unwrap_err();
    assert!(err.downcast_ref::<String>().unwrap().contains("scalar"));
}
