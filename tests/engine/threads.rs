//! Each thread records into a graph of its own; the runtime and its executable cache are shared. Threads train
//! at once and each gets what ndarray computes; `sync()` on one thread leaves another thread's tensors pending.

use crate::common;

use common::{values, Rng};
use lazuli::Tensor;
use ndarray::Array2;

/// Ten steps of gradient descent on `sum(tanh(x·w)²)`, from data seeded by `seed`; the final weights.
fn train(seed: u64) -> Vec<f64> {
    let mut rng = Rng::new(seed);
    let x = Tensor::from_slice(&values(&mut rng, lazuli::DType::F64, 12, -1.0, 1.0), &[4, 3]);
    let mut w = Tensor::from_slice(&values(&mut rng, lazuli::DType::F64, 6, -1.0, 1.0), &[3, 2]).requires_grad();
    for _ in 0..10 {
        let t = x.matmul(&w).tanh();
        let loss = (&t * &t).sum_all();
        let g = lazuli::grad(&loss, &[&w]).remove(0);
        w = lazuli::no_grad(|| &w - &(g * 0.1)).requires_grad();
        lazuli::sync().unwrap();
    }
    w.to_f64_vec().unwrap()
}

/// The same on ndarray: d/dw sum(tanh(xw)²) = xᵀ(2 tanh(xw)(1 − tanh²(xw))).
fn train_reference(seed: u64) -> Vec<f64> {
    let mut rng = Rng::new(seed);
    let x = Array2::from_shape_vec((4, 3), values(&mut rng, lazuli::DType::F64, 12, -1.0, 1.0)).unwrap();
    let mut w = Array2::from_shape_vec((3, 2), values(&mut rng, lazuli::DType::F64, 6, -1.0, 1.0)).unwrap();
    for _ in 0..10 {
        let t = x.dot(&w).mapv(f64::tanh);
        let dz = t.mapv(|t| 2.0 * t * (1.0 - t * t));
        w = &w - &(x.t().dot(&dz) * 0.1);
    }
    w.iter().copied().collect()
}

#[test]
fn threads_train_at_once_each_on_its_own_graph() {
    let workers: Vec<_> = (0..4u64).map(|seed| std::thread::spawn(move || train(seed))).collect();
    for (seed, worker) in workers.into_iter().enumerate() {
        let got = worker.join().expect("a training thread panicked");
        let want = train_reference(seed as u64);
        let err = common::rel_err(&got, &want, 1.0);
        assert!(err < 1e-12, "thread {seed}: relative error {err:e}\n got {got:?}\nwant {want:?}");
    }
}

#[test]
fn sync_computes_only_the_calling_threads_tensors() {
    let here = Tensor::from_slice(&[1.0f32, 2.0], &[2]) * 3.0;
    let there = std::thread::spawn(|| {
        let t = Tensor::from_slice(&[5.0f32, 7.0], &[2]) * 2.0;
        lazuli::sync().unwrap();
        assert!(!t.is_pending(), "sync() computes its own thread's tensor");
        t.to_vec::<f32>().unwrap()
    })
    .join()
    .unwrap();
    assert_eq!(there, vec![10.0, 14.0]);
    assert!(here.is_pending(), "another thread's sync() left this thread's tensor pending");
    lazuli::sync().unwrap();
    assert!(!here.is_pending());
    assert_eq!(here.to_vec::<f32>().unwrap(), vec![3.0, 6.0]);
}

#[test]
fn each_thread_has_its_own_random_stream() {
    let draw = |seed: Option<u64>| {
        std::thread::spawn(move || {
            if let Some(s) = seed {
                lazuli::manual_seed(s);
            }
            Tensor::rand(&[16], lazuli::DType::F32).to_vec::<f32>().unwrap()
        })
        .join()
        .unwrap()
    };
    // A thread nobody seeded starts from the default seed, whatever other threads drew before.
    let first = draw(None);
    assert_eq!(draw(None), first);
    assert_eq!(draw(Some(7)), draw(Some(7)));
    assert_ne!(draw(Some(7)), first);
    assert!(first.iter().all(|v| (0.0..1.0).contains(v)));
}
