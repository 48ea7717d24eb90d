//! Every op × every dtype it supports, run on the real PJRT CPU plugin and checked twice: against an ndarray
//! computation written here, and against the IR's reference interpreter (`evaluate_reference`).

use crate::common;

use common::{array, assert_close, tensor_of, values, Rng};
use lazuli::{DType, Tensor};
use ndarray::{ArrayD, Axis, IxDyn, Zip};

const FLOATS: [DType; 4] = [DType::F32, DType::F64, DType::F16, DType::BF16];
const NUMBERS: [DType; 9] =
    [DType::F32, DType::F64, DType::F16, DType::BF16, DType::I32, DType::I64, DType::U8, DType::U32, DType::U64];

/// One recorded result with its expected value.
struct Check {
    name: String,
    dtype: DType,
    got: Tensor,
    want: ArrayD<f64>,
}

/// Input data of `dtype` in [lo, hi) as a tensor plus the same values as an ndarray.
fn input(rng: &mut Rng, dtype: DType, dims: &[usize], lo: f64, hi: f64) -> (Tensor, ArrayD<f64>) {
    let n = dims.iter().product();
    let v = values(rng, dtype, n, lo, hi);
    (tensor_of(dtype, &v, dims), array(v, dims))
}

fn zip2(a: &ArrayD<f64>, b: &ArrayD<f64>, f: impl Fn(f64, f64) -> f64) -> ArrayD<f64> {
    let dims = lazuli::broadcast_shapes(a.shape(), b.shape()).unwrap();
    let (a, b) = (a.broadcast(IxDyn(&dims)).unwrap(), b.broadcast(IxDyn(&dims)).unwrap());
    Zip::from(&a).and(&b).map_collect(|&x, &y| f(x, y))
}

/// Run all checks in one program (`sync`), then compare each with its ndarray expectation and with the reference
/// interpreter (recorded before the sync, since the reference needs the pending graph).
fn run(checks: Vec<Check>) {
    let refs: Vec<ArrayD<f64>> = checks.iter().map(|c| c.got.evaluate_reference().unwrap()).collect();
    lazuli::sync().unwrap();
    for (c, r) in checks.iter().zip(refs) {
        assert!(!c.got.is_pending(), "{}: sync left it pending", c.name);
        assert_eq!(c.got.dims(), c.want.shape(), "{}: shape", c.name);
        let got = c.got.to_f64_vec().unwrap();
        let dt = c.got.dtype();
        let want: Vec<f64> = c.want.iter().map(|&x| dt.round(x)).collect();
        assert_close(&format!("{} vs ndarray", c.name), c.dtype, &got, &want);
        assert_close(
            &format!("{} vs reference interpreter", c.name),
            c.dtype,
            &got,
            &r.iter().copied().collect::<Vec<_>>(),
        );
    }
}

