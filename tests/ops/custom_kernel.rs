//! A user's Triton kernel on the CPU, where its composite runs: values and gradients against ndarray, a user
//! gradient rule, what a composite may capture, and launch parameters refused at the caller's line before XLA
//! sees them. (On an NVIDIA GPU the Triton call itself runs: `examples/custom_kernel.rs`.)

use crate::common;

use crate::common::panic_message;
use lazuli::{DType, Implementation, Tensor, TritonKernel};

/// A kernel text with one pointer per argument; on the CPU it is checked, never compiled.
fn ir(name: &str, pointers: usize) -> String {
    let args: Vec<String> =
        (0..pointers).map(|i| format!("%a{i}: !tt.ptr<f32> {{tt.divisibility = 16 : i32}}")).collect();
    format!("module {{\n  tt.func public @{name}({}) {{\n    tt.return\n  }}\n}}\n", args.join(", "))
}

#[test]
fn the_composite_runs_off_gpus_with_its_gradient() {
    // y = x * tanh(x) per element, and the sum of each row as a second output.
    let kernel = TritonKernel::new("xtanh", ir("xtanh", 3))
        .grid([4, 1, 1])
        .output(DType::F64, &[4, 3])
        .output(DType::F64, &[4])
        .composite(|x| {
            let y = &x[0] * &x[0].tanh();
            vec![y.clone(), y.sum(&[1])]
        });
    let xs: Vec<f64> = (0..12).map(|i| i as f64 / 4.0 - 1.4).collect();
    let x = Tensor::from_slice(&xs, &[4, 3]).requires_grad();
    let outs = kernel.call(&[&x]);
    let (y, rows) = (outs[0].to_vec::<f64>().unwrap(), outs[1].to_vec::<f64>().unwrap());
    let want: Vec<f64> = xs.iter().map(|v| v * v.tanh()).collect();
    common::assert_close("y", DType::F64, &y, &want);
    let want_rows: Vec<f64> = want.chunks(3).map(|r| r.iter().sum()).collect();
    common::assert_close("row sums", DType::F64, &rows, &want_rows);
    // d/dx of sum(y) + sum(rows) = 2 (tanh x + x (1 - tanh² x)): both outputs' cotangents reach x.
    let loss = outs[0].sum_all() + outs[1].sum_all();
    let g = lazuli::grad(&loss, &[&x]).remove(0).to_vec::<f64>().unwrap();
    let want_g: Vec<f64> = xs.iter().map(|v| 2.0 * (v.tanh() + v * (1.0 - v.tanh().powi(2)))).collect();
    common::assert_close("gradient", DType::F64, &g, &want_g);
}

#[test]
fn a_gradient_rule_replaces_the_composites() {
    // The composite says y = 3x; the rule (deliberately different, to see which one ran) says dx = 5g.
    let kernel = TritonKernel::new("scale", ir("scale", 2))
        .output(DType::F64, &[3])
        .composite(|x| vec![&x[0] * 3.0])
        .gradient(|_x, _r, _out, g| vec![Some(g * 5.0)]);
    let x = Tensor::from_slice(&[1.0f64, 2.0, 3.0], &[3]).requires_grad();
    let y = kernel.call(&[&x]).remove(0);
    assert_eq!(y.to_vec::<f64>().unwrap(), vec![3.0, 6.0, 9.0]);
    let g = lazuli::grad(&y.sum_all(), &[&x]).remove(0);
    assert_eq!(g.to_vec::<f64>().unwrap(), vec![5.0, 5.0, 5.0]);
}

#[test]
fn a_composite_may_capture_host_scalars_but_not_other_tensors() {
    let x = Tensor::from_slice(&[1.0f32, -2.0], &[2]);
    let scaled = TritonKernel::new("k", ir("k", 2)).output(DType::F32, &[2]).composite(|x| vec![&x[0] * 0.5]);
    assert_eq!(scaled.call(&[&x]).remove(0).to_vec::<f32>().unwrap(), vec![0.5, -1.0]);
    let outside = Tensor::from_slice(&[10.0f32, 20.0], &[2]);
    let captured =
        TritonKernel::new("k", ir("k", 2)).output(DType::F32, &[2]).composite(move |x| vec![&x[0] + &outside]);
    let line = line!() + 1;
    let msg = panic_message(|| drop(captured.call(&[&x])));
    assert!(msg.contains("that is not one of the kernel's inputs: pass it as an input"), "{msg}");
    assert!(msg.contains(&format!("recorded at tests/ops/custom_kernel.rs:{line}:")), "{msg}");
}

#[test]
fn bad_launch_parameters_are_refused_at_the_callers_line() {
    let x = Tensor::from_slice(&[1.0f32, 2.0], &[2]);
    let base = || TritonKernel::new("k", ir("k", 2)).output(DType::F32, &[2]).composite(|x| vec![x[0].clone()]);
    let cases: Vec<(TritonKernel, &str)> = vec![
        (base().warps(3), "num_warps = 3: must be 1, 2, 4, 8, 16 or 32"),
        (base().stages(0), "num_stages = 0: must be 1 to 8"),
        (base().grid([0, 1, 1]), "grid [0, 1, 1]"),
        (
            TritonKernel::new("k", ir("k", 3)).output(DType::F32, &[2]).composite(|x| vec![x[0].clone()]),
            "takes 3 argument(s), but the call passes 1 operand(s) and 1 result(s)",
        ),
        (
            TritonKernel::new("k", ir("other", 2)).output(DType::F32, &[2]).composite(|x| vec![x[0].clone()]),
            "has no `tt.func @k(…)`",
        ),
        (
            TritonKernel::new("k", ir("k", 2).replace("tt.return\n  }", "tt.return\n"))
                .output(DType::F32, &[2])
                .composite(|x| vec![x[0].clone()]),
            "is never closed",
        ),
        (TritonKernel::new("k", ir("k", 2)).composite(|x| vec![x[0].clone()]), "the kernel has no outputs"),
        (TritonKernel::new("k", ir("k", 2)).output(DType::F32, &[2]), "a custom kernel needs a composite"),
        (
            TritonKernel::new("k", ir("k", 2)).output(DType::F32, &[3]).composite(|x| vec![x[0].clone()]),
            "the composite returns (f32[2]), the kernel's results are (f32[3])",
        ),
        (
            base().implementation(Implementation::Triton),
            "Triton was asked for but the device is cpu, not an NVIDIA GPU",
        ),
    ];
    for (kernel, expect) in cases {
        let line = line!() + 1;
        let msg = panic_message(|| drop(kernel.call(&[&x])));
        assert!(msg.contains(expect), "{msg:?} should say {expect:?}");
        assert!(msg.contains(&format!("recorded at tests/ops/custom_kernel.rs:{line}:")), "{msg}");
    }
}
