//! `scaled_dot_product_attention` on the CPU (its composite): values against an ndarray computation written
//! here, gradients against finite differences, both layouts, masks, windows and bias; the kernel's choice in
//! the compile event; and a forced device implementation on the CPU as a clear error naming the line.

use crate::common;

use common::gradcheck::check_grad;
use common::{array, assert_close, tensor_of, values, Rng};
use lazuli::{scaled_dot_product_attention as sdpa, AttentionLayout, AttentionOptions, DType, Tensor};
use ndarray::{ArrayD, IxDyn};

/// Attention in f64 on `[B, H, T, D]` arrays, written out: scores, mask, softmax, weighted values.
fn reference(
    q: &ArrayD<f64>,
    k: &ArrayD<f64>,
    v: &ArrayD<f64>,
    causal: bool,
    window: Option<usize>,
    bias: Option<&ArrayD<f64>>,
    scale: f64,
) -> ArrayD<f64> {
    let (b, h, tq, dv) = (q.shape()[0], q.shape()[1], q.shape()[2], v.shape()[3]);
    let (tk, d) = (k.shape()[2], q.shape()[3]);
    let mut out = ArrayD::zeros(IxDyn(&[b, h, tq, dv]));
    for bi in 0..b {
        for hi in 0..h {
            for i in 0..tq {
                let mut s: Vec<f64> = (0..tk)
                    .map(|j| {
                        let dot: f64 = (0..d).map(|x| q[[bi, hi, i, x]] * k[[bi, hi, j, x]]).sum();
                        let bias = bias.map_or(0.0, |bb| {
                            let at = |dim: usize, idx: usize| if bb.shape()[dim] == 1 { 0 } else { idx };
                            bb[[at(0, bi), at(1, hi), at(2, i), at(3, j)]]
                        });
                        let visible = !causal || (j <= i && window.is_none_or(|w| i - j < w));
                        if visible {
                            dot * scale + bias
                        } else {
                            f64::NEG_INFINITY
                        }
                    })
                    .collect();
                let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                s.iter_mut().for_each(|x| *x = (*x - m).exp());
                let z: f64 = s.iter().sum();
                for x in 0..dv {
                    out[[bi, hi, i, x]] = (0..tk).map(|j| s[j] / z * v[[bi, hi, j, x]]).sum();
                }
            }
        }
    }
    out
}

fn data(seed: u64, dims: &[usize]) -> ArrayD<f64> {
    let n = dims.iter().product();
    array(values(&mut Rng::new(seed), DType::F64, n, -1.5, 1.5), dims)
}

/// `[B, H, T, D]` → `[B, T, H, D]` (and back: the permutation is its own inverse).
fn swap_heads_seq(a: &ArrayD<f64>) -> ArrayD<f64> {
    a.clone().permuted_axes(IxDyn(&[0, 2, 1, 3])).as_standard_layout().into_owned()
}

struct Case {
    name: &'static str,
    b: usize,
    h: usize,
    tq: usize,
    tk: usize,
    d: usize,
    dv: usize,
    causal: bool,
    window: Option<usize>,
    bias: Option<Vec<usize>>,
}

fn cases() -> Vec<Case> {
    let c = |name, (b, h, tq, tk, d, dv), causal, window, bias: Option<&[usize]>| Case {
        name,
        b,
        h,
        tq,
        tk,
        d,
        dv,
        causal,
        window,
        bias: bias.map(|b| b.to_vec()),
    };
    vec![
        c("plain", (2, 3, 5, 5, 4, 4), false, None, None),
        c("causal", (2, 2, 7, 7, 8, 8), true, None, None),
        c("causal, more keys than queries", (1, 2, 4, 6, 4, 4), true, None, None),
        c("cross, other value dim", (2, 1, 3, 6, 4, 5), false, None, None),
        c("sliding window of 3", (1, 2, 9, 9, 4, 4), true, Some(3), None),
        c("bias per head and query", (2, 2, 4, 5, 4, 4), false, None, Some(&[1, 2, 4, 5])),
        c("causal with a full bias", (1, 2, 5, 5, 4, 4), true, None, Some(&[1, 2, 5, 5])),
    ]
}

