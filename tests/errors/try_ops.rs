//! The `try_*` forms of the recording ops that can fail on user data: on operands that fit, the same values as
//! the panicking op (checked against ndarray); on operands that do not, the structured error (which op, the
//! shapes or dtypes, the axis, the backend) naming the caller's line, with the message the panicking op gives.

use crate::common::panic_message;
use lazuli::{AttentionOptions, DType, Error, Implementation, Tensor, TritonKernel};
use ndarray::{Array2, ArrayD, IxDyn};

/// The message without its "recorded at" line (the `Err` and the panic are recorded on different lines).
fn without_line(msg: &str) -> &str {
    msg.split("\n  recorded at").next().unwrap_or(msg)
}

/// `err` was recorded on line `line` of this file, and the panicking form says the same.
fn assert_at_with_panic(err: &Error, line: u32, panic: String) {
    let at = err.recorded_at().unwrap_or_else(|| panic!("{err:?} names no line"));
    assert_eq!((at.file, at.line), ("tests/errors/try_ops.rs", line), "{err}");
    assert!(err.to_string().contains(&format!("recorded at tests/errors/try_ops.rs:{line}:")), "{err}");
    assert_eq!(without_line(&panic), format!("lazuli: {}", without_line(&err.to_string())));
}

fn matrix(rows: usize, cols: usize, seed: f32) -> (Tensor, Array2<f32>) {
    let data: Vec<f32> = (0..rows * cols).map(|i| ((i as f32 + seed) * 0.37).sin()).collect();
    (Tensor::from_slice(&data, &[rows, cols]), Array2::from_shape_vec((rows, cols), data).unwrap())
}

#[test]
fn matmul_fits_or_names_both_shapes() {
    let (a, na) = matrix(2, 3, 0.0);
    let (b, nb) = matrix(3, 4, 1.0);
    let got = a.try_matmul(&b).unwrap().to_vec::<f32>().unwrap();
    let want = na.dot(&nb);
    for (g, w) in got.iter().zip(want.iter()) {
        assert!((g - w).abs() < 1e-5, "{got:?} vs {want:?}");
    }
    let (c, _) = matrix(4, 5, 2.0);
    let line = line!() + 1;
    let err = a.try_matmul(&c).unwrap_err();
    match &err {
        Error::ShapeMismatch { op, shapes, why, .. } => {
            assert_eq!(*op, "matmul");
            assert_eq!(shapes, &vec![vec![2, 3], vec![4, 5]]);
            assert!(why.contains("inner dimensions differ: f32[2,3] @ f32[4,5]"), "{why}");
        }
        other => panic!("expected a shape mismatch, got {other:?}"),
    }
    assert_at_with_panic(&err, line, panic_message(|| drop(a.matmul(&c))));
    // Batch dimensions that do not broadcast.
    let x = Tensor::zeros(&[2, 2, 3], DType::F32);
    let y = Tensor::zeros(&[3, 3, 4], DType::F32);
    assert!(matches!(x.try_matmul(&y), Err(Error::ShapeMismatch { op: "matmul", .. })));
}

#[test]
fn elementwise_ops_report_shapes_and_dtypes() {
    let (a, na) = matrix(2, 3, 0.0);
    let row = Tensor::from_slice(&[1.0f32, 2.0, 3.0], &[3]);
    let got = a.try_add(&row).unwrap().to_vec::<f32>().unwrap();
    let want = &na + &ndarray::arr1(&[1.0f32, 2.0, 3.0]);
    assert_eq!(got, want.iter().copied().collect::<Vec<_>>());
    assert_eq!(a.try_mul(2.0).unwrap().to_vec::<f32>().unwrap(), (&na * 2.0).iter().copied().collect::<Vec<_>>());

    let four = Tensor::zeros(&[4], DType::F32);
    let line = line!() + 1;
    let err = a.try_sub(&four).unwrap_err();
    match &err {
        Error::ShapeMismatch { op: "sub", shapes, .. } => assert_eq!(shapes, &vec![vec![2, 3], vec![4]]),
        other => panic!("expected a shape mismatch, got {other:?}"),
    }
    assert_at_with_panic(&err, line, panic_message(|| drop(&a - &four)));

    let ints = Tensor::from_slice(&[1i32, 2, 3], &[3]);
    let line = line!() + 1;
    let err = a.try_div(&ints).unwrap_err();
    match &err {
        Error::WrongDType { op: "div", dtypes, .. } => assert_eq!(dtypes, &vec![DType::F32, DType::I32]),
        other => panic!("expected a dtype error, got {other:?}"),
    }
    assert_at_with_panic(&err, line, panic_message(|| drop(&a / &ints)));
}