/// Name, the op, its reference, and the range of inputs.
type UnaryCase = (&'static str, fn(&Tensor) -> Tensor, fn(f64) -> f64, f64, f64);
/// Name, the comparison, its reference.
type ComparisonCase = (&'static str, fn(&Tensor, &Tensor) -> Tensor, fn(f64, f64) -> bool);

#[test]
fn unary_ops_every_float_dtype() {
    let table: [UnaryCase; 10] = [
        ("neg", |t| -t, |x| -x, -3.0, 3.0),
        ("abs", |t| t.abs(), f64::abs, -3.0, 3.0),
        ("exp", |t| t.exp(), f64::exp, -3.0, 3.0),
        ("log", |t| t.log(), f64::ln, 0.1, 5.0),
        ("sqrt", |t| t.sqrt(), f64::sqrt, 0.0, 9.0),
        ("rsqrt", |t| t.rsqrt(), |x| 1.0 / x.sqrt(), 0.1, 9.0),
        ("tanh", |t| t.tanh(), f64::tanh, -3.0, 3.0),
        ("sin", |t| t.sin(), f64::sin, -3.0, 3.0),
        ("cos", |t| t.cos(), f64::cos, -3.0, 3.0),
        ("sigmoid", |t| t.sigmoid(), |x| 1.0 / (1.0 + (-x).exp()), -6.0, 6.0),
    ];
    let mut rng = Rng::new(1);
    let mut checks = Vec::new();
    for dt in FLOATS {
        for (name, f, r, lo, hi) in table {
            let (x, xa) = input(&mut rng, dt, &[3, 5], lo, hi);
            checks.push(Check { name: format!("{name} {dt}"), dtype: dt, got: f(&x), want: xa.mapv(r) });
        }
    }
    for dt in [DType::I32, DType::I64] {
        let (x, xa) = input(&mut rng, dt, &[7], -50.0, 50.0);
        checks.push(Check { name: format!("neg {dt}"), dtype: dt, got: -&x, want: xa.mapv(|v| -v) });
        checks.push(Check { name: format!("abs {dt}"), dtype: dt, got: x.abs(), want: xa.mapv(f64::abs) });
    }
    run(checks);
}

#[test]
fn binary_ops_with_broadcasting_every_numeric_dtype() {
    let mut rng = Rng::new(2);
    let mut checks = Vec::new();
    for dt in NUMBERS {
        // [2,3,4] with [3,1] and [4]: leading dimension added, size-1 dimension repeated.
        // Unsigned subtraction below zero wraps; the expectations round through the dtype the same way.
        let (lo, hi) = if !dt.is_signed() { (0.0, 15.0) } else { (-8.0, 8.0) };
        let (a, aa) = input(&mut rng, dt, &[2, 3, 4], lo, hi);
        let (b, ba) = input(&mut rng, dt, &[3, 1], lo, hi);
        let (d, da) = input(&mut rng, dt, &[4], 1.0, 6.0); // nonzero divisor
        let int = !dt.is_float();
        let div = move |x: f64, y: f64| if int { (x / y).trunc() } else { x / y };
        let add = &a + &b;
        checks.push(Check { name: format!("add {dt}"), dtype: dt, got: add, want: zip2(&aa, &ba, |x, y| x + y) });
        checks.push(Check { name: format!("sub {dt}"), dtype: dt, got: &a - &b, want: zip2(&aa, &ba, |x, y| x - y) });
        checks.push(Check { name: format!("mul {dt}"), dtype: dt, got: &a * &b, want: zip2(&aa, &ba, |x, y| x * y) });
        checks.push(Check { name: format!("div {dt}"), dtype: dt, got: &a / &d, want: zip2(&aa, &da, div) });
        checks.push(Check { name: format!("max {dt}"), dtype: dt, got: a.maximum(&b), want: zip2(&aa, &ba, f64::max) });
        checks.push(Check { name: format!("min {dt}"), dtype: dt, got: a.minimum(&b), want: zip2(&aa, &ba, f64::min) });
        // Host scalars on both sides take the tensor's dtype.
        checks.push(Check { name: format!("scalar add {dt}"), dtype: dt, got: &a + 2.0, want: aa.mapv(|x| x + 2.0) });
        checks.push(Check {
            name: format!("scalar rsub {dt}"),
            dtype: dt,
            got: 20.0 - &a,
            want: aa.mapv(|x| 20.0 - x),
        });
        let (p, pa) =
            if dt.is_float() { input(&mut rng, dt, &[4], 0.5, 2.0) } else { input(&mut rng, dt, &[4], 0.0, 4.0) };
        let (e, ea) =
            if dt.is_float() { input(&mut rng, dt, &[4], -2.0, 2.0) } else { input(&mut rng, dt, &[4], 0.0, 3.0) };
        checks.push(Check { name: format!("pow {dt}"), dtype: dt, got: p.pow(&e), want: zip2(&pa, &ea, f64::powf) });
    }
    for dt in [DType::Bool, DType::I32, DType::U8, DType::U32, DType::U64] {
        let (a, aa) = input(&mut rng, dt, &[3, 4], 0.0, 10.0);
        let (b, ba) = input(&mut rng, dt, &[4], 0.0, 10.0);
        let and = |x: f64, y: f64| ((x as i64) & (y as i64)) as f64;
        let or = |x: f64, y: f64| ((x as i64) | (y as i64)) as f64;
        checks.push(Check { name: format!("and {dt}"), dtype: dt, got: a.and(&b), want: zip2(&aa, &ba, and) });
        checks.push(Check { name: format!("or {dt}"), dtype: dt, got: a.or(&b), want: zip2(&aa, &ba, or) });
    }
    let (a, aa) = input(&mut rng, DType::Bool, &[3, 4], 0.0, 1.0);
    let (b, ba) = input(&mut rng, DType::Bool, &[3, 4], 0.0, 1.0);
    checks.push(Check {
        name: "max bool".into(),
        dtype: DType::Bool,
        got: a.maximum(&b),
        want: zip2(&aa, &ba, f64::max),
    });
    run(checks);
}

#[test]
fn comparisons_and_select_every_dtype() {
    let mut rng = Rng::new(3);
    let mut checks = Vec::new();
    let table: [ComparisonCase; 6] = [
        ("eq", |a, b| a.eq(b), |x, y| x == y),
        ("ne", |a, b| a.ne(b), |x, y| x != y),
        ("lt", |a, b| a.lt(b), |x, y| x < y),
        ("le", |a, b| a.le(b), |x, y| x <= y),
        ("gt", |a, b| a.gt(b), |x, y| x > y),
        ("ge", |a, b| a.ge(b), |x, y| x >= y),
    ];
    for dt in DType::ALL {
        // Small integer-valued data so that equal pairs occur.
        let (a, aa) = input(&mut rng, dt, &[4, 5], 0.0, 4.0);
        let (b, ba) = input(&mut rng, dt, &[5], 0.0, 4.0);
        for (name, f, r) in table {
            let want = zip2(&aa, &ba, |x, y| r(x, y) as u8 as f64);
            checks.push(Check { name: format!("{name} {dt}"), dtype: DType::Bool, got: f(&a, &b), want });
        }
        let (c, ca) = input(&mut rng, DType::Bool, &[4, 1], 0.0, 1.0);
        let want = Zip::from(&ca.broadcast(IxDyn(&[4, 5])).unwrap())
            .and(&aa)
            .and(&ba.broadcast(IxDyn(&[4, 5])).unwrap())
            .map_collect(|&c, &x, &y| if c != 0.0 { x } else { y });
        checks.push(Check { name: format!("select {dt}"), dtype: dt, got: c.select(&a, &b), want });
        // `where_` is `select` under numpy's name: the function and the method, branches swapped, a host scalar.
        let swapped = Zip::from(&ca.broadcast(IxDyn(&[4, 5])).unwrap())
            .and(&aa)
            .and(&ba.broadcast(IxDyn(&[4, 5])).unwrap())
            .map_collect(|&c, &x, &y| if c != 0.0 { y } else { x });
        checks.push(Check { name: format!("where_ {dt}"), dtype: dt, got: lazuli::where_(&c, &b, &a), want: swapped });
        if dt != DType::Bool {
            let left = ca.broadcast(IxDyn(&[4, 5])).unwrap().to_owned();
            let scalar = Zip::from(&left).and(&aa).map_collect(|&c, &x| if c != 0.0 { x } else { 2.0 });
            checks.push(Check {
                name: format!("Tensor::where_ {dt}"),
                dtype: dt,
                got: c.where_(&a, 2.0),
                want: scalar,
            });
        }
    }
    run(checks);
}

#[test]
fn convert_between_every_pair_of_dtypes() {
    let mut rng = Rng::new(4);
    let mut checks = Vec::new();
    for from in DType::ALL {
        // Non-negative values below 100 fit every type; floats keep fractions to test truncation and rounding.
        let (x, xa) = input(&mut rng, from, &[6], 0.0, 100.0);
        for to in DType::ALL {
            let want = xa.mapv(|v| to.round(v));
            checks.push(Check { name: format!("convert {from} -> {to}"), dtype: to, got: x.to_dtype(to), want });
        }
    }
    run(checks);
}

#[test]
fn layout_ops_every_dtype() {
    let mut rng = Rng::new(5);
    let mut checks = Vec::new();
    for dt in DType::ALL {
        let (x, xa) = input(&mut rng, dt, &[2, 3, 4], 0.0, 9.0);
        let flat: Vec<f64> = xa.iter().copied().collect();
        checks.push(Check {
            name: format!("reshape {dt}"),
            dtype: dt,
            got: x.reshape(&[4, -1]),
            want: array(flat, &[4, 6]),
        });
        let want = xa.view().permuted_axes(IxDyn(&[2, 0, 1])).to_owned();
        checks.push(Check { name: format!("permute {dt}"), dtype: dt, got: x.permute(&[2, 0, 1]), want });
        let want = xa.view().permuted_axes(IxDyn(&[0, 2, 1])).to_owned();
        checks.push(Check { name: format!("t {dt}"), dtype: dt, got: x.t(), want });
        let (y, ya) = input(&mut rng, dt, &[3, 1], 0.0, 9.0);
        let want = ya.broadcast(IxDyn(&[2, 3, 5])).unwrap().to_owned();
        checks.push(Check { name: format!("broadcast {dt}"), dtype: dt, got: y.broadcast_to(&[2, 3, 5]), want });
    }
    run(checks);
}

fn fold(a: &ArrayD<f64>, axes: &[usize], init: f64, f: fn(f64, f64) -> f64) -> ArrayD<f64> {
    let mut r = a.clone();
    for &ax in axes.iter().rev() {
        r = r.fold_axis(Axis(ax), init, |&acc, &v| f(acc, v));
    }
    r
}

#[test]
fn reductions_every_dtype() {
    let mut rng = Rng::new(6);
    let mut checks = Vec::new();
    for dt in DType::ALL {
        let (x, xa) = input(&mut rng, dt, &[3, 4, 5], 0.0, 9.0);
        for axes in [vec![0usize], vec![1], vec![2], vec![0, 2], vec![0, 1, 2]] {
            let ia: Vec<isize> = axes.iter().map(|&a| a as isize).collect();
            if dt != DType::Bool {
                let want = fold(&xa, &axes, 0.0, |a, b| a + b);
                checks.push(Check { name: format!("sum {axes:?} {dt}"), dtype: dt, got: x.sum(&ia), want });
            }
            let want = fold(&xa, &axes, f64::NEG_INFINITY, f64::max);
            checks.push(Check { name: format!("max {axes:?} {dt}"), dtype: dt, got: x.max(&ia), want });
            let want = fold(&xa, &axes, f64::INFINITY, f64::min);
            checks.push(Check { name: format!("min {axes:?} {dt}"), dtype: dt, got: x.min(&ia), want });
            if dt.is_float() {
                let n: usize = axes.iter().map(|&a| xa.shape()[a]).product();
                let want = fold(&xa, &axes, 0.0, |a, b| a + b).mapv(|s| s / n as f64);
                checks.push(Check { name: format!("mean {axes:?} {dt}"), dtype: dt, got: x.mean(&ia), want });
            }
        }
        if dt != DType::Bool {
            let want = fold(&xa, &[1], 0.0, |a, b| a + b).insert_axis(Axis(1));
            checks.push(Check { name: format!("sum_keepdim {dt}"), dtype: dt, got: x.sum_keepdim(&[-2]), want });
        }
    }
    run(checks);
}

/// Plain triple loop over (batch, i, j, k).
fn matmul_ref(a: &ArrayD<f64>, b: &ArrayD<f64>, batch: usize, m: usize, k: usize, n: usize) -> ArrayD<f64> {
    let (av, bv): (Vec<f64>, Vec<f64>) = (a.iter().copied().collect(), b.iter().copied().collect());
    let mut out = vec![0.0; batch * m * n];
    for p in 0..batch {
        for i in 0..m {
            for j in 0..n {
                out[(p * m + i) * n + j] = (0..k).map(|q| av[(p * m + i) * k + q] * bv[(p * k + q) * n + j]).sum();
            }
        }
    }
    array(out, &[batch, m, n])
}

#[test]
fn matmul_every_numeric_dtype() {
    let mut rng = Rng::new(7);
    let mut checks = Vec::new();
    for dt in NUMBERS {
        let (lo, hi) = if dt.is_float() { (-2.0, 2.0) } else { (0.0, 4.0) };
        let (a, aa) = input(&mut rng, dt, &[3, 4], lo, hi);
        let (b, ba) = input(&mut rng, dt, &[4, 5], lo, hi);
        let want = matmul_ref(&aa, &ba, 1, 3, 4, 5).into_shape_with_order(IxDyn(&[3, 5])).unwrap();
        checks.push(Check { name: format!("matmul 2d {dt}"), dtype: dt, got: a.matmul(&b), want });
        let (c, ca) = input(&mut rng, dt, &[2, 3, 4], lo, hi);
        let (d, da) = input(&mut rng, dt, &[2, 4, 2], lo, hi);
        checks.push(Check {
            name: format!("matmul batched {dt}"),
            dtype: dt,
            got: c.matmul(&d),
            want: matmul_ref(&ca, &da, 2, 3, 4, 2),
        });
        // Batch broadcast: [2,3,4] @ [4,5] and a matrix-vector product.
        let want = matmul_ref(&ca, &ndarray::concatenate(Axis(0), &[ba.view(), ba.view()]).unwrap(), 2, 3, 4, 5);
        checks.push(Check { name: format!("matmul broadcast {dt}"), dtype: dt, got: c.matmul(&b), want });
        let (v, va) = input(&mut rng, dt, &[4], lo, hi);
        let want = matmul_ref(&aa, &va, 1, 3, 4, 1).into_shape_with_order(IxDyn(&[3])).unwrap();
        checks.push(Check { name: format!("matvec {dt}"), dtype: dt, got: a.matmul(&v), want });
    }
    run(checks);
}

#[test]
fn constructors() {
    let mut checks = Vec::new();
    for dt in NUMBERS {
        checks.push(Check {
            name: format!("zeros {dt}"),
            dtype: dt,
            got: Tensor::zeros(&[2, 3], dt),
            want: ArrayD::zeros(IxDyn(&[2, 3])),
        });
        checks.push(Check {
            name: format!("ones {dt}"),
            dtype: dt,
            got: Tensor::ones(&[3], dt),
            want: ArrayD::ones(IxDyn(&[3])),
        });
        checks.push(Check {
            name: format!("full {dt}"),
            dtype: dt,
            got: Tensor::full(&[2, 2], 7.0, dt),
            want: ArrayD::from_elem(IxDyn(&[2, 2]), 7.0),
        });
        let want = array((0..6).map(|i| i as f64).collect(), &[6]);
        checks.push(Check { name: format!("arange {dt}"), dtype: dt, got: Tensor::arange(6, dt), want });
    }
    let want = array(vec![1.0, 1.5, 2.0, 2.5], &[4]);
    checks.push(Check {
        name: "arange_step".into(),
        dtype: DType::F32,
        got: Tensor::arange_step(1.0, 3.0, 0.5, DType::F32),
        want,
    });
    run(checks);
}
