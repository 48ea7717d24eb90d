//! Gradient checking against central finite differences in f64.

use lazuli::{DType, Tensor};
use ndarray::ArrayD;

use super::Rng;

/// Check the gradient of `sum(f(inputs) * w)` (w random) against central differences, for every input.
/// `f` must be differentiable at the given points (keep them away from kinks).
#[track_caller]
pub fn check_grad(name: &str, inputs: &[ArrayD<f64>], f: impl Fn(&[Tensor]) -> Tensor) {
    let leaves: Vec<Tensor> = inputs.iter().map(|a| Tensor::from_ndarray(a).requires_grad()).collect();
    let out = f(&leaves);
    assert_eq!(out.dtype(), DType::F64, "{name}: check in f64");
    let mut rng = Rng::new(name.len() as u64);
    let w: Vec<f64> = (0..out.elements()).map(|_| rng.uniform(-1.0, 1.0)).collect();
    let wt = Tensor::from_slice(&w, out.dims());
    let loss = (&out * &wt).sum_all();
    let refs: Vec<&Tensor> = leaves.iter().collect();
    let grads = lazuli::grad(&loss, &refs);
    lazuli::sync().unwrap();

    let objective = |xs: &[ArrayD<f64>]| -> f64 {
        let ts: Vec<Tensor> = xs.iter().map(Tensor::from_ndarray).collect();
        (&f(&ts) * &wt).sum_all().item::<f64>().unwrap()
    };
    let eps = 1e-6;
    for (i, g) in grads.iter().enumerate() {
        assert_eq!(g.dims(), inputs[i].shape(), "{name}: gradient {i} shape");
        let got = g.to_vec::<f64>().unwrap();
        assert_eq!(got.len(), inputs[i].len(), "{name}: gradient {i} length");
        for (k, &got_k) in got.iter().enumerate() {
            let mut plus = inputs.to_vec();
            let mut minus = inputs.to_vec();
            plus[i].as_slice_mut().unwrap()[k] += eps;
            minus[i].as_slice_mut().unwrap()[k] -= eps;
            let fd = (objective(&plus) - objective(&minus)) / (2.0 * eps);
            let tol = 1e-6 * (1.0 + fd.abs());
            assert!(
                (got_k - fd).abs() <= tol,
                "{name}: d/d input {i}[{k}]: autodiff {got_k} vs finite differences {fd}"
            );
        }
    }
}
