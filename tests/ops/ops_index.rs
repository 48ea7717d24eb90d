//! Sorting, multi-axis slicing, scatter variants, checked indexing, einsum and the name aliases, on the real PJRT
//! CPU plugin: each result against an ndarray computation written here and the reference interpreter; bad input
//! names the caller's line (checked indices: at the read of the step that computed them).

use crate::common;

use common::Rng;
use lazuli::{DType, Tensor};
use ndarray::{ArrayD, Axis, IxDyn};

use super::ops_array::{check, run, whole};
use crate::common::panic_message;

/// Stable sort of every lane along `axis` in ndarray: (values, positions). NaN is the largest value.
fn sort_nd(x: &ArrayD<f64>, axis: usize, descending: bool) -> (ArrayD<f64>, ArrayD<f64>) {
    let (mut values, mut indices) = (x.clone(), x.clone());
    for ((lane, mut v), mut i) in
        x.lanes(Axis(axis)).into_iter().zip(values.lanes_mut(Axis(axis))).zip(indices.lanes_mut(Axis(axis)))
    {
        let key = |k: usize| if lane[k].is_nan() { (1, 0.0) } else { (0, lane[k]) };
        let mut order: Vec<usize> = (0..lane.len()).collect();
        order.sort_by(|&a, &b| {
            let o = key(a).partial_cmp(&key(b)).unwrap();
            if descending {
                o.reverse()
            } else {
                o
            }
        });
        for (j, &k) in order.iter().enumerate() {
            v[j] = lane[k];
            i[j] = k as f64;
        }
    }
    (values, indices)
}

#[test]
fn sort_argsort_topk_every_dtype() {
    let mut rng = Rng::new(31);
    let mut checks = Vec::new();
    // Few distinct values, so ties are common and stability shows.
    let cases: [(&[usize], isize); 4] = [(&[3, 5], 1), (&[4, 3], 0), (&[2, 3, 4], -1), (&[2, 3, 4], 1)];
    for dt in [DType::F32, DType::F64, DType::BF16, DType::F16, DType::I32, DType::I64, DType::U8, DType::U32] {
        for (k, &(dims, axis)) in cases.iter().enumerate() {
            let (x, xa) = whole(&mut rng, dt, dims, 0.0, 6.0);
            let a = axis.rem_euclid(dims.len() as isize) as usize;
            for descending in [false, true] {
                let (v, i) = sort_nd(&xa, a, descending);
                let name = format!("case {k} {dt} descending {descending}");
                checks.push(check(format!("sort {name}"), x.sort(axis, descending), v));
                checks.push(check(format!("argsort {name}"), x.argsort(axis, descending), i));
            }
            let (v, i) = sort_nd(&xa, a, true);
            let top = 2.min(dims[a]);
            let (tv, ti) = x.topk(top, axis);
            let first = |t: &ArrayD<f64>| t.slice_axis(Axis(a), ndarray::Slice::from(0..top)).to_owned();
            checks.push(check(format!("topk values case {k} {dt}"), tv, first(&v)));
            checks.push(check(format!("topk indices case {k} {dt}"), ti, first(&i)));
        }
    }
    run(checks);
}

#[test]
fn sort_puts_nan_last_ascending_and_first_descending() {
    let v = [f32::NAN, 1.0, f32::NEG_INFINITY, f32::NAN, 0.0, -0.0, f32::INFINITY, 1.0];
    let x = Tensor::from_slice(&v, &[1, 8]);
    let as_i64 = |t: Tensor| t.to_vec::<i64>().unwrap();
    // NaNs keep their order among themselves, and so do 0.0 and -0.0.
    assert_eq!(as_i64(x.argsort(1, false)), [2, 4, 5, 1, 7, 6, 0, 3]);
    assert_eq!(as_i64(x.argsort(1, true)), [0, 3, 6, 1, 7, 4, 5, 2]);
    let up = x.sort(1, false).to_vec::<f32>().unwrap();
    assert_eq!(up[..6], [f32::NEG_INFINITY, 0.0, -0.0, 1.0, 1.0, f32::INFINITY]);
    assert!(up[6].is_nan() && up[7].is_nan(), "{up:?}");
    assert!(up[2].is_sign_negative(), "-0.0 stays after 0.0: {up:?}");
    let (top, at) = x.topk(3, -1);
    let top = top.to_vec::<f32>().unwrap();
    assert!(top[0].is_nan() && top[1].is_nan() && top[2] == f32::INFINITY, "{top:?}");
    assert_eq!(as_i64(at), [0, 3, 6]);
    let reference = x.sort(1, true).evaluate_reference().unwrap();
    assert!(reference.iter().take(2).all(|v| v.is_nan()) && reference[IxDyn(&[0, 7])] == f64::NEG_INFINITY);
}

