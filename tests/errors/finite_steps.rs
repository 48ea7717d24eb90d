//! Training loops under `stop`, with one program a step and with the split step (`LAZULI_SPLIT_UPDATE=on`, forced
//! here: the CPU does not split by default). Split, the gradients' program counts the loss and the gradients
//! and hands its trip on in the sticky flag; the update's program guards the state by that flag without counting
//! the gradients again. Either way a trip is located at its line and the state stays as it was before the bad
//! step; split, the check is read by the update of the step after it (or by a read of the bad step's loss), one
//! step sooner than with one program a step.

use lazuli::nn::{Activation, HostRng, Mlp};
use lazuli::{AdamW, CheckFinite, Config, DType, LocateAhead, Module, Optimizer, Param, SplitUpdate, Tensor};

use super::finite::{init as init_one_program, located, state_bits, step_until_compiled_ahead};
use crate::common::child;

/// The runtime of this child process: `stop`, the step split, and the locator ahead where asked.
fn init(locate_ahead: bool) {
    let config = Config {
        check_finite: CheckFinite::Stop,
        split_update: SplitUpdate::On,
        locate_ahead: if locate_ahead { LocateAhead::On } else { LocateAhead::Off },
        ..Config::from_env().unwrap()
    };
    lazuli::init(config).unwrap();
}

/// A loop that reads its loss every step: the read of the bad step's loss (a result of its gradients' program)
/// is the trip, after the bad step's update ran under the flag and kept the state.
#[test]
fn a_read_of_the_bad_steps_loss_is_the_trip_when_split() {
    if child::alone(module_path!(), "a_read_of_the_bad_steps_loss_is_the_trip_when_split") {
        return; // the runtime's configuration is process-wide
    }
    init(false);
    // The bad step's two programs ran.
    the_bad_steps_read_is_the_trip(2, "hold their values from before the step, as the 1 program(s) launched");
}

/// A loop that does not read: the bad step's check is read when the next program after its update is launched
/// (here an evaluation, whose `sync()` returns the error); the state is bit for bit the state before the bad step,
/// the state was still donated, and the run goes on from there as a run that never took the bad step.
#[test]
fn stop_keeps_the_state_from_before_the_bad_step_when_split() {
    if child::alone(module_path!(), "stop_keeps_the_state_from_before_the_bad_step_when_split") {
        return; // the runtime's configuration and the counters are process-wide
    }
    init(false);
    // The evaluation's `sync()` reads the bad step's check: the bad step's update and the evaluation ran after it.
    the_state_is_kept_from_before_the_bad_step(true);
}

/// A non-finite state that an update made from finite values enters the next step's gradients' program as an
/// input: that program trips and names the input with the update's line.
#[test]
fn an_optimizer_update_is_named_at_the_next_step_when_split() {
    if child::alone(module_path!(), "an_optimizer_update_is_named_at_the_next_step_when_split") {
        return; // the runtime's configuration is process-wide
    }
    init(false);
    an_update_that_makes_nan_is_named_at_the_next_step();
}

