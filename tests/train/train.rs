//! Training steps: optimizer math against a host reference, one program per step after the first, and
//! in-place updates (donated buffers). Tests that read the process-wide counters run alone in a child process
//! (the other tests of the binary would add to them), and take turns on `SERIAL`.

use crate::common;

use std::sync::Mutex;

use common::{array, values, Rng};
use lazuli::nn::{Activation, HostRng, Linear, Mlp};
use lazuli::{AdamW, Config, DType, Module, Optimizer, Sgd, SplitUpdate, Tensor};
use ndarray::{Array1, Array2, Axis};

static SERIAL: Mutex<()> = Mutex::new(());

/// Linear regression `y = x W + b`, loss = mean((y - t)²), data fixed.
struct Problem {
    x: Array2<f64>,
    t: Array2<f64>,
    w: Array2<f64>,
    b: Array1<f64>,
}

fn problem() -> Problem {
    let mut rng = Rng::new(42);
    let m = |r: usize, c: usize, rng: &mut Rng| {
        array(values(rng, DType::F64, r * c, -1.0, 1.0), &[r, c]).into_dimensionality().unwrap()
    };
    let x = m(8, 3, &mut rng);
    let t = m(8, 2, &mut rng);
    let w = m(3, 2, &mut rng);
    let b = array(values(&mut rng, DType::F64, 2, -1.0, 1.0), &[2]).into_dimensionality().unwrap();
    Problem { x, t, w, b }
}

/// Hand-derived gradients of the regression loss.
fn grads(p: &Problem, w: &Array2<f64>, b: &Array1<f64>) -> (Array2<f64>, Array1<f64>) {
    let y = p.x.dot(w) + b;
    let d = (&y - &p.t) * (2.0 / y.len() as f64);
    (p.x.t().dot(&d), d.sum_axis(Axis(0)))
}

fn run_lazuli(
    p: &Problem,
    make: impl Fn(Vec<(String, lazuli::Param)>) -> Box<dyn Optimizer>,
    steps: usize,
) -> Vec<f64> {
    let layer = Linear::from_tensors(Tensor::from_ndarray(&p.w), Some(Tensor::from_ndarray(&p.b)));
    let mut opt = make(layer.named_params());
    let (x, t) = (Tensor::from_ndarray(&p.x), Tensor::from_ndarray(&p.t));
    for _ in 0..steps {
        let loss = (layer.forward(&x) - &t).pow(2.0).mean_all();
        loss.backward();
        opt.step();
        opt.zero_grad();
        lazuli::sync().unwrap();
    }
    let mut out = layer.weight.get().to_vec::<f64>().unwrap();
    out.extend(layer.bias.as_ref().unwrap().get().to_vec::<f64>().unwrap());
    out
}

fn assert_same(what: &str, got: &[f64], w: &Array2<f64>, b: &Array1<f64>) {
    let want: Vec<f64> = w.iter().chain(b.iter()).copied().collect();
    for (i, (g, e)) in got.iter().zip(&want).enumerate() {
        assert!((g - e).abs() < 1e-12 * (1.0 + e.abs()), "{what}: element {i}: {g} vs {e}");
    }
}

#[test]
fn sgd_with_momentum_and_weight_decay_matches_the_host_reference() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let p = problem();
    let (lr, mu, wd) = (0.1, 0.9, 0.01);
    let built = run_lazuli(&p, |params| Box::new(Sgd::new(params, lr).momentum(mu).weight_decay(wd)), 5);
    // Momentum set through the field, not the builder: its buffers start at the first step.
    let set = run_lazuli(
        &p,
        |params| {
            let mut sgd = Sgd::new(params, lr).weight_decay(wd);
            sgd.momentum = mu;
            Box::new(sgd)
        },
        5,
    );
    let (mut w, mut b) = (p.w.clone(), p.b.clone());
    let (mut bw, mut bb) = (Array2::zeros(w.raw_dim()), Array1::zeros(b.raw_dim()));
    for _ in 0..5 {
        let (gw, gb) = grads(&p, &w, &b);
        bw = bw * mu + gw + &w * wd;
        bb = bb * mu + gb + &b * wd;
        w = &w - &bw * lr;
        b = &b - &bb * lr;
    }
    assert_same("sgd", &built, &w, &b);
    assert_same("sgd, momentum set through the field", &set, &w, &b);
    // Saved before its first step, such an optimizer has the buffers that step would start from.
    let layer = Linear::from_tensors(Tensor::ones(&[2, 2], DType::F64), None);
    let mut sgd = Sgd::new(layer.named_params(), lr);
    sgd.momentum = mu;
    let state = sgd.state();
    assert_eq!(state.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(), ["weight.momentum_buffer"]);
    assert_eq!(state[0].1.to_vec::<f64>().unwrap(), [0.0; 4]);
}

