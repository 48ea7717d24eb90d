//! Array ops and nn functionals, every dtype each supports, on the real PJRT CPU plugin: each result is checked
//! against an ndarray computation written here and against the reference interpreter. Also bad input (panics
//! naming the caller's line) and generated shapes for slice and concat.

use crate::common;

use crate::common::panic_message;
use common::{array, tensor_of, tolerance, values, Rng};
use lazuli::{DType, Tensor};
use ndarray::{ArrayD, Axis, IxDyn, Slice};
use proptest::prelude::*;

pub(crate) const FLOATS: [DType; 4] = [DType::F32, DType::F64, DType::F16, DType::BF16];

/// Every dtype but bool.
fn numbers() -> Vec<DType> {
    DType::ALL.into_iter().filter(|&d| d != DType::Bool).collect()
}

/// Integer dtypes usable as indices.
fn index_dtypes() -> Vec<DType> {
    DType::ALL.into_iter().filter(|d| d.is_int()).collect()
}

/// One recorded result with its expected value; `slack` widens the dtype's tolerance for composites.
pub(crate) struct Check {
    name: String,
    got: Tensor,
    want: ArrayD<f64>,
    slack: f64,
}

pub(crate) fn check(name: impl Into<String>, got: Tensor, want: ArrayD<f64>) -> Check {
    Check { name: name.into(), got, want, slack: 1.0 }
}

pub(crate) fn input(rng: &mut Rng, dtype: DType, dims: &[usize], lo: f64, hi: f64) -> (Tensor, ArrayD<f64>) {
    let n = dims.iter().product();
    let v = values(rng, dtype, n, lo, hi);
    (tensor_of(dtype, &v, dims), array(v, dims))
}

/// Integer-valued data in [lo, hi) of any dtype: sums and comparisons are exact in every type.
pub(crate) fn whole(rng: &mut Rng, dtype: DType, dims: &[usize], lo: f64, hi: f64) -> (Tensor, ArrayD<f64>) {
    let n = dims.iter().product();
    let v: Vec<f64> = values(rng, DType::F64, n, lo, hi).into_iter().map(|x| dtype.round(x.floor())).collect();
    (tensor_of(dtype, &v, dims), array(v, dims))
}

#[track_caller]
fn assert_near(what: &str, dtype: DType, slack: f64, got: &[f64], want: &[f64]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let tol = tolerance(dtype) * slack;
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let ok = (g.is_nan() && w.is_nan()) || g == w || (g - w).abs() <= tol * (1.0 + w.abs().max(g.abs()));
        assert!(
            ok,
            "{what} ({dtype}): element {i}: got {g}, want {w} (tolerance {tol})\n got: {got:?}\nwant: {want:?}"
        );
    }
}

/// Run all checks in one program, then compare each with its expectation and with the reference interpreter.
pub(crate) fn run(checks: Vec<Check>) {
    let refs: Vec<ArrayD<f64>> = checks.iter().map(|c| c.got.evaluate_reference().unwrap()).collect();
    lazuli::sync().unwrap();
    for (c, r) in checks.iter().zip(refs) {
        assert_eq!(c.got.dims(), c.want.shape(), "{}: shape", c.name);
        let got = c.got.to_f64_vec().unwrap();
        let dt = c.got.dtype();
        let want: Vec<f64> = c.want.iter().map(|&x| dt.round(x)).collect();
        assert_near(&format!("{} vs ndarray", c.name), dt, c.slack, &got, &want);
        let r: Vec<f64> = r.iter().copied().collect();
        assert_near(&format!("{} vs reference interpreter", c.name), dt, c.slack, &got, &r);
    }
}

fn slice_nd(a: &ArrayD<f64>, axis: usize, start: usize, end: usize, step: usize) -> ArrayD<f64> {
    a.slice_axis(Axis(axis), Slice::new(start as isize, Some(end as isize), step as isize)).to_owned()
}