/// A trip in the split step's update (AdamW's step size, `lr / (1 − β₁)`, overflows f64 at `lr = f64::MAX`): the
/// update keeps no gradients for its locator (the weight's bf16 copy's gradient is donated to the new copy, as
/// without the check), so the gradients' program runs again on its kept inputs and feeds the update's locator,
/// which names the division at the optimizer's line; the weight keeps its value.
#[test]
fn a_trip_in_the_update_is_located_from_gradients_made_again_when_split() {
    if child::alone(module_path!(), "a_trip_in_the_update_is_located_from_gradients_made_again_when_split") {
        return; // the runtime's configuration is process-wide
    }
    init(false);
    let w = Param::new(Tensor::from_slice(&[1.0f32, -2.0, 3.0], &[3]));
    let mut opt = AdamW::new(vec![("w".into(), w.clone())], f64::MAX).weight_decay(0.0);
    let copy = w.get_as(DType::BF16).to_dtype(DType::F32);
    let loss = (&copy * &copy).sum_all();
    loss.backward();
    let before = lazuli::metrics();
    let line = line!() + 1;
    opt.step();
    lazuli::sync().unwrap();
    // The weight and its two moments (12 bytes each) to their new values, and the copy's bf16 gradient (6 bytes),
    // which the update no longer keeps, to the new copy.
    assert_eq!((lazuli::metrics() - before).bytes_donated, 3 * 12 + 6);
    let e = lazuli::wait().unwrap_err();
    let (op, at, report) = located(&e);
    assert_eq!((op, at.file, at.line), ("div", file!(), line), "{report}");
    assert!(report.contains("f64[]") && report.contains("1 of 1 non-finite"), "{report}");
    assert_eq!((lazuli::metrics() - before).gradients_remade, 1, "{report}");
    // The gradients' program ran again on the new copy, which the guard wrote from the kept weight.
    assert_eq!((lazuli::metrics() - before).copies_followed, 1, "{report}");
    assert_eq!(w.get().to_vec::<f32>().unwrap(), [1.0, -2.0, 3.0]);
}

/// `LAZULI_LOCATE_AHEAD` with the split step: the gradients' program, which updates no state itself, has its
/// locating program compiled ahead too, and the trip runs it without a compile.
#[test]
fn a_locator_compiled_ahead_locates_a_split_step_without_a_compile() {
    if child::alone(module_path!(), "a_locator_compiled_ahead_locates_a_split_step_without_a_compile") {
        return; // the runtime's configuration is process-wide
    }
    init(true);
    // The gradients' and the update's programs; the bad step's check is read by the next step's update.
    a_locator_ahead_trip(2, 1);
}

/// A weight read through a bf16 copy: the split step's update makes the new copy from the new weight, and the old
/// copy is no input of that program, so the copy has no old value of its own to keep. On a trip it is made from
/// the kept weight instead: after the error both hold their values from before the bad step. So the gradients'
/// check, which kept the old copy, follows it to the new one when the update is launched (once a step), and the
/// bad step is still located from the values it read.
#[test]
fn a_weights_bf16_copy_is_kept_with_the_weight_when_split() {
    if child::alone(module_path!(), "a_weights_bf16_copy_is_kept_with_the_weight_when_split") {
        return; // the runtime's configuration is process-wide
    }
    init(false);
    let w = Param::new(Tensor::from_slice(&[0.5f32, -1.0, 2.0], &[3]));
    let mut opt = AdamW::new(vec![("w".into(), w.clone())], 0.1);
    let x = Tensor::from_slice(&[1.0f32, 2.0, 3.0], &[3]);
    // `scale` 0 makes the loss log(0) = -inf and the gradient NaN.
    let mut step = |scale: f32| {
        let y = (&w.get_as(DType::BF16).to_dtype(DType::F32) * &x).sum_all();
        let loss = (y.pow(2.0) * Tensor::scalar(scale)).log();
        loss.backward();
        opt.step();
        opt.zero_grad();
        lazuli::sync()
    };
    let start = lazuli::metrics();
    for _ in 0..3 {
        step(1.0).unwrap();
    }
    lazuli::wait().unwrap();
    assert_eq!((lazuli::metrics() - start).copies_followed, 3);
    let read = |w: &Param| {
        let copy = w.get_as(DType::BF16).to_dtype(DType::F32).to_vec::<f32>().unwrap();
        (w.get().to_vec::<f32>().unwrap(), copy)
    };
    let before = read(&w);
    assert!(before.0.iter().chain(&before.1).all(|v| v.is_finite()), "{before:?}");
    let bad = lazuli::metrics();
    step(0.0).unwrap();
    let e = lazuli::wait().unwrap_err();
    let (op, _, report) = located(&e);
    assert_eq!(op, "log", "{report}");
    assert_eq!((lazuli::metrics() - bad).copies_followed, 1, "{report}");
    assert_eq!(read(&w), before, "{report}");
}