/// A learning rate, decay or eps out of range is a programmer error that would make every weight NaN (a beta of 1
/// divides by a zero bias correction) or move it the wrong way: a panic at the line that set it or that steps.
#[test]
fn hyperparameters_out_of_range_panic_at_the_callers_line() {
    let layer = Linear::from_tensors(Tensor::ones(&[2, 2], DType::F32), None);
    let line = |l: u32| format!("tests/train/train.rs:{l}:");
    let (l, msg) = (line!(), common::panic_message(|| drop(AdamW::new(layer.named_params(), -1e-3))));
    assert!(
        msg.contains("AdamW: lr is -0.001, but it must be finite and at least 0") && msg.contains(&line(l)),
        "{msg}"
    );
    let adamw = || AdamW::new(layer.named_params(), 1e-3);
    let (l, msg) = (line!(), common::panic_message(|| drop(adamw().betas(1.0, 0.999))));
    assert!(msg.contains("AdamW: beta1 is 1, but it must be in [0, 1)") && msg.contains(&line(l)), "{msg}");
    let (l, msg) = (line!(), common::panic_message(|| drop(adamw().eps(f64::NAN))));
    assert!(msg.contains("AdamW: eps is NaN") && msg.contains(&line(l)), "{msg}");
    let (l, msg) = (line!(), common::panic_message(|| drop(Sgd::new(layer.named_params(), 0.1).momentum(-0.5))));
    assert!(msg.contains("SGD: momentum is -0.5") && msg.contains(&line(l)), "{msg}");
    // Set later (a schedule gone wrong): the step that would use it says so.
    let mut opt = adamw();
    opt.set_lr(f64::INFINITY);
    let (l, msg) = (line!(), common::panic_message(|| opt.step()));
    assert!(msg.contains("AdamW: lr is inf") && msg.contains(&line(l)), "{msg}");
    let mut sgd = Sgd::new(layer.named_params(), 0.1);
    sgd.weight_decay = -1.0;
    let (l, msg) = (line!(), common::panic_message(|| sgd.step()));
    assert!(msg.contains("SGD: weight_decay is -1") && msg.contains(&line(l)), "{msg}");
}

/// AdamW on the regression problem, `steps` steps, on the host in f64.
fn adamw_reference(p: &Problem, (lr, b1, b2, eps, wd): (f64, f64, f64, f64, f64), steps: i32) -> Vec<f64> {
    let (mut w, mut b) = (p.w.clone(), p.b.clone());
    let (mut mw, mut vw) = (Array2::<f64>::zeros(w.raw_dim()), Array2::<f64>::zeros(w.raw_dim()));
    let (mut mb, mut vb) = (Array1::<f64>::zeros(b.raw_dim()), Array1::<f64>::zeros(b.raw_dim()));
    for t in 1..=steps {
        let (gw, gb) = grads(p, &w, &b);
        let (c1, c2) = (1.0 - f64::powi(b1, t), 1.0 - f64::powi(b2, t));
        mw = mw * b1 + &gw * (1.0 - b1);
        vw = vw * b2 + &gw * &gw * (1.0 - b2);
        mb = mb * b1 + &gb * (1.0 - b1);
        vb = vb * b2 + &gb * &gb * (1.0 - b2);
        w = &w * (1.0 - lr * wd) - (&mw / c1) / ((&vw / c2).mapv(f64::sqrt) + eps) * lr;
        b = &b * (1.0 - lr * wd) - (&mb / c1) / ((&vb / c2).mapv(f64::sqrt) + eps) * lr;
    }
    w.iter().chain(b.iter()).copied().collect()
}