#[test]
fn attention_matches_a_written_out_computation_in_both_layouts() {
    for (i, case) in cases().iter().enumerate() {
        let seed = 10 * i as u64;
        let q = data(seed, &[case.b, case.h, case.tq, case.d]);
        let k = data(seed + 1, &[case.b, case.h, case.tk, case.d]);
        let v = data(seed + 2, &[case.b, case.h, case.tk, case.dv]);
        let bias = case.bias.as_ref().map(|dims| data(seed + 3, dims));
        let scale = 0.7;
        let want = reference(&q, &k, &v, case.causal, case.window, bias.as_ref(), scale);
        for dtype in [DType::F64, DType::F32] {
            for layout in [AttentionLayout::Bhtd, AttentionLayout::Bthd] {
                let shaped = |a: &ArrayD<f64>| match layout {
                    AttentionLayout::Bhtd => a.clone(),
                    AttentionLayout::Bthd => swap_heads_seq(a),
                };
                let t = |a: &ArrayD<f64>| {
                    let a = shaped(a);
                    tensor_of(dtype, &a.iter().cloned().collect::<Vec<_>>(), a.shape())
                };
                let mut opts = if case.causal { AttentionOptions::causal() } else { AttentionOptions::new() };
                opts = opts.scale(scale).layout(layout);
                if let Some(w) = case.window {
                    opts = opts.window(w);
                }
                if let Some(bb) = &bias {
                    opts = opts.bias(&tensor_of(dtype, &bb.iter().cloned().collect::<Vec<_>>(), bb.shape()));
                }
                let got = sdpa(&t(&q), &t(&k), &t(&v), &opts).to_dtype(DType::F64).to_ndarray::<f64>().unwrap();
                let got = match layout {
                    AttentionLayout::Bhtd => got,
                    AttentionLayout::Bthd => swap_heads_seq(&got),
                };
                let what = format!("{} ({layout:?})", case.name);
                assert_close(
                    &what,
                    dtype,
                    &got.iter().cloned().collect::<Vec<_>>(),
                    &want.iter().cloned().collect::<Vec<_>>(),
                );
            }
        }
    }
}

#[test]
fn a_boolean_mask_hides_keys_like_a_minus_infinity_bias() {
    let (q, k, v) = (data(1, &[1, 2, 4, 4]), data(2, &[1, 2, 6, 4]), data(3, &[1, 2, 6, 4]));
    // Per query row a different set of visible keys, each row keeping at least one.
    let visible: Vec<bool> = (0..24).map(|i| i % 6 == 0 || (i * 7) % 5 < 3).collect();
    let bias = ArrayD::from_shape_vec(
        IxDyn(&[1, 1, 4, 6]),
        visible.iter().map(|&m| if m { 0.0 } else { f64::NEG_INFINITY }).collect(),
    )
    .unwrap();
    let want = reference(&q, &k, &v, false, None, Some(&bias), 0.5);
    let mask = Tensor::from_slice(&visible, &[1, 1, 4, 6]);
    let opts = AttentionOptions::new().scale(0.5).mask(&mask);
    let got = sdpa(&Tensor::from_ndarray(&q), &Tensor::from_ndarray(&k), &Tensor::from_ndarray(&v), &opts);
    assert_close("masked", DType::F64, &got.to_vec::<f64>().unwrap(), &want.iter().cloned().collect::<Vec<_>>());
}

#[test]
fn attention_gradients_match_finite_differences() {
    let (q, k, v) = (data(4, &[1, 2, 4, 3]), data(5, &[1, 2, 5, 3]), data(6, &[1, 2, 5, 3]));
    check_grad("attention", &[q.clone(), k.clone(), v.clone()], |t| {
        sdpa(&t[0], &t[1], &t[2], &AttentionOptions::new())
    });
    let (qc, kc, vc) = (data(7, &[1, 2, 5, 3]), data(8, &[1, 2, 5, 3]), data(9, &[1, 2, 5, 3]));
    check_grad("causal attention", &[qc.clone(), kc.clone(), vc.clone()], |t| {
        sdpa(&t[0], &t[1], &t[2], &AttentionOptions::causal().window(2))
    });
    let swap = |a: &ArrayD<f64>| swap_heads_seq(a);
    check_grad("attention, Bthd", &[swap(&qc), swap(&kc), swap(&vc)], |t| {
        sdpa(&t[0], &t[1], &t[2], &AttentionOptions::causal().layout(AttentionLayout::Bthd))
    });
    let bias = data(10, &[1, 2, 4, 5]);
    check_grad("attention with bias", &[q, k, v, bias], |t| {
        sdpa(&t[0], &t[1], &t[2], &AttentionOptions::new().bias(&t[3]))
    });
}