#[test]
fn slice_narrow_concat_stack_pad_flip_every_dtype() {
    let mut rng = Rng::new(1);
    let mut checks = Vec::new();
    for dt in DType::ALL {
        let (x, xa) = input(&mut rng, dt, &[3, 4, 5], 0.0, 9.0);
        checks.push(check(format!("slice axis 1 {dt}"), x.slice(1, 1, 3), slice_nd(&xa, 1, 1, 3, 1)));
        checks.push(check(format!("slice axis -1 {dt}"), x.slice(-1, 0, 5), xa.clone()));
        checks.push(check(format!("slice_step {dt}"), x.slice_step(2, 1, 5, 2), slice_nd(&xa, 2, 1, 5, 2)));
        checks.push(check(format!("slice_step 3 {dt}"), x.slice_step(0, 0, 3, 3), slice_nd(&xa, 0, 0, 3, 3)));
        checks.push(check(format!("narrow {dt}"), x.narrow(0, 2, 1), slice_nd(&xa, 0, 2, 3, 1)));
        checks.push(check(format!("empty slice {dt}"), x.slice(1, 2, 2), slice_nd(&xa, 1, 2, 2, 1)));

        let (y, ya) = input(&mut rng, dt, &[3, 2, 5], 0.0, 9.0);
        let (z, za) = input(&mut rng, dt, &[3, 1, 5], 0.0, 9.0);
        let want = ndarray::concatenate(Axis(1), &[xa.view(), ya.view(), za.view()]).unwrap();
        checks.push(check(format!("concat {dt}"), Tensor::concat(&[&x, &y, &z], -2), want));
        let (w, wa) = input(&mut rng, dt, &[3, 4, 5], 0.0, 9.0);
        for axis in [0usize, 1, 3] {
            let want = ndarray::stack(Axis(axis), &[xa.view(), wa.view()]).unwrap();
            checks.push(check(format!("stack {axis} {dt}"), Tensor::stack(&[&x, &w], axis as isize), want));
        }

        let fill = if dt == DType::Bool { 1.0 } else { 7.0 };
        let mut want = ArrayD::from_elem(IxDyn(&[4, 7, 5]), fill);
        want.slice_each_axis_mut(|ax| match ax.axis.index() {
            0 => Slice::new(1, Some(4), 1),
            1 => Slice::new(0, Some(4), 1),
            _ => Slice::new(0, None, 1),
        })
        .assign(&xa);
        checks.push(check(format!("pad {dt}"), x.pad(&[(1, 0), (0, 3), (0, 0)], fill), want));

        let mut v = xa.view();
        v.invert_axis(Axis(0));
        v.invert_axis(Axis(2));
        checks.push(check(format!("flip {dt}"), x.flip(&[-1, 0]), v.to_owned()));
    }
    run(checks);
}

/// `x` indexed along `axis` by `idx` (clamped to the axis like XLA's gather), in ndarray.
fn take_nd(x: &ArrayD<f64>, axis: usize, idx: &ArrayD<f64>) -> ArrayD<f64> {
    let n = x.shape()[axis];
    let parts: Vec<ArrayD<f64>> = idx
        .iter()
        .map(|&i| x.index_axis(Axis(axis), i.clamp(0.0, (n - 1) as f64) as usize).insert_axis(Axis(axis)).to_owned())
        .collect();
    let views: Vec<_> = parts.iter().map(|p| p.view()).collect();
    let joined = ndarray::concatenate(Axis(axis), &views).unwrap();
    let mut dims = x.shape()[..axis].to_vec();
    dims.extend(idx.shape());
    dims.extend(&x.shape()[axis + 1..]);
    array(joined.iter().copied().collect(), &dims)
}