#[test]
fn adamw_matches_the_host_reference() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let p = problem();
    let (lr, b1, b2, eps, wd) = (0.05, 0.9, 0.99, 1e-8, 0.1);
    let got = run_lazuli(&p, |params| Box::new(AdamW::new(params, lr).betas(b1, b2).eps(eps).weight_decay(wd)), 6);
    let want = adamw_reference(&p, (lr, b1, b2, eps, wd), 6);
    // AdamW's update is a ratio of small numbers: allow a few ulps of reassociation.
    for (i, (g, e)) in got.iter().zip(&want).enumerate() {
        assert!((g - e).abs() < 1e-10, "adamw: element {i}: {g} vs {e}");
    }
}

/// `LAZULI_SPLIT_UPDATE=on` (the default on NVIDIA GPUs): `step()` launches the gradients, the update is the step
/// boundary's program. Strict mode (one program per step, no compile after step 2) lets it through, the report
/// finds no break, the update still donates, and the result is the host's.
#[test]
fn a_step_split_before_its_update_matches_the_host_reference_in_two_programs_without_a_break() {
    let name = "a_step_split_before_its_update_matches_the_host_reference_in_two_programs_without_a_break";
    if common::child::alone(module_path!(), name) {
        return; // the runtime's configuration, the counters and captured events are process-wide
    }
    lazuli::init(Config { split_update: SplitUpdate::On, ..Config::from_env().unwrap() }).unwrap();
    let _strict = lazuli::diagnostics::strict_scope(lazuli::diagnostics::Budget::training());
    lazuli::diagnostics::events::start_capture();
    let p = problem();
    let hyper = (0.05, 0.9, 0.99, 1e-8, 0.1);
    let (lr, b1, b2, eps, wd) = hyper;
    let before = lazuli::metrics();
    let got = run_lazuli(&p, |params| Box::new(AdamW::new(params, lr).betas(b1, b2).eps(eps).weight_decay(wd)), 6);
    let d = lazuli::metrics() - before;
    let events = lazuli::diagnostics::events::take_captured();
    let programs: Vec<_> = events.iter().filter(|e| e.kind == lazuli::diagnostics::EventKind::Program).collect();
    let causes: Vec<&str> = programs.iter().map(|e| e.cause.as_str()).collect();
    assert_eq!(causes, ["gradients", "sync"].repeat(6), "{d}");
    let report = lazuli::diagnostics::report::analyse(&events);
    assert_eq!(report.steps_with_breaks, 0, "{report:?}");
    // From step 1 on, each update replaces the weight, the bias and both of their moments in place.
    let param_bytes = 8 * (p.w.len() + p.b.len()) as u64;
    assert!(d.bytes_donated >= 5 * 3 * param_bytes, "{d}");
    for (i, (g, e)) in got.iter().zip(&adamw_reference(&p, hyper, 6)).enumerate() {
        assert!((g - e).abs() < 1e-10, "split adamw: element {i}: {g} vs {e}");
    }
}

