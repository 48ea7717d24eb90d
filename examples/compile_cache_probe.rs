//! The persistent compile cache seen from outside: computes one small program per row count given on the command
//! line, prints its results (exact f32 bits and a host computation in f64) and the disk cache counters. Run it
//! twice with the same `LAZULI_COMPILE_CACHE` directory: the second run loads every program from disk.
//!
//! ```text
//! cargo run --example compile_cache_probe -- 2 3
//! ```
//! Output lines: `program rows=N got=<hex bits,…> expected=<f64,…>`, then
//! `counters compiles=C disk_cache_hits=H disk_cache_misses=M`. `tests/engine/compile_cache.rs` drives it.

use lazuli::Tensor;

/// lazuli sets no allocator; an application picks one. mimalloc, also as C's malloc (its `override` feature),
/// serves recording's many small allocations and the plugin's much faster than glibc's malloc (README, "Allocator").
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const K: usize = 3;
const J: usize = 4;

fn inputs(rows: usize) -> (Vec<f32>, Vec<f32>, Vec<f32>, f64) {
    let x = (0..rows * K).map(|i| (i as f32 * 0.37).sin()).collect();
    let w = (0..K * J).map(|i| (i as f32 * 0.61).cos() * 0.5).collect();
    let b = (0..J).map(|j| 0.1 * j as f32 - 0.15).collect();
    (x, w, b, 0.5 + 0.25 * rows as f64)
}

/// sum over j of tanh(x @ w + b)[i, j] * scale, plus the row's max of x @ w: two reductions, one program.
fn program(rows: usize) -> lazuli::Result<Vec<f32>> {
    let (x, w, b, scale) = inputs(rows);
    let x = Tensor::from_slice(&x, &[rows, K]);
    let w = Tensor::from_slice(&w, &[K, J]);
    let b = Tensor::from_slice(&b, &[J]);
    let xw = x.matmul(&w);
    let y = (&xw + &b).tanh() * scale;
    (y.sum(&[1]) + xw.max(&[1])).to_vec::<f32>()
}

fn expected(rows: usize) -> Vec<f64> {
    let (x, w, b, scale) = inputs(rows);
    (0..rows)
        .map(|i| {
            let xw: Vec<f64> =
                (0..J).map(|j| (0..K).map(|k| x[i * K + k] as f64 * w[k * J + j] as f64).sum()).collect();
            let sum: f64 = (0..J).map(|j| (xw[j] + b[j] as f64).tanh() * scale).sum();
            sum + xw.iter().cloned().fold(f64::NEG_INFINITY, f64::max)
        })
        .collect()
}

fn main() -> lazuli::Result<()> {
    let rows: Vec<usize> = std::env::args().skip(1).map(|a| a.parse().expect("row counts are numbers")).collect();
    let rows = if rows.is_empty() { vec![2, 3] } else { rows };
    for n in rows {
        let got = program(n)?;
        let bits: Vec<String> = got.iter().map(|v| format!("{:08x}", v.to_bits())).collect();
        let want: Vec<String> = expected(n).iter().map(|v| format!("{v:e}")).collect();
        println!("program rows={n} got={} expected={}", bits.join(","), want.join(","));
    }
    let m = lazuli::metrics();
    println!(
        "counters compiles={} disk_cache_hits={} disk_cache_misses={} compile_ms={:.3}",
        m.compiles, m.disk_cache_hits, m.disk_cache_misses, m.compile_ms
    );
    Ok(())
}
