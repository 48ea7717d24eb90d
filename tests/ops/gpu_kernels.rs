//! The fused kernels on an NVIDIA GPU, each against its composite: attention by cuDNN and by lazuli's Triton
//! kernels over a table of shapes (forward and gradients), the GPT trained with and without them, and a user's
//! Triton kernel. They need a GPU, so they are ignored by `cargo test`; on a machine with one:
//!
//!   LAZULI_DEVICE=gpu cargo test --release --test ops gpu_kernels -- --ignored
//!
//! Reference: the composite on the same values in f32 at `Precision::Highest` (no TF32), so the error measured is
//! the kernel's. Tolerances are relative Frobenius errors: bf16 1.5e-2, f16 4e-3, f32 (TF32 products) 5e-3.

use lazuli::nn::{Gpt, GptConfig, HostRng};
use lazuli::{
    scaled_dot_product_attention as sdpa, AdamW, AttentionLayout, AttentionOptions, DType, Implementation, Module,
    Optimizer, Precision, Tensor,
};

fn require_gpu() {
    let platform = lazuli::platform().expect("a runtime");
    assert_eq!(platform, "cuda", "these tests need an NVIDIA GPU: run them with LAZULI_DEVICE=gpu");
}

/// Deterministic values in [-1, 1).
fn data(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E3779B97F4A7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

#[derive(Clone, Copy, Debug)]
struct Case {
    b: usize,
    h: usize,
    tq: usize,
    tk: usize,
    d: usize,
    dtype: DType,
    causal: bool,
    window: Option<usize>,
    layout: AttentionLayout,
}

impl Case {
    fn dims(&self, t: usize) -> Vec<usize> {
        match self.layout {
            AttentionLayout::Bhtd => vec![self.b, self.h, t, self.d],
            AttentionLayout::Bthd => vec![self.b, t, self.h, self.d],
        }
    }

    fn options(&self, implementation: Implementation) -> AttentionOptions {
        let mut o = if self.causal { AttentionOptions::causal() } else { AttentionOptions::new() };
        if let Some(w) = self.window {
            o = o.window(w);
        }
        o.layout(self.layout).implementation(implementation)
    }

    /// Whether cuDNN's flash attention should take this case (lazuli's Triton kernels take every case here).
    fn cudnn_applies(&self) -> bool {
        matches!(self.dtype, DType::BF16 | DType::F16) && self.window.is_none() && (!self.causal || self.tq == self.tk)
    }

    fn tolerance(&self) -> f64 {
        match self.dtype {
            DType::BF16 => 1.5e-2,
            DType::F16 => 4e-3,
            _ => 5e-3,
        }
    }
}

/// Output and gradients (of `sum(out · w)`) of attention on `case`'s data in `dtype`, read as f64.
fn attention_and_grads(case: &Case, dtype: DType, implementation: Implementation) -> Vec<Vec<f64>> {
    // The same values in every dtype: rounded to the case's dtype first.
    let leaf = |seed, t| {
        let dims = case.dims(t);
        let vals: Vec<f32> = data(dims.iter().product(), seed).into_iter().map(|x| round(x, case.dtype)).collect();
        host_tensor(&vals, &dims, dtype).requires_grad()
    };
    let (q, k, v) = (leaf(1, case.tq), leaf(2, case.tk), leaf(3, case.tk));
    let out = sdpa(&q, &k, &v, &case.options(implementation)).to_dtype(DType::F32);
    let w = Tensor::from_slice(&data(out.elements(), 4), out.dims());
    let grads = lazuli::grad(&(&out * &w).sum_all(), &[&q, &k, &v]);
    std::iter::once(&out).chain(&grads).map(|t| t.to_dtype(DType::F64).to_vec::<f64>().expect("read")).collect()
}

fn round(x: f32, dtype: DType) -> f32 {
    match dtype {
        DType::BF16 => half::bf16::from_f32(x).to_f32(),
        DType::F16 => half::f16::from_f32(x).to_f32(),
        _ => x,
    }
}

fn host_tensor(vals: &[f32], dims: &[usize], dtype: DType) -> Tensor {
    match dtype {
        DType::BF16 => Tensor::from_slice(&vals.iter().map(|&x| half::bf16::from_f32(x)).collect::<Vec<_>>(), dims),
        DType::F16 => Tensor::from_slice(&vals.iter().map(|&x| half::f16::from_f32(x)).collect::<Vec<_>>(), dims),
        _ => Tensor::from_slice(vals, dims),
    }
}

fn relative_error(got: &[f64], want: &[f64]) -> f64 {
    let diff: f64 = got.iter().zip(want).map(|(a, b)| (a - b) * (a - b)).sum();
    let norm: f64 = want.iter().map(|b| b * b).sum();
    (diff / norm.max(1e-30)).sqrt()
}

fn cases() -> Vec<Case> {
    use AttentionLayout::{Bhtd, Bthd};
    use DType::{BF16, F16, F32};
    let c = |(b, h, tq, tk, d), dtype, causal, window, layout| Case { b, h, tq, tk, d, dtype, causal, window, layout };
    vec![
        c((8, 12, 1024, 1024, 64), BF16, true, None, Bthd), // GPT-2 small
        c((2, 4, 128, 128, 64), BF16, false, None, Bhtd),
        c((1, 3, 100, 100, 64), BF16, true, None, Bthd), // lengths not a multiple of a block
        c((2, 2, 256, 256, 128), F16, true, None, Bhtd),
        c((1, 2, 77, 77, 80), BF16, true, None, Bhtd),
        c((2, 2, 100, 100, 64), F32, true, None, Bhtd),
        c((1, 2, 256, 256, 64), BF16, true, Some(64), Bthd), // sliding window
    ]
}

#[test]
#[ignore = "needs an NVIDIA GPU: LAZULI_DEVICE=gpu cargo test --release --test ops gpu_kernels -- --ignored"]
fn fused_attention_matches_its_composite_forward_and_backward() {
    check_cases(&cases());
}

#[test]
#[ignore = "needs an NVIDIA GPU: LAZULI_DEVICE=gpu cargo test --release --test ops gpu_kernels -- --ignored"]
fn fused_attention_takes_more_keys_than_queries() {
    let c = Case {
        b: 1,
        h: 2,
        tq: 64,
        tk: 96,
        d: 64,
        dtype: DType::BF16,
        causal: false,
        window: None,
        layout: AttentionLayout::Bhtd,
    };
    check_cases(&[c]);
}

/// Every implementation that should apply to each case, against the composite.
fn check_cases(cases: &[Case]) {
    require_gpu();
    let mut failures = Vec::new();
    for &case in cases {
        let reference = lazuli::with_matmul_precision(Precision::Highest, || {
            attention_and_grads(&case, DType::F32, Implementation::Composite)
        });
        for implementation in [Implementation::Cudnn, Implementation::Triton] {
            let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                attention_and_grads(&case, case.dtype, implementation)
            }));
            let expected = implementation == Implementation::Triton || case.cudnn_applies();
            let Ok(got) = run else {
                println!("{case:?} {implementation}: does not apply (see the panic above)");
                if expected {
                    failures.push(format!("{case:?} {implementation}: refused, but it should apply"));
                }
                continue;
            };
            let errors: Vec<f64> = got.iter().zip(&reference).map(|(g, r)| relative_error(g, r)).collect();
            let finite = got.iter().flatten().all(|x| x.is_finite());
            println!(
                "{case:?} {implementation}: relative error out {:.1e}, dq {:.1e}, dk {:.1e}, dv {:.1e}",
                errors[0], errors[1], errors[2], errors[3]
            );
            if !finite || errors.iter().any(|&e| e > case.tolerance()) {
                failures.push(format!("{case:?} {implementation}: {errors:?} (finite: {finite})"));
            }
        }
    }
    assert!(failures.is_empty(), "kernels disagree with the composite:\n{}", failures.join("\n"));
}