/// An MLP trained with AdamW on two points, its loss `log(mse · scale)`: `scale`, a host scalar, 0 at a bad step
/// makes the planted `log` -inf and every gradient NaN.
struct PlantedLog {
    model: Mlp,
    opt: AdamW,
    x: Tensor,
    target: Tensor,
    /// The planted `log`'s line.
    line: u32,
}

impl PlantedLog {
    fn new(seed: u64) -> PlantedLog {
        let model = Mlp::new(&mut HostRng::new(seed), &[3, 8, 1], Activation::Tanh, DType::F32);
        let opt = AdamW::new(model.named_params(), 1e-2);
        let x = Tensor::from_slice(&[0.5f32, -1.0, 0.25, 1.0, 0.0, -0.5], &[2, 3]);
        let target = Tensor::from_slice(&[1.0f32, -1.0], &[2, 1]);
        PlantedLog { model, opt, x, target, line: 0 }
    }

    /// Records a training step and ends it with `sync()`; its loss.
    fn step(&mut self, scale: f32) -> lazuli::Result<Tensor> {
        let mse = (&self.model.forward(&self.x) - &self.target).pow(2.0).mean_all();
        self.line = line!() + 1;
        let loss = (mse * Tensor::scalar(scale)).log();
        loss.backward();
        self.opt.step();
        self.opt.zero_grad();
        lazuli::sync()?;
        Ok(loss)
    }

    fn state_bits(&self) -> Vec<(String, Vec<u32>)> {
        state_bits(&self.model, &self.opt)
    }
}

#[test]
fn an_optimizer_update_is_named_at_the_next_step() {
    if child::alone(module_path!(), "an_optimizer_update_is_named_at_the_next_step") {
        return; // the runtime's configuration is process-wide
    }
    init_one_program(CheckFinite::Stop);
    an_update_that_makes_nan_is_named_at_the_next_step();
}

/// AdamW with `eps = 0` on a zero gradient: the first step's update makes NaNs from finite values, which `stop`
/// does not count (what enters the update is finite); the second step's loss is NaN: that step trips, and its input
/// is named with the update's line. The second step kept the state the first one made.
fn an_update_that_makes_nan_is_named_at_the_next_step() {
    let w = Param::new(Tensor::from_slice(&[1.0f32, 2.0, 3.0], &[3]));
    let mut opt = AdamW::new(vec![("w".into(), w.clone())], 0.1).eps(0.0);
    let line = line!() + 4;
    let mut step = || {
        let loss = (&w.get() * 0.0).sum_all();
        loss.backward();
        opt.step();
        opt.zero_grad();
        lazuli::sync()
    };
    step().unwrap();
    step().unwrap();
    let e = lazuli::wait().unwrap_err();
    let (op, at, report) = located(&e);
    assert_eq!((op, at.file, at.line), ("parameter", file!(), line), "{report}");
    assert!(report.contains("an input of the step, f32[3]") && report.contains("3 of 3 non-finite"), "{report}");
    assert!(w.get().to_vec::<f32>().unwrap().iter().all(|v| v.is_nan()));
}

/// `LAZULI_LOCATE_AHEAD`: the locating program of a training step is compiled on a thread once the step runs
/// again, and run once on a finite step; a trip then runs it without compiling and names the op as a trip that
/// compiles does.
#[test]
fn a_locator_compiled_ahead_locates_without_a_compile_at_the_trip() {
    if child::alone(module_path!(), "a_locator_compiled_ahead_locates_without_a_compile_at_the_trip") {
        return; // the runtime's configuration is process-wide
    }
    let config =
        Config { check_finite: CheckFinite::Stop, locate_ahead: LocateAhead::On, ..Config::from_env().unwrap() };
    lazuli::init(config).unwrap();
    // One program a step: the bad step's check is read once two later steps are launched.
    a_locator_ahead_trip(1, 2);
}