#[test]
fn index_select_embedding_scatter_add_every_dtype() {
    let mut rng = Rng::new(2);
    let mut checks = Vec::new();
    for it in index_dtypes() {
        // Repeated, first and last indices; for signed types also out-of-range ones, which clamp.
        let raw: Vec<f64> =
            if it.is_signed() { vec![2.0, -3.0, 0.0, 3.0, 9.0, 2.0] } else { vec![2.0, 0.0, 3.0, 200.0, 1.0, 2.0] };
        let idx = tensor_of(it, &raw, &[2, 3]);
        let ia = array(raw.clone(), &[2, 3]);
        for dt in DType::ALL {
            let (x, xa) = input(&mut rng, dt, &[3, 4, 2], 0.0, 9.0);
            checks.push(check(
                format!("index_select axis 1 {dt} by {it}"),
                x.index_select(1, &idx),
                take_nd(&xa, 1, &ia),
            ));
            let flat = tensor_of(it, &raw[..4], &[4]);
            let fa = array(raw[..4].to_vec(), &[4]);
            checks.push(check(
                format!("index_select axis -1 {dt} by {it}"),
                x.index_select(-1, &flat),
                take_nd(&xa, 2, &fa),
            ));
            let (table, ta) = input(&mut rng, dt, &[4, 3], 0.0, 9.0);
            checks.push(check(format!("embedding {dt} by {it}"), table.embedding(&idx), take_nd(&ta, 0, &ia)));
            let scalar = tensor_of(it, &[1.0], &[]);
            let want = xa.index_axis(Axis(0), 1).to_owned();
            checks.push(check(format!("index_select scalar {dt} by {it}"), x.index_select(0, &scalar), want));
            if dt == DType::Bool {
                continue;
            }
            // Updates of the index_select's shape, added (accumulating repeats) at the clamped indices.
            let (u, ua) = input(&mut rng, dt, &[3, 2, 3, 2], 0.0, 5.0);
            let mut want = xa.clone();
            for (j, &i) in ia.iter().enumerate() {
                let row = i.clamp(0.0, 3.0) as usize;
                let upd = ua.index_axis(Axis(1), j / 3).index_axis(Axis(1), j % 3).to_owned();
                let mut dst = want.index_axis_mut(Axis(1), row);
                dst += &upd;
            }
            checks.push(check(format!("scatter_add {dt} by {it}"), x.scatter_add(1, &idx, &u), want));
        }
    }
    run(checks);
}

#[test]
fn one_hot_and_triangles_every_dtype() {
    let mut rng = Rng::new(3);
    let mut checks = Vec::new();
    for it in index_dtypes() {
        let raw = vec![0.0, 3.0, 1.0, 7.0, 3.0, 2.0];
        let ids = tensor_of(it, &raw, &[2, 3]);
        for dt in DType::ALL {
            let want =
                ArrayD::from_shape_fn(IxDyn(&[2, 3, 4]), |ix| (raw[ix[0] * 3 + ix[1]] == ix[2] as f64) as u8 as f64);
            checks.push(check(format!("one_hot {it} -> {dt}"), ids.one_hot(4, dt), want));
        }
    }
    for k in [-1isize, 0, 2] {
        let lower = ArrayD::from_shape_fn(IxDyn(&[4, 4]), |ix| (ix[1] as isize - ix[0] as isize <= k) as u8 as f64);
        let upper = ArrayD::from_shape_fn(IxDyn(&[4, 4]), |ix| (ix[1] as isize - ix[0] as isize >= k) as u8 as f64);
        checks.push(check(format!("tril_mask {k}"), Tensor::tril_mask(4, k), lower));
        checks.push(check(format!("triu_mask {k}"), Tensor::triu_mask(4, k), upper));
        for dt in DType::ALL {
            let (x, xa) = input(&mut rng, dt, &[2, 3, 5], 1.0, 9.0);
            let keep = |lower: bool| {
                ArrayD::from_shape_fn(IxDyn(&[2, 3, 5]), |ix| {
                    let d = ix[2] as isize - ix[1] as isize;
                    if (lower && d <= k) || (!lower && d >= k) {
                        xa[ix.clone()]
                    } else {
                        0.0
                    }
                })
            };
            checks.push(check(format!("tril {k} {dt}"), x.tril(k), keep(true)));
            checks.push(check(format!("triu {k} {dt}"), x.triu(k), keep(false)));
        }
    }
    run(checks);
}

