//! The precision of products: it reaches the compiled program (another precision is another program), values
//! stay right at every level, gradients follow the forward's precision, and the process-wide setting and the
//! per-thread scope combine as documented. One test: the process-wide setting is shared by the whole binary.
//! (On the CPU every level computes in full precision; on an NVIDIA GPU `Default` uses TF32: BENCHMARKS.md.)

mod common;

use common::{assert_close, values, Rng};
use lazuli::{DType, Precision, Tensor};
use ndarray::{Array2, Array3, Axis};

fn compiles_of(f: impl FnOnce()) -> u64 {
    let m0 = lazuli::metrics();
    f();
    (lazuli::metrics() - m0).compiles
}

#[test]
fn precision_reaches_the_program_and_values_stay_right() {
    let mut rng = Rng::new(11);
    let (b, m, k, n) = (3, 5, 7, 4);
    let a = Array3::from_shape_vec((b, m, k), values(&mut rng, DType::F32, b * m * k, -2.0, 2.0)).unwrap();
    let w = Array2::from_shape_vec((k, n), values(&mut rng, DType::F32, k * n, -2.0, 2.0)).unwrap();
    let want: Vec<f64> = a.axis_iter(Axis(0)).flat_map(|ai| ai.dot(&w).into_iter().collect::<Vec<_>>()).collect();
    let at = Tensor::from_slice(&a.iter().map(|&v| v as f32).collect::<Vec<_>>(), &[b, m, k]);
    let wt = Tensor::from_slice(&w.iter().map(|&v| v as f32).collect::<Vec<_>>(), &[k, n]);
    let product = || at.matmul(&wt).to_dtype(DType::F64).to_vec::<f64>().unwrap();

    assert_eq!(lazuli::matmul_precision(), Precision::Default);
    let mut seen = Vec::new();
    for p in [Precision::Default, Precision::High, Precision::Highest] {
        // A new precision compiles a new program; the same one again is a cache hit.
        let first = compiles_of(|| seen = lazuli::with_matmul_precision(p, product));
        assert_eq!(first, 1, "{p:?}: a program of its own");
        assert_close(&format!("{p:?}"), DType::F32, &seen, &want);
        assert_eq!(compiles_of(|| drop(lazuli::with_matmul_precision(p, product))), 0, "{p:?} again");
    }
    assert_eq!(lazuli::matmul_precision(), Precision::Default, "the scope ended");

    // Gradients: d/dW sum(A·W) = Σ_batch Aᵀ·1, recorded at the forward's precision (a program of its own too).
    let wg = wt.clone().requires_grad();
    let grad = || lazuli::grad(&at.matmul(&wg).sum_all(), &[&wg]).remove(0).to_dtype(DType::F64).to_vec::<f64>();
    let col_sums = a.sum_axis(Axis(0)).sum_axis(Axis(0));
    let want_g: Vec<f64> = col_sums.iter().flat_map(|&s| std::iter::repeat_n(s, n)).collect();
    assert_close("gradient, default", DType::F32, &grad().unwrap(), &want_g);
    let mut g = Vec::new();
    assert_eq!(compiles_of(|| g = lazuli::with_matmul_precision(Precision::Highest, grad).unwrap()), 1);
    assert_close("gradient, highest", DType::F32, &g, &want_g);

    // Convolutions too: the same values at every level on the CPU, each level its own program, gradients included.
    let x = Tensor::from_slice(&values(&mut rng, DType::F32, 2 * 3 * 6 * 5, -1.0, 1.0), &[2, 3, 6, 5])
        .to_dtype(DType::F32);
    let kernel = Tensor::from_slice(&values(&mut rng, DType::F32, 4 * 3 * 3 * 2, -1.0, 1.0), &[4, 3, 3, 2])
        .to_dtype(DType::F32)
        .requires_grad();
    let conv = || {
        let y = x.conv2d(&kernel, [1, 2], [1, 0]);
        let dk = lazuli::grad(&(&y * &y).sum_all(), &[&kernel]).remove(0);
        (y.to_dtype(DType::F64).to_vec::<f64>().unwrap(), dk.to_dtype(DType::F64).to_vec::<f64>().unwrap())
    };
    let (y0, dk0) = conv();
    let (mut y1, mut dk1) = (Vec::new(), Vec::new());
    assert_eq!(compiles_of(|| (y1, dk1) = lazuli::with_matmul_precision(Precision::Highest, conv)), 2);
    assert_close("conv2d, highest", DType::F32, &y1, &y0);
    assert_close("conv2d gradient, highest", DType::F32, &dk1, &dk0);

    // The process-wide setting reaches other threads; a scope on this thread still wins, and is undone.
    lazuli::set_matmul_precision(Precision::Highest);
    assert_eq!(std::thread::spawn(lazuli::matmul_precision).join().unwrap(), Precision::Highest);
    lazuli::with_matmul_precision(Precision::High, || assert_eq!(lazuli::matmul_precision(), Precision::High));
    assert_eq!(lazuli::matmul_precision(), Precision::Highest);
    // The program recorded under the process-wide setting is the one compiled under the scope above.
    assert_eq!(compiles_of(|| assert_close("process-wide", DType::F32, &product(), &want)), 0);
    lazuli::set_matmul_precision(Precision::Default);
    assert_eq!(lazuli::matmul_precision(), Precision::Default);
}