#[test]
fn the_compile_event_names_the_kernel_its_implementation_and_why() {
    if common::child::alone(module_path!(), "the_compile_event_names_the_kernel_its_implementation_and_why") {
        return; // captured events are process-wide: alone in a process of its own
    }
    let (q, k, v) = (data(11, &[1, 1, 3, 4]), data(12, &[1, 1, 3, 4]), data(13, &[1, 1, 3, 4]));
    let (q, k, v) = (Tensor::from_ndarray(&q), Tensor::from_ndarray(&k), Tensor::from_ndarray(&v.mapv(|x| x + 0.25)));
    lazuli::diagnostics::events::start_capture();
    let line = line!() + 1;
    let y = sdpa(&q, &k, &v, &AttentionOptions::causal().scale(0.375));
    y.to_vec::<f64>().unwrap();
    let events = lazuli::diagnostics::events::take_captured();
    let kernels: Vec<&String> = events.iter().flat_map(|e| &e.kernels).collect();
    let want = format!("attention at tests/ops/attention.rs:{line}:");
    assert!(
        kernels.iter().any(|k| k.starts_with(&want) && k.contains(": composite (f64, head dim 4, causal; ")),
        "{kernels:?} should name {want} and the composite"
    );
    assert!(kernels.iter().any(|k| k.contains("not an NVIDIA GPU")), "{kernels:?} should say why not cuDNN");
    let report = lazuli::diagnostics::report::render(&lazuli::diagnostics::report::analyse(&events));
    assert!(report.contains(&format!("custom kernels:\n  {want}")), "{report}");
}

/// Layer norm, bias + GELU and the cross-entropy have kernels too; where one does not run (here: no NVIDIA GPU) the
/// op records its formula, and the compile event still names it, its implementation and why, as it names attention.
#[test]
fn the_compile_event_names_fused_ops_recorded_as_their_formulas() {
    if common::child::alone(module_path!(), "the_compile_event_names_fused_ops_recorded_as_their_formulas") {
        return; // captured events are process-wide: alone in a process of its own
    }
    let x = Tensor::from_ndarray(&data(21, &[4, 6]));
    let (w, b) = (Tensor::from_ndarray(&data(22, &[6])), Tensor::from_ndarray(&data(23, &[6])));
    let t = Tensor::from_slice(&[0i32, 5, 2, 1], &[4]);
    let step = || {
        let (ln, gelu) = (line!() + 1, line!() + 2);
        let y = x.layer_norm_affine(&w, &b, 1e-5, DType::F64);
        let y = y.bias_gelu(&b, DType::F64);
        let ce = line!() + 1;
        let loss = y.cross_entropy(&t);
        loss.item::<f64>().unwrap();
        (ln, gelu, ce)
    };
    lazuli::diagnostics::events::start_capture();
    let (ln, gelu, ce) = step();
    let events = lazuli::diagnostics::events::take_captured();
    let kernels: Vec<&String> = events.iter().flat_map(|e| &e.kernels).collect();
    for (name, line) in [("layer_norm", ln), ("bias_gelu", gelu), ("cross_entropy", ce)] {
        let want = format!("{name} at tests/ops/attention.rs:{line}:");
        let named = kernels.iter().filter(|k| k.starts_with(&want)).collect::<Vec<_>>();
        assert_eq!(named.len(), 1, "{kernels:?} should name {want} once");
        assert!(named[0].contains(": composite (") && named[0].contains("not an NVIDIA GPU"), "{}", named[0]);
    }
    // Named with the program's compile: the same step again is a cache hit and names nothing.
    step();
    let again = lazuli::diagnostics::events::take_captured();
    assert!(again.iter().all(|e| e.cache_hit && e.kernels.is_empty()), "{again:?}");
}

