//! The finite check (`LAZULI_CHECK_FINITE`): a step whose outputs hold NaN or infinities is reported at the next
//! call that reads its check, with the first op that made a non-finite value from finite operands and its line. The
//! check is part of the runtime's configuration, so each test runs alone in a child process with its own runtime.

use lazuli::diagnostics::{events, EventKind};
use lazuli::nn::{Activation, HostRng, Mlp, Param};
use lazuli::{
    checkpoint, mesh, AdamW, CheckFinite, Config, DType, Error, Loc, LocateAhead, Module, Optimizer, PartitionSpec,
    Sgd, Tensor,
};

use crate::common::child;

/// The runtime of this child process, with the check in `mode`.
pub(super) fn init(mode: CheckFinite) {
    lazuli::init(Config { check_finite: mode, ..Config::from_env().unwrap() }).unwrap();
}

/// The error's op and line.
pub(super) fn located(e: &Error) -> (&'static str, Loc, &str) {
    match e {
        Error::NonFinite { op: Some(op), op_at: Some(at), report, .. } => (op, *at, report),
        other => panic!("expected a located NonFinite error, got {other}"),
    }
}

/// `log(w)` where `w` counts down 2, 1, 0, -1, …: the third step (step 2) makes `-inf`. Returns the result of each
/// step's `sync()` and the line of the `log`.
fn count_down_to_log_of_zero(steps: usize) -> (Vec<lazuli::Result<()>>, u32, Tensor) {
    let mut w = Tensor::from_slice(&[3.0f32, 4.0], &[2]);
    let mut results = Vec::new();
    let mut y = w.clone();
    let line = line!() + 4;
    for _ in 0..steps {
        w = &w - 1.0;
        // The planted op: its line is `line`.
        y = w.log();
        let _total = y.sum_all();
        results.push(lazuli::sync());
    }
    (results, line, y)
}

#[test]
fn a_forward_op_is_located_at_its_line() {
    if child::alone(module_path!(), "a_forward_op_is_located_at_its_line") {
        return; // the runtime's configuration is process-wide
    }
    init(CheckFinite::Stop);
    let (results, line, _) = count_down_to_log_of_zero(7);
    // Step 2 made -inf; its check is read once two later steps are launched: by step 4's `sync()`.
    assert!(results[..4].iter().all(|r| r.is_ok()), "{results:?}");
    let e = results[4].as_ref().unwrap_err();
    let (op, at, report) = located(e);
    assert_eq!((op, at.file, at.line), ("log", file!(), line), "{report}");
    assert!(report.contains("step 2: 2 of its 3 floating-point outputs hold non-finite values"), "{report}");
    assert!(report.contains(&format!("f32[2] recorded at {}:{line}", file!())), "{report}");
    assert!(report.contains("1 of 2 non-finite"), "{report}");
    // The operand of the log: w = [0, 1], finite.
    assert!(report.contains("operand 0: f32[2]: min 0e0, max 1e0, 0 NaN, 0 inf"), "{report}");
    let message = e.to_string();
    assert!(message.starts_with("non-finite values in the step materialized at"), "{message}");
    // Reported once, with the checks of the steps launched after it: the next steps run, and step 5's NaN (from
    // log(-2)) is the next error, read by `wait()`.
    assert!(results[5..].iter().all(|r| r.is_ok()), "{results:?}");
    let e = lazuli::wait().unwrap_err();
    let (op, at, report) = located(&e);
    assert_eq!((op, at.line), ("log", line));
    // w = [-3, -2]: the fifth step's.
    assert!(report.contains("operand 0: f32[2]: min -3e0, max -2e0"), "{report}");
}

#[test]
fn a_gradient_op_is_located_at_the_forward_line() {
    if child::alone(module_path!(), "a_gradient_op_is_located_at_the_forward_line") {
        return; // the runtime's configuration is process-wide
    }
    init(CheckFinite::Stop);
    let x = Tensor::from_slice(&[0.0f32, 4.0], &[2]).requires_grad();
    // sqrt is finite at 0; its gradient 1 / (2 sqrt(x)) is not. Gradient ops carry their forward op's line.
    let line = line!() + 1;
    let y = x.sqrt();
    y.sum_all().backward();
    let g = x.grad().unwrap();
    lazuli::sync().unwrap();
    let e = lazuli::wait().unwrap_err();
    let (op, at, report) = located(&e);
    assert_eq!((op, at.file, at.line), ("div", file!(), line), "{report}");
    assert!(report.contains("1 of 2 non-finite"), "{report}");
    // The check is read once; the values are there.
    lazuli::wait().unwrap();
    assert_eq!(g.to_vec::<f32>().unwrap(), vec![f32::INFINITY, 0.25]);
    assert_eq!(y.to_vec::<f32>().unwrap(), vec![0.0, 2.0]);
}