#[test]
fn reshape_and_broadcast_name_the_shape_asked_for() {
    let (a, na) = matrix(2, 3, 0.0);
    let r = a.try_reshape(&[3, -1]).unwrap();
    assert_eq!(r.dims(), &[3, 2]);
    assert_eq!(r.to_vec::<f32>().unwrap(), na.iter().copied().collect::<Vec<_>>());
    let line = line!() + 1;
    let err = a.try_reshape(&[4, 2]).unwrap_err();
    match &err {
        Error::ShapeMismatch { op: "reshape", shapes, .. } => assert_eq!(shapes, &vec![vec![2, 3], vec![4, 2]]),
        other => panic!("expected a shape mismatch, got {other:?}"),
    }
    assert_at_with_panic(&err, line, panic_message(|| drop(a.reshape(&[4, 2]))));
    assert!(matches!(a.try_reshape(&[2, -3]), Err(Error::InvalidArgument { op: "reshape", .. })));

    let b = a.try_broadcast_to(&[4, 2, 3]).unwrap().to_vec::<f32>().unwrap();
    let want = na.broadcast((4, 2, 3)).unwrap();
    assert_eq!(b, want.iter().copied().collect::<Vec<_>>());
    let err = a.try_broadcast_to(&[3]).unwrap_err();
    assert!(
        matches!(&err, Error::ShapeMismatch { op: "broadcast", shapes, .. } if shapes == &vec![vec![2, 3], vec![3]])
    );
    assert!(matches!(a.try_broadcast_to(&[2, 4]), Err(Error::ShapeMismatch { op: "broadcast", .. })));
}

#[test]
fn slicing_and_joining_report_ranges_axes_and_types() {
    let (a, na) = matrix(4, 3, 0.0);
    let rows = a.try_narrow(0, 1, 2).unwrap().to_vec::<f32>().unwrap();
    assert_eq!(rows, na.slice(ndarray::s![1..3, ..]).iter().copied().collect::<Vec<_>>());
    let cols = a.try_slice(-1, 1, 3).unwrap().to_vec::<f32>().unwrap();
    assert_eq!(cols, na.slice(ndarray::s![.., 1..3]).iter().copied().collect::<Vec<_>>());

    // A batch window past the end of the data.
    let line = line!() + 1;
    let err = a.try_narrow(0, 3, 2).unwrap_err();
    match &err {
        Error::ShapeMismatch { op: "narrow", shapes, why, .. } => {
            assert_eq!(shapes, &vec![vec![4, 3]]);
            assert!(why.contains("3..5 step 1 is out of range for axis 0 of f32[4,3]"), "{why}");
        }
        other => panic!("expected a shape mismatch, got {other:?}"),
    }
    assert_at_with_panic(&err, line, panic_message(|| drop(a.narrow(0, 3, 2))));
    let line = line!() + 1;
    let err = a.try_slice(2, 0, 1).unwrap_err();
    assert!(matches!(err, Error::BadAxis { op: "slice", axis: 2, rank: 2, .. }), "{err:?}");
    assert_at_with_panic(&err, line, panic_message(|| drop(a.slice(2, 0, 1))));

    let (b, nb) = matrix(2, 3, 5.0);
    let joined = Tensor::try_concat(&[&a, &b], 0).unwrap().to_vec::<f32>().unwrap();
    let want = ndarray::concatenate(ndarray::Axis(0), &[na.view(), nb.view()]).unwrap();
    assert_eq!(joined, want.iter().copied().collect::<Vec<_>>());
    let line = line!() + 1;
    let err = Tensor::try_concat(&[&a, &b], 1).unwrap_err();
    assert!(
        matches!(&err, Error::ShapeMismatch { op: "concatenate", shapes, .. } if shapes == &vec![vec![4, 3], vec![2, 3]]),
        "{err:?}"
    );
    assert_at_with_panic(&err, line, panic_message(|| drop(Tensor::concat(&[&a, &b], 1))));
    let ints = Tensor::zeros(&[2, 3], DType::I32);
    assert!(matches!(Tensor::try_concat(&[&b, &ints], 0), Err(Error::WrongDType { op: "concatenate", .. })));
    assert!(matches!(Tensor::try_concat(&[], 0), Err(Error::InvalidArgument { op: "concat", .. })));

    let stacked = Tensor::try_stack(&[&b, &b], 0).unwrap();
    assert_eq!(stacked.dims(), &[2, 2, 3]);
    assert!(matches!(Tensor::try_stack(&[&a, &b], 0), Err(Error::ShapeMismatch { op: "stack", .. })));
    assert!(matches!(Tensor::try_stack(&[&b, &ints], 0), Err(Error::WrongDType { op: "stack", .. })));
}

