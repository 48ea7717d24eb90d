//! Property tests over generated shapes: broadcasting, reductions, permutations and batched matmul on the real
//! plugin against ndarray, and products inside the elementwise ops and reductions XLA fuses around them.

use crate::common;

use common::{array, assert_close, tensor_of, values, Rng};
use lazuli::{DType, Tensor};
use ndarray::{ArrayD, Axis, IxDyn, Zip};
use proptest::prelude::*;

fn cfg() -> ProptestConfig {
    // Each case compiles a new program (~30 ms); 24 cases per property keep the suite quick on 2 cores.
    common::proptest_config(24)
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

    /// (A·B) ∘ C reduced, where A or B may be a broadcast: the shape of program whose fused form XLA's CPU
    /// compiler got wrong (`tests/ops/cpu_library_fusions.rs`). Sizes reach the tens, where XLA uses library kernels.
    #[test]
    fn products_fused_with_broadcasts_and_reductions(
        b in 1usize..5, m in 1usize..48, k in 1usize..48, n in 1usize..48, kind_a in 0u8..2, kind_b in 0u8..3,
        all in any::<bool>(), f64s in any::<bool>(), seed in any::<u64>(),
    ) {
        let dt = if f64s { DType::F64 } else { DType::F32 };
        let c = 0.37;
        let (a, aa) = match kind_a {
            0 => data(seed, dt, &[b, m, k]),
            _ => (Tensor::full(&[b, m, k], c, dt), ArrayD::from_elem(IxDyn(&[b, m, k]), dt.round(c))),
        };
        let (bt, ba) = match kind_b {
            0 => data(seed ^ 3, dt, &[b, k, n]),
            1 => (Tensor::full(&[b, k, n], c, dt), ArrayD::from_elem(IxDyn(&[b, k, n]), dt.round(c))),
            _ => {
                let (row, ra) = data(seed ^ 5, dt, &[n]);
                (row.broadcast_to(&[b, k, n]), ra.broadcast(IxDyn(&[b, k, n])).unwrap().to_owned())
            }
        };
        let (ct, ca) = data(seed ^ 9, dt, &[b, m, n]);
        let got = if all { (a.matmul(&bt) * &ct).sum_all() } else { (a.matmul(&bt) * &ct).sum(&[-1]) };
        // Each batch's product, and the same on magnitudes: |A|·|B| ∘ |C| summed alike bounds what rounding can
        // do to each result (a sum whose terms cancel is small next to the terms it was rounded against).
        let products = |a: &ArrayD<f64>, b: &ArrayD<f64>| {
            let mut prod = Vec::with_capacity(a.shape()[0] * m * n);
            for p in 0..a.shape()[0] {
                let x = a.index_axis(Axis(0), p).into_dimensionality::<ndarray::Ix2>().unwrap().to_owned();
                let y = b.index_axis(Axis(0), p).into_dimensionality::<ndarray::Ix2>().unwrap().to_owned();
                prod.extend(x.dot(&y).iter().copied());
            }
            array(prod, &[a.shape()[0], m, n])
        };
        let reduce = |x: ArrayD<f64>| if all { ArrayD::from_elem(IxDyn(&[]), x.sum()) } else { x.sum_axis(Axis(2)) };
        let want = reduce(products(&aa, &ba) * &ca);
        let bound = reduce(products(&aa.mapv(f64::abs), &ba.mapv(f64::abs)) * &ca.mapv(f64::abs));
        let tol = if f64s { 1e-13 } else { 1e-6 };
        let got = got.to_f64_vec().unwrap();
        prop_assert_eq!(got.len(), want.len());
        for (i, ((g, w), s)) in got.iter().zip(want.iter()).zip(bound.iter()).enumerate() {
            prop_assert!(
                (g - w).abs() <= tol * s.max(1.0),
                "element {}: got {}, want {} ({:?}, sum of magnitudes {})", i, g, w, dt, s
            );
        }
    }
}