#[test]
fn clamp_argmax_argmin_cumsum_every_numeric_dtype() {
    let mut rng = Rng::new(4);
    let mut checks = Vec::new();
    for dt in numbers() {
        let (x, xa) = input(&mut rng, dt, &[3, 6], 0.0, 10.0);
        checks.push(check(format!("clamp {dt}"), x.clamp(2.0, 7.0), xa.mapv(|v| v.clamp(2.0, 7.0))));
        // Few distinct values, so ties occur: the first index wins.
        let (y, ya) = whole(&mut rng, dt, &[4, 5, 3], 0.0, 3.0);
        for axis in [0usize, 1, 2] {
            let first = |better: fn(f64, f64) -> bool| {
                ya.map_axis(Axis(axis), |lane| {
                    let mut best = 0;
                    for (i, &v) in lane.iter().enumerate() {
                        if better(v, lane[best]) {
                            best = i;
                        }
                    }
                    best as f64
                })
            };
            checks.push(check(format!("argmax {axis} {dt}"), y.argmax(axis as isize), first(|a, b| a > b)));
            checks.push(check(format!("argmin {axis} {dt}"), y.argmin(axis as isize), first(|a, b| a < b)));
            let mut sums = ya.clone();
            for mut lane in sums.lanes_mut(Axis(axis)) {
                for i in 1..lane.len() {
                    lane[i] += lane[i - 1];
                }
            }
            checks.push(check(format!("cumsum {axis} {dt}"), y.cumsum(axis as isize), sums));
        }
    }
    // NaN counts as the extreme value for both argmax and argmin; the first NaN wins.
    let nan = f64::NAN;
    for dt in FLOATS {
        let v = [1.0, nan, 3.0, nan, 0.0, 2.0, 2.0, -1.0];
        let x = tensor_of(dt, &v, &[2, 4]);
        checks.push(check(format!("argmax nan {dt}"), x.argmax(1), array(vec![1.0, 1.0], &[2])));
        checks.push(check(format!("argmin nan {dt}"), x.argmin(1), array(vec![1.0, 3.0], &[2])));
        let inf = tensor_of(dt, &[f64::NEG_INFINITY; 3], &[3]);
        checks.push(check(format!("argmax all -inf {dt}"), inf.argmax(0), array(vec![0.0], &[])));
    }
    run(checks);
}

mod reference {
    use super::*;

    pub fn erf(x: f64) -> f64 {
        lazuli_hlo::ops::special::erf(x)
    }

    /// Reduce the lanes along `axis` with `f`, keeping the axis as size 1.
    pub fn lanes(a: &ArrayD<f64>, axis: usize, f: impl Fn(&[f64]) -> Vec<f64>) -> ArrayD<f64> {
        let mut out = a.clone();
        for mut lane in out.lanes_mut(Axis(axis)) {
            let v: Vec<f64> = lane.iter().copied().collect();
            for (dst, src) in lane.iter_mut().zip(f(&v)) {
                *dst = src;
            }
        }
        out
    }

    pub fn softmax(v: &[f64]) -> Vec<f64> {
        let m = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let s: f64 = v.iter().map(|x| (x - m).exp()).sum();
        v.iter().map(|x| (x - m).exp() / s).collect()
    }

    pub fn logsumexp(v: &[f64]) -> f64 {
        let m = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        m + v.iter().map(|x| (x - m).exp()).sum::<f64>().ln()
    }
}

