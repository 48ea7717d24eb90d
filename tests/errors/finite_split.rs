//! The finite check under `stop` with the split step (`LAZULI_SPLIT_UPDATE`, on by default on NVIDIA GPUs, forced
//! here on the CPU): the gradients' program counts the loss and the gradients and hands its trip on in the sticky
//! flag; the update's program guards the state by that flag without counting the gradients again. A trip is
//! located in the gradients' program, the state stays as it was before the bad step, and the check is read by the
//! update of the step after it (or by a read of the bad step's loss), one step sooner than with one program a step.

use lazuli::{AdamW, CheckFinite, Config, DType, Optimizer, Param, SplitUpdate, Tensor};

use super::finite::{located, step_until_compiled_ahead, PlantedLog};
use crate::common::child;

/// The runtime of this child process: `stop`, the step split, and the locator ahead where asked.
fn init(locate_ahead: bool) {
    let config = Config {
        check_finite: CheckFinite::Stop,
        split_update: SplitUpdate::On,
        locate_ahead,
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
    let mut run = PlantedLog::new(5);
    let read_loss = |loss: Tensor| loss.item::<f32>();
    for _ in 0..3 {
        assert!(run.step(1.0).and_then(read_loss).unwrap().is_finite());
    }
    let before = run.state_bits();
    let executions = lazuli::metrics().executions;
    let bad = run.step(0.0).and_then(read_loss);
    let (op, at, report) = located(bad.as_ref().unwrap_err());
    assert_eq!((op, at.line), ("log", run.line), "{report}");
    assert!(at.file.ends_with("errors/finite.rs"), "{at}");
    assert!(report.contains("step 3: "), "{report}");
    assert!(report.contains("hold their values from before the step, as the 1 program(s) launched"), "{report}");
    // The bad step's two programs ran (the locating run is not counted among executions).
    assert_eq!(lazuli::metrics().executions, executions + 2);
    assert_eq!(run.state_bits(), before, "{report}");
    assert!(run.step(1.0).and_then(read_loss).unwrap().is_finite());
    assert_ne!(run.state_bits(), before);
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
    let (op, at, report) = located(eval.as_ref().unwrap_err());
    assert_eq!((op, at.line), ("log", run.line), "{report}");
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
    assert_eq!((run.opt.steps(), run.opt.steps_applied().unwrap()), (5, 4));
    let mut clean = PlantedLog::new(3);
    for _ in 0..4 {
        clean.step(1.0).unwrap();
    }
    lazuli::wait().unwrap();
    assert_eq!(after, clean.state_bits(), "the frozen step counted in the bias correction");
}

/// A non-finite state that an update made from finite values enters the next step's gradients' program as an
/// input: that program trips and names the input with the update's line.
#[test]
fn an_optimizer_update_is_named_at_the_next_step_when_split() {
    if child::alone(module_path!(), "an_optimizer_update_is_named_at_the_next_step_when_split") {
        return; // the runtime's configuration is process-wide
    }
    init(false);
    let w = Param::new(Tensor::from_slice(&[1.0f32, 2.0, 3.0], &[3]));
    // With eps = 0, a parameter whose gradient is 0 gets 0 / 0 in AdamW's update.
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

/// `LAZULI_LOCATE_AHEAD` with the split step: the gradients' program, which updates no state itself, has its
/// locating program compiled ahead too, and the trip runs it without a compile.
#[test]
fn a_locator_compiled_ahead_locates_a_split_step_without_a_compile() {
    if child::alone(module_path!(), "a_locator_compiled_ahead_locates_a_split_step_without_a_compile") {
        return; // the runtime's configuration is process-wide
    }
    init(true);
    let w = Param::new(Tensor::from_slice(&[1.0f32, 2.0], &[2]));
    let mut opt = AdamW::new(vec![("w".into(), w.clone())], 0.01);
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
    assert!(before.locate_warm_runs >= 2, "both programs' locators ran once: {before:?}");
    // The bad step's check is read by the next step's update.
    step(0.0).unwrap();
    let e = step(1.0).unwrap_err();
    let (op, at, report) = located(&e);
    assert_eq!((op, at.file, at.line), ("log", file!(), line), "{report}");
    assert!(report.contains("operand 0: f32[2]: min 0e0, max 0e0, 0 NaN, 0 inf"), "{report}");
    let trip = lazuli::metrics() - before;
    assert_eq!((trip.locate_compiles, trip.locate_ahead), (0, 0), "the trip ran the program compiled ahead");
}

/// A weight read through a bf16 copy: the split step's update makes the new copy from the new weight, and the old
/// copy is no input of that program, so the copy has no old value of its own to keep. On a trip it is made from
/// the kept weight instead: after the error both hold their values from before the bad step.
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
    for _ in 0..3 {
        step(1.0).unwrap();
    }
    lazuli::wait().unwrap();
    let read = |w: &Param| {
        let copy = w.get_as(DType::BF16).to_dtype(DType::F32).to_vec::<f32>().unwrap();
        (w.get().to_vec::<f32>().unwrap(), copy)
    };
    let before = read(&w);
    assert!(before.0.iter().chain(&before.1).all(|v| v.is_finite()), "{before:?}");
    step(0.0).unwrap();
    let e = lazuli::wait().unwrap_err();
    let (op, _, report) = located(&e);
    assert_eq!(op, "log", "{report}");
    assert_eq!(read(&w), before, "{report}");
}
