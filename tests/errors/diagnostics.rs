//! Graph-break detection, recompile explanations and strict mode, checked through captured events.
//! The step counter, the capture and strict mode are process-wide: each test runs alone in a child process (the
//! other tests of the binary would add their programs and see strict mode), and they take turns on `SERIAL`.

use std::sync::Mutex;

use lazuli::diagnostics::{events, report, strict_scope, Budget, DiffKind, EventKind};
use lazuli::nn::{Activation, Gpt, GptConfig, HostRng, Mlp};
use lazuli::{AdamW, DType, Module, Optimizer, Sgd, Tensor};

use crate::common::child;

static SERIAL: Mutex<()> = Mutex::new(());

fn site(line: u32) -> String {
    format!("{}:{line}", file!())
}

#[test]
fn each_cause_is_reported_at_its_line() {
    if child::alone(module_path!(), "each_cause_is_reported_at_its_line") {
        return; // the step counter, the capture and strict mode are process-wide
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let x = Tensor::from_slice(&[1.0f32, 2.0, 3.0], &[3]);
    lazuli::sync().unwrap();
    events::start_capture();
    let y = (&x * 2.0).sum_all();
    let l_item = line!() + 1;
    assert_eq!(y.item::<f32>().unwrap(), 12.0);
    let z = &x + 1.0;
    let l_vec = line!() + 1;
    assert_eq!(z.to_vec::<f32>().unwrap(), vec![2.0, 3.0, 4.0]);
    let c = (&x * 3.0).sum_all();
    let l_if = line!() + 1;
    let big = c > 10.0;
    assert!(big);
    let l_display = line!() + 1;
    let d = &x * 4.0;
    assert_eq!(format!("{d}"), "[4, 8, 12] : f32[3]");
    let _pending = &x - 1.0;
    let l_sync = line!() + 1;
    lazuli::sync().unwrap();
    let ev = events::take_captured();

    let programs: Vec<_> = ev.iter().filter(|e| e.kind == EventKind::Program).collect();
    let got: Vec<(String, String, u32)> =
        programs.iter().map(|e| (e.cause.clone(), e.site(), e.program_in_step)).collect();
    assert_eq!(
        got,
        vec![
            ("item".into(), site(l_item), 1),
            ("to_vec".into(), site(l_vec), 2),
            ("host_control_flow".into(), site(l_if), 3),
            // Display cannot see the caller's line; it names the line that recorded the tensor.
            ("display".into(), site(l_display), 4),
            ("sync".into(), site(l_sync), 5),
        ]
    );
    assert!(programs.iter().all(|e| e.step == programs[0].step));
    assert!(ev.iter().any(|e| e.kind == EventKind::Read && e.site() == site(l_item) && e.bytes_to_host == 4));
    assert!(ev.iter().any(|e| e.kind == EventKind::StepEnd));

    let r = report::analyse(&ev);
    assert_eq!(r.steps_with_breaks, 1);
    let sites: Vec<(String, String)> = r.breaks.iter().map(|b| (b.cause.clone(), b.site.clone())).collect();
    for want in [("item", l_item), ("to_vec", l_vec), ("host_control_flow", l_if), ("display", l_display)] {
        assert!(sites.contains(&(want.0.to_string(), site(want.1))), "{want:?} in {sites:?}");
    }
    let text = report::render(&r);
    assert!(text.contains(&format!("host_control_flow at {}", site(l_if))), "{text}");
    assert!(text.contains("fix: read the value after the step boundary"), "{text}");
}

/// The explanation of the next compile of `f`, which must miss the cache.
fn explain_miss(f: impl FnOnce()) -> Vec<String> {
    differences_of_miss(f).1
}

/// The differences (kind, cause site) and the explanation of the next compile of `f`, which must miss the cache.
fn differences_of_miss(f: impl FnOnce()) -> (Vec<(DiffKind, String)>, Vec<String>) {
    events::start_capture();
    f();
    let ev = events::take_captured();
    let miss = ev.iter().find(|e| e.kind == EventKind::Program && !e.cache_hit).expect("a compile");
    (miss.differences.iter().map(|d| (d.kind, d.site.clone())).collect(), miss.explanation.clone())
}

#[test]
fn recompile_explanations_name_the_input_or_the_op() {
    if child::alone(module_path!(), "recompile_explanations_name_the_input_or_the_op") {
        return; // the step counter, the capture and strict mode are process-wide
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let chain = |x: &Tensor| x.sin().cos().tanh().exp().sum_all();

    // A changed shape.
    let x = Tensor::from_slice(&[0.5f32; 7 * 13], &[7, 13]);
    chain(&x).materialize().unwrap();
    let l_now = line!() + 1;
    let why = explain_miss(|| chain(&Tensor::from_slice(&[0.5f32; 8 * 13], &[8, 13])).materialize().unwrap());
    assert!(why[0].starts_with(&format!("input 0 (recorded at {}:", site(l_now))), "{why:?}");
    assert!(why[0].ends_with("now f32[8,13], before f32[7,13]"), "{why:?}");

    // A changed dtype.
    chain(&Tensor::from_slice(&[0.5f32; 9 * 13], &[9, 13])).materialize().unwrap();
    let why = explain_miss(|| chain(&Tensor::from_slice(&[0.5f64; 9 * 13], &[9, 13])).materialize().unwrap());
    assert!(why[0].ends_with("now f64[9,13], before f32[9,13]"), "{why:?}");

    // A changed op: the same line shape, another operator.
    let y = Tensor::from_slice(&[1.0f32; 11 * 3], &[11, 3]);
    let l_add = line!() + 1;
    (&y + &y).abs().rsqrt().sum_all().materialize().unwrap();
    let l_mul = line!() + 1;
    let why = explain_miss(|| (&y * &y).abs().rsqrt().sum_all().materialize().unwrap());
    assert!(
        why.iter().any(|l| l.starts_with(&format!("first different op: {}:", site(l_mul)))
            && l.contains(" mul (now) vs ")
            && l.contains(&format!("{}:", site(l_add)))
            && l.contains(" add (before)")),
        "{why:?}"
    );

    // An extra op.
    let w = Tensor::from_slice(&[1.0f32; 5 * 17], &[5, 17]);
    w.sqrt().sum(&[0]).materialize().unwrap();
    let l_extra = line!() + 1;
    let why = explain_miss(|| w.sqrt().sum(&[0]).exp().materialize().unwrap());
    assert!(
        why.iter().any(|l| l.contains("1 more op(s)") && l.contains(&format!("exp recorded at {}:", site(l_extra)))),
        "{why:?}"
    );

    // A constant compiled into the program.
    let v = Tensor::from_slice(&[1.0f32; 19], &[19]);
    (&v + Tensor::ones(&[19], DType::F32)).log().materialize().unwrap();
    let l_const = line!() + 1;
    let why = explain_miss(|| (&v + Tensor::zeros(&[19], DType::F32)).log().materialize().unwrap());
    assert!(
        why.iter().any(|l| l.starts_with(&format!("a constant recorded at {}:", site(l_const)))
            && l.contains("is 0 now, 1 before")),
        "{why:?}"
    );
}

#[test]
fn a_loop_that_runs_another_number_of_times_is_a_loop_count_at_its_line() {
    if child::alone(module_path!(), "a_loop_that_runs_another_number_of_times_is_a_loop_count_at_its_line") {
        return; // the step counter, the capture and strict mode are process-wide
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // Forward and backward: each iteration records its ops once and their gradients some more times.
    let l_loop = line!() + 5;
    let step = |w: &Tensor, n: usize| {
        let mut h = w.clone();
        for _ in 0..n {
            // Used twice per iteration, so its gradient accumulates (an add per iteration, from the second on).
            h = h.tanh() * 0.9 + &h;
        }
        h.sum_all().backward();
        let g = w.grad().unwrap();
        w.zero_grad();
        g.materialize().unwrap();
    };
    let w = Tensor::from_slice(&[0.3f32; 2 * 9], &[2, 9]).requires_grad();
    step(&w, 2);
    let (why, text) = differences_of_miss(|| step(&w, 5));
    assert_eq!(why, vec![(DiffKind::LoopCount, site(l_loop))], "{text:?}");
    let want = format!("the loop at {} recorded its ops 5 times, before 2", site(l_loop));
    assert!(text[0].starts_with(&want), "{text:?}");
    // From one iteration to several: the accumulating add is new, and part of the loop.
    let w = Tensor::from_slice(&[0.3f32; 3 * 9], &[3, 9]).requires_grad();
    step(&w, 1);
    let (why, text) = differences_of_miss(|| step(&w, 4));
    assert_eq!(why, vec![(DiffKind::LoopCount, site(l_loop))], "{text:?}");
    assert!(text[0].contains("recorded its ops 4 times, before 1"), "{text:?}");
}

#[test]
fn several_causes_in_one_compile_are_each_at_their_line() {
    if child::alone(module_path!(), "several_causes_in_one_compile_are_each_at_their_line") {
        return; // the step counter, the capture and strict mode are process-wide
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (l_batch, l_loop, l_const) = (line!() + 2, line!() + 5, line!() + 7);
    let f = |rows: usize, passes: usize, scale: f64| {
        let x = Tensor::from_slice(&vec![0.5f32; rows * 5], &[rows, 5]);
        let mut h = x.sin();
        for _ in 0..passes {
            h = h.cos() + 1.0;
        }
        let scale = Tensor::constant(scale, DType::F32);
        // A mean divides by the element count: a constant that follows from the shape, not a cause.
        (h * scale).mean_all().materialize().unwrap();
    };
    f(7, 2, 0.5);
    let (why, text) = differences_of_miss(|| f(9, 3, 0.25));
    let want = vec![
        (DiffKind::InputType, site(l_batch)),
        (DiffKind::LoopCount, site(l_loop)),
        (DiffKind::Constant, site(l_const)),
    ];
    assert_eq!(why, want, "{text:?}");
    assert!(text.iter().any(|l| l.ends_with("now f32[9,5], before f32[7,5]")), "{text:?}");
    assert!(text.iter().any(|l| l.contains("recorded its ops 3 times, before 2")), "{text:?}");
    assert!(text.iter().any(|l| l.contains("is 0.25 now, 0.5 before")), "{text:?}");
    assert_eq!(text.len(), 3, "nothing else: {text:?}");
    // Each cause alone is explained alone, against the graph that differs only there.
    let (why, _) = differences_of_miss(|| f(9, 3, 0.125));
    assert_eq!(why, vec![(DiffKind::Constant, site(l_const))]);
    let (why, _) = differences_of_miss(|| f(9, 4, 0.125));
    assert_eq!(why, vec![(DiffKind::LoopCount, site(l_loop))]);
}

#[test]
fn a_constant_that_changes_every_step_is_one_report_entry() {
    if child::alone(module_path!(), "a_constant_that_changes_every_step_is_one_report_entry") {
        return; // the step counter, the capture and strict mode are process-wide
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let v = Tensor::from_slice(&[1.0f32; 29], &[29]);
    let l_const = line!() + 2;
    let step = |i: usize| {
        let _y = (&v * Tensor::constant(i as f64, DType::F32)).exp();
        lazuli::sync().unwrap();
    };
    step(0);
    events::start_capture();
    for i in 1..12 {
        step(i);
    }
    let r = report::analyse(&events::take_captured());
    assert_eq!(r.recompile_sites.len(), 1, "{}", report::render(&r));
    let c = &r.recompile_sites[0];
    assert_eq!((c.kind, c.site.clone(), c.count, c.steps.len()), (DiffKind::Constant, site(l_const), 11, 11));
    assert_eq!(c.materialized_at, vec![format!("sync at {}", site(l_const + 1))]);
    assert!(c.advice.contains("host scalar operand"), "{}", c.advice);
    let text = report::render(&r);
    assert!(text.contains(&format!("constant at {}: 11 compile(s) in step(s) ", site(l_const))), "{text}");
}

fn mlp_step(model: &Mlp, opt: &mut Sgd, rows: usize) -> lazuli::Result<f32> {
    let x = Tensor::from_slice(&vec![0.5f32; rows * 3], &[rows, 3]);
    let loss = model.forward(&x).pow(2.0).mean_all();
    loss.backward();
    opt.step();
    opt.zero_grad();
    lazuli::sync()?;
    loss.item::<f32>()
}

#[test]
fn strict_mode_refuses_breaks_and_recompiles_and_passes_a_clean_loop() {
    if child::alone(module_path!(), "strict_mode_refuses_breaks_and_recompiles_and_passes_a_clean_loop") {
        return; // the step counter, the capture and strict mode are process-wide
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let model = Mlp::new(&mut HostRng::new(5), &[3, 8, 1], Activation::Tanh, DType::F32);
    let mut opt = Sgd::new(model.named_params(), 0.1);
    let _strict = strict_scope(Budget::training());
    lazuli::sync().unwrap();
    for _ in 0..4 {
        mlp_step(&model, &mut opt, 4).expect("a clean loop passes strict mode");
    }
    // A break: item() before the step boundary.
    let x = Tensor::from_slice(&[0.5f32; 12], &[4, 3]);
    let loss = model.forward(&x).pow(2.0).mean_all();
    let l_item = line!() + 1;
    let e = loss.item::<f32>().unwrap_err().to_string();
    assert!(e.contains("graph break") && e.contains(&format!("{}:", site(l_item))) && e.contains("item"), "{e}");
    // Nothing ran: finishing the step as usual is the same cached program.
    loss.backward();
    opt.step();
    opt.zero_grad();
    lazuli::sync().unwrap();
    assert!(loss.item::<f32>().is_ok());
    // A recompile after warm-up: another batch size.
    let e = mlp_step(&model, &mut opt, 5).unwrap_err().to_string();
    assert!(e.contains("recompile") && e.contains("now f32[5,3], before f32[4,3]"), "{e}");
}

#[test]
fn chrome_trace_has_the_programs_on_a_timeline() {
    if child::alone(module_path!(), "chrome_trace_has_the_programs_on_a_timeline") {
        return; // the step counter, the capture and strict mode are process-wide
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    events::start_capture();
    let a = Tensor::from_slice(&[1.0f32, 2.0], &[2]);
    let b = (&a * 5.0).exp().sum_all();
    lazuli::sync().unwrap();
    let _ = b.item::<f32>().unwrap();
    let ev = events::take_captured();
    let trace = report::chrome_trace(&ev);
    let text = serde_json::to_string(&trace).unwrap();
    let back: serde_json::Value = serde_json::from_str(&text).unwrap();
    let names: Vec<String> =
        back["traceEvents"].as_array().unwrap().iter().map(|e| e["name"].as_str().unwrap().to_string()).collect();
    assert!(names.iter().any(|n| n.starts_with("execute (sync at tests/errors/diagnostics.rs:")), "{names:?}");
    assert!(names.iter().any(|n| n.starts_with("read (item at tests/errors/diagnostics.rs:")), "{names:?}");
    assert!(names.iter().any(|n| n.starts_with("end of step")), "{names:?}");
    for e in back["traceEvents"].as_array().unwrap().iter().filter(|e| e["ph"] == "X") {
        assert!(e["ts"].as_f64().unwrap() >= 0.0 && e["dur"].as_f64().unwrap() > 0.0, "{e}");
    }
}

#[test]
fn a_checkpoint_mid_step_is_reported_at_its_line() {
    if child::alone(module_path!(), "a_checkpoint_mid_step_is_reported_at_its_line") {
        return; // the step counter, the capture and strict mode are process-wide
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let layer = lazuli::nn::Linear::new(&mut HostRng::new(9), 3, 2, true, DType::F32);
    let mut opt = Sgd::new(layer.named_params(), 0.1);
    lazuli::sync().unwrap();
    events::start_capture();
    let loss = layer.forward(&Tensor::from_slice(&[1.0f32; 6], &[2, 3])).sum_all();
    loss.backward();
    opt.step();
    let path = std::env::temp_dir().join(format!("lazuli-diag-{}.safetensors", std::process::id()));
    let l_save = line!() + 1;
    lazuli::checkpoint::save(&path, &layer, Some(&opt), &[], &Default::default()).unwrap();
    lazuli::sync().unwrap();
    let ev = events::take_captured();
    std::fs::remove_file(&path).unwrap();
    let r = report::analyse(&ev);
    assert!(r.breaks.iter().any(|b| b.cause == "checkpoint" && b.site == site(l_save)), "{r:?}");
    assert!(report::render(&r).contains("save checkpoints right after lazuli::sync()"));
}

/// A GPT's step repeats its block: the forward's `n_layer` copies are found at the line that called the model (the
/// `nn` layers pass their caller's line on), and the backward's and the optimizer's per-block runs as well (the
/// block next to the head and the loss, and the first optimizer block, differ from the others: at least three
/// copies); the report lists them. An MLP whose layers all differ in shape repeats nothing.
#[test]
fn repeated_layers_are_found_and_layers_of_other_shapes_are_not() {
    if child::alone(module_path!(), "repeated_layers_are_found_and_layers_of_other_shapes_are_not") {
        return; // the capture is process-wide
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let cfg = GptConfig {
        vocab: 32,
        block_size: 16,
        n_layer: 4,
        n_head: 2,
        d_model: 16,
        dropout: 0.0,
        dtype: DType::F32,
        scan_blocks: false,
        checkpoint_blocks: false,
    };
    let model = Gpt::new(&mut HostRng::new(3), cfg);
    let mut opt = AdamW::new(model.named_params(), 1e-3);
    let ids: Vec<i32> = (0..16).map(|i| i * 7 % 32).collect();
    let ids = Tensor::from_slice(&ids, &[2, 8]);
    lazuli::sync().unwrap();
    events::start_capture();
    let l_loss = line!() + 1;
    model.loss(&ids, &ids).backward();
    opt.step();
    opt.zero_grad();
    lazuli::sync().unwrap();
    let ev = events::take_captured();
    let compiled: Vec<_> = ev.iter().filter(|e| e.kind == EventKind::Program && !e.cache_hit).collect();
    assert_eq!(compiled.len(), 1);
    let repeats = &compiled[0].repeats;
    let forward = &repeats[0];
    assert!(forward.starts_with("4 copies of ") && forward.contains(&site(l_loss)), "{repeats:#?}");
    assert!(forward.contains("as one scanned body"), "{forward}");
    let runs = repeats.iter().filter(|r| r.starts_with("4 copies") || r.starts_with("3 copies")).count();
    assert!(runs >= 3, "forward, backward and optimizer: {repeats:#?}");
    let text = report::render(&report::analyse(&ev));
    assert!(text.contains("repeated structure") && text.contains(forward.as_str()), "{text}");

    let widths = [3, 5, 7, 9, 11, 13, 1];
    let mlp = Mlp::new(&mut HostRng::new(5), &widths, Activation::Tanh, DType::F32);
    events::start_capture();
    let x = Tensor::from_slice(&[0.5f32; 12], &[4, 3]);
    mlp.forward(&x).pow(2.0).mean_all().backward();
    lazuli::sync().unwrap();
    let ev = events::take_captured();
    let compiled: Vec<_> = ev.iter().filter(|e| e.kind == EventKind::Program && !e.cache_hit).collect();
    assert_eq!(compiled.len(), 1);
    assert_eq!(compiled[0].repeats, Vec::<String>::new());
}

/// A run without programs (an empty events file) reports zero times, not "-0.0 ms" (a float sum of nothing).
#[test]
fn an_empty_run_reports_zero_times() {
    let text = report::render(&report::analyse(&[]));
    assert!(text.contains("time: compile 0.0 ms | execute 0.0 ms | transfer 0.0 ms"), "{text}");
    assert!(text.contains("no graph breaks, no recompiles after warm-up"), "{text}");
}