#[test]
fn functionals_every_float_dtype() {
    let mut rng = Rng::new(5);
    let mut checks = Vec::new();
    let gelu_tanh =
        |x: f64| 0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh());
    let gelu_erf = |x: f64| 0.5 * x * (1.0 + reference::erf(x / 2f64.sqrt()));
    for dt in FLOATS {
        let (x, xa) = input(&mut rng, dt, &[3, 4, 5], -4.0, 4.0);
        let slack = 4.0; // composites round after every op in half precision
        let mut push = |name: &str, got: Tensor, want: ArrayD<f64>| {
            checks.push(Check { name: format!("{name} {dt}"), got, want, slack });
        };
        push("erf", x.erf(), xa.mapv(reference::erf));
        push("relu", x.relu(), xa.mapv(|v| v.max(0.0)));
        push("gelu", x.gelu(), xa.mapv(gelu_tanh));
        push("gelu_erf", x.gelu_erf(), xa.mapv(gelu_erf));
        for axis in [0usize, 2] {
            let sm = reference::lanes(&xa, axis, reference::softmax);
            push(&format!("softmax {axis}"), x.softmax(axis as isize), sm);
            let lsm = reference::lanes(&xa, axis, |v| {
                let l = reference::logsumexp(v);
                v.iter().map(|x| x - l).collect()
            });
            push(&format!("log_softmax {axis}"), x.log_softmax(axis as isize - 3), lsm);
            let lse = xa.map_axis(Axis(axis), |lane| reference::logsumexp(&lane.to_vec()));
            push(&format!("logsumexp {axis}"), x.logsumexp(&[axis as isize]), lse);
        }
        // logsumexp over two axes at once, and a row of -inf (the max-shift must not produce NaN).
        let lse2 = ArrayD::from_shape_fn(IxDyn(&[4]), |ix| {
            let v: Vec<f64> =
                (0..3).flat_map(|i| (0..5).map(move |k| (i, k))).map(|(i, k)| xa[[i, ix[0], k]]).collect();
            reference::logsumexp(&v)
        });
        push("logsumexp [0, 2]", x.logsumexp(&[0, -1]), lse2.clone());
        push(
            "logsumexp_keepdim [0, 2]",
            x.logsumexp_keepdim(&[0, -1]),
            lse2.into_shape_with_order(vec![1, 4, 1]).unwrap(),
        );
        let lse1 = xa.map_axis(Axis(1), |lane| reference::logsumexp(&lane.to_vec())).insert_axis(Axis(1));
        push("logsumexp_keepdim 1", x.logsumexp_keepdim(&[1]), lse1);
        let ninf = tensor_of(dt, &[f64::NEG_INFINITY, f64::NEG_INFINITY, 0.0, 1.0], &[2, 2]);
        push(
            "logsumexp -inf row",
            ninf.logsumexp(&[1]),
            array(vec![f64::NEG_INFINITY, 1.0 + (1.0 + (-1f64).exp()).ln()], &[2]),
        );
        let big = tensor_of(dt, &[1000.0, 1000.0], &[2]);
        if dt != DType::F16 {
            push("logsumexp large", big.logsumexp(&[0]), array(vec![1000.0 + 2f64.ln()], &[]));
        }

        let ln = |axes: &[usize]| {
            let n: usize = axes.iter().map(|&a| xa.shape()[a]).product();
            let mut mean = xa.clone();
            let mut var = xa.clone();
            let (mut m_sum, mut v_sum) = (xa.clone(), xa.clone());
            for &a in axes.iter().rev() {
                m_sum = m_sum.sum_axis(Axis(a)).insert_axis(Axis(a));
            }
            let m = m_sum.mapv(|s| s / n as f64);
            mean.zip_mut_with(&m.broadcast(xa.shape()).unwrap(), |x, &m| *x -= m);
            var.assign(&mean.mapv(|c| c * c));
            v_sum.assign(&var);
            for &a in axes.iter().rev() {
                v_sum = v_sum.sum_axis(Axis(a)).insert_axis(Axis(a));
            }
            let inv = v_sum.mapv(|s| 1.0 / (s / n as f64 + 1e-5).sqrt());
            &mean * &inv.broadcast(xa.shape()).unwrap()
        };
        push("layer_norm [-1]", x.layer_norm(&[-1], 1e-5), ln(&[2]));
        push("layer_norm [1, 2]", x.layer_norm(&[1, 2], 1e-5), ln(&[1, 2]));

        let (logits, la) = input(&mut rng, dt, &[4, 3], -3.0, 3.0);
        let targets = Tensor::from_slice(&[2i64, 0, 1, 2], &[4]);
        let ce: f64 = (0..4)
            .map(|i| {
                let row: Vec<f64> = (0..3).map(|c| la[[i, c]]).collect();
                reference::logsumexp(&row) - row[[2usize, 0, 1, 2][i]]
            })
            .sum::<f64>()
            / 4.0;
        push("cross_entropy", logits.cross_entropy(&targets), array(vec![ce], &[]));
        let (t, ta) = input(&mut rng, dt, &[3, 4, 5], -4.0, 4.0);
        let mse = (&xa - &ta).mapv(|d| d * d).mean().unwrap();
        push("mse_loss", x.mse_loss(&t), array(vec![mse], &[]));
    }
    for dt in [DType::I32, DType::I64] {
        let (x, xa) = input(&mut rng, dt, &[7], -5.0, 5.0);
        checks.push(check(format!("relu {dt}"), x.relu(), xa.mapv(|v| v.max(0.0))));
    }
    run(checks);
}

#[test]
fn empty_dimensions() {
    let mut rng = Rng::new(6);
    let (x, xa) = input(&mut rng, DType::F32, &[2, 3], -4.0, 4.0);
    let empty = Tensor::zeros(&[0, 3], DType::F32);
    let none = Tensor::from_slice::<i32>(&[], &[0]);
    let zeros = |dims: &[usize]| ArrayD::zeros(IxDyn(dims));
    run(vec![
        check("cumsum over an empty axis", empty.cumsum(0), zeros(&[0, 3])),
        check("cumsum beside an empty axis", empty.cumsum(1), zeros(&[0, 3])),
        check("index_select by no indices", x.index_select(1, &none), zeros(&[2, 0])),
        check("scatter_add of nothing", x.scatter_add(1, &none, &Tensor::zeros(&[2, 0], DType::F32)), xa.clone()),
        check("concat with an empty part", Tensor::concat(&[&empty, &x], 0), xa.clone()),
        check("pad of an empty tensor", empty.pad(&[(1, 0), (0, 0)], 2.0), ArrayD::from_elem(IxDyn(&[1, 3]), 2.0)),
    ]);
}

