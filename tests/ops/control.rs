//! Structured control flow (`scan`, `while_loop`, `cond`) on the CPU plugin: values against the reference
//! interpreter and against the same computation written unrolled in Rust; gradients against the unrolled
//! computation's gradients and against finite differences (f64), with saved residuals and recomputed steps
//! (`Scan::remat`) alike; captured tensors lifted into the loop.

use crate::common::{self, gradcheck::check_grad, Rng};

use crate::common::panic_message;
use lazuli::{cond, scan, while_loop, DType, Scan, Tensor};

fn rand(rng: &mut Rng, dims: &[usize]) -> Tensor {
    let n = dims.iter().product();
    Tensor::from_slice(&common::values(rng, DType::F64, n, -1.0, 1.0), dims)
}

fn vec_of(t: &Tensor) -> Vec<f64> {
    t.to_vec::<f64>().unwrap()
}

/// XLA's value, the reference interpreter's and the unrolled computation's agree.
#[track_caller]
fn agree(what: &str, got: &Tensor, unrolled: &Tensor) {
    let reference = got.evaluate_reference().unwrap();
    let want = vec_of(unrolled);
    assert_eq!(got.dims(), unrolled.dims(), "{what}: shape");
    common::assert_close(&format!("{what} vs unrolled"), DType::F64, &vec_of(got), &want);
    common::assert_close(&format!("{what} vs reference"), DType::F64, reference.as_slice().unwrap(), &want);
}

/// One step of a small recurrent cell: h' = tanh(h W + x), y = h' · v (a scalar per step).
fn cell(h: &Tensor, x: &Tensor, w: &Tensor, v: &Tensor) -> (Tensor, Tensor) {
    let n = h.dims()[0] as isize;
    let next = (&h.reshape(&[1, n]).matmul(w).reshape(&[n]) + x).tanh();
    let y = (&next * v).sum_all();
    (next, y)
}

/// The cell unrolled over the leading axis of `xs` (reversed: from the last step).
fn unrolled(h0: &Tensor, xs: &Tensor, w: &Tensor, v: &Tensor, reverse: bool) -> (Tensor, Tensor) {
    let n = xs.dims()[0];
    let mut h = h0.clone();
    let mut ys = vec![None; n];
    let order: Vec<usize> = if reverse { (0..n).rev().collect() } else { (0..n).collect() };
    for t in order {
        let (next, y) = cell(&h, &xs.slice(0, t, t + 1).reshape(&[xs.dims()[1] as isize]), w, v);
        h = next;
        ys[t] = Some(y.reshape(&[1]));
    }
    let ys: Vec<Tensor> = ys.into_iter().map(|y| y.unwrap()).collect();
    let refs: Vec<&Tensor> = ys.iter().collect();
    (h, Tensor::concat(&refs, 0))
}

/// The cell as a scan; `w` and `v` are captured by the body. Its gradient reads the activations it saved.
fn scanned(h0: &Tensor, xs: &Tensor, w: &Tensor, v: &Tensor, reverse: bool) -> (Tensor, Tensor) {
    scanned_with(Scan::new(), h0, xs, w, v, reverse)
}

/// [`scanned`] recomputing each step in the backward pass.
fn scanned_remat(h0: &Tensor, xs: &Tensor, w: &Tensor, v: &Tensor, reverse: bool) -> (Tensor, Tensor) {
    scanned_with(Scan::new().remat(true), h0, xs, w, v, reverse)
}

fn scanned_with(scan: Scan, h0: &Tensor, xs: &Tensor, w: &Tensor, v: &Tensor, reverse: bool) -> (Tensor, Tensor) {
    let (carry, ys) = scan.reverse(reverse).run(
        |c, x| {
            let (next, y) = cell(&c[0], &x[0], w, v);
            (vec![next], vec![y])
        },
        std::slice::from_ref(h0),
        std::slice::from_ref(xs),
    );
    (carry[0].clone(), ys[0].clone())
}