#[test]
fn sort_and_topk_inside_a_scan_body_and_its_gradient() {
    // Each step adds the row's two largest values to the carry; the body's sort lowers inside the loop's region.
    let rows: Vec<f64> = vec![3.0, -1.0, 7.5, 2.0, 0.5, 4.0, -2.0, 6.0, 1.0];
    let xs = Tensor::from_slice(&rows, &[3, 3]).requires_grad();
    let (carry, ys) = lazuli::scan(
        |c, x| {
            let (top, _) = x[0].topk(2, 0);
            (vec![&c[0] + &top.sum_all()], vec![x[0].argsort(0, false)])
        },
        &[Tensor::scalar(0.0f64)],
        std::slice::from_ref(&xs),
    );
    assert_eq!(carry[0].item::<f64>().unwrap(), (7.5 + 3.0) + (4.0 + 2.0) + (6.0 + 1.0));
    assert_eq!(ys[0].to_vec::<i64>().unwrap(), [1, 0, 2, 1, 0, 2, 0, 2, 1]);
    let g = lazuli::grad(&carry[0], &[&xs]);
    assert_eq!(g[0].to_vec::<f64>().unwrap(), [1.0, 0.0, 1.0, 1.0, 0.0, 1.0, 0.0, 1.0, 1.0]);
    assert_eq!(carry[0].evaluate_reference().unwrap()[IxDyn(&[])], 23.5);
}

#[test]
fn sorting_bad_input_names_the_callers_line() {
    let x = Tensor::from_slice(&[1.0f32; 12], &[3, 4]);
    let here = |line: u32| format!("{}:{line}:", file!());
    let cases: Vec<(u32, &str, String)> = vec![
        (line!(), "axis 2", panic_message(|| drop(x.sort(2, false)))),
        (line!(), "not defined for bool", panic_message(|| drop(x.gt(0.0).argsort(0, true)))),
        (line!(), "larger than axis", panic_message(|| drop(x.topk(5, 1)))),
        (line!(), "axis -3", panic_message(|| drop(x.topk(1, -3)))),
    ];
    for (line, needle, msg) in cases {
        assert!(msg.contains(needle), "line {line}: expected {needle:?} in {msg}");
        assert!(msg.contains(&here(line)), "line {line}: message must name {}: {msg}", here(line));
    }
    let err = x.try_topk(9, 0).unwrap_err();
    assert!(matches!(err, lazuli::Error::InvalidArgument { op: "topk", .. }), "{err}");
}

/// The positions a range of an axis of size `n` selects: CPython's `slice(start, stop).indices(n)` (negative from
/// the end, clamped), every `step`-th of them, from the last one backwards when `step` is negative (ndarray's `s!`).
fn range_positions(n: usize, start: Option<isize>, stop: Option<isize>, step: isize) -> Vec<usize> {
    let n = n as isize;
    let fix = |v: isize| (if v < 0 { v + n } else { v }).clamp(0, n);
    let (lo, hi) = (start.map_or(0, fix), stop.map_or(n, fix));
    let mut range: Vec<usize> = (lo..hi.max(lo)).map(|i| i as usize).collect();
    if step < 0 {
        range.reverse();
    }
    range.into_iter().step_by(step.unsigned_abs()).collect()
}

/// `x` sliced along its leading axes.
fn slice_reference(x: &ArrayD<f64>, slices: &[lazuli::AxisSlice]) -> ArrayD<f64> {
    let mut out = x.clone();
    for (d, s) in slices.iter().enumerate() {
        out = out.select(Axis(d), &range_positions(x.shape()[d], s.start, s.end, s.step));
    }
    out
}

