//! Sharding on 8 virtual CPU devices: attribute strings that XLA runs, training that matches one device for every
//! plan, state that stays sharded between steps, and clear errors for bad specs. The runtime on 8 devices and the
//! counters are per process: each test runs alone in a child process.

use std::sync::Mutex;

use lazuli::nn::{Activation, HostRng, Mlp};
use lazuli::{mesh, AdamW, Config, DType, Mesh, Module, Optimizer, PartitionSpec, SplitUpdate, Tensor};

use crate::common::child;

static SERIAL: Mutex<()> = Mutex::new(());

fn eight_devices() {
    lazuli::init(Config { cpu_device_count: 8, ..Config::default() }).unwrap();
}

fn p(dims: &[&[&str]]) -> PartitionSpec {
    PartitionSpec::new(dims)
}

#[test]
fn every_spec_form_compiles_runs_and_gathers() {
    if child::alone(module_path!(), "every_spec_form_compiles_runs_and_gathers") {
        return; // the runtime (on 8 devices) and the counters are process-wide: alone in a process of its own
    }
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    eight_devices();
    let m = mesh(&[("data", 4), ("model", 2)]).unwrap();
    let vals: Vec<f32> = (0..64).map(|i| i as f32 * 0.5 - 7.0).collect();
    let x = Tensor::from_slice(&vals, &[8, 8]);
    let want_sum: Vec<f32> = (0..8).map(|r| (0..8).map(|c| (vals[r * 8 + c] * 2.0).exp().ln()).sum()).collect();
    for spec in [
        p(&[&[], &[]]),
        p(&[&["data"], &[]]),
        p(&[&[], &["model"]]),
        p(&[&["data"], &["model"]]),
        p(&[&["model"], &["data"]]),
        p(&[&["data", "model"], &[]]),
        p(&[&["model", "data"], &[]]),
    ] {
        let xs = x.shard(&m, &spec);
        assert_eq!(xs.to_vec::<f32>().unwrap(), vals, "{spec}: placing and gathering round-trips");
        let y = (&xs * 2.0).exp().log().sum(&[1]);
        let got = y.to_vec::<f32>().unwrap();
        for (a, b) in got.iter().zip(&want_sum) {
            assert!((a - b).abs() < 1e-4, "{spec}: {got:?} vs {want_sum:?}");
        }
        let z = &xs + 1.0;
        z.materialize().unwrap();
        assert_eq!(z.sharding().unwrap().spec(), spec, "an elementwise result keeps the input's layout");
        assert_eq!(z.to_vec::<f32>().unwrap(), vals.iter().map(|v| v + 1.0).collect::<Vec<_>>());
    }
    // A constraint inside the graph.
    let c = (&x.shard(&m, &p(&[&["data"], &[]])) * 3.0).with_sharding_constraint(&m, &p(&[&[], &["model"]]));
    c.materialize().unwrap();
    assert_eq!(c.sharding().unwrap().spec(), p(&[&[], &["model"]]));
    assert_eq!(c.to_vec::<f32>().unwrap(), vals.iter().map(|v| v * 3.0).collect::<Vec<_>>());
}

/// Parameter placement of the plans for an MLP: dp (replicated), fsdp (weights split over data on dim 0), tp
/// (Megatron: first layer by columns, second by rows over model), 2d (tp over model plus fsdp over data).
fn place(model: &Mlp, m: &Mesh, plan: &str) {
    let has = |a: &str| m.axes().iter().any(|(n, _)| n == a);
    lazuli::shard_params(model, m, |name, t| {
        let rank = t.rank();
        let layer: usize = name.split('.').nth(1).unwrap().parse().unwrap();
        let weight = name.ends_with("weight");
        match plan {
            "dp" => PartitionSpec::replicated(rank),
            "fsdp" if weight => PartitionSpec::split(rank, 0, "data"),
            "tp" | "2d" if weight => {
                let mut s = PartitionSpec::split(rank, if layer.is_multiple_of(2) { 1 } else { 0 }, "model");
                if plan == "2d" && has("data") {
                    s.0[if layer.is_multiple_of(2) { 0 } else { 1 }].push("data".into());
                }
                s
            }
            "tp" | "2d" if layer.is_multiple_of(2) => PartitionSpec::split(rank, 0, "model"),
            _ => PartitionSpec::replicated(rank),
        }
    });
}