#[test]
fn scan_matches_the_unrolled_loop_and_the_reference() {
    let mut rng = Rng::new(1);
    let (h0, xs, w, v) = (rand(&mut rng, &[3]), rand(&mut rng, &[5, 3]), rand(&mut rng, &[3, 3]), rand(&mut rng, &[3]));
    for reverse in [false, true] {
        let (h, ys) = scanned(&h0, &xs, &w, &v, reverse);
        let (uh, uys) = unrolled(&h0, &xs, &w, &v, reverse);
        assert_eq!(ys.dims(), &[5]);
        agree(&format!("final carry (reverse {reverse})"), &h, &uh);
        agree(&format!("ys (reverse {reverse})"), &ys, &uys);
    }
}

#[test]
fn scan_with_several_carries_and_ys_and_an_integer_counter() {
    // carry: (running sum f64[2], step count i32); ys: (the sum so far, its square f64[2]).
    let xs = Tensor::from_slice(&[1.0f64, 2.0, 3.0, 4.0, 5.0, 6.0], &[3, 2]);
    let (carry, ys) = scan(
        |c, x| {
            let s = &c[0] + &x[0];
            let n = &c[1] + &Tensor::scalar(1i32);
            (vec![s.clone(), n], vec![s.sum_all(), &s * &s])
        },
        &[Tensor::zeros(&[2], DType::F64), Tensor::zeros(&[], DType::I32)],
        &[xs],
    );
    assert_eq!(vec_of(&carry[0]), [9.0, 12.0]);
    assert_eq!(carry[1].to_vec::<i32>().unwrap(), [3]);
    assert_eq!(vec_of(&ys[0]), [3.0, 10.0, 21.0]);
    assert_eq!(vec_of(&ys[1]), [1.0, 4.0, 16.0, 36.0, 81.0, 144.0]);
    assert_eq!(ys[1].evaluate_reference().unwrap().as_slice().unwrap(), [1.0, 4.0, 16.0, 36.0, 81.0, 144.0]);
}

#[test]
fn scan_gradient_matches_the_unrolled_gradient() {
    let mut rng = Rng::new(2);
    let leaves = [rand(&mut rng, &[3]), rand(&mut rng, &[4, 3]), rand(&mut rng, &[3, 3]), rand(&mut rng, &[3])]
        .map(|t| t.requires_grad());
    let refs: Vec<&Tensor> = leaves.iter().collect();
    for reverse in [false, true] {
        let loss = |f: fn(&Tensor, &Tensor, &Tensor, &Tensor, bool) -> (Tensor, Tensor)| {
            let (h, ys) = f(&leaves[0], &leaves[1], &leaves[2], &leaves[3], reverse);
            &(&h * &h).sum_all() + &(&ys * &ys.sin()).sum_all()
        };
        let want = lazuli::grad(&loss(unrolled), &refs);
        let saved = lazuli::grad(&loss(scanned), &refs);
        let remat = lazuli::grad(&loss(scanned_remat), &refs);
        for (i, ((s, r), w)) in saved.iter().zip(&remat).zip(&want).enumerate() {
            let what = format!("d/d input {i} (reverse {reverse})");
            common::assert_close(&format!("{what}, saved"), DType::F64, &vec_of(s), &vec_of(w));
            common::assert_close(&format!("{what}, remat"), DType::F64, &vec_of(r), &vec_of(w));
            common::assert_close(&format!("{what}, saved vs remat"), DType::F64, &vec_of(s), &vec_of(r));
        }
    }
}

#[test]
fn scan_gradient_matches_finite_differences() {
    let mut rng = Rng::new(3);
    let inputs: Vec<_> = [&[3][..], &[4, 3], &[3, 3], &[3]]
        .iter()
        .map(|d| common::array(common::values(&mut rng, DType::F64, d.iter().product(), -1.0, 1.0), d))
        .collect();
    check_grad("scan", &inputs, |x| {
        let (h, ys) = scanned(&x[0], &x[1], &x[2], &x[3], false);
        Tensor::concat(&[&h, &ys], 0)
    });
    check_grad("reverse scan", &inputs, |x| scanned(&x[0], &x[1], &x[2], &x[3], true).1);
    check_grad("scan, remat", &inputs, |x| {
        let (h, ys) = scanned_remat(&x[0], &x[1], &x[2], &x[3], false);
        Tensor::concat(&[&h, &ys], 0)
    });
    check_grad("reverse scan, remat", &inputs, |x| scanned_remat(&x[0], &x[1], &x[2], &x[3], true).1);
}