#[test]
fn slice_axes_follows_numpy_and_ndarray() {
    use lazuli::s;
    let mut rng = Rng::new(32);
    let mut checks = Vec::new();
    let cases: Vec<Vec<lazuli::AxisSlice>> = vec![
        s![.., 1..3].to_vec(),
        s![1.., ..;2, -2..].to_vec(),
        s![..;-1, 1..4;-2].to_vec(),
        s![-100..100, ..=1, ..=-1].to_vec(),
        s![-1..1, -3..-1;-1, ..4;-3].to_vec(),
        s![..].to_vec(),
        vec![],
    ];
    for dt in [DType::F32, DType::I32, DType::BF16, DType::Bool] {
        let (x, xa) = whole(&mut rng, dt, &[3, 4, 5], 0.0, 9.0);
        for (k, slices) in cases.iter().enumerate() {
            checks.push(check(format!("slice_axes {k} {dt}"), x.slice_axes(slices), slice_reference(&xa, slices)));
        }
    }
    run(checks);
}

/// `x` with each `updates` slab written into the slab of `x` at its index along `axis` by `combine(old, new)`,
/// indices clamped, in the indices' row-major order.
fn scatter_reference(
    x: &ArrayD<f64>,
    axis: usize,
    idx: &[i64],
    upd: &ArrayD<f64>,
    combine: impl Fn(f64, f64) -> f64,
) -> ArrayD<f64> {
    let n = x.shape()[axis] as i64;
    let mut out = x.clone();
    let flat_upd = upd.to_shape([&x.shape()[..axis], &[idx.len()], &x.shape()[axis + 1..]].concat()).unwrap();
    for (j, &i) in idx.iter().enumerate() {
        let i = i.clamp(0, n - 1) as usize;
        let src = flat_upd.index_axis(Axis(axis), j);
        let mut dst = out.index_axis_mut(Axis(axis), i);
        dst.zip_mut_with(&src, |o, &u| *o = combine(*o, u));
    }
    out
}

#[test]
fn scatter_variants_every_dtype() {
    let mut rng = Rng::new(33);
    let mut checks = Vec::new();
    // Repeated indices (0 three times after clamping, 3 twice) and clamped ones (9 and -1).
    let (idx, idx_dims, axis) = ([0i64, 2, 0, 3, 9, -1], [2usize, 3], 1usize);
    for dt in [DType::F32, DType::F64, DType::BF16, DType::I32, DType::I64, DType::U8] {
        let (x, xa) = whole(&mut rng, dt, &[2, 5, 3], 0.0, 20.0);
        let (u, ua) = whole(&mut rng, dt, &[2, 2, 3, 3], 0.0, 20.0);
        for idt in [DType::I64, DType::I32] {
            let i = Tensor::from_slice(&idx, &idx_dims).to_dtype(idt);
            let name = |op: &str| format!("{op} {dt} by {idt}");
            checks.push(check(
                name("scatter"),
                x.scatter(1, &i, &u),
                scatter_reference(&xa, axis, &idx, &ua, |_, b| b),
            ));
            checks.push(check(
                name("scatter_max"),
                x.scatter_max(1, &i, &u),
                scatter_reference(&xa, axis, &idx, &ua, f64::max),
            ));
            checks.push(check(
                name("scatter_min"),
                x.scatter_min(-2, &i, &u),
                scatter_reference(&xa, axis, &idx, &ua, f64::min),
            ));
            let sum = scatter_reference(&xa, axis, &idx, &ua, |a, b| a + b).mapv(|v| dt.round(v));
            checks.push(check(name("index_add"), x.index_add(1, &i, &u), sum));
        }
    }
    run(checks);
}

