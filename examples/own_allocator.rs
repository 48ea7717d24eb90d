//! An application with a global allocator of its own: lazuli sets none, so this links and runs. A small
//! computation and its gradient are checked against values computed here on the host.
//!
//! cargo run --release --example own_allocator

use lazuli::{DType, Tensor};

/// The application's choice (here the system's allocator; a counting or arena allocator would do as well).
#[global_allocator]
static GLOBAL: std::alloc::System = std::alloc::System;

fn main() -> lazuli::Result<()> {
    let xs = [1.0f32, -2.0, 3.0, 0.5, -1.5, 2.5];
    let ws = [0.5f32, -1.0, 0.25, 2.0, -0.75, 1.5];
    let x = Tensor::from_slice(&xs, &[2, 3]);
    let w = Tensor::from_slice(&ws, &[3, 2]).requires_grad();

    // y = sum(tanh(x @ w) * 2); dy/dw = x^T @ (2 * (1 - tanh(x @ w)^2)).
    let y = (x.matmul(&w).tanh() * 2.0).sum_all();
    y.backward();
    let (got_y, got_grad) = (y.item::<f32>()?, w.grad().expect("w has a gradient").to_vec::<f32>()?);

    let z: Vec<f64> = (0..4)
        .map(|k| {
            let (i, j) = (k / 2, k % 2);
            (0..3).map(|p| xs[i * 3 + p] as f64 * ws[p * 2 + j] as f64).sum::<f64>()
        })
        .collect();
    let want_y: f64 = z.iter().map(|v| 2.0 * v.tanh()).sum();
    let want_grad: Vec<f64> = (0..6)
        .map(|k| {
            let (p, j) = (k / 2, k % 2);
            (0..2).map(|i| xs[i * 3 + p] as f64 * 2.0 * (1.0 - z[i * 2 + j].tanh().powi(2))).sum::<f64>()
        })
        .collect();

    let close = |a: f32, b: f64| (a as f64 - b).abs() <= 1e-5 * b.abs().max(1.0);
    assert!(close(got_y, want_y), "y = {got_y}, expected {want_y}");
    for (g, e) in got_grad.iter().zip(&want_grad) {
        assert!(close(*g, *e), "dy/dw = {got_grad:?}, expected {want_grad:?}");
    }
    let ones = Tensor::ones(&[3], DType::F32).sum_all().item::<f32>()?;
    assert_eq!(ones, 3.0);
    println!("y = {got_y:.6} and dy/dw = {got_grad:?} match the host's values, with the system allocator");
    Ok(())
}