/// Run `f`, expect a panic, return its message.
#[test]
fn bad_input_names_the_callers_line() {
    let x = Tensor::from_slice(&[1.0f32; 12], &[3, 4]);
    let w4 = Tensor::from_slice(&[1.0f32; 4], &[4]);
    const F32: DType = DType::F32;
    let here = |line: u32| format!("{}:{line}:", file!());
    let (t3, smooth) =
        (Tensor::from_slice(&[0i32; 3], &[3]), lazuli::CrossEntropyOptions::default().label_smoothing(1.5));
    let cases: Vec<(u32, &str, String)> = vec![
        (line!(), "out of range", panic_message(|| drop(x.slice(1, 2, 5)))),
        (line!(), "out of range", panic_message(|| drop(x.slice(1, 3, 2)))),
        (line!(), "axis 2", panic_message(|| drop(x.slice(2, 0, 1)))),
        (line!(), "out of range", panic_message(|| drop(x.narrow(0, 2, 2)))),
        (line!(), "f32[3,4]", panic_message(|| drop(Tensor::concat(&[&x, &x.t()], 0)))),
        (line!(), "i32", panic_message(|| drop(Tensor::concat(&[&x, &x.to_dtype(DType::I32)], 0)))),
        (line!(), "stack", panic_message(|| drop(Tensor::stack(&[&x, &x.t()], 0)))),
        (line!(), "integer", panic_message(|| drop(x.index_select(0, &x)))),
        (line!(), "integer", panic_message(|| drop(x.embedding(&Tensor::from_slice(&[0.5f64], &[1]))))),
        (line!(), "updates", panic_message(|| drop(x.scatter_add(0, &Tensor::from_slice(&[0i32], &[1]), &x)))),
        (line!(), "pairs", panic_message(|| drop(x.pad(&[(1, 1)], 0.0)))),
        (line!(), "integer", panic_message(|| drop(x.one_hot(3, DType::F32)))),
        (line!(), "targets", panic_message(|| drop(x.cross_entropy(&Tensor::from_slice(&[0i32; 4], &[4]))))),
        (line!(), "floating-point", panic_message(|| drop(x.to_dtype(DType::I32).softmax(0)))),
        (line!(), "at least one axis", panic_message(|| drop(x.layer_norm(&[], 1e-5)))),
        (line!(), "must be [4]", panic_message(|| drop(x.layer_norm_affine(&x, &x, 1e-5, DType::F32)))),
        (line!(), "x's shape", panic_message(|| drop(x.add_layer_norm_affine(&x.t(), None, &w4, &w4, 1e-5, F32)))),
        (line!(), "bias must be", panic_message(|| drop(x.add_layer_norm_affine(&x, Some(&x), &w4, &w4, 1e-5, F32)))),
        (line!(), "must be [4]", panic_message(|| drop(x.bias_gelu(&x, DType::F32)))),
        (line!(), "floating-point", panic_message(|| drop(x.to_dtype(DType::I32).gelu()))),
        (line!(), "bool", panic_message(|| drop(lazuli::where_(&x, &x, &x)))),
        (line!(), "floating-point", panic_message(|| drop(x.to_dtype(DType::I32).logsumexp_keepdim(&[0])))),
        (line!(), "axis 2", panic_message(|| drop(x.logsumexp_keepdim(&[2])))),
        (line!(), "leading shape", panic_message(|| drop(x.cross_entropy(&Tensor::from_slice(&[0i32; 4], &[4]))))),
        (line!(), "label_smoothing", panic_message(|| drop(x.cross_entropy_with(&t3, &smooth)))),
        (line!(), "integer", panic_message(|| drop(x.take_along_axis(&x, 1)))),
        (line!(), "rank", panic_message(|| drop(x.take_along_axis(&Tensor::from_slice(&[0i32; 3], &[3]), 1)))),
        (line!(), "broadcast", panic_message(|| drop(x.take_along_axis(&Tensor::from_slice(&[0i32; 2], &[2, 1]), 1)))),
        (line!(), "axis 2", panic_message(|| drop(x.take_along_axis(&Tensor::from_slice(&[0i32; 2], &[2, 1]), 2)))),
        (line!(), "argmax", panic_message(|| drop(Tensor::from_slice(&[true], &[1]).argmax(0)))),
    ];
    for (line, needle, msg) in cases {
        assert!(msg.contains(needle), "line {line}: expected {needle:?} in {msg}");
        assert!(msg.contains(&here(line)), "line {line}: message must name {}: {msg}", here(line));
    }
}