#[test]
fn repeated_scatter_indices_last_update_wins_and_extremes_take_all() {
    let x = Tensor::from_slice(&[10.0f32, 20.0, 30.0, 40.0], &[4]);
    let idx = Tensor::from_slice(&[1i32, 3, 1, 1, 3], &[5]);
    let updates = |v: [f32; 5]| Tensor::from_slice(&v, &[5]);
    // Slot 1 gets updates 0, 2 and 3; slot 3 gets updates 1 and 4.
    let written = x.scatter(0, &idx, &updates([1.0, 2.0, 50.0, 3.0, 4.0]));
    assert_eq!(written.to_vec::<f32>().unwrap(), [10.0, 3.0, 30.0, 4.0]);
    let high = x.scatter_max(0, &idx, &updates([1.0, 2.0, 50.0, 3.0, 45.0]));
    assert_eq!(high.to_vec::<f32>().unwrap(), [10.0, 50.0, 30.0, 45.0]);
    let upd = updates([1.0, 2.0, 50.0, 3.0, f32::NAN]);
    let low = x.scatter_min(0, &idx, &upd).to_vec::<f32>().unwrap();
    assert_eq!(low[..3], [10.0, 1.0, 30.0]);
    assert!(low[3].is_nan(), "NaN wins a scatter_min too, as in minimum: {low:?}");
    let r = x.scatter_min(0, &idx, &upd).evaluate_reference().unwrap();
    assert!(r[IxDyn(&[3])].is_nan() && r[IxDyn(&[1])] == 1.0);
}

/// Every assignment of the letters' values, summing the products of the operands' entries into the output.
fn einsum_reference(spec: &str, xs: &[&ArrayD<f64>]) -> ArrayD<f64> {
    let (ins, out) = spec.split_once("->").unwrap();
    let ins: Vec<Vec<char>> = ins.split(',').map(|s| s.chars().collect()).collect();
    let out: Vec<char> = out.chars().collect();
    let mut letters: Vec<char> = ins.iter().flatten().copied().collect();
    letters.sort_unstable();
    letters.dedup();
    // A letter's size is its largest: a size-1 axis broadcasts (read at 0), as under NumPy's `...`.
    let size = |c: char| {
        let axes = ins.iter().zip(xs).filter_map(|(t, x)| t.iter().position(|&d| d == c).map(|a| x.shape()[a]));
        axes.max().unwrap()
    };
    let sizes: Vec<usize> = letters.iter().map(|&c| size(c)).collect();
    let odims: Vec<usize> = out.iter().map(|&c| size(c)).collect();
    let mut result = ArrayD::<f64>::zeros(IxDyn(&odims));
    let total: usize = sizes.iter().product();
    for mut flat in 0..total {
        let mut value = vec![0; letters.len()];
        for l in (0..letters.len()).rev() {
            value[l] = flat % sizes[l];
            flat /= sizes[l];
        }
        let at = |c: char| value[letters.iter().position(|&d| d == c).unwrap()];
        let entry = |t: &Vec<char>, x: &ArrayD<f64>| {
            let ix: Vec<usize> = t.iter().zip(x.shape()).map(|(&c, &n)| at(c).min(n - 1)).collect();
            x[IxDyn(&ix)]
        };
        let term: f64 = ins.iter().zip(xs).map(|(t, x)| entry(t, x)).product();
        result[IxDyn(&out.iter().map(|&c| at(c)).collect::<Vec<_>>())] += term;
    }
    result
}