/// A weight's gradient from a batch of one, `xᵀ · dh`, is a matrix product larger than its operands, which the check
/// counts in its place (`hlo::finite::update_inputs`): a gradient op that makes an infinity in `dh` still trips the
/// step, is located at its forward line, and the weight keeps its value.
#[test]
fn a_gradient_counted_by_its_products_operands_trips_and_keeps_the_weight() {
    if child::alone(module_path!(), "a_gradient_counted_by_its_products_operands_trips_and_keeps_the_weight") {
        return; // the runtime's configuration is process-wide
    }
    init(CheckFinite::Stop);
    let start: Vec<f32> = (0..12).map(|i| i as f32 / 4.0).collect();
    let w = Param::new(Tensor::from_slice(&start, &[4, 3]));
    let mut opt = Sgd::new(vec![("w".into(), w.clone())], 0.1);
    // h = x · w is w's first row, [0, 0.25, 0.5]: sqrt is finite at 0, its gradient is not.
    let x = Tensor::from_slice(&[1.0f32, 0.0, 0.0, 0.0], &[1, 4]);
    let line = line!() + 1;
    let loss = x.matmul(&w.get()).sqrt().sum_all();
    loss.backward();
    opt.step();
    lazuli::sync().unwrap();
    let e = lazuli::wait().unwrap_err();
    let (op, at, report) = located(&e);
    assert_eq!((op, at.file, at.line), ("div", file!(), line), "{report}");
    assert!(report.contains("kept: parameters and optimizer state hold their values"), "{report}");
    let bits = |v: Vec<f32>| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(w.get().to_vec::<f32>().unwrap()), bits(start));
}

#[test]
fn log_mode_reports_and_carries_on() {
    if child::alone(module_path!(), "log_mode_reports_and_carries_on") {
        return; // the runtime's configuration and the captured events are process-wide
    }
    init(CheckFinite::Log);
    events::start_capture();
    let (results, line, y) = count_down_to_log_of_zero(5);
    lazuli::wait().unwrap();
    assert!(results.iter().all(|r| r.is_ok()));
    // Steps 2 (-inf) to 4 (NaN from log of negatives) tripped; only the first is located.
    let trips: Vec<_> = events::take_captured().into_iter().filter(|e| e.kind == EventKind::NonFinite).collect();
    assert_eq!(trips.iter().map(|e| e.step).collect::<Vec<_>>(), vec![2, 3, 4]);
    let first = trips[0].explanation.join("\n");
    assert!(first.contains(&format!("first non-finite value: log at {}:{line}", file!())), "{first}");
    assert!(trips[1].explanation.join("\n").contains("not located: only the first trip"));
    let report = lazuli::diagnostics::report::render(&lazuli::diagnostics::report::analyse(&trips));
    assert!(report.contains(&format!("step 2 at {}:", file!())) && report.contains("log at"), "{report}");
    assert!(y.to_vec::<f32>().unwrap().iter().all(|v| v.is_nan()));
}

#[test]
fn off_adds_no_output_and_never_trips() {
    if child::alone(module_path!(), "off_adds_no_output_and_never_trips") {
        return; // the runtime's configuration and the captured events are process-wide
    }
    init(CheckFinite::Off);
    events::start_capture();
    let (results, _, y) = count_down_to_log_of_zero(5);
    lazuli::wait().unwrap();
    assert!(results.iter().all(|r| r.is_ok()));
    let ev = events::take_captured();
    assert!(ev.iter().all(|e| e.kind != EventKind::NonFinite));
    // w, log(w) and its sum: three outputs, no check.
    let programs: Vec<_> = ev.iter().filter(|e| e.kind == EventKind::Program).collect();
    assert_eq!(programs.len(), 5);
    assert!(programs.iter().all(|e| e.outputs == 3), "{programs:?}");
    assert!(y.to_vec::<f32>().unwrap().iter().all(|v| v.is_nan()));
}

#[test]
fn a_clean_training_loop_never_trips() {
    if child::alone(module_path!(), "a_clean_training_loop_never_trips") {
        return; // the runtime's configuration and the captured events are process-wide
    }
    init(CheckFinite::Stop);
    events::start_capture();
    let model = Mlp::new(&mut HostRng::new(5), &[3, 8, 1], Activation::Tanh, DType::F32);
    let mut opt = AdamW::new(model.named_params(), 1e-2);
    let x = Tensor::from_slice(&[0.5f32, -1.0, 0.25, 1.0, 0.0, -0.5, 0.75, 0.5, -0.25, -1.0, 1.0, 0.1], &[4, 3]);
    let target = Tensor::from_slice(&[1.0f32, -1.0, 0.5, 0.0], &[4, 1]);
    let mut losses = Vec::new();
    for step in 0..40 {
        let loss = (&model.forward(&x) - &target).pow(2.0).mean_all();
        loss.backward();
        opt.step();
        opt.zero_grad();
        lazuli::sync().unwrap();
        if step % 10 == 0 || step == 39 {
            losses.push(loss.item::<f32>().unwrap());
        }
    }
    lazuli::wait().unwrap();
    assert!(losses.last().unwrap() < &(losses[0] * 0.5), "{losses:?}");
    let ev = events::take_captured();
    assert!(ev.iter().all(|e| e.kind != EventKind::NonFinite));
    // Every step's program counted its outputs' non-finite values in one more output.
    let step = ev.iter().rfind(|e| e.kind == EventKind::Program && e.cause == "sync").unwrap();
    assert!(step.outputs > 1 && step.cache_hit);
}

