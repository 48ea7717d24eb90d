//! lazuli's CPU launcher (`Config::cpu_launcher`): a step's program runs on a thread of its own while the host
//! records the next step, unless the host read results of its latest program (it would wait anyway), in which
//! case the next program runs on the calling thread. Both paths must compute what ndarray computes, including the
//! uploads of fresh host data, donated weights, values read right after they were queued, and large buffers
//! dropped while programs are queued.
//!
//! One test, alone in a child process: the metrics checked here are counted per process, and a second test
//! running alongside would add its own programs to them.

use crate::common;

use common::{values, Rng};
use lazuli::Tensor;
use ndarray::Array2;

/// How a training loop reads its losses.
#[derive(Clone, Copy)]
enum Reads {
    Never,
    /// Every that many steps, the step's own loss.
    Every(usize),
    /// Every step, the previous step's loss (a loop that logs without waiting for the step it just launched).
    Previous,
}

/// `steps` steps of gradient descent on `sum(tanh(x·w)²)` with a fresh host batch every step (data seeded by
/// `seed`), reading losses as `reads` says. Returns the final weights and how many of the steps after the first
/// were queued on the launcher.
fn train(seed: u64, steps: usize, reads: Reads) -> (Vec<f64>, u64) {
    let mut rng = Rng::new(seed);
    let xs: Vec<Vec<f64>> = (0..steps).map(|_| values(&mut rng, lazuli::DType::F64, 12, -1.0, 1.0)).collect();
    let mut w = Tensor::from_slice(&values(&mut rng, lazuli::DType::F64, 6, -1.0, 1.0), &[3, 2]).requires_grad();
    let mut queued = 0;
    let mut previous: Option<Tensor> = None;
    for (step, x) in xs.iter().enumerate() {
        let before = lazuli::metrics();
        let x = Tensor::from_slice(x, &[4, 3]);
        let t = x.matmul(&w).tanh();
        let loss = (&t * &t).sum_all();
        let g = lazuli::grad(&loss, &[&w]).remove(0);
        w = lazuli::no_grad(|| &w - &(g * 0.1)).requires_grad();
        lazuli::sync().unwrap();
        if step > 0 {
            queued += (lazuli::metrics() - before).queued;
        }
        let read = match reads {
            Reads::Never => None,
            Reads::Every(n) => (step % n == 0).then(|| loss.clone()),
            Reads::Previous => previous.replace(loss),
        };
        if let Some(loss) = read {
            let got = loss.item::<f64>().unwrap();
            assert!(got.is_finite() && got >= 0.0, "step {step}: loss {got}");
        }
    }
    (w.to_f64_vec().unwrap(), queued)
}

/// The same on ndarray: d/dw sum(tanh(xw)²) = xᵀ(2 tanh(xw)(1 − tanh²(xw))).
fn train_reference(seed: u64, steps: usize) -> Vec<f64> {
    let mut rng = Rng::new(seed);
    let xs: Vec<Vec<f64>> = (0..steps).map(|_| values(&mut rng, lazuli::DType::F64, 12, -1.0, 1.0)).collect();
    let mut w = Array2::from_shape_vec((3, 2), values(&mut rng, lazuli::DType::F64, 6, -1.0, 1.0)).unwrap();
    for x in xs {
        let x = Array2::from_shape_vec((4, 3), x).unwrap();
        let t = x.dot(&w).mapv(f64::tanh);
        let dz = t.mapv(|t| 2.0 * t * (1.0 - t * t));
        w = &w - &(x.t().dot(&dz) * 0.1);
    }
    w.iter().copied().collect()
}

fn check(what: &str, got: &[f64], want: &[f64]) {
    let err = common::rel_err(got, want, 1.0);
    assert!(err < 1e-12, "{what}: relative error {err:e}\n got {got:?}\nwant {want:?}");
}

#[test]
fn the_launcher_and_the_calling_thread_compute_the_same_steps() {
    if common::child::alone(module_path!(), "the_launcher_and_the_calling_thread_compute_the_same_steps") {
        return; // the counters are process-wide: alone in a process of its own
    }
    // The CI machines have two cores or more; `LAZULI_CPU_LAUNCHER` may change the mode, and other backends
    // queue programs in their plugin instead.
    let mode = std::env::var("LAZULI_CPU_LAUNCHER").unwrap_or_default();
    let cpu = lazuli::runtime_info().unwrap().platform == "cpu";
    let queues = cpu
        && match mode.as_str() {
            "0" | "off" => false,
            "always" => true,
            _ => std::thread::available_parallelism().is_ok_and(|n| n.get() >= 2),
        };
    let steps = 12;

    // A loop that never reads: every step after the first is queued.
    let (got, queued) = train(1, steps, Reads::Never);
    check("queued steps", &got, &train_reference(1, steps));
    assert_eq!(queued, if queues { steps as u64 - 1 } else { 0 }, "steps queued on the launcher (mode {mode:?})");

    // A loop that reads every step's loss: the steps run on the calling thread (unless the mode says always).
    let (got, queued) = train(2, steps, Reads::Every(1));
    check("steps read every time", &got, &train_reference(2, steps));
    let want = if queues && mode == "always" { steps as u64 - 1 } else { 0 };
    assert_eq!(queued, want, "steps queued while every loss is read (mode {mode:?})");

    // Reading every fourth loss: the step after each read runs here, the others are queued.
    let (got, queued) = train(3, steps, Reads::Every(4));
    check("steps read now and then", &got, &train_reference(3, steps));
    let want = match (queues, mode.as_str()) {
        (false, _) => 0,
        (true, "always") => steps as u64 - 1,
        // Reads after steps 0, 4 and 8: steps 1, 5 and 9 run here.
        (true, _) => steps as u64 - 1 - 3,
    };
    assert_eq!(queued, want, "steps queued while every fourth loss is read (mode {mode:?})");

    // Reading the previous step's loss every step: that program is done or nearly, and the loop records the
    // next step meanwhile; every step after the first is queued.
    let (got, queued) = train(4, steps, Reads::Previous);
    check("steps reading the previous loss", &got, &train_reference(4, steps));
    let want = if queues { steps as u64 - 1 } else { 0 };
    assert_eq!(queued, want, "steps queued while the previous loss is read (mode {mode:?})");

    // Large values (2 MiB each, handed back to the launcher one by one when dropped) made, used and dropped
    // while programs are queued; each step's result depends on the previous one's.
    let n = 512 * 1024;
    let mut acc = Tensor::from_slice(&vec![0.0f32; n], &[n]);
    for k in 1..=6 {
        let big = Tensor::from_slice(&vec![k as f32; n], &[n]);
        acc = &acc + &(&big * 0.5);
        lazuli::sync().unwrap();
        drop(big);
    }
    let total: f32 = (1..=6).map(|k| k as f32 * 0.5).sum();
    let got = acc.to_vec::<f32>().unwrap();
    assert!(got.iter().all(|&v| v == total), "large values: {} instead of {total}", got[0]);
}