#[test]
fn einsum_against_every_assignment() {
    let mut rng = Rng::new(34);
    let mut checks = Vec::new();
    // (spec given, the same with its output written out, operand shapes)
    let cases: [(&str, &str, &[&[usize]]); 22] = [
        ("ij,jk->ik", "ij,jk->ik", &[&[2, 3], &[3, 4]]),
        ("bij,bjk->bik", "bij,bjk->bik", &[&[2, 3, 4], &[2, 4, 2]]),
        ("ij->ji", "ij->ji", &[&[2, 3]]),
        ("ij->", "ij->", &[&[2, 3]]),
        ("i,i", "i,i->", &[&[5], &[5]]),
        ("ij,j", "ij,j->i", &[&[3, 4], &[4]]),
        ("ba,ca", "ba,ca->bc", &[&[2, 3], &[4, 3]]),
        ("i,j->ij", "i,j->ij", &[&[3], &[2]]),
        ("ijk,ikl,lm->mj", "ijk,ikl,lm->mj", &[&[2, 3, 2], &[2, 2, 3], &[3, 2]]),
        (" bhqd, bhkd -> bhqk ", "bhqd,bhkd->bhqk", &[&[1, 2, 3, 4], &[1, 2, 2, 4]]),
        ("ij,ij->ij", "ij,ij->ij", &[&[2, 3], &[2, 3]]),
        ("ij,ij", "ij,ij->", &[&[2, 3], &[2, 3]]),
        (",i->i", ",i->i", &[&[], &[4]]),
        // `...`: aligned from the right, size 1 broadcasting, first in an implicit output.
        ("...ij,...jk->...ik", "xyij,yjk->xyik", &[&[2, 3, 2, 4], &[3, 4, 2]]),
        ("...ij,...jk", "xyij,yjk->xyik", &[&[2, 1, 2, 4], &[3, 4, 2]]),
        ("i...->...", "iy->y", &[&[3, 4]]),
        ("...,...->...", "xy,y->xy", &[&[2, 3], &[3]]),
        ("b...d,b...d->b...", "bxd,bxd->bx", &[&[2, 1, 3], &[2, 4, 3]]),
        // Repeated indices within an operand: diagonals.
        ("ii->i", "ii->i", &[&[3, 3]]),
        ("ii", "ii->", &[&[4, 4]]),
        ("iji,jk->ik", "iji,jk->ik", &[&[3, 2, 3], &[2, 4]]),
        ("bii,bi->b", "bii,bi->b", &[&[2, 3, 3], &[2, 3]]),
    ];
    for dt in [DType::F32, DType::F64] {
        for (spec, full, shapes) in cases {
            let inputs: Vec<(Tensor, ArrayD<f64>)> = shapes.iter().map(|d| whole(&mut rng, dt, d, -3.0, 4.0)).collect();
            let ts: Vec<&Tensor> = inputs.iter().map(|p| &p.0).collect();
            let arrays: Vec<&ArrayD<f64>> = inputs.iter().map(|p| &p.1).collect();
            checks.push(check(
                format!("einsum {spec:?} {dt}"),
                lazuli::einsum(spec, &ts),
                einsum_reference(full, &arrays),
            ));
        }
    }
    run(checks);
}

#[test]
fn aliases_are_the_ops_they_name() {
    let mut rng = Rng::new(35);
    let (x, xa) = whole(&mut rng, DType::F32, &[2, 3, 4], 0.0, 9.0);
    let idx = Tensor::from_slice(&[3i64, 0, -1, 2, 1, 1], &[2, 3, 1]);
    let same = |a: &Tensor, b: &Tensor| {
        assert_eq!(a.dims(), b.dims());
        assert_eq!(a.to_f64_vec().unwrap(), b.to_f64_vec().unwrap());
    };
    same(&x.gather(-1, &idx), &x.take_along_axis(&idx, -1));
    same(&x.transpose(&[2, 0, 1]), &x.permute(&[2, 0, 1]));
    same(&x.swapaxes(0, -1), &x.permute(&[2, 1, 0]));
    let want: Vec<f64> = xa.view().permuted_axes(IxDyn(&[2, 1, 0])).iter().copied().collect();
    assert_eq!(x.swapaxes(-1, 0).to_f64_vec().unwrap(), want);
    assert_eq!(x.expand_dims(1).dims(), [2, 1, 3, 4]);
    assert_eq!(x.unsqueeze(-1).dims(), [2, 3, 4, 1]);
    assert_eq!(x.expand_dims(0).squeeze(0).to_f64_vec().unwrap(), xa.iter().copied().collect::<Vec<_>>());
    let i = Tensor::from_slice(&[1i32, 1], &[2]);
    let u = Tensor::from_slice(&[0.5f32; 16], &[2, 2, 4]);
    let y = x.slice(1, 0, 2);
    same(&y.index_add(1, &i, &u), &y.scatter_add(1, &i, &u));
}