#[test]
fn a_malformed_setting_names_the_variable() {
    let test = child::test_name(module_path!(), "a_malformed_setting_names_the_variable");
    match std::env::var("LAZULI_CHECK_FINITE").ok().as_deref() {
        None => {
            child::passes(&test, &[("LAZULI_CHECK_FINITE", "sometimes")]);
            child::passes(&test, &[("LAZULI_CHECK_FINITE", "log")]);
        }
        Some("sometimes") => {
            let e = Config::from_env().unwrap_err().to_string();
            assert!(e.contains("LAZULI_CHECK_FINITE=\"sometimes\": expected off, stop, skip or log"), "{e}");
        }
        Some(_) => assert_eq!(Config::from_env().unwrap().check_finite, CheckFinite::Log),
    }
}

/// Host copies of every parameter and optimizer state tensor, as bits.
pub(super) fn state_bits(model: &Mlp, opt: &AdamW) -> Vec<(String, Vec<u32>)> {
    let params = model.named_params().into_iter().map(|(n, p)| (n, p.get()));
    params
        .chain(opt.state())
        .map(|(n, t)| (n, t.to_vec::<f32>().unwrap().iter().map(|v| v.to_bits()).collect()))
        .collect()
}

#[test]
fn skip_keeps_parameters_and_optimizer_state_bit_identical() {
    if child::alone(module_path!(), "skip_keeps_parameters_and_optimizer_state_bit_identical") {
        return; // the runtime's configuration, the counters and the captured events are process-wide
    }
    init(CheckFinite::Skip);
    events::start_capture();
    let new_model = || Mlp::new(&mut HostRng::new(3), &[3, 8, 1], Activation::Tanh, DType::F32);
    let model = new_model();
    let mut opt = AdamW::new(model.named_params(), 1e-2);
    let x = Tensor::from_slice(&[0.5f32, -1.0, 0.25, 1.0, 0.0, -0.5], &[2, 3]);
    let target = Tensor::from_slice(&[1.0f32, -1.0], &[2, 1]);
    // `scale` is a host scalar: inf at the bad step makes the loss and every gradient non-finite.
    let step = |model: &Mlp, opt: &mut AdamW, scale: f32| {
        let loss = (&model.forward(&x) - &target).pow(2.0).mean_all() * Tensor::scalar(scale);
        loss.backward();
        opt.step();
        opt.zero_grad();
        lazuli::sync().unwrap();
        loss
    };
    for _ in 0..3 {
        step(&model, &mut opt, 1.0);
    }
    let before = state_bits(&model, &opt);
    let donated = lazuli::metrics().bytes_donated;
    let bad = step(&model, &mut opt, f32::INFINITY);
    let after_bad = state_bits(&model, &opt);
    assert!(bad.item::<f32>().unwrap().is_infinite());
    assert_eq!(before, after_bad, "the skipped step changed the state");
    // The state was still donated: the guarded program hands the old buffers back.
    assert!(lazuli::metrics().bytes_donated > donated);
    // The run carries on from the kept state: the next step is finite and moves the weights.
    let next = step(&model, &mut opt, 1.0);
    assert!(next.item::<f32>().unwrap().is_finite());
    lazuli::wait().unwrap();
    assert_ne!(state_bits(&model, &opt), before);
    assert_eq!(lazuli::metrics().skipped_steps, 1);
    // ... exactly as if the bad step had never run: AdamW's bias correction counts the steps applied, not taken.
    let clean_model = new_model();
    let mut clean_opt = AdamW::new(clean_model.named_params(), 1e-2);
    for _ in 0..4 {
        step(&clean_model, &mut clean_opt, 1.0);
    }
    lazuli::wait().unwrap();
    assert_eq!(state_bits(&model, &opt), state_bits(&clean_model, &clean_opt), "the skipped step counted");
    assert_eq!((opt.steps(), opt.steps_applied().unwrap(), clean_opt.steps_applied().unwrap()), (5, 4, 4));
    // A checkpoint saves the steps applied: a run resumed from it goes on as the clean one does.
    let path = std::env::temp_dir().join(format!("lazuli-skip-{}.safetensors", std::process::id()));
    checkpoint::save(&path, &model, Some(&opt), &[], &Default::default()).unwrap();
    let resumed_model = Mlp::new(&mut HostRng::new(9), &[3, 8, 1], Activation::Tanh, DType::F32);
    let mut resumed_opt = AdamW::new(resumed_model.named_params(), 1e-2);
    let (_, meta) = checkpoint::load(&path, &resumed_model, Some(&mut resumed_opt)).unwrap();
    std::fs::remove_file(&path).unwrap();
    assert_eq!(meta.optimizer_steps, 4);
    step(&resumed_model, &mut resumed_opt, 1.0);
    step(&clean_model, &mut clean_opt, 1.0);
    lazuli::wait().unwrap();
    assert_eq!(state_bits(&resumed_model, &resumed_opt), state_bits(&clean_model, &clean_opt));
    let trips: Vec<_> = events::take_captured().into_iter().filter(|e| e.kind == EventKind::NonFinite).collect();
    assert_eq!(trips.len(), 1);
    let text = trips[0].explanation.join("\n");
    assert!(text.contains("entered the update; parameters and optimizer state keep their values"), "{text}");
    // Skip reads what enters the update, as dynamic loss scaling does: a NaN that AdamW makes from a finite
    // gradient (0 / 0 with eps = 0) reaches the state unseen; every later step's gradient (2w · 0) is then NaN and
    // the step skipped, and the twentieth skip in a row ends the run, saying why.
    let w = Param::new(Tensor::from_slice(&[1.0f32, 2.0], &[2]));
    let mut opt = AdamW::new(vec![("w".into(), w.clone())], 0.1).eps(0.0);
    let skipped = lazuli::metrics().skipped_steps;
    let mut results = Vec::new();
    for _ in 0..25 {
        (&w.get() * &w.get() * 0.0).sum_all().backward();
        opt.step();
        opt.zero_grad();
        results.push(lazuli::sync().and_then(|_| lazuli::wait()));
        if results.last().unwrap().is_err() {
            break;
        }
    }
    assert!(w.get().to_vec::<f32>().unwrap().iter().all(|v| v.is_nan()));
    assert_eq!(results.len(), 21, "the first step made the NaN, the next 20 were skipped: {results:?}");
    match results.pop().unwrap().unwrap_err() {
        Error::NonFinite { report, .. } => assert!(report.contains("20 steps in a row were skipped"), "{report}"),
        other => panic!("expected NonFinite, got {other}"),
    }
    assert_eq!(lazuli::metrics().skipped_steps, skipped + 20);
    // A program that updates no state has nothing to skip: its trip is an event, not a skipped step.
    events::start_capture();
    let z = Tensor::from_slice(&[0.0f32, 1.0], &[2]).log();
    assert_eq!(z.to_vec::<f32>().unwrap(), vec![f32::NEG_INFINITY, 0.0]);
    lazuli::wait().unwrap();
    assert_eq!(lazuli::metrics().skipped_steps, 21);
    let last = events::take_captured().into_iter().rfind(|e| e.kind == EventKind::NonFinite).unwrap();
    assert!(last.explanation.join("\n").contains("updates no state: nothing to skip"), "{last:?}");
}