#[test]
#[ignore = "needs an NVIDIA GPU: LAZULI_DEVICE=gpu cargo test --release --test ops gpu_kernels -- --ignored"]
fn an_unsupported_head_dim_falls_back_to_the_composite_and_says_why() {
    require_gpu();
    let q = host_tensor(&data(2 * 2 * 64 * 36, 5), &[2, 2, 64, 36], DType::BF16);
    lazuli::diagnostics::events::start_capture();
    let y = sdpa(&q, &q, &q, &AttentionOptions::causal());
    y.to_dtype(DType::F32).to_vec::<f32>().unwrap();
    let kernels: Vec<String> =
        lazuli::diagnostics::events::take_captured().into_iter().flat_map(|e| e.kernels).collect();
    assert!(
        kernels.iter().any(|k| k.contains(": composite (") && k.contains("head dim 36 is not supported by cuDNN")),
        "{kernels:?}"
    );
}

/// Losses of 20 AdamW steps of a small GPT of `dtype`, attention by `implementation`.
fn train(dtype: DType, implementation: Implementation) -> Vec<f64> {
    let cfg = GptConfig {
        vocab: 96,
        block_size: 128,
        n_layer: 2,
        n_head: 2,
        d_model: 128,
        dropout: 0.0,
        dtype,
        scan_blocks: false,
        checkpoint_blocks: false,
    };
    let model = Gpt::new(&mut HostRng::new(7), cfg);
    let mut opt = AdamW::new(model.named_params(), 1e-3);
    let tokens: Vec<i32> = (0..4 * 129).map(|i| (i * 37 + i / 5) % 96).collect();
    let ids = Tensor::from_slice(&tokens, &[4, 129]);
    let (x, y) = (ids.narrow(1, 0, 128), ids.narrow(1, 1, 128));
    (0..20)
        .map(|_| {
            let loss = lazuli::with_attention(implementation, || model.loss(&x, &y));
            loss.backward();
            opt.step();
            opt.zero_grad();
            lazuli::sync().unwrap();
            loss.to_dtype(DType::F64).item::<f64>().unwrap()
        })
        .collect()
}

#[test]
#[ignore = "needs an NVIDIA GPU: LAZULI_DEVICE=gpu cargo test --release --test ops gpu_kernels -- --ignored"]
fn the_gpt_trains_to_the_same_losses_with_and_without_fused_attention() {
    require_gpu();
    // f32: Triton's kernel; bf16: cuDNN's. Tolerance per step: 2e-3 (f32, TF32 products on both sides) and 3e-2.
    for (dtype, tolerance) in [(DType::F32, 2e-3), (DType::BF16, 3e-2)] {
        let fused = train(dtype, Implementation::Auto);
        let composite = train(dtype, Implementation::Composite);
        println!("{dtype}: fused {fused:?}\n{dtype}: composite {composite:?}");
        assert!(fused[19] < fused[0] - 0.5, "{dtype}: the model did not learn: {fused:?}");
        for (i, (a, b)) in fused.iter().zip(&composite).enumerate() {
            assert!((a - b).abs() <= tolerance * b.abs(), "{dtype}: step {i}: fused {a} vs composite {b}");
        }
    }
}
