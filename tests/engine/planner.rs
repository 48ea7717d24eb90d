//! The sharding planner on real recorded steps: data parallel for a small model with a large batch, a sharded plan
//! when the replicated model does not fit, readable output, overrides, applying the plan, and the CPU cost model's
//! ranking of the `sharded_train` step against the order measured on 8 virtual devices. The runtime on 8 devices
//! is per process: each test runs alone in a child process.

use std::sync::Mutex;

use lazuli::nn::{Activation, Gpt, GptConfig, HostRng, Mlp};
use lazuli::sharding::{apply_plan, plan, DeviceModel};
use lazuli::{AdamW, Config, DType, Module, Optimizer, PartitionSpec, Tensor};

use crate::common::child;

static SERIAL: Mutex<()> = Mutex::new(());

fn eight_devices() {
    lazuli::init(Config { cpu_device_count: 8, ..Config::default() }).unwrap();
}

fn loss_of(model: &Mlp, batch: usize, d_in: usize) -> Tensor {
    let x = Tensor::from_slice(&vec![0.1f32; batch * d_in], &[batch, d_in]);
    model.forward(&x).pow(2.0).mean_all()
}

#[test]
fn planner_choices_output_and_application() {
    if child::alone(module_path!(), "planner_choices_output_and_application") {
        return; // the runtime (on 8 devices) is per process: alone in a process of its own
    }
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    eight_devices();
    // Small model, large batch: replicate the weights, split the batch.
    let small = Mlp::new(&mut HostRng::new(1), &[32, 64, 64, 8], Activation::Tanh, DType::F32);
    let p = plan(&small, &loss_of(&small, 4096, 32), 4096, 8, 1e12, DeviceModel::CPU);
    assert_eq!(p.chosen().name, "dp", "{p}");
    let text = p.to_string();
    assert!(text.contains("est. step") && text.contains("layers.*.weight") && text.contains("chosen: dp"), "{text}");

    // A wide model whose replicated copy (weights, gradients, Adam moments) is over the limit: a sharded plan.
    let wide = Mlp::new(&mut HostRng::new(2), &[256, 2048, 256], Activation::Tanh, DType::F32);
    let loss = loss_of(&wide, 64, 256);
    let unlimited = plan(&wide, &loss, 64, 8, 1e12, DeviceModel::CPU);
    let replicated = unlimited.candidates.iter().find(|c| c.name == "dp").unwrap().memory_bytes;
    let param_bytes = (wide.num_params() * 4) as f64;
    assert!(replicated >= 4.0 * param_bytes, "weights, gradients and two moments: {replicated} vs {param_bytes}");
    let mut p = plan(&wide, &loss, 64, 8, 0.5 * replicated, DeviceModel::CPU);
    assert!(["fsdp", "tp", "2d"].contains(&p.chosen().name), "{p}");
    assert!(p.chosen().fits && p.chosen().memory_bytes <= 0.5 * replicated, "{p}");
    assert!(p.reason.contains("over the memory limit: dp"), "{}", p.reason);

    // Overrides, then apply: parameters are placed as the plan says and a training step runs on the mesh.
    p.choose("fsdp").unwrap();
    p.override_param("layers.1.bias", PartitionSpec::replicated(1)).unwrap();
    let mesh = apply_plan(&p, &wide).unwrap();
    assert_eq!(mesh.size(), 8);
    let w0 = wide.layers[0].weight.get();
    assert_eq!(w0.sharding().unwrap().spec(), PartitionSpec::split(2, 0, "data"));
    assert!(wide.layers[1].bias.as_ref().unwrap().get().sharding().unwrap().is_replicated());
    // The placed model trains exactly like an unplaced copy.
    let twin = Mlp::new(&mut HostRng::new(2), &[256, 2048, 256], Activation::Tanh, DType::F32);
    let run = |m: &Mlp| {
        let mut opt = AdamW::new(m.named_params(), 1e-3);
        (0..3)
            .map(|_| {
                let l = loss_of(m, 64, 256);
                l.backward();
                opt.step();
                opt.zero_grad();
                lazuli::sync().unwrap();
                l.item::<f32>().unwrap()
            })
            .collect::<Vec<f32>>()
    };
    let (a, b) = (run(&wide), run(&twin));
    for (x, y) in a.iter().zip(&b) {
        assert!((x - y).abs() <= 1e-6 + 1e-4 * y.abs(), "sharded {a:?} vs unsharded {b:?}");
    }
}