/// `steps` AdamW steps of the MLP, placed by `plan` on its mesh (or on one device), each step reading its loss.
/// Each step after the first runs `programs` cached programs (2 where the step is split before its update).
fn train_in(plan: Option<(&Mesh, &str)>, steps: usize, programs: u64) -> (Vec<f32>, Mlp) {
    let model = Mlp::new(&mut HostRng::new(11), &[16, 32, 32, 8], Activation::Tanh, DType::F32);
    if let Some((m, plan)) = plan {
        place(&model, m, plan);
    }
    let mut opt = AdamW::new(model.named_params(), 1e-2);
    let mut rng = HostRng::new(12);
    let xs: Vec<f32> = (0..32 * 16).map(|_| rng.normal() as f32).collect();
    let ys: Vec<f32> = (0..32 * 8).map(|_| rng.normal() as f32).collect();
    let mut x = Tensor::from_slice(&xs, &[32, 16]);
    if let Some((m, _)) = plan {
        if m.axes().iter().any(|(n, _)| n == "data") {
            x = x.shard(m, &PartitionSpec::split(2, 0, "data"));
        }
    }
    let y = Tensor::from_slice(&ys, &[32, 8]);
    let mut losses = Vec::new();
    for step in 0..steps {
        let before = lazuli::metrics();
        let loss = (model.forward(&x) - &y).pow(2.0).mean_all();
        loss.backward();
        opt.step();
        opt.zero_grad();
        lazuli::sync().unwrap();
        losses.push(loss.item::<f32>().unwrap());
        let d = lazuli::metrics() - before;
        if step > 0 {
            assert_eq!((d.compiles, d.executions), (0, programs), "step {step}: {d}");
            assert_eq!(d.bytes_to_host, 4, "step {step}: only the loss comes back, nothing is gathered ({d})");
        }
    }
    (losses, model)
}

fn train(plan: Option<(&Mesh, &str)>, steps: usize) -> (Vec<f32>, Mlp) {
    train_in(plan, steps, 1)
}

/// The step split before its update (`LAZULI_SPLIT_UPDATE=on`, the default on NVIDIA GPUs) on a mesh: the first
/// program's sharded gradients feed the update, and sharded plans train as one device does.
#[test]
fn a_step_split_before_its_update_on_a_mesh_matches_one_device() {
    if child::alone(module_path!(), "a_step_split_before_its_update_on_a_mesh_matches_one_device") {
        return; // the runtime's configuration and the counters are process-wide
    }
    lazuli::init(Config { cpu_device_count: 4, split_update: SplitUpdate::On, ..Config::default() }).unwrap();
    let (reference, _) = train_in(None, 10, 2);
    for (plan, axes) in [("fsdp", vec![("data", 4)]), ("2d", vec![("data", 2), ("model", 2)])] {
        let m = mesh(&axes).unwrap();
        let (losses, _) = train_in(Some((&m, plan)), 10, 2);
        for (i, (a, b)) in losses.iter().zip(&reference).enumerate() {
            assert!((a - b).abs() <= 2e-5 * (1.0 + b.abs()), "{plan}: step {i}: {a} vs {b}");
        }
    }
}

#[test]
fn every_plan_on_2_4_and_8_devices_matches_one_device() {
    if child::alone(module_path!(), "every_plan_on_2_4_and_8_devices_matches_one_device") {
        return; // the runtime (on 8 devices) and the counters are process-wide: alone in a process of its own
    }
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    eight_devices();
    let (reference, _) = train(None, 20);
    for n in [2usize, 4, 8] {
        for plan in ["dp", "fsdp", "tp", "2d"] {
            let axes: Vec<(&str, usize)> = match plan {
                "dp" | "fsdp" => vec![("data", n)],
                "tp" => vec![("model", n)],
                _ => vec![("data", n / 2), ("model", 2)],
            };
            let m = mesh(&axes).unwrap();
            let (losses, model) = train(Some((&m, plan)), 20);
            for (i, (a, b)) in losses.iter().zip(&reference).enumerate() {
                assert!((a - b).abs() <= 2e-5 * (1.0 + b.abs()), "{plan} on {n}: step {i}: {a} vs {b}");
            }
            // Parameters are still laid out as placed.
            let w0 = model.layers[0].weight.get();
            let s = w0.sharding().expect("placed");
            let want = match plan {
                "dp" => PartitionSpec::replicated(2),
                "fsdp" => PartitionSpec::split(2, 0, "data"),
                "tp" => PartitionSpec::split(2, 1, "model"),
                _ => p(&[&["data"], &["model"]]),
            };
            assert_eq!(s.spec(), want, "{plan} on {n}");
        }
    }
}