/// Gradients that only slice one pending value (two parameters joined by a concatenation: their gradients are
/// slices of its cotangent) leave the gradients' program as that value, one output instead of one per slice; the
/// update slices it, and the step is SGD's on the host. A lone view (the loss, a reshape of its value) is computed
/// as itself, so that reading it after `step()` runs nothing.
#[test]
fn gradients_that_slice_one_pending_value_leave_the_first_program_as_that_value() {
    let name = "gradients_that_slice_one_pending_value_leave_the_first_program_as_that_value";
    if common::child::alone(module_path!(), name) {
        return; // the runtime's configuration and captured events are process-wide
    }
    lazuli::init(Config { split_update: SplitUpdate::On, ..Config::from_env().unwrap() }).unwrap();
    let (a0, b0, x) = ([0.5, -1.0, 2.0], [1.5, 0.25], [1.0, 2.0, -1.0, 0.5, 3.0]);
    let (a, b) =
        (lazuli::nn::Param::new(Tensor::from_slice(&a0, &[3])), lazuli::nn::Param::new(Tensor::from_slice(&b0, &[2])));
    let mut opt = Sgd::new(vec![("a".into(), a.clone()), ("b".into(), b.clone())], 0.1);
    lazuli::diagnostics::events::start_capture();
    let joined = Tensor::concat(&[&a.get(), &b.get()], 0);
    // loss = (Σ x·w)², so dloss/dw = 2 (Σ x·w) x.
    let loss = (joined * Tensor::from_slice(&x, &[5])).sum_all().pow(2.0).reshape(&[1]);
    loss.backward();
    opt.step();
    assert!(!loss.is_pending(), "the loss was computed by the gradients' program");
    opt.zero_grad();
    lazuli::sync().unwrap();
    let events = lazuli::diagnostics::events::take_captured();
    let programs: Vec<_> = events.iter().filter(|e| e.kind == lazuli::diagnostics::EventKind::Program).collect();
    let shape: Vec<(&str, usize)> = programs.iter().map(|e| (e.cause.as_str(), e.outputs)).collect();
    // The loss and the cotangent of the concatenation; then the two parameters.
    assert_eq!(shape, [("gradients", 2), ("sync", 2)]);
    let w: Vec<f64> = a0.iter().chain(&b0).copied().collect();
    let dot: f64 = w.iter().zip(&x).map(|(w, x)| w * x).sum();
    let want: Vec<f64> = w.iter().zip(&x).map(|(w, x)| w - 0.1 * 2.0 * dot * x).collect();
    let mut got = a.get().to_vec::<f64>().unwrap();
    got.extend(b.get().to_vec::<f64>().unwrap());
    for (i, (g, e)) in got.iter().zip(&want).enumerate() {
        assert!((g - e).abs() < 1e-12, "element {i}: {g} vs {e}");
    }
    assert!((loss.to_vec::<f64>().unwrap()[0] - dot * dot).abs() < 1e-12);
}

/// `step()` returns nothing: an error of the gradients' program it launches (here strict mode refusing the
/// compile) is returned by the thread's next materialization, naming `step()`'s line, and loses nothing.
#[test]
fn an_error_of_the_gradients_launched_by_step_is_returned_by_the_next_sync_at_steps_line() {
    let name = "an_error_of_the_gradients_launched_by_step_is_returned_by_the_next_sync_at_steps_line";
    if common::child::alone(module_path!(), name) {
        return; // the runtime's configuration and strict mode are process-wide
    }
    lazuli::init(Config { split_update: SplitUpdate::On, ..Config::from_env().unwrap() }).unwrap();
    let p = problem();
    let layer = Linear::from_tensors(Tensor::from_ndarray(&p.w), Some(Tensor::from_ndarray(&p.b)));
    let mut opt = Sgd::new(layer.named_params(), 0.1);
    let (x, t) = (Tensor::from_ndarray(&p.x), Tensor::from_ndarray(&p.t));
    let strict =
        lazuli::diagnostics::strict_scope(lazuli::diagnostics::Budget { programs_per_step: 1, compile_until_step: 0 });
    (layer.forward(&x) - &t).pow(2.0).mean_all().backward();
    let line = line!() + 1;
    opt.step();
    let err = lazuli::sync().unwrap_err().to_string();
    assert!(err.contains(&format!("recompile at {}:{line}", file!())), "{err}");
    drop(strict);
    lazuli::sync().unwrap();
    let (gw, gb) = grads(&p, &p.w, &p.b);
    let mut got = layer.weight.get().to_vec::<f64>().unwrap();
    got.extend(layer.bias.as_ref().unwrap().get().to_vec::<f64>().unwrap());
    assert_same("sgd after the error", &got, &(&p.w - &gw * 0.1), &(&p.b - &gb * 0.1));
}