/// Runs `step` until the locating programs whose compile started ahead are compiled, then three more times: the
/// next finite check read runs each once.
pub(super) fn step_until_compiled_ahead(mut step: impl FnMut()) {
    let compiling = || {
        let m = lazuli::metrics();
        m.locate_ahead == 0 || m.locate_compiles < m.locate_ahead
    };
    let mut steps = 0;
    while compiling() {
        assert!(steps < 3000, "no locating program was compiled ahead");
        step();
        steps += 1;
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    (0..3).for_each(|_| step());
}

#[test]
fn a_sharded_step_is_located_at_its_line() {
    if child::alone(module_path!(), "a_sharded_step_is_located_at_its_line") {
        return; // the runtime (on 4 devices) is process-wide
    }
    sharded_trip(false);
}

/// As `a_sharded_step_is_located_at_its_line`, the mesh step's locating program compiled ahead (whole, for one
/// device) and run once before the trip, which then compiles nothing.
#[test]
fn a_sharded_step_is_located_by_a_program_compiled_ahead() {
    if child::alone(module_path!(), "a_sharded_step_is_located_by_a_program_compiled_ahead") {
        return; // the runtime (on 4 devices) is process-wide
    }
    sharded_trip(true);
}

/// A replicated MLP stepped on a 4-device mesh whose planted `log` goes -inf once its parameters are zeroed: the
/// trip names the `log`'s line and the state keeps its layout and values. With `ahead`, the locating program is
/// compiled ahead and run once first, and the trip compiles nothing.
fn sharded_trip(ahead: bool) {
    let config = Config {
        check_finite: CheckFinite::Stop,
        cpu_device_count: 4,
        locate_ahead: if ahead { LocateAhead::On } else { LocateAhead::Off },
        ..Config::from_env().unwrap()
    };
    lazuli::init(config).unwrap();
    let m = mesh(&[("data", 4)]).unwrap();
    let model = Mlp::new(&mut HostRng::new(4), &[2, 8, 1], Activation::Tanh, DType::F32);
    lazuli::shard_params(&model, &m, |_, t| PartitionSpec::replicated(t.rank()));
    let mut opt = AdamW::new(model.named_params(), 1e-2);
    let xs: Vec<f32> = (0..16).map(|i| i as f32 * 0.25 - 2.0).collect();
    let x = Tensor::from_slice(&xs, &[8, 2]).shard(&m, &PartitionSpec::split(2, 0, "data"));
    let line = line!() + 4;
    let step = |opt: &mut AdamW, floor: f32| {
        let y = model.forward(&x);
        // The planted op: log of a value that reaches 0 when `floor` is 0.
        let loss = (y.pow(2.0) + Tensor::scalar(floor)).log().mean_all();
        loss.backward();
        opt.step();
        opt.zero_grad();
        lazuli::sync()
    };
    step(&mut opt, 1.0).unwrap();
    if ahead {
        step_until_compiled_ahead(|| step(&mut opt, 1.0).unwrap());
    }
    let before = state_bits(&model, &opt);
    // One parameter set to zero makes y = 0 for every row: log(0) = -inf.
    for (_, p) in model.named_params() {
        p.set(p.get() * 0.0);
    }
    let zeroed = state_bits(&model, &opt);
    assert_ne!(before, zeroed);
    let at_trip = lazuli::metrics();
    assert_eq!(at_trip.locate_warm_runs >= 1, ahead, "{at_trip:?}");
    step(&mut opt, 0.0).unwrap();
    let e = lazuli::wait().unwrap_err();
    let (op, at, report) = located(&e);
    assert_eq!((op, at.file, at.line), ("log", file!(), line), "{report}");
    // The program ran on the mesh, and its state kept its layout and its values from before the step.
    let w = &model.named_params()[0].1;
    assert_eq!(w.get().sharding().unwrap().mesh, m);
    assert_eq!(state_bits(&model, &opt), zeroed);
    let trip = lazuli::metrics() - at_trip;
    assert_eq!(trip.locate_compiles, u64::from(!ahead), "{trip:?}");
}

#[test]
fn an_overflow_in_f16_and_bf16_is_located_at_its_line() {
    if child::alone(module_path!(), "an_overflow_in_f16_and_bf16_is_located_at_its_line") {
        return; // the runtime's configuration is process-wide
    }
    init(CheckFinite::Stop);
    // f16's largest value is 65504, bf16's about 3.4e38: squaring 300 and 2e19 overflows, from finite operands.
    for (dtype, name, big) in [(DType::F16, "f16", 300.0f32), (DType::BF16, "bf16", 2e19)] {
        let x = Tensor::from_slice(&[1.0f32, big], &[2]).to_dtype(dtype);
        let line = line!() + 1;
        let y = &x * &x;
        let _total = y.sum_all();
        lazuli::sync().unwrap();
        let e = lazuli::wait().unwrap_err();
        let (op, at, report) = located(&e);
        assert_eq!((op, at.file, at.line), ("mul", file!(), line), "{dtype:?}: {report}");
        assert!(report.contains(&format!("{name}[2] recorded at {}:{line}", file!())), "{report}");
        assert!(report.contains("1 of 2 non-finite") && report.contains("0 NaN, 0 inf"), "{report}");
    }
}

#[test]
fn skip_on_a_mesh_keeps_the_state_and_the_step_count() {
    if child::alone(module_path!(), "skip_on_a_mesh_keeps_the_state_and_the_step_count") {
        return; // the runtime (on 4 devices) is process-wide
    }
    lazuli::init(Config { check_finite: CheckFinite::Skip, cpu_device_count: 4, ..Config::from_env().unwrap() })
        .unwrap();
    let m = mesh(&[("data", 4)]).unwrap();
    let xs: Vec<f32> = (0..16).map(|i| i as f32 * 0.25 - 2.0).collect();
    let x = Tensor::from_slice(&xs, &[8, 2]).shard(&m, &PartitionSpec::split(2, 0, "data"));
    let run = |scales: &[f32]| {
        let model = Mlp::new(&mut HostRng::new(4), &[2, 8, 1], Activation::Tanh, DType::F32);
        lazuli::shard_params(&model, &m, |_, t| PartitionSpec::replicated(t.rank()));
        let mut opt = AdamW::new(model.named_params(), 1e-2);
        for &scale in scales {
            let loss = model.forward(&x).pow(2.0).mean_all() * Tensor::scalar(scale);
            loss.backward();
            opt.step();
            opt.zero_grad();
            lazuli::sync().unwrap();
        }
        lazuli::wait().unwrap();
        (state_bits(&model, &opt), opt.steps_applied().unwrap())
    };
    let skipped = run(&[1.0, f32::INFINITY, 1.0]);
    assert_eq!(skipped, run(&[1.0, 1.0]));
    assert_eq!(skipped.1, 2);
}

/// The grouped counts (one reduction over up to `GROUP_TENSORS` flattened, concatenated tensors of one dtype)
/// compile on the real CPU plugin and count what the reference interpreter counts: NaN, +inf and −inf, in every
/// group, with f16 beside f32 and more tensors than one group holds; counted whole and in rows.
#[test]
fn grouped_counts_on_the_plugin_match_the_reference() {
    use lazuli_hlo::finite::{count_groups, count_nonfinite_grouped, Counting, Total};

    // As on a GPU and on the CPU (here all small: grouped, no rows); and small enough limits that most tensors
    // are counted alone, as 4 or 3 rows summed into one (padded to whole rows), beside groups small enough to share.
    let alone_in_rows =
        Counting { tensors: 32, elements: 4, rows: Some(4), total: Total::Joined, guard_rebuilds: false };
    let threes = Counting { tensors: 3, elements: 10, rows: Some(3), total: Total::Joined, guard_rebuilds: false };
    for counting in [Counting::FOR_GPU, Counting::FOR_CPU, alone_in_rows, threes] {
        let (mut g, xs, values, planted) = planted_counts_graph();
        let loc = g.nodes[xs[0]].loc;
        let counts = count_nonfinite_grouped(&mut g, &xs, &counting, loc).unwrap().unwrap();
        g.outputs = vec![counts];
        let want: Vec<i32> = g.evaluate(&values).unwrap()[0].iter().map(|&c| c as i32).collect();
        let types: Vec<_> = xs.iter().map(|&x| &g.nodes[x].ty).collect();
        let groups = count_groups(&types, &counting).len();
        assert!(groups >= 3, "at least two f32 groups and one f16 group: {counting:?}");
        assert_eq!(want.len(), groups, "one count per group: {want:?}");
        assert_eq!(want.iter().sum::<i32>() as usize, planted, "the counts hold every planted value: {want:?}");
        assert_eq!(counts_on_the_cpu_plugin(&g, &xs, &values), want, "{counting:?}");
    }
}

/// A guarded check's one total counted by rows (each tensor's rows counted, the row counts joined and summed) on
/// the real CPU plugin: the planted count, the reference's, whether the rows are longer than every tensor, divide
/// some and leave others a padded last row, or hold one element.
#[test]
fn a_total_by_rows_on_the_plugin_counts_every_planted_value() {
    use lazuli_hlo::finite::{count_total_by_rows, TOTAL_ROW_WIDTH};
    for width in [TOTAL_ROW_WIDTH, 4, 1] {
        let (mut g, xs, values, planted) = planted_counts_graph();
        let loc = g.nodes[xs[0]].loc;
        let total = count_total_by_rows(&mut g, &xs, width, loc).unwrap();
        g.outputs = vec![total];
        let want: Vec<i32> = g.evaluate(&values).unwrap()[0].iter().map(|&c| c as i32).collect();
        assert_eq!(want, vec![planted as i32], "the reference, rows of {width}");
        assert_eq!(counts_on_the_cpu_plugin(&g, &xs, &values), want, "the plugin, rows of {width}");
    }
}

/// A guarded check's one total as the CPU counts it (each group's partial counts joined and summed once) on the real
/// CPU plugin: the planted count, the reference's, with every tensor alone in rows, groups of three, and the CPU's
/// own limits (every tensor small: one group of f32 per 32 tensors, one of f16).
#[test]
fn a_joined_total_on_the_plugin_counts_every_planted_value() {
    use lazuli_hlo::finite::{count_total_joined, Counting, Total};
    let alone_in_rows =
        Counting { tensors: 32, elements: 4, rows: Some(4), total: Total::Joined, guard_rebuilds: false };
    let threes = Counting { tensors: 3, elements: 10, rows: Some(3), total: Total::Joined, guard_rebuilds: false };
    for counting in [Counting::FOR_CPU, alone_in_rows, threes] {
        let (mut g, xs, values, planted) = planted_counts_graph();
        let loc = g.nodes[xs[0]].loc;
        let total = count_total_joined(&mut g, &xs, &counting, loc).unwrap();
        g.outputs = vec![total];
        let want: Vec<i32> = g.evaluate(&values).unwrap()[0].iter().map(|&c| c as i32).collect();
        assert_eq!(want, vec![planted as i32], "the reference, {counting:?}");
        assert_eq!(counts_on_the_cpu_plugin(&g, &xs, &values), want, "the plugin, {counting:?}");
    }
}

/// A graph of `GROUP_TENSORS + 9` f32 parameters of assorted shapes and one f16, with values where tensor `i`
/// holds `i % 4` non-finite elements (as many as fit), of every kind, and the f16 one; and how many were planted.
fn planted_counts_graph() -> (lazuli_hlo::Graph, Vec<usize>, Vec<ndarray::ArrayD<f64>>, usize) {
    use lazuli_hlo::finite::GROUP_TENSORS;
    use lazuli_hlo::{Graph, Loc, TensorType};
    use ndarray::{ArrayD, IxDyn};
    let loc = Loc::caller();
    let mut g = Graph::new();
    let shapes: Vec<Vec<usize>> = (0..GROUP_TENSORS + 9).map(|i| vec![1 + i % 3, 2 + i % 5]).collect();
    let mut xs: Vec<_> = shapes.iter().map(|s| g.parameter(TensorType::new(DType::F32, s.clone()), loc)).collect();
    xs.push(g.parameter(TensorType::new(DType::F16, [3]), loc));
    let specials = [f64::NAN, f64::INFINITY, f64::NEG_INFINITY];
    let mut values: Vec<ArrayD<f64>> = shapes
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let n: usize = s.iter().product();
            let v = (0..n).map(|k| if k < i % 4 { specials[(i + k) % 3] } else { k as f64 * 0.5 - 1.0 });
            ArrayD::from_shape_vec(IxDyn(s), v.collect()).unwrap()
        })
        .collect();
    values.push(ArrayD::from_shape_vec(IxDyn(&[3]), vec![1.0, f64::NAN, 2.0]).unwrap());
    let planted: usize = shapes.iter().enumerate().map(|(i, s)| (i % 4).min(s.iter().product())).sum::<usize>() + 1;
    (g, xs, values, planted)
}