#[test]
fn new_ops_bad_input_names_the_callers_line() {
    use lazuli::s;
    let x = Tensor::from_slice(&[1.0f32; 12], &[3, 4]);
    let (i, u) = (Tensor::from_slice(&[0i32, 1], &[2]), Tensor::from_slice(&[1.0f32; 8], &[2, 4]));
    let here = |line: u32| format!("{}:{line}:", file!());
    let cases: Vec<(u32, &str, String)> = vec![
        (line!(), "3 slices", panic_message(|| drop(x.slice_axes(&s![.., .., ..])))),
        (line!(), "step 0", panic_message(|| drop(x.slice_axes(&s![..;0])))),
        (line!(), "updates must be", panic_message(|| drop(x.scatter(1, &i, &u)))),
        (line!(), "not defined for bool", panic_message(|| drop(x.gt(0.0).scatter(0, &i, &u)))),
        (line!(), "integer", panic_message(|| drop(x.scatter_max(0, &u, &u)))),
        (line!(), "indices integers", panic_message(|| drop(x.scatter(0, &u, &u)))),
        (line!(), "axis 2", panic_message(|| drop(x.scatter_min(2, &i, &u)))),
        (line!(), "has size 3 in one operand and 4", panic_message(|| drop(lazuli::einsum("ii->i", &[&x])))),
        (line!(), "must place", panic_message(|| drop(lazuli::einsum("...ij->ij", &[&x.reshape(&[1, 3, 4])])))),
        (line!(), "more axes than its rank", panic_message(|| drop(lazuli::einsum("...ijk->i", &[&x])))),
        (line!(), "do not broadcast", panic_message(|| drop(lazuli::einsum("...j,...j", &[&x, &x.slice(0, 0, 2)])))),
        (line!(), "2 operands", panic_message(|| drop(lazuli::einsum("ij,jk->ik", &[&x])))),
        (line!(), "has size 3 in one operand and 4", panic_message(|| drop(lazuli::einsum("ij,ij->i", &[&x, &x.t()])))),
        (line!(), "output index 'k'", panic_message(|| drop(lazuli::einsum("ij->k", &[&x])))),
        (line!(), "has 3 indices", panic_message(|| drop(lazuli::einsum("ijk->i", &[&x])))),
        (line!(), "not 1", panic_message(|| drop(x.squeeze(0)))),
        (line!(), "axis 3", panic_message(|| drop(x.swapaxes(0, 3)))),
    ];
    for (line, needle, msg) in cases {
        assert!(msg.contains(needle), "line {line}: expected {needle:?} in {msg}");
        assert!(msg.contains(&here(line)), "line {line}: message must name {}: {msg}", here(line));
    }
}

#[test]
fn checked_index_select_reports_the_first_bad_index_at_the_read() {
    let table = Tensor::from_slice(&[0.0f32, 1.0, 2.0, 3.0, 4.0, 5.0], &[3, 2]);
    let ok = Tensor::from_slice(&[2i32, 0, 1], &[3]);
    let good = table.index_select_checked(0, &ok);
    assert!(matches!(table.try_index_select_checked(2, &ok), Err(lazuli::Error::BadAxis { .. })));
    let floats = Tensor::from_slice(&[1.0f32], &[1]);
    assert!(matches!(table.try_index_select_checked(0, &floats), Err(lazuli::Error::WrongDType { .. })));
    assert_eq!(good.to_vec::<f32>().unwrap(), [4.0, 5.0, 0.0, 1.0, 2.0, 3.0]);

    let ids = Tensor::from_slice(&[0i64, 2, 1, -1, 3, 7], &[2, 3]);
    let line = line!() + 1;
    let rows = table.index_select_checked(0, &ids);
    let err = rows.to_vec::<f32>().unwrap_err();
    let msg = err.to_string();
    match err {
        lazuli::Error::IndexOutOfRange { index, position, size, count, total, at, .. } => {
            assert_eq!((index, position, size, count, total), (-1, vec![1, 0], 3, 3, 6), "{msg}");
            assert_eq!((at.file, at.line), (file!(), line), "{msg}");
        }
        other => panic!("expected IndexOutOfRange, got {other}"),
    }
    assert!(msg.contains("valid: 0 to 3 exclusive") && msg.contains(&format!("{}:{line}:", file!())), "{msg}");
    // Reported once: the values (clamped, as XLA gathers) read fine afterwards.
    assert_eq!(rows.to_vec::<f32>().unwrap()[6..8], [0.0, 1.0]);

    // Not read directly: the next step's materialization reports it; `sync()` computes it with the step.
    let line = line!() + 1;
    let later = table.index_select_checked(1, &Tensor::from_slice(&[1u8, 2], &[2]));
    lazuli::sync().unwrap();
    drop(later);
    let err = (&good * 2.0).sum_all().item::<f32>().unwrap_err();
    assert!(matches!(err, lazuli::Error::IndexOutOfRange { index: 2, size: 2, .. }), "{err}");
    assert!(err.to_string().contains(&format!("{}:{line}:", file!())), "{err}");
}