fn dims_and_axis() -> impl Strategy<Value = (Vec<usize>, usize)> {
    prop::collection::vec(1usize..5, 1..5).prop_flat_map(|dims| {
        let r = dims.len();
        (Just(dims), 0..r)
    })
}

proptest! {
    #![proptest_config(common::proptest_config(24))]

    #[test]
    fn slices_of_any_shape((dims, axis) in dims_and_axis(), a in 0usize..6, b in 0usize..6, step in 1usize..4, seed in any::<u64>()) {
        let n = dims[axis];
        let start = a % (n + 1);
        let end = start + b % (n + 1 - start);
        let (x, xa) = input(&mut Rng::new(seed), DType::F32, &dims, -4.0, 4.0);
        let got = x.slice_step(axis as isize, start, end, step);
        let want = slice_nd(&xa, axis, start, end, step);
        prop_assert_eq!(got.dims(), want.shape());
        prop_assert_eq!(got.to_f64_vec().unwrap(), want.iter().copied().collect::<Vec<_>>());
    }

    #[test]
    fn concat_of_any_shapes((dims, axis) in dims_and_axis(), sizes in prop::collection::vec(0usize..4, 1..4), seed in any::<u64>()) {
        let mut rng = Rng::new(seed);
        let parts: Vec<(Tensor, ArrayD<f64>)> = sizes
            .iter()
            .map(|&s| {
                let mut d = dims.clone();
                d[axis] = s;
                input(&mut rng, DType::I32, &d, -50.0, 50.0)
            })
            .collect();
        let ts: Vec<&Tensor> = parts.iter().map(|p| &p.0).collect();
        let views: Vec<_> = parts.iter().map(|p| p.1.view()).collect();
        let got = Tensor::concat(&ts, axis as isize);
        let want = ndarray::concatenate(Axis(axis), &views).unwrap();
        prop_assert_eq!(got.dims(), want.shape());
        prop_assert_eq!(got.to_f64_vec().unwrap(), want.iter().copied().collect::<Vec<_>>());
    }
}

/// PyTorch's `cross_entropy` with the mean reduction, written out on ndarray: `[..., C]` logits, `[...]` targets.
fn cross_entropy_reference(x: &ArrayD<f64>, targets: &[i64], ignore: Option<i64>, eps: f64) -> f64 {
    let c = *x.shape().last().unwrap();
    let rows = x.to_shape((targets.len(), c)).unwrap();
    let (mut sum, mut count) = (0.0, 0usize);
    for (i, &t) in targets.iter().enumerate() {
        if Some(t) == ignore {
            continue;
        }
        let row: Vec<f64> = rows.row(i).to_vec();
        let lse = reference::logsumexp(&row);
        let q = |k: usize| (1.0 - eps) * ((k as i64 == t) as u8 as f64) + eps / c as f64;
        sum -= (0..c).map(|k| q(k) * (row[k] - lse)).sum::<f64>();
        count += 1;
    }
    sum / count as f64
}