#[test]
fn each_step_after_the_first_is_one_cached_program_updating_in_place() {
    if common::child::alone(module_path!(), "each_step_after_the_first_is_one_cached_program_updating_in_place") {
        return; // the counters and captured events are process-wide: alone in a process of its own
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut rng = HostRng::new(7);
    let model = Mlp::new(&mut rng, &[4, 16, 16, 3], Activation::Tanh, DType::F32);
    let mut opt = AdamW::new(model.named_params(), 1e-2);
    let param_bytes: u64 = model.params().iter().map(|p| p.get().tensor_type().byte_size() as u64).sum();
    // A fixed batch: three Gaussian blobs.
    let n = 48;
    let (mut xs, mut ys) = (Vec::new(), Vec::new());
    for i in 0..n {
        let c = i % 3;
        for d in 0..4 {
            xs.push(if d == c { 2.0f32 } else { 0.0 } + rng.normal() as f32 * 0.3);
        }
        ys.push(c);
    }
    let x = Tensor::from_slice(&xs, &[n, 4]);
    let onehot: Vec<f32> = ys.iter().flat_map(|&c| (0..3).map(move |k| (k == c) as u8 as f32)).collect();
    let target = Tensor::from_slice(&onehot, &[n, 3]);
    let mut losses = Vec::new();
    for step in 0..30 {
        let before = lazuli::metrics();
        let logits = model.forward(&x);
        // Softmax cross-entropy written out: logsumexp(logits) - <target, logits>.
        let m = logits.max_keepdim(&[1]);
        let lse = (&logits - &m).exp().sum(&[1]).log() + m.reshape(&[-1]);
        let loss = (lse - (&logits * &target).sum(&[1])).mean_all();
        loss.backward();
        opt.step();
        opt.zero_grad();
        lazuli::sync().unwrap();
        losses.push(loss.item::<f32>().unwrap());
        let d = lazuli::metrics() - before;
        if step >= 1 {
            assert_eq!((d.compiles, d.executions), (0, 1), "step {step}: one cached program ({d})");
            // Parameters and both Adam moments are donated to their new values.
            assert!(
                d.bytes_donated >= 3 * param_bytes,
                "step {step}: {} donated < {}",
                d.bytes_donated,
                3 * param_bytes
            );
        }
    }
    assert!(losses[29] < 0.2 * losses[0], "loss falls: {losses:?}");
    // The step's program outputs the loss, the new parameters, both moments and AdamW's count of steps applied
    // (its bias corrections are computed from it in the program): no stale gradients (they move with their
    // parameter and `zero_grad()` clears them).
    lazuli::diagnostics::events::start_capture();
    let loss = {
        let logits = model.forward(&x);
        let m = logits.max_keepdim(&[1]);
        let lse = (&logits - &m).exp().sum(&[1]).log() + m.reshape(&[-1]);
        (lse - (&logits * &target).sum(&[1])).mean_all()
    };
    loss.backward();
    opt.step();
    opt.zero_grad();
    lazuli::sync().unwrap();
    let ev = lazuli::diagnostics::events::take_captured();
    let program = ev.iter().find(|e| e.cause == "sync" && e.kind == lazuli::diagnostics::EventKind::Program).unwrap();
    assert_eq!(program.outputs, 2 + 3 * model.params().len(), "{program:?}");
}

#[test]
fn donation_never_consumes_a_buffer_that_is_still_needed() {
    if common::child::alone(module_path!(), "donation_never_consumes_a_buffer_that_is_still_needed") {
        return; // the counters are process-wide: alone in a process of its own
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // The leaf behind `y` has no handle, but `y` (pending, held) still needs it after `a` is read.
    let y = Tensor::from_slice(&[1.0f32, 2.0, 3.0], &[3]) * 2.0;
    let a = &y + 1.0;
    let b = &y + 2.0;
    assert_eq!(a.to_vec::<f32>().unwrap(), vec![3.0, 5.0, 7.0]);
    assert_eq!(b.to_vec::<f32>().unwrap(), vec![4.0, 6.0, 8.0]);
    assert_eq!(y.to_vec::<f32>().unwrap(), vec![2.0, 4.0, 6.0]);

    // A value rebound every iteration dies with its step: its buffer is reused for the new value.
    let before = lazuli::metrics();
    let mut x = Tensor::from_slice(&[1.0f32; 256], &[256]);
    x.materialize().unwrap();
    for _ in 0..4 {
        x = &x * 2.0 + 1.0;
        lazuli::sync().unwrap();
    }
    let d = lazuli::metrics() - before;
    assert!(d.bytes_donated >= 4 * 1024, "the old x is donated each step: {d}");
    assert!(x.to_vec::<f32>().unwrap().iter().all(|&v| v == 31.0));

    // A clone the user still holds is never donated.
    let keep = Tensor::from_slice(&[5.0f32; 4], &[4]);
    let kept = keep.clone();
    let next = &keep * 3.0;
    drop(keep);
    lazuli::sync().unwrap();
    assert_eq!(next.to_vec::<f32>().unwrap(), vec![15.0; 4]);
    assert_eq!(kept.to_vec::<f32>().unwrap(), vec![5.0; 4]);
}

/// An optimizer's update is recorded at the training loop's `step()` line, for every optimizer, also behind `dyn`.
#[test]
fn updates_are_recorded_at_the_callers_step_line() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let lin = Linear::new(&mut HostRng::new(3), 2, 2, true, DType::F32);
    let x = Tensor::from_slice(&[1.0f32, -2.0, 0.5, 3.0], &[2, 2]);
    let mut opts: Vec<Box<dyn Optimizer>> =
        vec![Box::new(Sgd::new(lin.named_params(), 0.1)), Box::new(AdamW::new(lin.named_params(), 0.1))];
    for opt in &mut opts {
        lin.forward(&x).sum_all().backward();
        let line = line!() + 1;
        opt.step();
        let at = lin.weight.get().location();
        assert_eq!((at.file, at.line), ("tests/train/train.rs", line), "recorded at {at}");
        opt.zero_grad();
    }
}

/// Batches uploaded step after step (their buffers reused once dropped) carry each step's values, also when a
/// tensor of the batch's shape is a parameter whose buffer is donated to its update every step.
#[test]
fn each_steps_batch_holds_its_own_values() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut w = Tensor::from_slice(&[0.5f32; 6], &[2, 3]);
    let mut w_ref = [0.5f64; 6];
    for step in 0..6 {
        let vals: Vec<f32> = (0..6).map(|k| (step * 10 + k) as f32).collect();
        let x = Tensor::from_slice(&vals, &[2, 3]);
        let kept = Tensor::from_slice(&[step as f32; 6], &[2, 3]);
        let total = (&x * &w).sum_all();
        w = &w - &x * 0.01;
        lazuli::sync().unwrap();
        let want: f64 = vals.iter().zip(&w_ref).map(|(&v, &wr)| v as f64 * wr).sum();
        assert!((total.item::<f32>().unwrap() as f64 - want).abs() < 1e-3 * want.abs(), "step {step}");
        for (wr, &v) in w_ref.iter_mut().zip(&vals) {
            *wr -= v as f64 * 0.01;
        }
        let got = w.to_vec::<f32>().unwrap();
        assert!(got.iter().zip(&w_ref).all(|(&g, &r)| (g as f64 - r).abs() < 1e-4), "step {step}: {got:?}");
        assert_eq!(kept.to_vec::<f32>().unwrap(), vec![step as f32; 6], "step {step}");
    }
}