/// A step with an integer counter in its carry, a leaky ReLU (a comparison the gradient reads), a scale from the
/// counter and two ys: (h, n), x, w -> ((h', n + 1), (sum(h'²), sin(pre))).
fn leaky_cell(c: &[Tensor], x: &Tensor, w: &Tensor) -> (Vec<Tensor>, Vec<Tensor>) {
    let n = &c[1] + &Tensor::scalar(1i32);
    let k = c[0].dims()[0] as isize;
    let scale = &n.to_dtype(DType::F64) * 0.5;
    let pre = &(&c[0].reshape(&[1, k]).matmul(w).reshape(&[k]) + x) * &scale;
    let next = pre.gt(0.0).select(&pre, &(&pre * 0.1));
    (vec![next.clone(), n], vec![(&next * &next).sum_all(), pre.sin()])
}

#[test]
fn saved_residuals_recomputed_steps_and_the_unrolled_loop_give_one_gradient() {
    let mut rng = Rng::new(4);
    let [h0, xs, w] =
        [rand(&mut rng, &[3]), rand(&mut rng, &[5, 3]), rand(&mut rng, &[3, 3])].map(|t| t.requires_grad());
    let n0 = Tensor::zeros(&[], DType::I32);
    let loss = |c: &[Tensor], ys: &[Tensor]| {
        let a = (&c[0] * &c[0]).sum_all();
        &(&a + &(&ys[0] * &ys[0]).sum_all()) + &ys[1].cos().sum_all()
    };
    let scan_loss = |scan: Scan| {
        let (c, ys) = scan.run(|c, x| leaky_cell(c, &x[0], &w), &[h0.clone(), n0.clone()], std::slice::from_ref(&xs));
        loss(&c, &ys)
    };
    let unrolled_loss = {
        let mut c = vec![h0.clone(), n0.clone()];
        let (mut y0, mut y1) = (Vec::new(), Vec::new());
        for t in 0..5 {
            let (next, ys) = leaky_cell(&c, &xs.slice(0, t, t + 1).reshape(&[3]), &w);
            c = next;
            y0.push(ys[0].reshape(&[1]));
            y1.push(ys[1].reshape(&[1, 3]));
        }
        let ys = [Tensor::concat(&y0.iter().collect::<Vec<_>>(), 0), Tensor::concat(&y1.iter().collect::<Vec<_>>(), 0)];
        loss(&c, &ys)
    };
    let refs = [&h0, &xs, &w];
    let want = lazuli::grad(&unrolled_loss, &refs);
    for (remat, unroll) in [(false, false), (true, false), (false, true), (true, true)] {
        let l = scan_loss(Scan::new().remat(remat).unroll(unroll));
        let how = format!("remat {remat}, unroll {unroll}");
        common::assert_close(&format!("loss ({how})"), DType::F64, &vec_of(&l), &vec_of(&unrolled_loss));
        for (i, (g, w)) in lazuli::grad(&l, &refs).iter().zip(&want).enumerate() {
            common::assert_close(&format!("d/d input {i} ({how})"), DType::F64, &vec_of(g), &vec_of(w));
        }
    }
}