#[test]
fn cross_entropy_options_every_float_dtype() {
    use lazuli::CrossEntropyOptions;
    let mut rng = Rng::new(8);
    let mut checks = Vec::new();
    // [2, 3] positions of 5 classes; -100 and class 1 appear as targets so that either can be the ignored one.
    let ids = [3i64, -100, 1, 0, 4, 1];
    let none = CrossEntropyOptions::default();
    let cases: [(&str, CrossEntropyOptions); 5] = [
        ("plain", none),
        ("ignore -100", none.ignore_index(-100)),
        ("ignore class 1", none.ignore_index(1)),
        ("smoothing 0.1", CrossEntropyOptions { ignore_index: None, label_smoothing: 0.1 }),
        ("ignore -100, smoothing 0.25", none.ignore_index(-100).label_smoothing(0.25)),
    ];
    for dt in FLOATS {
        let (x, xa) = input(&mut rng, dt, &[2, 3, 5], -3.0, 3.0);
        let mut push = |name: String, got: Tensor, want: f64| {
            checks.push(Check { name, got, want: array(vec![want], &[]), slack: 4.0 });
        };
        for tdt in [DType::I64, DType::I32] {
            let t = Tensor::from_slice(&ids, &[2, 3]).to_dtype(tdt);
            for (name, opts) in cases {
                // Without ignore_index, -100 is a target out of range: no one-hot term, counted in the mean (as
                // cross_entropy documents); the reference treats it as a class that matches none.
                let want = cross_entropy_reference(&xa, &ids, opts.ignore_index, opts.label_smoothing);
                push(format!("cross_entropy {name} {dt} {tdt}"), x.cross_entropy_with(&t, &opts), want);
            }
        }
        // Leading shape [2, 3] through plain cross_entropy, targets all in range: PyTorch's value.
        let ok = [3i64, 2, 1, 0, 4, 1];
        let want = cross_entropy_reference(&xa, &ok, None, 0.0);
        push(format!("cross_entropy [2, 3, 5] {dt}"), x.cross_entropy(&Tensor::from_slice(&ok, &[2, 3])), want);
        // Every position ignored: 0/0, NaN as in PyTorch.
        let all = CrossEntropyOptions::default().ignore_index(7).label_smoothing(0.1);
        push(
            format!("cross_entropy all ignored {dt}"),
            x.cross_entropy_with(&Tensor::from_slice(&[7i64; 6], &[2, 3]), &all),
            f64::NAN,
        );
    }
    run(checks);
}

/// numpy's `take_along_axis` on ndarray, negative indices from the end, the rest clamped to `[0, n-1]`.
fn take_along_axis_reference(x: &ArrayD<f64>, idx: &ArrayD<i64>, axis: usize) -> ArrayD<f64> {
    let r = x.ndim();
    let out: Vec<usize> =
        (0..r).map(|d| if d == axis { idx.shape()[d] } else { x.shape()[d].max(idx.shape()[d]) }).collect();
    let n = x.shape()[axis] as i64;
    ArrayD::from_shape_fn(IxDyn(&out), |ix| {
        let at = |a: &[usize], d: usize| if a[d] == 1 { 0 } else { ix[d] };
        let ii: Vec<usize> = (0..r).map(|d| at(idx.shape(), d)).collect();
        let mut k = idx[IxDyn(&ii)];
        if k < 0 {
            k += n;
        }
        let mut xi: Vec<usize> = (0..r).map(|d| at(x.shape(), d)).collect();
        xi[axis] = k.clamp(0, n - 1) as usize;
        x[IxDyn(&xi)]
    })
}

#[test]
fn take_along_axis_every_dtype() {
    let mut rng = Rng::new(9);
    let mut checks = Vec::new();
    // (x dims, index dims, axis, index values drawn from): same shape, fewer and more picks than the axis,
    // broadcasting either way beside the axis, negative and out-of-range indices.
    let cases: [(&[usize], &[usize], isize); 6] = [
        (&[3, 4], &[3, 4], 1),
        (&[3, 4], &[3, 2], -1),
        (&[3, 4], &[5, 4], 0),
        (&[2, 3, 5], &[2, 3, 1], 2),
        (&[2, 1, 5], &[1, 4, 3], -1),
        (&[2, 3, 4], &[2, 6, 4], 1),
    ];
    for dt in [DType::F32, DType::F64, DType::BF16, DType::I32, DType::I64, DType::U8] {
        for (k, &(xd, id, axis)) in cases.iter().enumerate() {
            let (x, xa) = whole(&mut rng, dt, xd, 0.0, 50.0);
            let a = axis.rem_euclid(xd.len() as isize) as usize;
            let n = xd[a] as f64;
            let iv: Vec<i64> = values(&mut rng, DType::F64, id.iter().product(), -n - 2.0, n + 2.0)
                .into_iter()
                .map(|v| v.floor() as i64)
                .collect();
            let ia = ArrayD::from_shape_vec(IxDyn(id), iv.clone()).unwrap();
            let want = take_along_axis_reference(&xa, &ia, a);
            for idt in [DType::I64, DType::I32] {
                let it = Tensor::from_slice(&iv, id).to_dtype(idt);
                checks.push(check(
                    format!("take_along_axis {k} {dt} by {idt}"),
                    x.take_along_axis(&it, axis),
                    want.clone(),
                ));
            }
        }
    }
    run(checks);
}