/// `g`'s one `i32` output, compiled and run on the real CPU plugin with `values` as its f32 and f16 parameters `xs`.
fn counts_on_the_cpu_plugin(g: &lazuli_hlo::Graph, xs: &[usize], values: &[ndarray::ArrayD<f64>]) -> Vec<i32> {
    use lazuli_hlo::{emit, EmitOptions};
    use lazuli_pjrt::{provision, Client, ClientOptions, CompileOptions, ElementType, Plugin};
    let plugin = Plugin::load(provision::cpu_plugin_path().unwrap()).unwrap();
    let client = Client::new(&plugin, &ClientOptions::new().cpu_device_count(1)).unwrap();
    let exe = client.compile(&emit(g, &EmitOptions::default()), &CompileOptions::default()).unwrap();
    let device = &client.devices()[0];
    let mut args = Vec::new();
    for (v, &x) in values.iter().zip(xs) {
        let dims: Vec<i64> = v.shape().iter().map(|&d| d as i64).collect();
        let (bytes, ty) = match g.nodes[x].ty.dtype {
            DType::F16 => (v.iter().flat_map(|&e| half::f16::from_f64(e).to_le_bytes()).collect(), ElementType::F16),
            _ => (v.iter().flat_map(|&e| (e as f32).to_le_bytes()).collect::<Vec<u8>>(), ElementType::F32),
        };
        args.push(client.buffer_from_host(&bytes, ty, &dims, device).unwrap());
    }
    let out = exe.execute(&args.iter().collect::<Vec<_>>()).unwrap();
    out[0].to_host().unwrap().chunks(4).map(|c| i32::from_le_bytes(c.try_into().unwrap())).collect()
}