/// Steps until the locating programs of the step's `programs` programs are compiled ahead and have run once, then
/// a bad step: the error comes with the `later`-th step after it, names the planted `log` with its operand, and
/// the trip compiled nothing.
fn a_locator_ahead_trip(programs: u64, later: usize) {
    let w = Param::new(Tensor::from_slice(&[1.0f32, 2.0], &[2]));
    let mut opt = AdamW::new(vec![("w".into(), w.clone())], 0.01);
    // The loss falls as w grows, so however many steps the compile ahead takes, w stays away from 0 (a loss that
    // drove w down reached log(0) after about 80 steps on a loaded machine).
    let line = line!() + 3;
    let mut step = |scale: f32| {
        let batch = Tensor::from_slice(&[scale, scale], &[2]);
        let loss = -(&w.get() * &batch).log().sum_all();
        loss.backward();
        opt.step();
        opt.zero_grad();
        lazuli::sync()
    };
    step_until_compiled_ahead(|| step(1.0).unwrap());
    let before = lazuli::metrics();
    assert!(before.locate_warm_runs >= programs, "each program's locator ran once: {before:?}");
    step(0.0).unwrap();
    (1..later).for_each(|_| step(1.0).unwrap());
    let e = step(1.0).unwrap_err();
    let (op, at, report) = located(&e);
    assert_eq!((op, at.file, at.line), ("log", file!(), line), "{report}");
    assert!(report.contains("2 of 2 non-finite"), "{report}");
    // The log's operand, w · 0.
    assert!(report.contains("operand 0: f32[2]: min 0e0, max 0e0, 0 NaN, 0 inf"), "{report}");
    let trip = lazuli::metrics() - before;
    assert_eq!((trip.locate_compiles, trip.locate_ahead), (0, 0), "the trip ran the program compiled ahead");
    assert!(trip.locate_run_ms > 0.0, "{trip:?}");
}

/// A loop that reads its loss every step waits for each step anyway: under `stop` the bad step's own read reads
/// its check and is the trip's error, located before anything runs after it, with the state from before the step;
/// the next step trains again.
#[test]
fn a_read_of_the_bad_steps_loss_is_the_trip() {
    if child::alone(module_path!(), "a_read_of_the_bad_steps_loss_is_the_trip") {
        return; // the runtime's configuration is process-wide
    }
    init_one_program(CheckFinite::Stop);
    // Only the bad step ran (the locating run is not counted among executions).
    the_bad_steps_read_is_the_trip(1, "hold their values from before the step\n");
}

/// Three good steps and a bad one, each reading its loss: the bad step's read is the trip, located at the planted
/// `log`, after the bad step's `programs` programs ran (and no other); its report says `kept`; the state is the one
/// from before the bad step and the next step trains again.
fn the_bad_steps_read_is_the_trip(programs: u64, kept: &str) {
    let mut run = PlantedLog::new(5);
    let read_loss = |loss: Tensor| loss.item::<f32>();
    for _ in 0..3 {
        assert!(run.step(1.0).and_then(read_loss).unwrap().is_finite());
    }
    let before = run.state_bits();
    let executions = lazuli::metrics().executions;
    let bad = run.step(0.0).and_then(read_loss);
    let (op, at, report) = located(bad.as_ref().unwrap_err());
    assert_eq!((op, at.file, at.line), ("log", file!(), run.line), "{report}");
    assert!(report.contains("step 3: "), "{report}");
    assert!(report.contains(kept), "{report}");
    assert_eq!(lazuli::metrics().executions, executions + programs);
    assert_eq!(run.state_bits(), before, "{report}");
    assert!(run.step(1.0).and_then(read_loss).unwrap().is_finite());
    assert_ne!(run.state_bits(), before);
}

/// `stop` keeps the state as `skip` does, with donation on: a planted `log(0)` is located at its line with its
/// step, and the parameters and AdamW's moments after the error are bit for bit those before the bad step,
/// although two more programs (an evaluation and a training step) were launched after it; the run can go on from
/// there, as if the frozen steps had never run.
#[test]
fn stop_keeps_the_state_from_before_the_bad_step() {
    if child::alone(module_path!(), "stop_keeps_the_state_from_before_the_bad_step") {
        return; // the runtime's configuration and the counters are process-wide
    }
    init_one_program(CheckFinite::Stop);
    // An evaluation (another program, which updates no state) and a training step are launched after the bad
    // step; the training step's `sync()` reads its check. Both read the flag and hand it on.
    the_state_is_kept_from_before_the_bad_step(false);
}