/// A scan written out in the program (`Scan::unroll`) computes what the loop does, both ways round, and its
/// gradient (written out too) matches finite differences, saved or recomputed.
#[test]
fn an_unrolled_scan_computes_and_differentiates_as_the_loop() {
    let mut rng = Rng::new(6);
    let (h0, xs, w, v) = (rand(&mut rng, &[3]), rand(&mut rng, &[5, 3]), rand(&mut rng, &[3, 3]), rand(&mut rng, &[3]));
    for reverse in [false, true] {
        let (h, ys) = scanned_with(Scan::new().unroll(true), &h0, &xs, &w, &v, reverse);
        let (uh, uys) = unrolled(&h0, &xs, &w, &v, reverse);
        agree(&format!("final carry (reverse {reverse})"), &h, &uh);
        agree(&format!("ys (reverse {reverse})"), &ys, &uys);
    }
    let inputs: Vec<_> = [&[3][..], &[4, 3], &[3, 3], &[3]]
        .iter()
        .map(|d| common::array(common::values(&mut rng, DType::F64, d.iter().product(), -1.0, 1.0), d))
        .collect();
    for remat in [false, true] {
        let scan = Scan::new().unroll(true).remat(remat);
        check_grad(&format!("unrolled scan (remat {remat})"), &inputs, |x| {
            let (h, ys) = scanned_with(scan, &x[0], &x[1], &x[2], &x[3], false);
            Tensor::concat(&[&h, &ys], 0)
        });
        check_grad(&format!("unrolled reverse scan (remat {remat})"), &inputs, |x| {
            scanned_with(scan, &x[0], &x[1], &x[2], &x[3], true).1
        });
    }
}

#[test]
fn a_scan_of_no_steps_returns_its_carry_and_empty_ys_written_out_or_looped() {
    let c = Tensor::from_slice(&[1.5f64, -2.0], &[2]);
    for unroll in [false, true] {
        let (carry, ys) = Scan::new().length(0).unroll(unroll).run(
            |c, _| (vec![&c[0] * 2.0], vec![c[0].clone()]),
            std::slice::from_ref(&c),
            &[],
        );
        assert_eq!(vec_of(&carry[0]), [1.5, -2.0], "unroll {unroll}");
        assert_eq!(ys[0].dims(), &[0, 2], "unroll {unroll}");
        assert!(vec_of(&ys[0]).is_empty(), "unroll {unroll}");
    }
}

#[test]
fn while_loop_matches_the_rust_loop_and_the_reference() {
    // Newton's iteration for sqrt(a), with a step counter, until the step is below 1e-12 or 50 steps.
    let a = Tensor::from_slice(&[2.0f64, 9.0, 0.25], &[3]);
    let out = while_loop(
        |c| {
            let big = (&(&c[0] * &c[0]) - &a).abs().max(&[0]).gt(1e-12);
            let more = c[1].lt(Tensor::scalar(50i32));
            big.and(&more)
        },
        |c| vec![&(&c[0] + &(&a / &c[0])) * 0.5, &c[1] + &Tensor::scalar(1i32)],
        &[Tensor::ones(&[3], DType::F64), Tensor::zeros(&[], DType::I32)],
    );
    let (mut x, mut n) = (vec![1.0f64; 3], 0);
    let av = [2.0f64, 9.0, 0.25];
    while x.iter().zip(&av).map(|(x, a)| (x * x - a).abs()).fold(0.0, f64::max) > 1e-12 && n < 50 {
        x = x.iter().zip(&av).map(|(x, a)| (x + a / x) * 0.5).collect();
        n += 1;
    }
    assert_eq!(out[1].to_vec::<i32>().unwrap(), [n]);
    common::assert_close("sqrt", DType::F64, &vec_of(&out[0]), &x);
    common::assert_close("sqrt vs reference", DType::F64, out[0].evaluate_reference().unwrap().as_slice().unwrap(), &x);
    assert!(n > 3, "the loop ran several steps ({n})");
}

#[test]
fn while_loop_gradient_is_refused_naming_its_line() {
    let x = Tensor::from_slice(&[0.5f64], &[1]).requires_grad();
    let line = line!() + 1;
    let out = while_loop(|c| c[0].sum_all().lt(10.0), |c| vec![&c[0] * 2.0], std::slice::from_ref(&x));
    let msg = panic_message(|| {
        lazuli::grad(&out[0].sum_all(), &[&x]);
    });
    assert!(msg.contains("while_loop") && msg.contains("scan"), "{msg}");
    assert!(msg.contains(&format!("control.rs:{line}:")), "names the loop's line {line}: {msg}");
    // Forward only, it runs: 0.5 → 16.
    assert_eq!(vec_of(&lazuli::no_grad(|| out[0].clone())), [16.0]);
}