/// `clip_grad_norm` against the host: the returned norm is the L2 norm of all gradients together, each gradient is
/// scaled by `min(1, max_norm / (norm + 1e-6))`, and nothing is read before the caller reads (all pending). One
/// f64 problem (hand-derived gradients) and one mixed-precision model (gradients read back before clipping).
#[test]
fn clip_grad_norm_matches_the_host_and_stays_on_the_device() {
    let p = problem();
    let (gw, gb) = grads(&p, &p.w, &p.b);
    let norm = gw.iter().chain(gb.iter()).map(|g| g * g).sum::<f64>().sqrt();
    for max_norm in [0.1 * norm, norm * 10.0, 0.0] {
        let layer = Linear::from_tensors(Tensor::from_ndarray(&p.w), Some(Tensor::from_ndarray(&p.b)));
        let (x, t) = (Tensor::from_ndarray(&p.x), Tensor::from_ndarray(&p.t));
        (layer.forward(&x) - &t).pow(2.0).mean_all().backward();
        let total = lazuli::optim::clip_grad_norm(&layer.params(), max_norm);
        assert!(total.is_pending(), "the norm is a tensor of the step, not a host number");
        assert!(layer.weight.grad().unwrap().is_pending(), "the scaled gradient is pending");
        assert_eq!(total.dtype(), DType::F64);
        let got = total.item::<f64>().unwrap();
        assert!((got - norm).abs() < 1e-12 * norm, "norm {got} vs {norm}");
        let coef = (max_norm / (norm + 1e-6)).min(1.0);
        let w = layer.weight.grad().unwrap().to_vec::<f64>().unwrap();
        let b = layer.bias.as_ref().unwrap().grad().unwrap().to_vec::<f64>().unwrap();
        assert_same(&format!("clipped to {max_norm}"), &[w, b].concat(), &(&gw * coef), &(&gb * coef));
    }

    // f32 and bf16 gradients: the norm is accumulated in f32 and each gradient keeps its dtype.
    let a = Linear::new(&mut HostRng::new(5), 4, 3, true, DType::F32);
    let b = Linear::new(&mut HostRng::new(6), 3, 2, false, DType::BF16);
    let x = Tensor::from_slice(&[0.5f32, -1.0, 2.0, 0.25, 1.5, -0.5, 0.75, 1.0], &[2, 4]);
    let h = a.forward(&x).to_dtype(DType::BF16);
    b.forward(&h).to_dtype(DType::F32).pow(2.0).sum_all().backward();
    let params: Vec<lazuli::Param> = a.params().into_iter().chain(b.params()).collect();
    let before: Vec<Vec<f64>> = params.iter().map(|p| p.grad().unwrap().to_f64_vec().unwrap()).collect();
    let norm = before.iter().flatten().map(|g| g * g).sum::<f64>().sqrt();
    let total = lazuli::optim::clip_grad_norm(&params, 0.5);
    assert_eq!(total.dtype(), DType::F32);
    let got = total.item::<f32>().unwrap() as f64;
    assert!((got - norm).abs() < 1e-5 * norm, "norm {got} vs {norm}");
    let coef = (0.5 / (norm + 1e-6)).min(1.0);
    assert!(coef < 1.0, "this case clips");
    for (p, g0) in params.iter().zip(&before) {
        let g = p.grad().unwrap();
        let dt = g.dtype();
        let tol = if dt == DType::BF16 { 1e-2 } else { 1e-5 };
        for (x, y) in g.to_f64_vec().unwrap().iter().zip(g0) {
            assert!((x - y * coef).abs() <= tol * (1e-3 + (y * coef).abs()), "{dt}: {x} vs {}", y * coef);
        }
    }
    // Nothing to clip: 0.
    let none = Linear::new(&mut HostRng::new(7), 2, 2, true, DType::F32);
    assert_eq!(lazuli::optim::clip_grad_norm(&none.params(), 1.0).item::<f32>().unwrap(), 0.0);
}

#[test]
fn clip_grad_norm_refuses_a_negative_max_norm_at_the_callers_line() {
    let params = Linear::new(&mut HostRng::new(8), 2, 2, true, DType::F32).params();
    let params = std::panic::AssertUnwindSafe(&params);
    let line = line!() + 1;
    let err = std::panic::catch_unwind(|| lazuli::optim::clip_grad_norm(&params, -1.0)).expect_err("panics");
    let msg = err.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(msg.contains("max_norm") && msg.contains(&format!("tests/train/train.rs:{line}:")), "{msg}");
}