#[test]
fn indexing_reports_axes_and_index_types() {
    let (a, na) = matrix(4, 3, 0.0);
    let idx = Tensor::from_slice(&[3i32, 0], &[2]);
    let got = a.try_index_select(0, &idx).unwrap().to_vec::<f32>().unwrap();
    let want: Vec<f32> = [3, 0].iter().flat_map(|&r| na.row(r).to_vec()).collect();
    assert_eq!(got, want);
    let err = a.try_index_select(-3, &idx).unwrap_err();
    assert!(matches!(err, Error::BadAxis { op: "index_select", axis: -3, rank: 2, .. }), "{err:?}");
    let float_idx = Tensor::from_slice(&[1.0f32], &[1]);
    let line = line!() + 1;
    let err = a.try_index_select(0, &float_idx).unwrap_err();
    assert!(
        matches!(&err, Error::WrongDType { op: "take", dtypes, .. } if dtypes == &vec![DType::F32, DType::F32]),
        "{err:?}"
    );
    assert_at_with_panic(&err, line, panic_message(|| drop(a.index_select(0, &float_idx))));
}

#[test]
fn data_that_does_not_fill_its_shape() {
    let data = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0];
    let t = Tensor::try_from_slice(&data, &[3, 2]).unwrap();
    let want = ArrayD::from_shape_vec(IxDyn(&[3, 2]), data.to_vec()).unwrap();
    assert_eq!(t.to_vec::<f32>().unwrap(), want.iter().copied().collect::<Vec<_>>());
    let line = line!() + 1;
    let err = Tensor::try_from_slice(&data[..5], &[3, 2]).unwrap_err();
    assert!(
        matches!(&err, Error::ShapeMismatch { op: "from_slice", shapes, .. } if shapes == &vec![vec![5], vec![3, 2]]),
        "{err:?}"
    );
    assert_at_with_panic(&err, line, panic_message(|| drop(Tensor::from_slice(&data[..5], &[3, 2]))));
    let err = Tensor::try_from_slice::<f32>(&[], &[1 << 32, 1 << 32]).unwrap_err();
    assert!(matches!(err, Error::ShapeMismatch { op: "from_slice", .. }), "{err:?}");
}