#[test]
fn bad_attention_input_panics_at_the_callers_line() {
    let q = Tensor::zeros(&[1, 2, 3, 4], DType::F32);
    let k = Tensor::zeros(&[1, 2, 5, 8], DType::F32);
    let line = line!() + 1;
    let err = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| sdpa(&q, &k, &k, &AttentionOptions::new())))
        .unwrap_err();
    let msg = err.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(msg.contains("q and k must have the same head dim"), "{msg}");
    assert!(msg.contains(&format!("tests/ops/attention.rs:{line}:")), "{msg}");
    let err =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| sdpa(&q, &q, &q, &AttentionOptions::new().window(2))))
            .unwrap_err();
    let msg = err.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(msg.contains("a sliding window needs causal attention"), "{msg}");
}

/// An empty batch, no heads or no queries give an empty result and gradient (the composite's: a kernel has nothing
/// to launch); queries without keys have nothing to attend to and are refused at the line. A GPT reading an empty
/// batch gives PyTorch's mean cross-entropy of nothing, NaN, and zero gradients, as the reference does.
#[test]
fn empty_attention_is_an_empty_result_and_queries_without_keys_are_refused() {
    for (dims, causal) in [([0, 2, 3, 4], true), ([1, 0, 3, 4], false), ([2, 2, 0, 4], true)] {
        let q = Tensor::from_ndarray(&data(31, &dims)).requires_grad();
        let opts = if causal { AttentionOptions::causal() } else { AttentionOptions::new() };
        let y = sdpa(&q, &q, &q, &opts.layout(AttentionLayout::Bhtd));
        assert_eq!(y.dims(), dims);
        let dq = lazuli::grad(&(&y * &y).sum_all(), &[&q]).remove(0);
        assert_eq!(dq.evaluate_reference().unwrap().len(), 0);
        assert_eq!((y.to_vec::<f64>().unwrap(), dq.to_vec::<f64>().unwrap()), (vec![], vec![]), "{dims:?}");
    }
    let (q, k) = (Tensor::zeros(&[1, 2, 3, 4], DType::F32), Tensor::zeros(&[1, 2, 0, 4], DType::F32));
    let line = line!() + 1;
    let msg = common::panic_message(|| drop(sdpa(&q, &k, &k, &AttentionOptions::new().layout(AttentionLayout::Bhtd))));
    assert!(msg.contains("queries without keys") && msg.contains(&format!("attention.rs:{line}:")), "{msg}");

    use lazuli::nn::{Gpt, GptConfig, HostRng, Module};
    let cfg = GptConfig { vocab: 16, block_size: 8, n_layer: 1, n_head: 2, d_model: 8, ..GptConfig::gpt2_small(16) };
    let gpt = Gpt::new(&mut HostRng::new(1), cfg);
    let ids = Tensor::zeros(&[0, 8], DType::I64);
    let loss = gpt.forward(&ids).cross_entropy(&ids);
    let params: Vec<Tensor> = gpt.params().iter().map(|p| p.get()).collect();
    let grads = lazuli::grad(&loss, &params.iter().collect::<Vec<_>>());
    let want: Vec<Vec<f64>> = grads.iter().map(|g| g.evaluate_reference().unwrap().iter().copied().collect()).collect();
    assert!(loss.evaluate_reference().unwrap().iter().all(|l| l.is_nan()));
    assert!(loss.item::<f32>().unwrap().is_nan());
    for ((g, w), p) in grads.iter().zip(&want).zip(&params) {
        assert_eq!(g.to_f64_vec().unwrap(), vec![0.0; p.elements()]);
        assert_eq!(w, &vec![0.0; p.elements()]);
    }
}

/// Run by `forcing_cudnn_on_the_cpu_is_a_clear_error`, in a process of its own with `LAZULI_ATTENTION=cudnn`.
#[test]
#[ignore]
fn forced_cudnn_child() {
    let q = Tensor::zeros(&[1, 2, 3, 4], DType::BF16);
    let _ = sdpa(&q, &q, &q, &AttentionOptions::causal());
}

#[test]
fn forcing_cudnn_on_the_cpu_is_a_clear_error() {
    let child = common::child::test_name(module_path!(), "forced_cudnn_child");
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", &child, "--ignored", "--nocapture"])
        .env("LAZULI_ATTENTION", "cudnn")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the child should fail:\n{stderr}");
    assert!(
        stderr.contains("cuDNN was asked for but the device is cpu, not an NVIDIA GPU (asked for by LAZULI_ATTENTION)"),
        "{stderr}"
    );
    assert!(stderr.contains("recorded at tests/ops/attention.rs:"), "{stderr}");
}
