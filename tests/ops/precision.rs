//! The precision of products: it reaches the compiled program (another precision is another program), values
//! stay right at every level, gradients follow the forward's precision, and the process-wide setting and the
//! per-thread scope combine as documented. One test, alone in a child process: the process-wide setting is
//! shared by the whole binary.
//! On the CPU every level computes in full precision. On an NVIDIA GPU (`LAZULI_DEVICE=gpu`) the default lets
//! XLA use TF32 for f32 products, so there the test also checks that `Highest` is measurably more exact.

use crate::common;

use common::{values, Rng};
use lazuli::{DType, Precision, Tensor};
use ndarray::{Array2, Array3, Axis};

fn compiles_of(f: impl FnOnce()) -> u64 {
    let m0 = lazuli::metrics();
    f();
    (lazuli::metrics() - m0).compiles
}

/// Relative to the largest reference value (these products have no values near zero that matter).
fn rel_err(got: &[f64], want: &[f64]) -> f64 {
    common::rel_err(got, want, 1e-30)
}

fn f32_tensor(v: &[f64], dims: &[usize]) -> Tensor {
    common::tensor_of(DType::F32, v, dims)
}

fn read(t: &Tensor) -> Vec<f64> {
    t.to_f64_vec().unwrap()
}

#[test]
fn precision_reaches_the_program_and_values_stay_right() {
    if common::child::alone(module_path!(), "precision_reaches_the_program_and_values_stay_right") {
        return; // the setting and the counters are process-wide: alone in a process of its own
    }
    let tf32 = lazuli::platform().unwrap() == "cuda";
    // f32 with 7 terms per sum: 1e-6; TF32 inputs (10 mantissa bits) on a GPU: about 1e-3.
    let tol = |p: Precision| if tf32 && p != Precision::Highest { 5e-3 } else { 1e-6 };
    let mut rng = Rng::new(11);
    let (b, m, k, n) = (3, 5, 7, 4);
    let a = Array3::from_shape_vec((b, m, k), values(&mut rng, DType::F32, b * m * k, -2.0, 2.0)).unwrap();
    let w = Array2::from_shape_vec((k, n), values(&mut rng, DType::F32, k * n, -2.0, 2.0)).unwrap();
    let want: Vec<f64> = a.axis_iter(Axis(0)).flat_map(|ai| ai.dot(&w).into_iter().collect::<Vec<_>>()).collect();
    let at = f32_tensor(a.as_slice().unwrap(), &[b, m, k]);
    let wt = f32_tensor(w.as_slice().unwrap(), &[k, n]);
    let product = || read(&at.matmul(&wt));

    assert_eq!(lazuli::matmul_precision(), Precision::Default);
    let mut seen = Vec::new();
    for p in [Precision::Default, Precision::High, Precision::Highest] {
        // A new precision compiles a new program; the same one again is a cache hit.
        let first = compiles_of(|| seen = lazuli::with_matmul_precision(p, product));
        assert_eq!(first, 1, "{p:?}: a program of its own");
        assert!(rel_err(&seen, &want) <= tol(p), "{p:?}: error {:e}", rel_err(&seen, &want));
        assert_eq!(compiles_of(|| drop(lazuli::with_matmul_precision(p, product))), 0, "{p:?} again");
    }
    assert_eq!(lazuli::matmul_precision(), Precision::Default, "the scope ended");

    // Gradients: d/dW sum(A·W) = Σ_batch Aᵀ·1, recorded at the forward's precision (a program of its own too).
    let wg = wt.clone().requires_grad();
    let grad = || read(&lazuli::grad(&at.matmul(&wg).sum_all(), &[&wg]).remove(0));
    let col_sums = a.sum_axis(Axis(0)).sum_axis(Axis(0));
    let want_g: Vec<f64> = col_sums.iter().flat_map(|&s| std::iter::repeat_n(s, n)).collect();
    assert!(rel_err(&grad(), &want_g) <= tol(Precision::Default));
    let mut g = Vec::new();
    assert_eq!(compiles_of(|| g = lazuli::with_matmul_precision(Precision::Highest, grad)), 1);
    assert!(rel_err(&g, &want_g) <= tol(Precision::Highest), "gradient, highest: {:e}", rel_err(&g, &want_g));

    // Convolutions too: each level its own program, gradients included; the same values within the tolerances.
    let x = f32_tensor(&values(&mut rng, DType::F32, 2 * 3 * 6 * 5, -1.0, 1.0), &[2, 3, 6, 5]);
    let kernel = f32_tensor(&values(&mut rng, DType::F32, 4 * 3 * 3 * 2, -1.0, 1.0), &[4, 3, 3, 2]).requires_grad();
    let conv = || {
        let y = x.conv2d(&kernel, [1, 2], [1, 0]);
        let dk = lazuli::grad(&(&y * &y).sum_all(), &[&kernel]).remove(0);
        (read(&y), read(&dk))
    };
    let (y0, dk0) = conv();
    let (mut y1, mut dk1) = (Vec::new(), Vec::new());
    assert_eq!(compiles_of(|| (y1, dk1) = lazuli::with_matmul_precision(Precision::Highest, conv)), 2);
    assert!(rel_err(&y0, &y1) <= tol(Precision::Default), "conv2d: {:e}", rel_err(&y0, &y1));
    assert!(rel_err(&dk0, &dk1) <= tol(Precision::Default), "conv2d gradient: {:e}", rel_err(&dk0, &dk1));

    if tf32 {
        // A product large enough for the GPU's matrix units: TF32 shows at the default, not at `Highest`.
        let (m, k, n) = (128, 512, 128);
        let a = Array2::from_shape_vec((m, k), values(&mut rng, DType::F32, m * k, -1.0, 1.0)).unwrap();
        let w = Array2::from_shape_vec((k, n), values(&mut rng, DType::F32, k * n, -1.0, 1.0)).unwrap();
        let want: Vec<f64> = a.dot(&w).into_iter().collect();
        let (at, wt) = (f32_tensor(a.as_slice().unwrap(), &[m, k]), f32_tensor(w.as_slice().unwrap(), &[k, n]));
        let err = |p| rel_err(&lazuli::with_matmul_precision(p, || read(&at.matmul(&wt))), &want);
        let (default, highest) = (err(Precision::Default), err(Precision::Highest));
        println!("128x512x128 f32 product on the GPU: relative error {default:e} by default, {highest:e} at Highest");
        assert!(highest <= 1e-5 && default > 10.0 * highest, "default {default:e}, highest {highest:e}");
    }

    // The process-wide setting reaches other threads; a scope on this thread still wins, and is undone.
    lazuli::set_matmul_precision(Precision::Highest);
    assert_eq!(std::thread::spawn(lazuli::matmul_precision).join().unwrap(), Precision::Highest);
    lazuli::with_matmul_precision(Precision::High, || assert_eq!(lazuli::matmul_precision(), Precision::High));
    assert_eq!(lazuli::matmul_precision(), Precision::Highest);
    // The program recorded under the process-wide setting is the one compiled under the scope above.
    let mut again = Vec::new();
    assert_eq!(compiles_of(|| again = product()), 0);
    assert!(rel_err(&again, &want) <= tol(Precision::Highest), "process-wide: {:e}", rel_err(&again, &want));
    lazuli::set_matmul_precision(Precision::Default);
    assert_eq!(lazuli::matmul_precision(), Precision::Default);
}