#[test]
fn bad_specs_and_meshes_are_clear_errors_at_the_users_line() {
    if child::alone(module_path!(), "bad_specs_and_meshes_are_clear_errors_at_the_users_line") {
        return; // the runtime (on 8 devices) and the counters are process-wide: alone in a process of its own
    }
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    eight_devices();
    let m = mesh(&[("data", 4)]).unwrap();
    let x = Tensor::from_slice(&[1.0f32; 12], &[6, 2]);
    let panic_text = |f: &dyn Fn()| {
        let e = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_err();
        e.downcast_ref::<String>().cloned().unwrap()
    };
    let line = line!() + 1;
    let e = panic_text(&|| drop(x.shard(&m, &p(&[&["batch"], &[]]))));
    assert!(e.contains("no axis named \"batch\"") && e.contains(&format!("{}:{line}:", file!())), "{e}");
    let line = line!() + 1;
    let e = panic_text(&|| drop(x.shard(&m, &p(&[&["data"], &[]]))));
    assert!(
        e.contains("dimension 0 of size 6 is not divisible by 4") && e.contains(&format!("{}:{line}:", file!())),
        "{e}"
    );
    let line = line!() + 1;
    let e = mesh(&[("data", 16)]).unwrap_err().to_string();
    assert!(e.contains("needs 16 devices, the runtime has 8") && e.contains(&format!("{}:{line}", file!())), "{e}");
    // A value not computed yet, sharded onto another mesh than its program's inputs: the read's error names the
    // constraint's line and both meshes.
    let on_m = Tensor::from_slice(&[1.0f32; 16], &[8, 2]).shard(&m, &p(&[&["data"], &[]]));
    let other = mesh(&[("data", 8)]).unwrap();
    let line = line!() + 1;
    let elsewhere = (&on_m * 2.0).shard(&other, &p(&[&["data"], &[]]));
    let e = elsewhere.to_vec::<f32>().unwrap_err().to_string();
    assert!(e.contains(&format!("the sharding constraint at {}:{line}:", file!())) && e.contains("two meshes"), "{e}");
}

/// A value its program makes from constants alone (zeros, ones, an arange) and then shards runs on the mesh of its
/// constraint: the values are right and laid out as asked, and later programs take it as a placed input.
#[test]
fn a_value_made_from_constants_runs_on_its_constraints_mesh() {
    if child::alone(module_path!(), "a_value_made_from_constants_runs_on_its_constraints_mesh") {
        return; // the runtime (on 8 devices) and the counters are process-wide: alone in a process of its own
    }
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    eight_devices();
    let m = mesh(&[("data", 4), ("model", 2)]).unwrap();
    let rows = p(&[&["data"], &[]]);
    let zeros = Tensor::zeros(&[8, 2], DType::F32).shard(&m, &rows);
    assert_eq!(zeros.to_vec::<f32>().unwrap(), vec![0.0; 16]);
    assert_eq!(zeros.sharding().expect("laid out").spec(), rows);
    // Made from constants by ops, laid out on both axes, then read by a program with a placed input.
    let both = p(&[&["data"], &["model"]]);
    let made = (Tensor::ones(&[8, 4], DType::F32) * 3.0).with_sharding_constraint(&m, &both) + 1.0;
    let want: Vec<f32> = vec![4.0; 32];
    assert_eq!(made.to_vec::<f32>().unwrap(), want);
    let placed = Tensor::from_slice(&(0..32).map(|i| i as f32).collect::<Vec<_>>(), &[8, 4]).shard(&m, &both);
    let sum = &made + &placed;
    let want: Vec<f32> = (0..32).map(|i| i as f32 + 4.0).collect();
    assert_eq!(sum.to_vec::<f32>().unwrap(), want);
    assert_eq!(sum.sharding().expect("on the mesh").spec(), both);
}

#[test]
fn sorting_and_checked_indices_on_a_mesh() {
    if child::alone(module_path!(), "sorting_and_checked_indices_on_a_mesh") {
        return; // the runtime on 8 devices is process-wide
    }
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    eight_devices();
    let m = mesh(&[("data", 4), ("model", 2)]).unwrap();
    let vals: Vec<f32> = (0..64).map(|i| ((i * 37) % 64) as f32).collect();
    let x = Tensor::from_slice(&vals, &[8, 8]);
    // Rows split over `data`, columns over `model`: sorting each row keeps the row split and drops the other.
    let xs = x.shard(&m, &p(&[&["data"], &["model"]]));
    let (top, at) = xs.topk(3, 1);
    assert_eq!(top.to_vec::<f32>().unwrap(), x.topk(3, 1).0.to_vec::<f32>().unwrap());
    assert_eq!(at.to_vec::<i64>().unwrap(), x.argsort(1, true).slice(1, 0, 3).to_vec::<i64>().unwrap());

    // A checked lookup into a row-split table: its report is one more output of the sharded program.
    let table = x.shard(&m, &p(&[&["data"], &[]]));
    let good = table.index_select_checked(0, &Tensor::from_slice(&[7i32, 0], &[2]));
    assert_eq!(good.to_vec::<f32>().unwrap(), [&vals[56..64], &vals[0..8]].concat());
    let bad = table.index_select_checked(0, &Tensor::from_slice(&[1i32, 8], &[2]));
    let err = bad.to_vec::<f32>().unwrap_err();
    assert!(matches!(err, lazuli::Error::IndexOutOfRange { index: 8, size: 8, .. }), "{err}");
}
