//! Record a small computation lazily, materialize it, and watch the executable cache: the first run compiles,
//! a second run of the same structure with new values only executes.

use lazuli::{DType, Tensor};

/// lazuli sets no allocator; an application picks one. mimalloc, also as C's malloc (its `override` feature),
/// serves recording's many small allocations and the plugin's much faster than glibc's malloc (README, "Allocator").
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// A little model: y = sum(tanh(x @ w + b) * scale, axis 1). `scale` is a host scalar, so it is a program
/// parameter: changing it does not recompile.
fn model(x: &Tensor, w: &Tensor, b: &Tensor, scale: f64) -> Tensor {
    ((x.matmul(w) + b).tanh() * scale).sum(&[1])
}

fn main() -> lazuli::Result<()> {
    println!("lazuli quickstart on {}", lazuli::runtime_info()?);

    let x = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]);
    let w = Tensor::from_slice(&[0.1f32, -0.2, 0.3, -0.4, 0.5, -0.6], &[3, 2]);
    let b = Tensor::full(&[2], 0.25, DType::F32);

    let y = model(&x, &w, &b, 2.0);
    println!("recorded y = {y:?}; nothing has run yet: {}", lazuli::metrics());

    // Reading the value materializes it: lower to StableHLO, compile, run.
    println!("y = {y}");
    let first = lazuli::metrics();
    println!("after the first run:  {first}");

    // Same structure, new values (new input data and a new scale): a cache hit, no compile.
    let x2 = Tensor::from_slice(&[0.5f32, -1.0, 1.5, -2.0, 2.5, -3.0], &[2, 3]);
    let y2 = model(&x2, &w, &b, 0.5);
    println!("y2 = {y2}");
    let second = lazuli::metrics();
    println!("after the second run: {second}");

    // A different shape is a different structure: one more compile.
    let x3 = Tensor::from_slice(&[1.0f32; 12], &[4, 3]);
    let y3 = model(&x3, &w, &b, 1.0);
    println!("y3 = {y3}");
    let third = lazuli::metrics();
    println!("after a new shape:    {third}");

    let d = second - first;
    println!(
        "\nsummary: first run compiled {} program(s); the same structure with new values compiled {} and hit the cache {} time(s); a new shape compiled {}",
        first.compiles,
        d.compiles,
        d.cache_hits,
        (third - second).compiles
    );
    assert_eq!(first.compiles, 1, "the first run compiles once");
    assert_eq!(d.compiles, 0, "new values must not recompile");
    Ok(())
}