#[test]
fn check_indices_setting_checks_index_select_and_embedding() {
    let test = common::child::test_name(module_path!(), "check_indices_setting_checks_index_select_and_embedding");
    if std::env::var("LAZULI_CHECK_INDICES").is_err() {
        common::child::passes(&test, &[("LAZULI_CHECK_INDICES", "1")]);
        // A malformed value stops at the first indexing op's line.
        let out = common::child::run(&test, &[("LAZULI_CHECK_INDICES", "maybe")]);
        let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{text}");
        let line = format!("{}:{}:", file!(), FIRST_INDEXING_LINE);
        assert!(text.contains("LAZULI_CHECK_INDICES=\"maybe\": expected 1 or 0") && text.contains(&line), "{text}");
        return;
    }
    let table = Tensor::from_slice(&[0.0f32, 1.0, 2.0, 3.0], &[2, 2]);
    let line = line!() + 2;
    const FIRST_INDEXING_LINE: u32 = line!() + 1;
    let err = table.embedding(&Tensor::from_slice(&[1i32, 5], &[2])).to_vec::<f32>().unwrap_err();
    assert!(matches!(err, lazuli::Error::IndexOutOfRange { op: "embedding", index: 5, .. }), "{err}");
    assert!(err.to_string().contains(&format!("{}:{line}:", file!())), "{err}");
    let err = table.index_select(1, &Tensor::from_slice(&[-3i64], &[1])).to_vec::<f32>().unwrap_err();
    assert!(matches!(err, lazuli::Error::IndexOutOfRange { op: "index_select", index: -3, .. }), "{err}");
    assert_eq!(table.index_select(0, &Tensor::from_slice(&[1i64], &[1])).to_vec::<f32>().unwrap(), [2.0, 3.0]);
    // Cross-entropy targets are class indices: one past the classes is named with its position; `ignore_index`
    // is not out of range; targets in range give the loss as unchecked.
    let logits = Tensor::from_slice(&[0.0f32, 1.0, 2.0, 0.5, 0.5, 0.5, 1.0, 0.0, 0.0, 3.0, 2.0, 1.0], &[2, 2, 3]);
    let line = line!() + 1;
    let loss = logits.cross_entropy(&Tensor::from_slice(&[2i64, 0, 1, 3], &[2, 2]));
    let err = loss.item::<f32>().unwrap_err();
    assert!(
        matches!(&err, lazuli::Error::IndexOutOfRange { op: "cross_entropy", index: 3, axis: 2, size: 3, position, .. }
            if position == &[1, 1]),
        "{err}"
    );
    assert!(err.to_string().contains(&format!("{}:{line}:", file!())), "{err}");
    let opts = lazuli::CrossEntropyOptions::default().ignore_index(-100);
    let ignored = logits.cross_entropy_with(&Tensor::from_slice(&[2i64, -100, 1, 0], &[2, 2]), &opts);
    let lse = |r: [f64; 3]| r.iter().map(|v| v.exp()).sum::<f64>().ln();
    let want = ((lse([0.0, 1.0, 2.0]) - 2.0) + (lse([1.0, 0.0, 0.0]) - 0.0) + (lse([3.0, 2.0, 1.0]) - 3.0)) / 3.0;
    assert!((ignored.item::<f32>().unwrap() as f64 - want).abs() < 1e-5);
}