/// Three good steps, a bad one (step 3) and an evaluation, then training steps: the error, from the evaluation's
/// `sync()` when `split`, else from the next step's, names the planted `log`; every parameter and moment, read back
/// from the device, is as before the bad step, though the state was still donated; the flag is cleared with the
/// error and the run trains on, bit for bit as one that never took the frozen steps (AdamW's bias correction counts
/// the steps applied).
fn the_state_is_kept_from_before_the_bad_step(split: bool) {
    let mut run = PlantedLog::new(3);
    for _ in 0..3 {
        run.step(1.0).unwrap();
    }
    let before = run.state_bits();
    let donated = lazuli::metrics().bytes_donated;
    let bad = run.step(0.0);
    let evaluated = run.model.forward(&run.x).sum_all();
    let eval = lazuli::sync();
    assert!(bad.is_ok(), "{bad:?}");
    let trip = if split { eval } else { eval.and_then(|()| run.step(1.0).map(drop)) };
    let (op, at, report) = located(trip.as_ref().unwrap_err());
    assert_eq!((op, at.file, at.line), ("log", file!(), run.line), "{report}");
    assert!(report.contains("step 3: "), "{report}");
    assert!(report.contains("as the 2 program(s) launched after it left them"), "{report}");
    // The evaluation ran on the kept state.
    assert!(evaluated.item::<f32>().unwrap().is_finite());
    assert_eq!(run.state_bits(), before, "{report}");
    assert!(lazuli::metrics().bytes_donated > donated);
    run.step(1.0).unwrap();
    lazuli::wait().unwrap();
    let after = run.state_bits();
    assert_ne!(after, before);
    assert!(after.iter().all(|(_, bits)| bits.iter().all(|&b| f32::from_bits(b).is_finite())));
    let taken = if split { 5 } else { 6 };
    assert_eq!((run.opt.steps(), run.opt.steps_applied().unwrap()), (taken, 4));
    let mut clean = PlantedLog::new(3);
    for _ in 0..4 {
        clean.step(1.0).unwrap();
    }
    lazuli::wait().unwrap();
    assert_eq!(after, clean.state_bits(), "the frozen steps counted in the bias correction");
}

/// A guarded step leaves AdamW's moments where they are: the update's kernels read each old moment once, so the
/// step's program (the plugin's own plan of it) holds no copy of them. An MLP of 0.5M weights on a batch of two:
/// its temporaries are its gradients (as many bytes as the weights) and little else, where a step that copied its
/// moments to keep the old ones for the weights' step held about twice that (checked: 4.2 MB against 2.2 MB).
#[test]
fn a_guarded_step_leaves_the_moments_in_place() {
    if child::alone(module_path!(), "a_guarded_step_leaves_the_moments_in_place") {
        return; // the runtime's configuration is process-wide
    }
    init_one_program(CheckFinite::Stop);
    let model = Mlp::new(&mut HostRng::new(5), &[256, 1024, 256], Activation::Tanh, DType::F32);
    let mut opt = AdamW::new(model.named_params(), 1e-3);
    let x = Tensor::randn(&[2, 256], DType::F32);
    let weights: usize = model.named_params().iter().map(|(_, p)| p.get().tensor_type().byte_size()).sum();
    for _ in 0..2 {
        let loss = model.forward(&x).pow(2.0).mean_all();
        loss.backward();
        opt.step();
        opt.zero_grad();
        lazuli::sync().unwrap();
    }
    lazuli::wait().unwrap();
    let plan = lazuli::program_memory().unwrap().expect("the step ran");
    let bound = 3 * weights as i64 / 2;
    assert!(plan.temp_bytes < bound, "temporaries {} B, more than 1.5 × the weights' {weights} B", plan.temp_bytes);
}
