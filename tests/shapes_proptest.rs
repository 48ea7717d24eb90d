//! Property tests over generated shapes: broadcasting, reductions, permutations and batched matmul on the real
//! plugin against ndarray.

mod common;

use common::{array, assert_close, tensor_of, values, Rng};
use lazuli::{DType, Tensor};
use ndarray::{ArrayD, Axis, IxDyn, Zip};
use proptest::prelude::*;

fn cfg() -> ProptestConfig {
    // Each case compiles a new program (~30 ms); 24 cases per property keep the suite quick on 2 cores.
    ProptestConfig { cases: 24, ..ProptestConfig::default() }
}

/// Two shapes that broadcast: a base shape, each side drops some leading dims and sets some dims to 1.
fn broadcast_pair() -> impl Strategy<Value = (Vec<usize>, Vec<usize>)> {
    prop::collection::vec(1usize..5, 0..5)
        .prop_flat_map(|base| {
            let r = base.len();
            (Just(base), 0..=r, 0..=r, prop::collection::vec(any::<bool>(), r), prop::collection::vec(any::<bool>(), r))
        })
        .prop_map(|(base, da, db, ones_a, ones_b)| {
            let a = base.iter().enumerate().skip(da).map(|(i, &d)| if ones_a[i] { 1 } else { d }).collect();
            let b = base.iter().enumerate().skip(db).map(|(i, &d)| if ones_b[i] { 1 } else { d }).collect();
            (a, b)
        })
}

fn data(seed: u64, dtype: DType, dims: &[usize]) -> (Tensor, ArrayD<f64>) {
    let n = dims.iter().product();
    let v = values(&mut Rng::new(seed), dtype, n, -4.0, 4.0);
    (tensor_of(dtype, &v, dims), array(v, dims))
}

fn check(what: &str, t: &Tensor, want: &ArrayD<f64>) {
    assert_eq!(t.dims(), want.shape(), "{what}: shape");
    let dt = t.dtype();
    let want: Vec<f64> = want.iter().map(|&x| dt.round(x)).collect();
    assert_close(what, dt, &t.to_f64_vec().unwrap(), &want);
}

proptest! {
    #![proptest_config(cfg())]

    #[test]
    fn binary_ops_broadcast_like_numpy((sa, sb) in broadcast_pair(), seed in any::<u64>(), int in any::<bool>()) {
        let dt = if int { DType::I32 } else { DType::F32 };
        let (a, aa) = data(seed, dt, &sa);
        let (b, ba) = data(seed ^ 1, dt, &sb);
        let (sum, prod, max) = (&a + &b, &a * &b, a.maximum(&b));
        lazuli::sync().unwrap();
        let dims = lazuli::broadcast_shapes(&sa, &sb).unwrap();
        let (x, y) = (aa.broadcast(IxDyn(&dims)).unwrap(), ba.broadcast(IxDyn(&dims)).unwrap());
        check("add", &sum, &(&x + &y));
        check("mul", &prod, &(&x * &y));
        check("max", &max, &Zip::from(&x).and(&y).map_collect(|&p, &q| p.max(q)));
    }

    #[test]
    fn reductions_over_any_axes(dims in prop::collection::vec(1usize..5, 1..5), mask in any::<u8>(), seed in any::<u64>()) {
        let axes: Vec<usize> = (0..dims.len()).filter(|i| mask & (1 << i) != 0).collect();
        let (x, xa) = data(seed, DType::F64, &dims);
        let ia: Vec<isize> = axes.iter().map(|&a| a as isize).collect();
        let (s, m) = (x.sum(&ia), x.max(&ia));
        let (mut ws, mut wm) = (xa.clone(), xa.clone());
        for &a in axes.iter().rev() {
            ws = ws.sum_axis(Axis(a));
            wm = wm.fold_axis(Axis(a), f64::NEG_INFINITY, |&p, &q| p.max(q));
        }
        check("sum", &s, &ws);
        check("max", &m, &wm);
    }

    #[test]
    fn permutations(dims in prop::collection::vec(1usize..5, 1..5), seed in any::<u64>()) {
        let mut perm: Vec<usize> = (0..dims.len()).collect();
        let mut rng = Rng::new(seed);
        for i in (1..perm.len()).rev() {
            perm.swap(i, (rng.next_u64() % (i as u64 + 1)) as usize);
        }
        let (x, xa) = data(seed, DType::F32, &dims);
        let p: Vec<isize> = perm.iter().map(|&a| a as isize).collect();
        check("permute", &x.permute(&p), &xa.view().permuted_axes(IxDyn(&perm)).to_owned());
    }

    #[test]
    fn batched_matmul(batch in prop::collection::vec(1usize..4, 0..3), m in 1usize..5, k in 1usize..5, n in 1usize..5, seed in any::<u64>()) {
        let mut da = batch.clone();
        da.extend([m, k]);
        let mut db = batch.clone();
        db.extend([k, n]);
        let (a, aa) = data(seed, DType::F64, &da);
        let (b, ba) = data(seed ^ 7, DType::F64, &db);
        let bsz: usize = batch.iter().product();
        let a3 = aa.into_shape_with_order(IxDyn(&[bsz, m, k])).unwrap();
        let b3 = ba.into_shape_with_order(IxDyn(&[bsz, k, n])).unwrap();
        let mut out = Vec::new();
        for p in 0..bsz {
            let x = a3.index_axis(Axis(0), p).into_dimensionality::<ndarray::Ix2>().unwrap().to_owned();
            let y = b3.index_axis(Axis(0), p).into_dimensionality::<ndarray::Ix2>().unwrap().to_owned();
            out.extend(x.dot(&y).iter().copied());
        }
        let mut dims = batch.clone();
        dims.extend([m, n]);
        check("matmul", &a.matmul(&b), &array(out, &dims));
    }
}