/// Memory counts the activations the backward reads, not every forward result: for `sum(0.5 (x W)² + 1)` with
/// the square written `y * y`, the only one is `y` (the square's gradient reads both operands; the matmul's reads
/// `x`, an input, and `W`, a weight; the constant factor's, the shift's and the sum's read nothing). Split over
/// the batch, each device keeps its share.
#[test]
fn memory_counts_what_the_backward_reads() {
    if child::alone(module_path!(), "memory_counts_what_the_backward_reads") {
        return; // the runtime (on 8 devices) is per process: alone in a process of its own
    }
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    eight_devices();
    let (batch, d_in, d_out) = (64, 16, 48);
    let layer = lazuli::nn::Linear::from_tensors(
        lazuli::nn::init::normal(&mut HostRng::new(4), &[d_in, d_out], 0.1, DType::F32),
        None,
    );
    let x = Tensor::from_slice(&vec![0.5f32; batch * d_in], &[batch, d_in]);
    let y = layer.forward(&x);
    let loss = (&(&(&y * &y) * 0.5) + 1.0).sum_all();
    let y_bytes = (batch * d_out * 4) as f64;
    let weight_state = (d_in * d_out * 4) as f64 * 4.0; // weight, gradient, two moments
    for devices in [1, 4] {
        let p = plan(&layer, &loss, batch, devices, 1e12, DeviceModel::CPU);
        let dp = p.candidates.iter().find(|c| c.name == "dp").unwrap();
        assert_eq!(dp.work.saved_bytes, y_bytes / devices as f64, "{p}");
        assert_eq!(dp.memory_bytes, weight_state + y_bytes / devices as f64, "{p}");
    }
}

/// `sharded_train`'s default step (2-layer GPT, d=128, 4 heads, T=64, batch 32; vocabulary about 123 bytes) on 8
/// virtual devices: the estimates rank the plans in the order of the measured median steps in BENCHMARKS.md
/// ("The planner's estimates vs measured steps, on virtual CPU devices"; the whole run is in
/// docs/perf-log/2026-11-29-planner-virtual-cpu.md). Only the estimates are computed here; nothing is timed.
#[test]
fn cpu_estimates_rank_sharded_train_plans_as_measured() {
    if child::alone(module_path!(), "cpu_estimates_rank_sharded_train_plans_as_measured") {
        return; // the runtime (on 8 devices) is per process: alone in a process of its own
    }
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    eight_devices();
    let measured = ["dp", "fsdp", "2d", "tp"];
    let cfg = GptConfig {
        vocab: 123,
        block_size: 64,
        n_layer: 2,
        n_head: 4,
        d_model: 128,
        dropout: 0.0,
        dtype: DType::F32,
        scan_blocks: false,
        checkpoint_blocks: false,
    };
    let model = Gpt::new(&mut HostRng::new(1), cfg);
    let (b, t) = (32, 64);
    let ids: Vec<i32> = (0..b * t).map(|i| (i * 31 % 123) as i32).collect();
    let x = Tensor::from_slice(&ids, &[b, t]);
    let y = Tensor::from_slice(&ids[1..].iter().chain(&[0]).copied().collect::<Vec<i32>>(), &[b, t]);
    let p = plan(&model, &model.loss(&x, &y), b, 8, 1e12, DeviceModel::CPU);
    let ranked: Vec<&str> = p.ranking().iter().map(|c| c.name).collect();
    assert_eq!(ranked, measured, "{p}");
    assert_eq!(p.chosen().name, "dp", "{p}");
    // The explanation names the terms and that the devices share cores.
    assert!(p.reason.contains("elementwise") && p.reason.contains("share 2 cores"), "{}", p.reason);
    // Replicated work shows: dp updates every parameter on every device, tp repeats the layer norms.
    let c = |n: &str| p.candidates.iter().find(|c| c.name == n).unwrap().clone();
    assert!(c("dp").update_s > 4.0 * c("fsdp").update_s, "{p}");
    assert!(c("tp").elementwise_s > c("dp").elementwise_s, "{p}");
}

/// Fused attention is one op in the graph, but the planner counts what it computes: the data-parallel plan's
/// matmul FLOPs per device are the GPT's products, attention's two included, forward and backward (3×).
#[test]
fn the_planner_counts_the_products_inside_fused_attention() {
    if child::alone(module_path!(), "the_planner_counts_the_products_inside_fused_attention") {
        return; // the runtime (on 8 devices) is per process: alone in a process of its own
    }
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    eight_devices();
    let (vocab, t, layers, heads, d) = (96, 32, 2, 4, 64);
    let cfg = GptConfig {
        vocab,
        block_size: t,
        n_layer: layers,
        n_head: heads,
        d_model: d,
        dropout: 0.0,
        dtype: DType::F32,
        scan_blocks: false,
        checkpoint_blocks: false,
    };
    let model = Gpt::new(&mut HostRng::new(3), cfg);
    let b = 16;
    let ids: Vec<i32> = (0..b * t).map(|i| (i * 7 % vocab) as i32).collect();
    let x = Tensor::from_slice(&ids, &[b, t]);
    let p = plan(&model, &model.loss(&x, &x), b, 8, 1e12, DeviceModel::CPU);
    let dp = p.candidates.iter().find(|c| c.name == "dp").unwrap();
    let rows = (b * t) as f64 / 8.0; // tokens per device
    let (d, t, heads, vocab) = (d as f64, t as f64, heads as f64, vocab as f64);
    let projections = 2.0 * rows * (d * 3.0 * d + d * d + d * 4.0 * d + 4.0 * d * d);
    let attention = 2.0 * 2.0 * rows * heads * t * (d / heads); // q kᵀ and p v, per token: T keys, hd each
    let head = 2.0 * rows * d * vocab;
    let forward = layers as f64 * (projections + attention) + head;
    assert_eq!(dp.work.matmul_flops, 3.0 * forward, "{p}");
}