/// `x * w` if `sum(x) > 0`, else `sin(x) + b`; `w` and `b` are captured by the branches.
fn branchy(x: &Tensor, w: &Tensor, b: &Tensor) -> Tensor {
    let pred = x.sum_all().gt(0.0);
    cond(&pred, |a| vec![&a[0] * w], |a| vec![&a[0].sin() + b], std::slice::from_ref(x)).remove(0)
}

#[test]
fn cond_takes_the_right_branch() {
    let w = Tensor::from_slice(&[2.0f64, 3.0], &[2]);
    let b = Tensor::from_slice(&[10.0f64, 20.0], &[2]);
    for xs in [[1.0f64, 0.5], [-1.0, 0.5]] {
        let x = Tensor::from_slice(&xs, &[2]);
        let got = branchy(&x, &w, &b);
        let want = if xs[0] + xs[1] > 0.0 { &x * &w } else { &x.sin() + &b };
        agree(&format!("cond on {xs:?}"), &got, &want);
    }
}

#[test]
fn cond_gradient_matches_finite_differences_and_the_branch_taken() {
    for (xs, taken) in [([0.7f64, 0.5], true), ([-0.7, 0.5], false)] {
        let inputs = [
            common::array(xs.to_vec(), &[2]),
            common::array(vec![1.5, -0.5], &[2]),
            common::array(vec![0.2, 0.1], &[2]),
        ];
        check_grad(&format!("cond {taken}"), &inputs, |x| branchy(&x[0], &x[1], &x[2]));
        // Against the branch written directly.
        let leaves: Vec<Tensor> = inputs.iter().map(|a| Tensor::from_ndarray(a).requires_grad()).collect();
        let refs: Vec<&Tensor> = leaves.iter().collect();
        let got = lazuli::grad(&branchy(&leaves[0], &leaves[1], &leaves[2]).sum_all(), &refs);
        let direct = if taken { &leaves[0] * &leaves[1] } else { &leaves[0].sin() + &leaves[2] };
        let want = lazuli::grad(&direct.sum_all(), &refs);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            common::assert_close(&format!("cond {taken}: d/d input {i}"), DType::F64, &vec_of(g), &vec_of(w));
        }
    }
}

#[test]
fn scan_inside_cond_and_scan_inside_scan() {
    // Each row's cumulative sum (an inner scan), summed over rows by an outer scan; only if the total is positive.
    let xs = Tensor::from_slice(&[1.0f64, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]);
    let (total, rows) = scan(
        |c, row| {
            let (_, cum) = scan(
                |s, e| {
                    let s2 = &s[0] + &e[0];
                    (vec![s2.clone()], vec![s2])
                },
                &[Tensor::zeros(&[], DType::F64)],
                &[row[0].clone()],
            );
            (vec![&c[0] + &cum[0]], vec![cum[0].clone()])
        },
        &[Tensor::zeros(&[3], DType::F64)],
        &[xs],
    );
    assert_eq!(vec_of(&rows[0]), [1.0, 3.0, 6.0, 4.0, 9.0, 15.0]);
    assert_eq!(vec_of(&total[0]), [5.0, 12.0, 21.0]);
    let pred = total[0].sum_all().gt(0.0);
    let out = cond(&pred, |a| vec![a[0].clone()], |a| vec![a[0].neg()], &[total[0].clone()]).remove(0);
    assert_eq!(vec_of(&out), [5.0, 12.0, 21.0]);
}

#[test]
fn a_second_call_reuses_the_compiled_program() {
    // The same structure with other values: the loop's programs are part of the graph's hash, not its values.
    let run = |k: f64| {
        let xs = Tensor::from_slice(&[1.0f64, 2.0, 3.0], &[3]);
        let (c, _) =
            scan(|c, x| (vec![&(&c[0] * k) + &x[0]], vec![c[0].clone()]), &[Tensor::zeros(&[], DType::F64)], &[xs]);
        c[0].item::<f64>().unwrap()
    };
    assert_eq!(run(1.0), 6.0);
    assert_eq!(run(2.0), 11.0);
}

