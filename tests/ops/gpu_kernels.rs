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

#[test]
#[ignore = "needs an NVIDIA GPU: LAZULI_DEVICE=gpu cargo test --release --test ops gpu_kernels -- --ignored"]
fn fused_attention_takes_more_heads_than_a_grid_column() {
    // 70,000 batch · heads: a causal flash kernel runs them along the grid's x (y takes 65,535).
    let (b, h, tq, tk, d, dtype) = (700, 100, 40, 40, 64, DType::BF16);
    check_cases(&[Case { b, h, tq, tk, d, dtype, causal: true, window: None, layout: AttentionLayout::Bthd }]);
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

/// Output and the gradient of the packed `[B, T, 3, H, D]` tensor (of `sum(out · w)`) when q, k, v are its slots,
/// read as f64, and the kernels the compile events name.
fn packed_attention_and_grad(
    case: &Case,
    dtype: DType,
    implementation: Implementation,
) -> (Vec<Vec<f64>>, Vec<String>) {
    let dims = [case.b, case.tq, 3, case.h, case.d];
    let vals: Vec<f32> = data(dims.iter().product(), 11).into_iter().map(|x| round(x, case.dtype)).collect();
    let qkv = host_tensor(&vals, &dims, dtype).requires_grad();
    let part =
        |i: usize| qkv.narrow(2, i, 1).reshape(&[case.b as isize, case.tq as isize, case.h as isize, case.d as isize]);
    lazuli::diagnostics::events::start_capture();
    let out = sdpa(&part(0), &part(1), &part(2), &case.options(implementation)).to_dtype(DType::F32);
    let w = Tensor::from_slice(&data(out.elements(), 12), out.dims());
    let grads = lazuli::grad(&(&out * &w).sum_all(), &[&qkv]);
    let values = std::iter::once(&out).chain(&grads).map(|t| t.to_dtype(DType::F64).to_vec::<f64>().expect("read"));
    let values = values.collect();
    let kernels = lazuli::diagnostics::events::take_captured().into_iter().flat_map(|e| e.kernels).collect();
    (values, kernels)
}

#[test]
#[ignore = "needs an NVIDIA GPU: LAZULI_DEVICE=gpu cargo test --release --test ops gpu_kernels -- --ignored"]
fn fused_attention_reads_packed_q_k_v_in_place() {
    require_gpu();
    use DType::{BF16, F16, F32};
    let c = |(b, h, t, d), dtype, causal, window| Case {
        b,
        h,
        tq: t,
        tk: t,
        d,
        dtype,
        causal,
        window,
        layout: AttentionLayout::Bthd,
    };
    let cases = [
        c((8, 12, 1024, 64), BF16, true, None), // GPT-2 small
        c((1, 3, 100, 64), BF16, true, None),   // not a multiple of a block
        c((2, 2, 256, 128), F16, false, None),
        c((1, 2, 100, 256), BF16, true, None), // dq's and dk/dv's blocks differ
        c((2, 2, 100, 64), F32, true, None),
        c((1, 2, 256, 64), BF16, true, Some(64)),
    ];
    let mut failures = Vec::new();
    for case in cases {
        let (reference, _) = lazuli::with_matmul_precision(Precision::Highest, || {
            packed_attention_and_grad(&case, DType::F32, Implementation::Composite)
        });
        let (got, kernels) = packed_attention_and_grad(&case, case.dtype, Implementation::Auto);
        if !kernels.iter().any(|k| k.contains(": triton (") && k.contains("q, k, v packed")) {
            failures.push(format!("{case:?}: not the packed Triton kernels: {kernels:?}"));
        }
        failures.extend(compare(&format!("{case:?} packed: out, dqkv"), &got, &reference, |_| case.tolerance()));
    }
    assert!(failures.is_empty(), "packed kernels disagree with the composite:\n{}", failures.join("\n"));
}

/// The custom kernels the compile events name (with the implementation that ran and why) for self-attention of `q`
/// under each of `options`, each computed.
fn kernels_chosen(q: &Tensor, options: &[AttentionOptions]) -> Vec<String> {
    lazuli::diagnostics::events::start_capture();
    for o in options {
        sdpa(q, q, q, o).to_dtype(DType::F32).to_vec::<f32>().unwrap();
    }
    lazuli::diagnostics::events::take_captured().into_iter().flat_map(|e| e.kernels).collect()
}

#[test]
#[ignore = "needs an NVIDIA GPU: LAZULI_DEVICE=gpu cargo test --release --test ops gpu_kernels -- --ignored"]
fn an_unsupported_head_dim_falls_back_to_the_composite_and_says_why() {
    require_gpu();
    let q = host_tensor(&data(2 * 2 * 64 * 36, 5), &[2, 2, 64, 36], DType::BF16);
    let kernels = kernels_chosen(&q, &[AttentionOptions::causal()]);
    assert!(
        kernels.iter().any(|k| k.contains(": composite (") && k.contains("head dim 36 is not supported by cuDNN")),
        "{kernels:?}"
    );
}

#[test]
#[ignore = "needs an NVIDIA GPU: LAZULI_DEVICE=gpu cargo test --release --test ops gpu_kernels -- --ignored"]
fn auto_takes_triton_where_it_was_measured_faster_than_cudnn_and_says_so() {
    require_gpu();
    let q = host_tensor(&data(2 * 256 * 4 * 64, 6), &[2, 256, 4, 64], DType::BF16);
    let (causal, no_mask) = (AttentionOptions::causal(), AttentionOptions::new());
    let kernels = kernels_chosen(&q, &[causal.layout(AttentionLayout::Bthd), no_mask.layout(AttentionLayout::Bthd)]);
    let hopper = kernels.iter().any(|k| k.contains(": triton (") && k.contains("Triton before cuDNN: measured faster"));
    let elsewhere = kernels.iter().filter(|k| k.contains(": cudnn (")).count() == 2;
    assert!(hopper || elsewhere, "{kernels:?}");
    assert!(kernels.iter().any(|k| k.contains(": cudnn (")), "no mask: cuDNN everywhere: {kernels:?}");
}

/// Losses of 20 AdamW steps of a small GPT of `dtype`, attention by `implementation`.
fn train(dtype: DType, implementation: Implementation) -> Vec<f64> {
    train_blocks(dtype, implementation, None)
}

/// [`train`] with the blocks unrolled (`scan: None`) or stacked and scanned, as a loop (`Some(false)`) or written
/// out in the program (`Some(true)`).
fn train_blocks(dtype: DType, implementation: Implementation, scan: Option<bool>) -> Vec<f64> {
    let cfg = GptConfig {
        vocab: 96,
        block_size: 128,
        n_layer: 2,
        n_head: 2,
        d_model: 128,
        dropout: 0.0,
        dtype,
        scan_blocks: scan.is_some(),
        checkpoint_blocks: false,
    };
    let mut model = Gpt::new(&mut HostRng::new(7), cfg);
    if let Some(s) = &mut model.scanned {
        s.unroll = scan;
    }
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
    // The model's fused q, k, v projection goes to Triton's packed kernels (auto); cuDNN's is forced once. Tolerance
    // per step: 2e-3 (f32, TF32 products on both sides) and 3e-2.
    let runs = [
        (DType::F32, Implementation::Auto, 2e-3),
        (DType::BF16, Implementation::Auto, 3e-2),
        (DType::BF16, Implementation::Cudnn, 3e-2),
    ];
    for (dtype, implementation, tolerance) in runs {
        let fused = train(dtype, implementation);
        let composite = train(dtype, Implementation::Composite);
        println!("{dtype} {implementation}: fused {fused:?}\n{dtype}: composite {composite:?}");
        assert!(fused[19] < fused[0] - 0.5, "{dtype} {implementation}: the model did not learn: {fused:?}");
        for (i, (a, b)) in fused.iter().zip(&composite).enumerate() {
            let what = format!("{dtype} {implementation}: step {i}");
            assert!((a - b).abs() <= tolerance * b.abs(), "{what}: fused {a} vs composite {b}");
        }
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU: LAZULI_DEVICE=gpu cargo test --release --test ops gpu_kernels -- --ignored"]
fn the_scanned_gpt_trains_to_the_unrolled_losses_looped_or_written_out() {
    require_gpu();
    // Same weights, same kernels; the scan's products and sums run in another order. Tolerance per step as above.
    for (dtype, tolerance) in [(DType::F32, 2e-3), (DType::BF16, 3e-2)] {
        let unrolled = train_blocks(dtype, Implementation::Auto, None);
        for unroll in [false, true] {
            let scanned = train_blocks(dtype, Implementation::Auto, Some(unroll));
            println!("{dtype}: unrolled {unrolled:?}\n{dtype}: scanned (unroll {unroll}) {scanned:?}");
            assert!(scanned[19] < scanned[0] - 0.5, "{dtype}, unroll {unroll}: the model did not learn: {scanned:?}");
            for (i, (a, b)) in scanned.iter().zip(&unrolled).enumerate() {
                let what = format!("{dtype}, unroll {unroll}: step {i}");
                assert!((a - b).abs() <= tolerance * b.abs(), "{what}: scanned {a} vs unrolled {b}");
            }
        }
    }
}

/// The relative error of each of `got`'s results against `want`'s, printed after `what`; a failure line when a
/// value is not finite or result `i`'s error is above `tolerance(i)`.
fn compare(what: &str, got: &[Vec<f64>], want: &[Vec<f64>], tolerance: impl Fn(usize) -> f64) -> Option<String> {
    let errors: Vec<f64> = got.iter().zip(want).map(|(g, w)| relative_error(g, w)).collect();
    let finite = got.iter().flatten().all(|v| v.is_finite());
    let shown: Vec<String> = errors.iter().map(|e| format!("{e:.1e}")).collect();
    println!("{what}: relative errors {}", shown.join(", "));
    let within = errors.iter().enumerate().all(|(i, &e)| e <= tolerance(i));
    (!finite || !within).then(|| format!("{what}: {errors:?} (finite: {finite})"))
}

/// `y = layer_norm(x) · w + b` in `out` and the gradients of `sum(y · r)` for x, w and b, read as f64: by the
/// fused op, or by the formula of separate ops (the reference, computed in f32).
fn layer_norm_and_grads(rows: &[usize], width: usize, dtype: DType, out: DType, fused: bool) -> Vec<Vec<f64>> {
    let mut dims = rows.to_vec();
    dims.push(width);
    let n: usize = dims.iter().product();
    let x_vals: Vec<f32> = data(n, 11).into_iter().map(|v| round(3.0 * v + 0.5, dtype)).collect();
    let w_vals: Vec<f32> = data(width, 12).into_iter().map(|v| round(1.0 + 0.5 * v, dtype)).collect();
    let b_vals: Vec<f32> = data(width, 13).into_iter().map(|v| round(0.3 * v, dtype)).collect();
    let (x, w, b) = if fused {
        (
            host_tensor(&x_vals, &dims, dtype),
            host_tensor(&w_vals, &[width], dtype),
            host_tensor(&b_vals, &[width], dtype),
        )
    } else {
        (
            Tensor::from_slice(&x_vals, &dims),
            Tensor::from_slice(&w_vals, &[width]),
            Tensor::from_slice(&b_vals, &[width]),
        )
    };
    let (x, w, b) = (x.requires_grad(), w.requires_grad(), b.requires_grad());
    let y = if fused {
        x.layer_norm_affine(&w, &b, 1e-5, out).to_dtype(DType::F32)
    } else {
        let y = x.layer_norm(&[-1], 1e-5) * &w + &b;
        // Rounded to `out` as the kernel rounds its result.
        y.to_dtype(out).to_dtype(DType::F32)
    };
    let r = Tensor::from_slice(&data(n, 14), &dims);
    let grads = lazuli::grad(&(&y * &r).sum_all(), &[&x, &w, &b]);
    std::iter::once(&y).chain(&grads).map(|t| t.to_dtype(DType::F64).to_vec::<f64>().expect("read")).collect()
}

#[test]
#[ignore = "needs an NVIDIA GPU: LAZULI_DEVICE=gpu cargo test --release --test ops gpu_kernels -- --ignored"]
fn fused_layer_norm_matches_the_formula_forward_and_backward() {
    require_gpu();
    use DType::{BF16, F16, F32};
    // (leading dims, width, x dtype, result dtype, tolerance): GPT-2 small's, widths not a power of two, rows
    // not a multiple of a block, 16-bit inputs and results.
    let cases: [(&[usize], usize, DType, DType, f64); 6] = [
        (&[8, 1024], 768, F32, BF16, 1e-2),
        (&[8, 1024], 768, F32, F32, 1e-5),
        (&[3, 37], 100, F32, F32, 1e-5),
        (&[5], 4096, F32, BF16, 1e-2),
        (&[4, 33], 768, BF16, BF16, 1.5e-2),
        (&[129], 1600, F16, F32, 4e-3),
    ];
    let failures: Vec<String> = cases
        .into_iter()
        .filter_map(|(rows, width, dtype, out, tolerance)| {
            let got = layer_norm_and_grads(rows, width, dtype, out, true);
            let want = layer_norm_and_grads(rows, width, dtype, out, false);
            // The gradients sum over rows in another order (and from a rounded cotangent for 16-bit results).
            let tolerance = |i: usize| if i == 0 { tolerance } else { tolerance.max(2e-3) };
            compare(&format!("layer norm {rows:?}×{width} {dtype}→{out}: y, dx, dw, db"), &got, &want, tolerance)
        })
        .collect();
    assert!(failures.is_empty(), "the layer-norm kernels disagree with the formula:\n{}", failures.join("\n"));
}

/// `(s, y) = (x + a + c, layer_norm(s) · w + b)` (`c` a bias along the last axis, when `biased`) with `s` in x's
/// type and `y` in `out`, and the gradients of `sum(y · r) + sum(s · q)` for x, a, (c,) w and b, read as f64: by
/// the fused op, or by separate ops in f32 (the reference, rounding the sum and the result where the kernel does).
fn add_layer_norm_and_grads(dims: &[usize], types: (DType, DType, DType), biased: bool, fused: bool) -> Vec<Vec<f64>> {
    let (dtype, added, out) = types;
    let (n, width) = (dims.iter().product::<usize>(), dims[dims.len() - 1]);
    let x_vals: Vec<f32> = data(n, 31).into_iter().map(|v| round(3.0 * v + 0.5, dtype)).collect();
    let a_vals: Vec<f32> = data(n, 32).into_iter().map(|v| round(v, added)).collect();
    let w_vals: Vec<f32> = data(width, 33).into_iter().map(|v| 1.0 + 0.5 * v).collect();
    let b_vals: Vec<f32> = data(width, 34).into_iter().map(|v| 0.3 * v).collect();
    let (x, a) = if fused {
        (host_tensor(&x_vals, dims, dtype), host_tensor(&a_vals, dims, added))
    } else {
        (Tensor::from_slice(&x_vals, dims), Tensor::from_slice(&a_vals, dims))
    };
    let (w, b) = (Tensor::from_slice(&w_vals, &[width]), Tensor::from_slice(&b_vals, &[width]));
    let c = Tensor::from_slice(&data(width, 37).into_iter().map(|v| 0.2 * v).collect::<Vec<_>>(), &[width]);
    let (x, a, w, b, c) =
        (x.requires_grad(), a.requires_grad(), w.requires_grad(), b.requires_grad(), c.requires_grad());
    let (s, y) = if fused {
        let (s, y) = x.add_layer_norm_affine(&a, biased.then_some(&c), &w, &b, 1e-5, out);
        (s.to_dtype(DType::F32), y.to_dtype(DType::F32))
    } else {
        let a = if biased { a.to_dtype(DType::F32) + &c } else { a.clone() };
        let s = (&x + &a).to_dtype(dtype).to_dtype(DType::F32);
        let y = s.layer_norm(&[-1], 1e-5) * &w + &b;
        (s, y.to_dtype(out).to_dtype(DType::F32))
    };
    let (r, q) = (Tensor::from_slice(&data(n, 35), dims), Tensor::from_slice(&data(n, 36), dims));
    let loss = (&y * &r).sum_all() + (&s * &q).sum_all();
    let wrt: Vec<&Tensor> = [&x, &a].into_iter().chain(biased.then_some(&c)).chain([&w, &b]).collect();
    let grads = lazuli::grad(&loss, &wrt);
    [&s, &y].into_iter().chain(&grads).map(|t| t.to_dtype(DType::F64).to_vec::<f64>().expect("read")).collect()
}

#[test]
#[ignore = "needs an NVIDIA GPU: LAZULI_DEVICE=gpu cargo test --release --test ops gpu_kernels -- --ignored"]
fn fused_add_layer_norm_matches_the_formula_forward_and_backward() {
    require_gpu();
    use DType::{BF16, F16, F32};
    // (dims, x / added / result dtypes, tolerance): GPT-2 small's residual stream (f32 plus an f32 or bf16
    // branch, bf16 result), ragged rows and widths, a 16-bit stream (the sum rounded before it is normalized).
    // With `biased`, the added tensor is a linear layer's product and its bias comes with it.
    type Case<'a> = (&'a [usize], (DType, DType, DType), bool, f64);
    let cases: [Case; 7] = [
        (&[8, 1024, 768], (F32, F32, BF16), false, 1e-2),
        (&[8, 1024, 768], (F32, BF16, BF16), false, 1e-2),
        (&[8, 1024, 768], (F32, BF16, BF16), true, 1e-2),
        (&[3, 37, 100], (F32, F32, F32), false, 1e-5),
        (&[3, 37, 100], (F32, BF16, F32), true, 1e-5),
        (&[4, 33, 768], (BF16, BF16, BF16), false, 1.5e-2),
        (&[129, 1600], (F16, F32, F32), true, 4e-3),
    ];
    let failures: Vec<String> = cases
        .into_iter()
        .filter_map(|(dims, types, biased, tolerance)| {
            let got = add_layer_norm_and_grads(dims, types, biased, true);
            let want = add_layer_norm_and_grads(dims, types, biased, false);
            // The gradients sum over rows in another order; `a`'s is rounded to its type.
            let (_, added, _) = types;
            let tolerance = |i: usize| match i {
                0 | 1 => tolerance,
                3 if added != DType::F32 => tolerance.max(1e-2),
                _ => tolerance.max(2e-3),
            };
            let grads = if biased { "dx, da, dc, dw, db" } else { "dx, da, dw, db" };
            let what = format!("add + layer norm {dims:?} {types:?}: s, y, {grads}");
            compare(&what, &got, &want, tolerance)
        })
        .collect();
    assert!(failures.is_empty(), "the add + layer-norm kernel disagrees with the formula:\n{}", failures.join("\n"));
}

/// `gelu(x + b)` in `out` and the gradients of `sum(y · r)` for x and b, read as f64: by the fused op, or by the
/// formula of separate ops in f32 (the reference).
fn bias_gelu_and_grads(rows: &[usize], cols: usize, dtype: DType, out: DType, fused: bool) -> Vec<Vec<f64>> {
    let mut dims = rows.to_vec();
    dims.push(cols);
    let n: usize = dims.iter().product();
    let x_vals: Vec<f32> = data(n, 21).into_iter().map(|v| round(4.0 * v, dtype)).collect();
    let b_vals: Vec<f32> = data(cols, 22).into_iter().map(|v| 0.5 * v).collect();
    let x = if fused { host_tensor(&x_vals, &dims, dtype) } else { Tensor::from_slice(&x_vals, &dims) };
    let (x, b) = (x.requires_grad(), Tensor::from_slice(&b_vals, &[cols]).requires_grad());
    let y = if fused {
        x.bias_gelu(&b, out).to_dtype(DType::F32)
    } else {
        (&x + &b).gelu().to_dtype(out).to_dtype(DType::F32)
    };
    let r = Tensor::from_slice(&data(n, 23), &dims);
    let grads = lazuli::grad(&(&y * &r).sum_all(), &[&x, &b]);
    std::iter::once(&y).chain(&grads).map(|t| t.to_dtype(DType::F64).to_vec::<f64>().expect("read")).collect()
}

#[test]
#[ignore = "needs an NVIDIA GPU: LAZULI_DEVICE=gpu cargo test --release --test ops gpu_kernels -- --ignored"]
fn fused_bias_gelu_matches_the_formula_forward_and_backward() {
    require_gpu();
    use DType::{BF16, F32};
    // GPT-2 small's MLP (bf16 product in, bf16 out), f32, and ragged shapes (columns not a multiple of a block).
    let cases: [(&[usize], usize, DType, DType, f64); 4] = [
        (&[8, 1024], 3072, BF16, BF16, 1e-2),
        (&[8, 1024], 3072, F32, F32, 1e-5),
        (&[3, 37], 100, F32, BF16, 1e-2),
        (&[7], 1000, BF16, F32, 1e-2),
    ];
    let failures: Vec<String> = cases
        .into_iter()
        .filter_map(|(rows, cols, dtype, out, tolerance)| {
            let got = bias_gelu_and_grads(rows, cols, dtype, out, true);
            let want = bias_gelu_and_grads(rows, cols, dtype, out, false);
            compare(&format!("bias_gelu {rows:?}×{cols} {dtype}→{out}: y, dx, db"), &got, &want, |_| tolerance)
        })
        .collect();
    assert!(failures.is_empty(), "the bias-GELU kernels disagree with the formula:\n{}", failures.join("\n"));
}

/// The mean cross-entropy of `[n, c]` logits of `dtype`, widened to `loss` first where that is wider (a bf16
/// product read as f32), against ids (`wild`: two rows' ids out of range), and its gradient, read as f64: by
/// `Tensor::cross_entropy` (lazuli's kernel on the GPU), or by log-softmax and a one-hot sum of separate ops in f32
/// (the reference, rounded to `loss` and `dtype` as the op's loss and gradient are).
fn cross_entropy_and_grad(
    n: usize,
    c: usize,
    (dtype, loss): (DType, DType),
    ids: DType,
    (wild, cotangent): (bool, f64),
    fused: bool,
) -> Vec<Vec<f64>> {
    let x_vals: Vec<f32> = data(n * c, 31).into_iter().map(|v| round(6.0 * v, dtype)).collect();
    let mut t: Vec<i64> = (0..n).map(|i| ((i * 7919 + 3) % c) as i64).collect();
    if wild {
        (t[0], t[1]) = (-1, c as i64);
    }
    let (x, value) = if fused {
        let x = host_tensor(&x_vals, &[n, c], dtype).requires_grad();
        let t = match ids {
            DType::I64 => Tensor::from_slice(&t, &[n]),
            _ => Tensor::from_slice(&t.iter().map(|&v| v as i32).collect::<Vec<_>>(), &[n]),
        };
        // As a model's `[B, T, C]` logits: the op flattens them, and the kernel reads through the widening.
        let logits = x.to_dtype(loss).reshape(&[1, n as isize, c as isize]);
        let value = logits.cross_entropy(&t.reshape(&[1, n as isize]));
        (x, value)
    } else {
        let x = Tensor::from_slice(&x_vals, &[n, c]).requires_grad();
        let mut hot = vec![0f32; n * c];
        t.iter().enumerate().filter(|(_, &id)| (0..c as i64).contains(&id)).for_each(|(i, &id)| {
            hot[i * c + id as usize] = 1.0;
        });
        let picked = (x.log_softmax(1) * Tensor::from_slice(&hot, &[n, c])).sum_all();
        (x, picked * (-1.0 / n as f64))
    };
    // `backward()`'s unit cotangent, which the forward's gradient is taken at, or another one that scales it.
    let dx = lazuli::grad(&(value.clone() * cotangent), &[&x]).remove(0);
    let read = |v: &Tensor, as_: DType| v.to_dtype(as_).to_dtype(DType::F64).to_vec::<f64>().expect("read");
    vec![read(&value, loss), read(&dx, dtype)]
}

#[test]
#[ignore = "needs an NVIDIA GPU: LAZULI_DEVICE=gpu cargo test --release --test ops gpu_kernels -- --ignored"]
fn fused_cross_entropy_matches_the_formula_forward_and_backward() {
    require_gpu();
    use DType::{BF16, F16, F32, I32, I64};
    // (rows, classes, (logits, loss), ids, (ids out of range, the loss's cotangent), tolerance): GPT-2's vocabulary
    // with bf16 logits and an f32 loss (the kernel reads the bf16 values), and a bf16 loss; the same with a
    // cotangent that is not one; a ragged one; f16 logits with ids that pick nothing; a row block larger than the
    // rows. Run under each `LAZULI_CROSS_ENTROPY_GRAD` (the gradient in the forward, or a backward kernel).
    let cases = [
        (512, 50304, (BF16, F32), I32, (false, 1.0), 1e-2),
        (512, 50304, (BF16, BF16), I32, (false, 1.0), 1e-2),
        (512, 50304, (BF16, F32), I32, (false, 2.5), 1e-2),
        (129, 50257, (F32, F32), I64, (false, 1.0), 1e-5),
        (37, 1000, (F16, F16), I32, (true, 0.5), 4e-3),
        (3, 5, (F32, F32), I32, (false, 1.0), 1e-5),
    ];
    let failures: Vec<String> = cases
        .into_iter()
        .filter_map(|(n, c, dtypes, ids, (wild, cotangent), tolerance)| {
            let got = cross_entropy_and_grad(n, c, dtypes, ids, (wild, cotangent), true);
            let want = cross_entropy_and_grad(n, c, dtypes, ids, (wild, cotangent), false);
            if wild {
                // No gradient on the rows whose ids pick nothing.
                assert!(got[1][..2 * c].iter().all(|&d| d == 0.0), "{n}×{c}: gradient on rows without a class");
            }
            let (dtype, loss) = dtypes;
            compare(&format!("cross-entropy {n}×{c} {dtype}→{loss}, {ids} ids: loss, dx"), &got, &want, |_| {
                tolerance
            })
        })
        .collect();
    assert!(failures.is_empty(), "the cross-entropy kernels disagree with the formula:\n{}", failures.join("\n"));
}

/// With `LAZULI_PROFILE_TRACE`, `profile()` also writes the plugin's whole trace: the file reads as the same
/// kernels the profile counted, and holds the host's spans too (the plugin's launch call). Run in a child process,
/// as the setting is the process's.
#[test]
#[ignore = "needs an NVIDIA GPU: LAZULI_DEVICE=gpu cargo test --release --test ops gpu_kernels -- --ignored"]
fn profile_writes_the_plugins_whole_trace() {
    const CHILD: &str = "LAZULI_TEST_TRACE_FILE";
    let Ok(path) = std::env::var(CHILD) else {
        let path = std::env::temp_dir().join(format!("lazuli-trace-{}.xplane.pb", std::process::id()));
        let path = path.to_str().expect("a UTF-8 temporary directory");
        let test = crate::common::child::test_name(module_path!(), "profile_writes_the_plugins_whole_trace");
        crate::common::child::passes(&test, &[(CHILD, path), ("LAZULI_PROFILE_TRACE", path)]);
        let _ = std::fs::remove_file(path);
        return;
    };
    require_gpu();
    let x = Tensor::from_slice(&data(256 * 256, 7), &[256, 256]);
    let (value, profile) = lazuli::profile(1, || x.matmul(&x).sum(&[0, 1]).item::<f32>()).unwrap();
    assert!(value.unwrap().is_finite());
    let bytes = std::fs::read(&path).expect("the trace file was written");
    let written = lazuli::diagnostics::DeviceProfile::from_xspace(&bytes, 1).expect("an XSpace");
    assert!(profile.launches() > 0, "{profile}");
    assert_eq!(written.launches(), profile.launches(), "{written}");
    let host_span = b"PJRT_LoadedExecutable_Execute";
    assert!(bytes.windows(host_span.len()).any(|w| w == host_span), "the host's spans are in the file");
}