/// The locator's reductions of watched nodes (`FiniteStats`: the count of non-finite elements and the range; nodes
/// of one dtype and size stacked into one reduction by rows) compile on the real CPU plugin and give what the
/// reference interpreter gives: f32, f16, bf16 and f64 nodes, stacked ones, an empty one, one all NaN, and a count
/// past f32's exact integers (2^24 + 3 infinities); and the same with 16-bit nodes widened to f32 first, as the CPU's
/// locator reduces them.
#[test]
fn the_locators_stats_on_the_plugin_match_the_reference() {
    for widen in [false, true] {
        locators_stats_match_the_reference(widen);
    }
}

fn locators_stats_match_the_reference(widen: bool) {
    use lazuli_hlo::finite::stats;
    use lazuli_hlo::{emit, EmitOptions, FiniteStats, Graph, Loc, TensorType};
    use lazuli_pjrt::{provision, Client, ClientOptions, CompileOptions, ElementType, Plugin};
    use ndarray::{ArrayD, IxDyn};

    let loc = Loc::caller();
    let big = (1 << 24) + 3;
    let specs: [(DType, Vec<f64>); 10] = [
        (DType::F32, vec![1.5, -3.0, f64::INFINITY, 2.0, f64::NAN]),
        (DType::F16, vec![0.25, -8.0, 70000.0]), // 70000 is past f16's largest: inf
        (DType::BF16, vec![f64::NAN; 4]),
        (DType::F64, vec![-1e300, 1e300, f64::NEG_INFINITY]),
        (DType::F32, vec![]),
        (DType::F32, vec![f64::INFINITY; big]),
        // Stacked with the first: f32 of its size.
        (DType::F32, vec![-0.5, 7.0, 1.0, 2.0, 3.0]),
        (DType::F32, vec![f64::NEG_INFINITY, 0.0, 0.0, 9.0, -9.5]),
        // Stacked with each other: bf16 and f64 of one size.
        (DType::BF16, vec![1.0, -2.0, 4.0, 8.0]),
        (DType::F64, vec![f64::NAN, 1.0, 2.0]),
    ];
    let mut g = Graph::new();
    let xs: Vec<_> = specs.iter().map(|(dt, v)| g.parameter(TensorType::new(*dt, [v.len()]), loc)).collect();
    let groups = stats(&mut g, &xs, lazuli_hlo::finite::GROUP_TENSORS, usize::MAX, widen, loc).unwrap();
    assert!(groups.iter().any(|(_, of)| of.windows(2).any(|w| w == [xs[0], xs[6]])), "the first f32 nodes stacked");
    g.outputs = groups.iter().map(|&(v, _)| v).collect();
    let values: Vec<ArrayD<f64>> =
        specs.iter().map(|(_, v)| ArrayD::from_shape_vec(IxDyn(&[v.len()]), v.clone()).unwrap()).collect();
    let want = g.evaluate(&values).unwrap();

    let plugin = Plugin::load(provision::cpu_plugin_path().unwrap()).unwrap();
    let client = Client::new(&plugin, &ClientOptions::new().cpu_device_count(1)).unwrap();
    // As lazuli compiles every program: min and max propagate NaN (XLA's fast min/max off).
    let mut options = CompileOptions::default();
    options.xla_options.push(("xla_cpu_enable_fast_min_max".into(), lazuli_pjrt::XlaOption::Bool(false)));
    let exe = client.compile(&emit(&g, &EmitOptions::default()), &options).unwrap();
    let device = &client.devices()[0];
    let mut args = Vec::new();
    for (dt, v) in &specs {
        let (bytes, ty): (Vec<u8>, _) = match dt {
            DType::F16 => (v.iter().flat_map(|&e| half::f16::from_f64(e).to_le_bytes()).collect(), ElementType::F16),
            DType::BF16 => (v.iter().flat_map(|&e| half::bf16::from_f64(e).to_le_bytes()).collect(), ElementType::BF16),
            DType::F64 => (v.iter().flat_map(|&e| e.to_le_bytes()).collect(), ElementType::F64),
            _ => (v.iter().flat_map(|&e| (e as f32).to_le_bytes()).collect(), ElementType::F32),
        };
        args.push(client.buffer_from_host(&bytes, ty, &[v.len() as i64], device).unwrap());
    }
    let out = exe.execute(&args.iter().collect::<Vec<_>>()).unwrap();
    let decode = |dtype: DType, bytes: Vec<u8>| -> Vec<f64> {
        match dtype {
            DType::F64 => bytes.chunks(8).map(|c| f64::from_le_bytes(c.try_into().unwrap())).collect(),
            _ => bytes.chunks(4).map(|c| f32::from_le_bytes(c.try_into().unwrap()) as f64).collect(),
        }
    };
    let mut seen = 0;
    for (((all, of), got), want) in groups.iter().zip(&out).zip(&want) {
        let dtype = g.nodes[*all].ty.dtype;
        let got = decode(dtype, got.to_host().unwrap());
        let want: Vec<f64> = want.iter().copied().collect();
        for (j, &x) in of.iter().enumerate() {
            let (got, want) = (FiniteStats::read(dtype, &got[3 * j..]), FiniteStats::read(dtype, &want[3 * j..]));
            let same = |a: f64, b: f64| a == b || (a.is_nan() && b.is_nan());
            assert!(
                got.0 == want.0 && same(got.1, want.1) && same(got.2, want.2),
                "node {x}: {got:?} against {want:?}"
            );
            seen += 1;
        }
    }
    assert_eq!(seen, specs.len());
    // The count past 2^24 came through exactly.
    let (i, j) =
        groups.iter().enumerate().find_map(|(i, (_, of))| Some((i, of.iter().position(|&x| x == xs[5])?))).unwrap();
    let host = decode(DType::F32, out[i].to_host().unwrap());
    assert_eq!(FiniteStats::read(DType::F32, &host[3 * j..]).0, big as u64);
}

