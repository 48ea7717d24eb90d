//! Control flow refused at the caller's line: a loop body that changes its carry's shape or dtype (the `Err` of
//! `try_scan` / `try_while_loop`, the panic of `scan` / `while_loop`), a condition that is not a bool scalar,
//! branches of a `cond` that return different types, and a scan with nothing to count its steps.

use crate::common::panic_message;
use lazuli::{cond, scan, try_cond, try_scan, try_while_loop, while_loop, DType, Error, Scan, Tensor};

/// `err` names line `line` of this file.
#[track_caller]
fn assert_at(err: &Error, line: u32) {
    let at = err.recorded_at().unwrap_or_else(|| panic!("{err:?} names no line"));
    assert_eq!((at.file, at.line), ("tests/errors/control_flow.rs", line), "{err}");
}

#[track_caller]
fn assert_names_line(msg: &str, line: u32) {
    assert!(msg.contains(&format!("recorded at tests/errors/control_flow.rs:{line}:")), "names line {line}: {msg}");
}

fn xs() -> Tensor {
    Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[3, 2])
}

#[test]
fn a_scan_body_that_changes_the_carry_shape_is_refused_at_the_call() {
    let h0 = Tensor::zeros(&[2], DType::F32);
    // The body appends to its carry: f32[2] would become f32[4].
    let grow = |c: &[Tensor], x: &[Tensor]| (vec![Tensor::concat(&[&c[0], &x[0]], 0)], vec![]);
    let line = line!() + 1;
    let err = try_scan(grow, std::slice::from_ref(&h0), &[xs()]).expect_err("a carry that grows is refused");
    assert_at(&err, line);
    let Error::ShapeMismatch { op, why, .. } = &err else { panic!("a shape error: {err:?}") };
    assert_eq!(*op, "scan");
    assert!(why.contains("carry 0 from f32[2] into f32[4]"), "{why}");
    let line = line!() + 1;
    let msg = panic_message(|| drop(scan(grow, std::slice::from_ref(&h0), &[xs()])));
    assert_names_line(&msg, line);
    assert!(msg.contains("carry 0 from f32[2] into f32[4]"), "{msg}");
}

#[test]
fn a_scan_body_that_changes_the_carry_dtype_is_refused_at_the_call() {
    let h0 = Tensor::zeros(&[2], DType::F32);
    let widen = |c: &[Tensor], x: &[Tensor]| (vec![(&c[0] + &x[0]).to_dtype(DType::F64)], vec![]);
    let line = line!() + 1;
    let err = Scan::new().try_run(widen, std::slice::from_ref(&h0), &[xs()]).expect_err("a carry that changes dtype");
    assert_at(&err, line);
    assert!(matches!(err, Error::WrongDType { op: "scan", .. }), "{err:?}");
    assert!(err.to_string().contains("from f32[2] into f64[2]"), "{err}");
}

#[test]
fn a_scan_body_returning_another_number_of_carries_is_refused() {
    let line = line!() + 1;
    let err = try_scan(|c, _| (vec![c[0].clone(), c[0].clone()], vec![]), &[Tensor::zeros(&[2], DType::F32)], &[xs()])
        .expect_err("two carries for one");
    assert_at(&err, line);
    assert!(err.to_string().contains("returns 2 carry value(s) for a carry of 1"), "{err}");
}

#[test]
fn a_scan_without_xs_needs_a_length() {
    let line = line!() + 1;
    let err = try_scan(|c, _| (vec![c[0].clone()], vec![]), &[Tensor::zeros(&[2], DType::F32)], &[]).err().unwrap();
    assert_at(&err, line);
    assert!(err.to_string().contains("length(n)"), "{err}");
    // With one, it runs: three steps of +1.
    let (c, _) = Scan::new().length(3).run(|c, _| (vec![&c[0] + 1.0], vec![]), &[Tensor::zeros(&[2], DType::F32)], &[]);
    assert_eq!(c[0].to_vec::<f32>().unwrap(), [3.0, 3.0]);
}

#[test]
fn xs_of_different_lengths_are_refused() {
    let (short, h0) = (Tensor::zeros(&[2, 2], DType::F32), Tensor::zeros(&[], DType::F32));
    let keep = |c: &[Tensor], _: &[Tensor]| (vec![c[0].clone()], vec![]);
    let line = line!() + 1;
    let err = try_scan(keep, &[h0], &[xs(), short]).unwrap_err();
    assert_at(&err, line);
    assert!(matches!(err, Error::ShapeMismatch { op: "scan", .. }), "{err:?}");
}

#[test]
fn a_while_body_that_changes_the_carry_is_refused_at_the_call() {
    let x = [Tensor::zeros(&[2], DType::F32)];
    let small = |c: &[Tensor]| c[0].sum_all().lt(3.0);
    let grow = |c: &[Tensor]| vec![c[0].reshape(&[1, 2])];
    let line = line!() + 1;
    let err = try_while_loop(small, grow, &x).unwrap_err();
    assert_at(&err, line);
    assert!(err.to_string().contains("carry 0 from f32[2] into f32[1,2]"), "{err}");
    let line = line!() + 1;
    let msg = panic_message(|| drop(while_loop(small, grow, &x)));
    assert_names_line(&msg, line);
}

#[test]
fn a_while_condition_must_be_a_bool_scalar() {
    let x = Tensor::zeros(&[2], DType::F32);
    let line = line!() + 1;
    let err = try_while_loop(|c| c[0].lt(3.0), |c| vec![&c[0] + 1.0], &[x]).unwrap_err();
    assert_at(&err, line);
    assert!(err.to_string().contains("one bool scalar"), "{err}");
}

#[test]
fn cond_branches_must_agree_and_the_predicate_be_a_bool_scalar() {
    let x = Tensor::zeros(&[2], DType::F32);
    let pred = x.sum_all().gt(0.0);
    let (same, sum) = (|a: &[Tensor]| vec![a[0].clone()], |a: &[Tensor]| vec![a[0].sum_all()]);
    let line = line!() + 1;
    let err = try_cond(&pred, same, sum, std::slice::from_ref(&x)).unwrap_err();
    assert_at(&err, line);
    assert!(err.to_string().contains("the true branch returns (f32[2]), the false branch (f32[])"), "{err}");
    let line = line!() + 1;
    let msg = panic_message(|| drop(cond(&x, same, same, std::slice::from_ref(&x))));
    assert_names_line(&msg, line);
    assert!(msg.contains("bool scalar"), "{msg}");
}
