//! `lazuli-bench attention`: attention alone (bf16; by default GPT-2 small's shapes, B=8, T=1024, H=12, D=64,
//! causal), forward and forward+backward, for each of lazuli's implementations beside JAX's cuDNN call and
//! PyTorch's SDPA (`python/attention.py`, embedded), in one run; `--shapes` and `--masks` make it a table of cases
//! (what `Implementation::Auto`'s choice is measured on).
//!
//! lazuli's times: `iters` steps back to back (each one program: the attention, or the attention and the
//! gradients of `sum(out · w)` with respect to q, k and v), one wait at the end, divided by `iters`; the median of
//! `reps` such runs. The Python side times each call until its results are ready (median of its calls).

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use lazuli::{scaled_dot_product_attention, AttentionLayout, AttentionOptions, DType, Implementation, Tensor};
use serde_json::Value;

use crate::stats::median;
use crate::BenchResult;

const SCRIPT: &str = include_str!("../python/attention.py");

/// One implementation's times, milliseconds.
pub struct Row {
    pub name: String,
    pub fwd_ms: f64,
    pub fwd_bwd_ms: f64,
}

/// One measured case: `[b, t, h, d]` (Bthd) bf16 operands, causal or not.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Case {
    pub dims: [usize; 4],
    pub causal: bool,
}

impl Case {
    /// GPT-2 small's attention: B=8, T=1024, H=12, D=64, causal.
    pub const GPT2: Case = Case { dims: [8, 1024, 12, 64], causal: true };

    /// `BxTxHxD`, as `--shapes` takes it.
    pub fn parse_dims(s: &str) -> Result<[usize; 4], String> {
        let parts: Vec<usize> = s
            .split('x')
            .map(|p| p.trim().parse::<usize>())
            .collect::<Result<_, _>>()
            .map_err(|e| format!("attention shape `{s}`: {e} (expected BxTxHxD, e.g. 8x1024x12x64)"))?;
        match parts.as_slice() {
            &[b, t, h, d] if b * t * h * d > 0 => Ok([b, t, h, d]),
            _ => Err(format!("attention shape `{s}`: expected four positive sizes BxTxHxD, e.g. 8x1024x12x64")),
        }
    }

    pub fn describe(&self) -> String {
        let [b, t, h, d] = self.dims;
        let mask = if self.causal { "causal" } else { "no mask" };
        format!("B={b}, T={t}, H={h}, D={d}, bf16, {mask}")
    }
}

/// lazuli's row for `implementation` on the case's bf16 operands.
fn lazuli_row(implementation: Implementation, case: Case, iters: usize, reps: usize) -> BenchResult<Row> {
    let dims = case.dims;
    let n: usize = dims.iter().product();
    let data = |seed: u64| -> Vec<f32> {
        let mut s = seed.wrapping_mul(0x9E3779B97F4A7C15) | 1;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
            })
            .collect()
    };
    let leaf = |seed| -> BenchResult<Tensor> {
        let t = Tensor::from_slice(&data(seed), &dims).to_dtype(DType::BF16);
        t.materialize()?; // a device value, then a gradient leaf
        Ok(t.requires_grad())
    };
    let (q, k, v) = (leaf(1)?, leaf(2)?, leaf(3)?);
    let w = Tensor::from_slice(&data(4), &dims);
    w.materialize()?;
    let mask = if case.causal { AttentionOptions::causal() } else { AttentionOptions::default() };
    let opts = mask.layout(AttentionLayout::Bthd).implementation(implementation);
    let forward = || scaled_dot_product_attention(&q, &k, &v, &opts);
    let with_grads = || {
        let out = scaled_dot_product_attention(&q, &k, &v, &opts).to_dtype(DType::F32);
        lazuli::grad(&(&out * &w).sum_all(), &[&q, &k, &v])
    };
    let time = |step: &dyn Fn() -> Vec<Tensor>| -> BenchResult<f64> {
        let mut per_rep = Vec::new();
        for rep in 0..=reps {
            let t0 = Instant::now();
            for _ in 0..iters {
                let outs = step();
                lazuli::sync()?;
                drop(outs);
            }
            lazuli::wait()?;
            if rep > 0 {
                per_rep.push(t0.elapsed().as_secs_f64() * 1e3 / iters as f64); // rep 0 compiles and warms up
            }
        }
        Ok(median(&per_rep))
    };
    Ok(Row {
        name: format!("lazuli, scaled_dot_product_attention ({implementation})"),
        fwd_ms: time(&|| vec![forward()])?,
        fwd_bwd_ms: time(&with_grads)?,
    })
}

/// JAX's and PyTorch's rows, from the embedded script run by `python`.
fn python_rows(python: &Path, dir: &Path, case: Case, iters: usize) -> BenchResult<Vec<Row>> {
    let script = dir.join("attention.py");
    std::fs::write(&script, SCRIPT)?;
    let [b, t, h, d] = case.dims;
    let out = Command::new(python)
        .arg(&script)
        .args([b, t, h, d, iters, case.causal as usize].map(|x| x.to_string()))
        .stderr(std::process::Stdio::inherit())
        .output()?;
    let mut rows = Vec::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let v: Value = serde_json::from_str(line)?;
        if let Some(e) = v["error"].as_str() {
            eprintln!("lazuli-bench: {}: {e}", v["name"]);
            continue;
        }
        let ms = |key: &str| v[key].as_f64().unwrap_or(f64::NAN);
        rows.push(Row {
            name: v["name"].as_str().unwrap_or("?").into(),
            fwd_ms: ms("fwd_ms"),
            fwd_bwd_ms: ms("fwd_bwd_ms"),
        });
    }
    Ok(rows)
}

/// Every row of one case: lazuli's implementations that apply on this device (one that does not apply is left
/// out, with the reason on stderr), then JAX's and PyTorch's.
pub fn run(python: &Path, dir: &Path, case: Case, iters: usize, reps: usize) -> BenchResult<Vec<Row>> {
    let mut rows = Vec::new();
    let on_gpu = lazuli::platform()? == "cuda";
    let implementations: &[Implementation] = if on_gpu {
        &[Implementation::Cudnn, Implementation::Triton, Implementation::Composite]
    } else {
        &[Implementation::Composite]
    };
    for &implementation in implementations {
        eprintln!("lazuli-bench: attention, {}, lazuli ({implementation})", case.describe());
        match lazuli_row(implementation, case, iters, reps) {
            Ok(row) => rows.push(row),
            Err(e) => eprintln!("lazuli-bench: attention, {}, lazuli ({implementation}): {e}", case.describe()),
        }
    }
    eprintln!("lazuli-bench: attention, {}, JAX and PyTorch", case.describe());
    rows.extend(python_rows(python, dir, case, iters)?);
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::Case;

    #[test]
    fn a_shape_is_four_positive_sizes() {
        assert_eq!(Case::parse_dims("8x1024x12x64"), Ok([8, 1024, 12, 64]));
        for bad in ["8x1024x12", "8x1024x0x64", "8x1024x12xD", ""] {
            let err = Case::parse_dims(bad).expect_err(bad);
            assert!(err.contains(&format!("`{bad}`")) && err.contains("BxTxHxD"), "{err}");
        }
    }
}