/// The locator counts only ops that can make a non-finite value, not those that move values (transpose, select,
/// reshape, …): a `-inf` made by a `log`, moved through a transpose and a select that keeps it, then multiplied,
/// is located at the `log`; an output that is a reshape is named with its own count.
#[test]
fn a_value_moved_by_layout_ops_is_located_where_it_was_made() {
    if child::alone(module_path!(), "a_value_moved_by_layout_ops_is_located_where_it_was_made") {
        return; // the runtime's configuration is process-wide
    }
    init(CheckFinite::Stop);
    let w = Tensor::from_slice(&[0.0f32, 1.0, 2.0, 3.0], &[2, 2]);
    let line = line!() + 1;
    let y = w.log();
    let moved = y.transpose(&[1, 0]);
    let kept = moved.gt(-1.0e30).select(&moved, &moved);
    let _product = &kept * 2.0;
    let _flat = kept.reshape(&[4]);
    lazuli::sync().unwrap();
    let e = lazuli::wait().unwrap_err();
    let (op, at, report) = located(&e);
    assert_eq!((op, at.file, at.line), ("log", file!(), line), "{report}");
    assert!(report.contains("f32[4] recorded at"), "the reshaped output is named: {report}");
    assert!(report.contains("1 of 4 non-finite"), "{report}");
}