#[test]
fn a_body_that_panics_names_its_own_line() {
    let xs = Tensor::from_slice(&[1.0f64, 2.0], &[2, 1]);
    let line = line!() + 1;
    let body = |c: &[Tensor], x: &[Tensor]| (vec![c[0].matmul(&x[0])], vec![]);
    let msg = panic_message(|| {
        scan(body, &[Tensor::zeros(&[2], DType::F64)], std::slice::from_ref(&xs));
    });
    assert!(msg.contains(&format!("control.rs:{line}:")), "names the body's line {line}: {msg}");
}

/// A scan whose body runs a scan (each row's running product of sines, summed into the carry): its gradient,
/// saved and recomputed, against finite differences.
#[test]
fn a_scan_inside_a_scan_differentiates_in_both_modes() {
    let mut rng = Rng::new(5);
    let inputs: Vec<_> = [&[3][..], &[2, 3], &[3]]
        .iter()
        .map(|d| common::array(common::values(&mut rng, DType::F64, d.iter().product(), -1.0, 1.0), d))
        .collect();
    // The outer scan also written out around the looped inner one (`Scan::unroll`).
    for (remat, unroll) in [(false, false), (true, false), (false, true), (true, true)] {
        check_grad(&format!("nested scan (remat {remat}, outer unrolled {unroll})"), &inputs, |x| {
            let scan = Scan::new().remat(remat);
            let (total, rows) = scan.unroll(unroll).run(
                |c, row| {
                    let (_, cum) = scan.run(
                        |s, e| {
                            let s2 = &s[0] * &(&e[0] + &c[0].sum_all()).sin();
                            (vec![s2.clone()], vec![s2])
                        },
                        &[Tensor::ones(&[], DType::F64)],
                        &[&row[0] * &x[2]],
                    );
                    (vec![(&c[0] + &cum[0]).tanh()], vec![cum[0].clone()])
                },
                &[x[0].clone()],
                &[x[1].clone()],
            );
            Tensor::concat(&[&total[0], &rows[0].reshape(&[6])], 0)
        });
    }
}

/// A body that computes on a captured tensor alone (a sum, a slice, a scaled copy of a weight) before using it:
/// those ops belong to the body, so the captured tensor gets its gradient through them, in a scan (looped or
/// written out) and in a `cond`'s branch.
#[test]
fn ops_on_a_captured_tensor_inside_a_body_pass_its_gradient() {
    let mut rng = Rng::new(9);
    let inputs: Vec<_> = [&[3][..], &[4, 3], &[3, 3]]
        .iter()
        .map(|d| common::array(common::values(&mut rng, DType::F64, d.iter().product(), -1.0, 1.0), d))
        .collect();
    let weight = |w: &Tensor, variant: usize| match variant {
        0 => w.sum(&[0]),
        1 => w.slice(0, 1, 2).reshape(&[3]),
        _ => (w * 2.0).sum(&[0]).tanh(),
    };
    for unroll in [false, true] {
        for variant in 0..3 {
            check_grad(&format!("scan, captured op {variant} (unroll {unroll})"), &inputs, |x| {
                let (total, _) = Scan::new().unroll(unroll).run(
                    |c, row| (vec![(&c[0] + &(&row[0] * &weight(&x[2], variant))).tanh()], vec![]),
                    &[x[0].clone()],
                    &[x[1].clone()],
                );
                total[0].clone()
            });
        }
    }
    check_grad("cond, captured op", &inputs, |x| {
        let positive = x[0].sum_all().gt(-10.0);
        cond(&positive, |o| vec![&o[0] * &weight(&x[2], 2)], |o| vec![o[0].clone()], std::slice::from_ref(&x[0]))
            .remove(0)
    });
}