#[test]
fn kernels_forced_where_they_cannot_run_are_unsupported() {
    if lazuli::platform().unwrap() != "cpu" {
        return; // on a GPU both kernels run: nothing unsupported to test
    }
    let q = Tensor::zeros(&[1, 2, 8, 16], DType::F32);
    let opts = AttentionOptions::new().implementation(Implementation::Cudnn);
    let line = line!() + 1;
    let err = lazuli::try_scaled_dot_product_attention(&q, &q, &q, &opts).unwrap_err();
    match &err {
        Error::Unsupported { op: "attention", backend, .. } => assert_eq!(backend, "cpu"),
        other => panic!("expected unsupported, got {other:?}"),
    }
    assert_at_with_panic(&err, line, panic_message(|| drop(lazuli::scaled_dot_product_attention(&q, &q, &q, &opts))));
    // Shapes that do not fit are a shape mismatch whatever the implementation.
    let k = Tensor::zeros(&[1, 2, 8, 15], DType::F32);
    let auto = AttentionOptions::new();
    assert!(matches!(lazuli::try_scaled_dot_product_attention(&q, &k, &q, &auto), Err(Error::ShapeMismatch { .. })));
    // The composite gives the same values as the plain call.
    let (x, _) = matrix(16, 16, 0.0);
    let x = x.reshape(&[1, 1, 16, 16]);
    let got = lazuli::try_scaled_dot_product_attention(&x, &x, &x, &auto).unwrap().to_vec::<f32>().unwrap();
    let want = lazuli::scaled_dot_product_attention(&x, &x, &x, &auto).to_vec::<f32>().unwrap();
    assert_eq!(got, want);

    let ir = "module {\n  tt.func public @k(%a0: !tt.ptr<f32> {tt.divisibility = 16 : i32}, %a1: !tt.ptr<f32> \
              {tt.divisibility = 16 : i32}) {\n    tt.return\n  }\n}\n";
    let kernel = |implementation| {
        TritonKernel::new("k", ir)
            .output(DType::F32, &[2])
            .composite(|x| vec![&x[0] * 2.0])
            .implementation(implementation)
    };
    let v = Tensor::from_slice(&[1.5f32, -2.0], &[2]);
    let out = kernel(Implementation::Auto).try_call(&[&v]).unwrap();
    assert_eq!(out[0].to_vec::<f32>().unwrap(), vec![3.0, -4.0]);
    let triton = kernel(Implementation::Triton);
    let line = line!() + 1;
    let err = triton.try_call(&[&v]).unwrap_err();
    assert!(matches!(&err, Error::Unsupported { op: "custom_kernel", backend, .. } if backend == "cpu"), "{err:?}");
    assert_at_with_panic(&err, line, panic_message(|| drop(triton.call(&[&v]))));
    let wrong = Tensor::zeros(&[3], DType::F32);
    assert!(matches!(kernel(Implementation::Auto).try_call(&[&wrong]), Err(Error::InvalidArgument { .. })));
}

/// The CPU plugins have no profiler: `profile` says so at the caller's line and runs nothing. On a GPU the same
/// call profiles a product and finds its matmul kernel.
#[test]
fn profiling_is_unsupported_on_the_cpu_and_finds_the_matmul_on_a_gpu() {
    let (x, _) = matrix(64, 64, 0.5);
    let line = line!() + 1;
    let result = lazuli::profile(1, || x.matmul(&x).sum(&[0, 1]).item::<f32>());
    if lazuli::platform().unwrap() != "cpu" {
        let (value, profile) = result.unwrap();
        assert!(value.unwrap().is_finite());
        assert!(profile.busy > std::time::Duration::ZERO, "{profile}");
        assert!(profile.kernels.iter().any(|k| k.kind == lazuli::diagnostics::KernelKind::Matmul), "{profile}");
        return;
    }
    let err = result.expect_err("the CPU plugins have no profiler");
    assert!(matches!(&err, Error::Unsupported { op: "profile", backend, .. } if backend == "cpu"), "{err:?}");
    assert_eq!(err.recorded_at().map(|at| at.line), Some(line), "{err}");
    assert!(err.to_string().contains("no profiler extension"), "{err}");
}