/// A `-inf` mask is meant to be there: an add of a mask makes `-inf` from a non-finite operand and is passed over,
/// and the `log` after it, which makes `-inf` from finite values, is found. The mask may be a constant compiled in
/// (`Tensor::constant`; reduced through an optimization barrier, so that XLA does not fold its reduction at
/// compile time) or a host value, an input of the step (`Tensor::full`): an op that made non-finite values from
/// finite ones is named before a non-finite input.
#[test]
fn a_mask_is_counted_and_passed_over() {
    if child::alone(module_path!(), "a_mask_is_counted_and_passed_over") {
        return; // the runtime's configuration is process-wide
    }
    init(CheckFinite::Stop);
    let w = Tensor::from_slice(&[0.5f32, 1.0, 2.0, 3.0], &[2, 2]);
    let compiled_in = Tensor::constant(f64::NEG_INFINITY, DType::F32).broadcast_to(&[2, 2]).tril(0);
    let host = Tensor::full(&[2, 2], f64::NEG_INFINITY, DType::F32).tril(0);
    let _masked = &(&w + &compiled_in) * &host;
    let line = line!() + 1;
    let _y = (&w - 0.5).log();
    lazuli::sync().unwrap();
    let e = lazuli::wait().unwrap_err();
    let (op, at, report) = located(&e);
    assert_eq!((op, at.file, at.line), ("log", file!(), line), "{report}");
    assert!(report.contains("operand 0: f32[2,2]: min 0e0, max 2.5e0, 0 NaN, 0 inf"), "{report}");
}
