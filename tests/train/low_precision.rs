//! Low-precision copies of parameters (`Param::get_as`): training with bf16 copies kept by the optimizer is bit
//! for bit training that converts the f32 weights at each use (an MLP, and the tiny GPT scanned and with
//! recomputed blocks, SGD and AdamW, with gradient clipping); a new value, a checkpoint load and a skipped step
//! leave the copy equal to the convert of the value; copies are updated in place, inputs of the step from step 1
//! (also under strict mode) and laid out as their sharded parameters; gradients of direct and copied uses add up;
//! a non-float dtype is an error at the caller's line.

use std::panic::AssertUnwindSafe;

use lazuli::diagnostics::{strict_scope, Budget};
use lazuli::nn::{Activation, Block, Gpt, GptConfig, HostRng, Linear, Mlp, Param};
use lazuli::optim::clip_grad_norm;
use lazuli::{
    checkpoint, mesh, scaled_dot_product_attention, shard_params, AdamW, AttentionLayout, AttentionOptions,
    CheckFinite, Config, DType, Module, Optimizer, PartitionSpec, Sgd, Tensor,
};

use crate::common::child;

const LOW: DType = DType::BF16;
const F32: DType = DType::F32;

/// The bits of a float tensor's values, widened to f32 (exactly, for bf16).
fn bits(t: &Tensor) -> Vec<u32> {
    t.to_dtype(F32).to_vec::<f32>().unwrap().into_iter().map(f32::to_bits).collect()
}

fn all_bits(params: &[Param]) -> Vec<Vec<u32>> {
    params.iter().map(|p| bits(&p.get())).collect()
}

/// Every copy a parameter keeps equals the convert of its value.
fn assert_copies_follow(params: &[(String, Param)]) {
    for (name, p) in params {
        assert_eq!(bits(&p.get_as(LOW)), bits(&p.get().to_dtype(LOW)), "{name}'s copy");
    }
}

/// `x @ w` on bf16 operands with an f32 result, the weight converted here: the path without copies.
fn mm(x: &Tensor, w: &Tensor) -> Tensor {
    x.to_dtype(LOW).matmul(&w.to_dtype(LOW)).to_dtype(F32)
}

fn linear(l: &Linear, x: &Tensor) -> Tensor {
    mm(x, &l.weight.get()) + l.bias.as_ref().expect("a bias").get()
}

/// `x @ w + b` all in bf16, the weight and bias converted here: q, k and v as attention reads them.
fn linear_low(l: &Linear, x: &Tensor) -> Tensor {
    x.to_dtype(LOW).matmul(&l.weight.get().to_dtype(LOW)) + l.bias.as_ref().expect("a bias").get().to_dtype(LOW)
}

type MakeOpt = fn(Vec<(String, Param)>) -> Box<dyn Optimizer>;

fn sgd(params: Vec<(String, Param)>) -> Box<dyn Optimizer> {
    Box::new(Sgd::new(params, 0.05).momentum(0.9).weight_decay(1e-2))
}

fn adamw(params: Vec<(String, Param)>) -> Box<dyn Optimizer> {
    Box::new(AdamW::new(params, 1e-2))
}

/// Deterministic batches of a smooth target.
fn batch(step: u64) -> (Tensor, Tensor) {
    let mut rng = HostRng::new(100 + step);
    let x: Vec<f32> = (0..16 * 4).map(|_| rng.normal() as f32).collect();
    let y: Vec<f32> = x.chunks(4).map(|r| (r[0] * r[1] - r[2] + 0.5 * r[3]).tanh()).collect();
    (Tensor::from_slice(&x, &[16, 4]), Tensor::from_slice(&y, &[16, 1]))
}

fn mlp(copies: bool) -> Mlp {
    let mut m = Mlp::new(&mut HostRng::new(5), &[4, 32, 32, 1], Activation::Tanh, F32);
    if copies {
        m.layers = m.layers.into_iter().map(|l| l.with_matmul_dtype(LOW)).collect();
    }
    m
}

/// The MLP with each weight converted at its use.
fn mlp_converting(m: &Mlp, x: &Tensor) -> Tensor {
    let mut h = x.clone();
    for (i, l) in m.layers.iter().enumerate() {
        h = linear(l, &h);
        if i + 1 < m.layers.len() {
            h = h.tanh();
        }
    }
    h
}

/// `steps` steps with clipped gradients; the model's parameters after each.
fn train_mlp(copies: bool, make_opt: MakeOpt, steps: std::ops::Range<u64>, m: &Mlp) -> Vec<Vec<Vec<u32>>> {
    let mut opt = make_opt(m.named_params());
    let mut after = Vec::new();
    for step in steps {
        let (x, y) = batch(step);
        let out = if copies { m.forward(&x) } else { mlp_converting(m, &x) };
        (out - &y).pow(2.0).mean_all().backward();
        clip_grad_norm(&m.params(), 0.05);
        opt.step();
        opt.zero_grad();
        lazuli::sync().unwrap();
        after.push(all_bits(&m.params()));
    }
    after
}

#[test]
fn an_mlp_with_copies_trains_bit_for_bit_as_converting_at_each_use() {
    for (name, make_opt) in [("sgd", sgd as MakeOpt), ("adamw", adamw)] {
        let (with, without) = (mlp(true), mlp(false));
        let trained = train_mlp(true, make_opt, 0..4, &with);
        assert_eq!(trained, train_mlp(false, make_opt, 0..4, &without), "{name}");
        assert_ne!(trained[0], trained[3], "{name}: the weights moved");
        assert_copies_follow(&with.named_params());
    }
}

fn gpt(scan_blocks: bool, checkpoint_blocks: bool) -> Gpt {
    let cfg = GptConfig {
        vocab: 11,
        block_size: 8,
        n_layer: 2,
        n_head: 2,
        d_model: 16,
        dropout: 0.0,
        dtype: F32,
        scan_blocks,
        checkpoint_blocks,
    };
    Gpt::new(&mut HostRng::new(3), cfg)
}

/// `Block::forward` with every product on bf16 operands converted at its use, attention on bf16 q, k, v.
fn block_converting(b: &Block, x: &Tensor) -> Tensor {
    let (n, t, d) = (x.dims()[0] as isize, x.dims()[1] as isize, x.dims()[2] as isize);
    let h = b.attn.n_head as isize;
    let qkv = linear_low(&b.attn.qkv, &b.ln1.forward(x)).reshape(&[n, t, 3, h, d / h]);
    let part = |i: usize| qkv.narrow(2, i, 1).reshape(&[n, t, h, d / h]);
    let opts = AttentionOptions::causal().layout(AttentionLayout::Bthd);
    let y = scaled_dot_product_attention(&part(0), &part(1), &part(2), &opts);
    let x = x + linear(&b.attn.proj, &y.to_dtype(F32).reshape(&[n, t, d]));
    let m = linear(&b.fc_proj, &linear(&b.fc, &b.ln2.forward(&x)).gelu());
    x + m
}

/// `Gpt::loss` with every product converting its weight at its use.
fn gpt_loss_converting(g: &Gpt, ids: &Tensor, targets: &Tensor) -> Tensor {
    let pos = Tensor::arange(ids.dims()[1], DType::I32);
    let mut x = g.wte.forward(ids) + g.wpe.forward(&pos);
    for b in &g.blocks {
        x = if g.config.checkpoint_blocks { x.checkpoint(|x| block_converting(b, x)) } else { block_converting(b, &x) };
    }
    if let Some(s) = &g.scanned {
        // The stacked products' weights are used by the scan: converted there, once for all layers, as the copies
        // are (inside the body, XLA would keep each layer's weight gradient an f32 product).
        let used_in_products = |name: &str| name.ends_with("weight") && !name.starts_with("ln");
        let weights: Vec<Tensor> = (s.stacked.iter())
            .map(|(name, p)| if used_in_products(name) { p.get().to_dtype(LOW) } else { p.get() })
            .collect();
        let body = |h: &[Tensor], w: &[Tensor]| (vec![block_converting(&s.block(w), &h[0])], vec![]);
        x = s.scan().run(body, std::slice::from_ref(&x), &weights).0.remove(0);
    }
    // The head's weight converted before its transpose, as `Gpt` takes its copy: XLA keeps an f32 product where a
    // convert follows it directly, so converting after the transpose would round the head's gradient differently.
    let logits = mm(&g.ln_f.forward(&x), &g.wte.weight.get().to_dtype(LOW).t());
    logits.reshape(&[-1, g.config.vocab as isize]).cross_entropy(&targets.reshape(&[-1]))
}

fn train_gpt(g: &Gpt, copies: bool, make_opt: MakeOpt) -> Vec<Vec<u32>> {
    let mut opt = make_opt(g.named_params());
    for step in 0..2u64 {
        let mut rng = HostRng::new(7 + step);
        let ids: Vec<i32> = (0..16).map(|_| (rng.uniform() * 11.0) as i32 % 11).collect();
        let targets: Vec<i32> = ids.iter().map(|&i| (i * 3 + 1) % 11).collect();
        let (ids, targets) = (Tensor::from_slice(&ids, &[2, 8]), Tensor::from_slice(&targets, &[2, 8]));
        let loss = if copies { g.loss(&ids, &targets) } else { gpt_loss_converting(g, &ids, &targets) };
        loss.backward();
        opt.step();
        opt.zero_grad();
        lazuli::sync().unwrap();
    }
    all_bits(&g.params())
}

/// The tiny GPT with recomputed blocks (AdamW: the copies are taken inside `checkpoint`) and scanned (SGD): its
/// tied head uses the token embedding both directly and through its copy.
#[test]
fn the_gpt_with_copies_trains_bit_for_bit_as_converting_at_each_use() {
    for (scan, recompute, make_opt) in [(false, true, adamw as MakeOpt), (true, false, sgd)] {
        let with = gpt(scan, recompute).with_matmul_dtype(LOW);
        let trained = train_gpt(&with, true, make_opt);
        let initial = all_bits(&gpt(scan, recompute).params());
        assert_ne!(trained, initial, "scan {scan}, recompute {recompute}: the weights moved");
        assert_eq!(trained, train_gpt(&gpt(scan, recompute), false, make_opt), "scan {scan}, recompute {recompute}");
        let copied: Vec<(String, Param)> =
            with.named_params().into_iter().filter(|(n, _)| n.ends_with("weight") && !n.contains("ln")).collect();
        assert_copies_follow(&copied);
    }
}

/// `Param::set` with a computed value, with a pending one, and a checkpoint load: the copy is the new value's.
#[test]
fn a_new_value_or_a_loaded_checkpoint_resets_the_copy() {
    let p = Param::new(Tensor::from_slice(&[1.0f32, 2.0, 3.0], &[3]));
    let first = bits(&p.get_as(LOW));
    // Not representable in bf16: the copy is rounded, and differs from the first.
    p.set(Tensor::from_slice(&[1.0 + 1.0 / 256.0 + 1.0 / 1024.0, -2.7f32, 1e-3], &[3]));
    assert_eq!(bits(&p.get_as(LOW)), bits(&p.get().to_dtype(LOW)));
    assert_ne!(bits(&p.get_as(LOW)), first);
    p.set(&p.get() * 3.3);
    assert_eq!(bits(&p.get_as(LOW)), bits(&p.get().to_dtype(LOW)));

    let model = mlp(true);
    let mut opt = AdamW::new(model.named_params(), 1e-2);
    let path = std::env::temp_dir().join(format!("lazuli-low-precision-{}.safetensors", std::process::id()));
    let step = |opt: &mut AdamW, s: u64| {
        let (x, y) = batch(s);
        (model.forward(&x) - &y).pow(2.0).mean_all().backward();
        opt.step();
        opt.zero_grad();
        lazuli::sync().unwrap();
    };
    (0..2).for_each(|s| step(&mut opt, s));
    checkpoint::save(&path, &model, Some(&opt), &[], &Default::default()).unwrap();
    let saved = all_bits(&model.params());
    (2..4).for_each(|s| step(&mut opt, s));
    let copy_before_load = bits(&model.layers[0].weight.get_as(LOW));
    checkpoint::load(&path, &model, Some(&mut opt)).unwrap();
    std::fs::remove_file(&path).unwrap();
    assert_eq!(all_bits(&model.params()), saved);
    assert_copies_follow(&model.named_params());
    assert_ne!(bits(&model.layers[0].weight.get_as(LOW)), copy_before_load);
    // Resumed with copies, the run repeats its own steps bit for bit.
    let resumed: Vec<_> = (2..4)
        .map(|s| {
            step(&mut opt, s);
            all_bits(&model.params())
        })
        .collect();
    let again = mlp(true);
    assert_eq!(train_mlp_plain(&again, 0..4)[2..], resumed[..]);
}

/// [`a_new_value_or_a_loaded_checkpoint_resets_the_copy`]'s training, uninterrupted.
fn train_mlp_plain(model: &Mlp, steps: std::ops::Range<u64>) -> Vec<Vec<Vec<u32>>> {
    let mut opt = AdamW::new(model.named_params(), 1e-2);
    steps
        .map(|s| {
            let (x, y) = batch(s);
            (model.forward(&x) - &y).pow(2.0).mean_all().backward();
            opt.step();
            opt.zero_grad();
            lazuli::sync().unwrap();
            all_bits(&model.params())
        })
        .collect()
}

/// A parameter used directly and through its copy: its gradient is the sum, the copy's part converted; accumulated
/// over two `backward()`s, scaled by clipping, and cleared by `zero_grad`.
#[test]
fn direct_and_copied_uses_add_their_gradients() {
    let values = [0.5f32, -1.25, 3.0, 0.1];
    let (a, b) = ([0.75f32, -2.0, 1.5, 4.0], [0.5f32, 0.25, -3.0, 8.0]); // b is exact in bf16
    let loss = |w: &Tensor, w_low: &Tensor| {
        let (a, b) = (Tensor::from_slice(&a, &[4]), Tensor::from_slice(&b, &[4]).to_dtype(LOW));
        (w * &a).sum_all() + (w_low * &b).to_dtype(F32).sum_all()
    };
    let p = Param::new(Tensor::from_slice(&values, &[4]));
    loss(&p.get(), &p.get_as(LOW)).backward();
    let g = p.grad().unwrap().to_vec::<f32>().unwrap();
    assert_eq!(g, (0..4).map(|i| a[i] + b[i]).collect::<Vec<_>>());
    // The same as converting at the use.
    let q = Param::new(Tensor::from_slice(&values, &[4]));
    loss(&q.get(), &q.get().to_dtype(LOW)).backward();
    assert_eq!(q.grad().unwrap().to_vec::<f32>().unwrap(), g);
    // A second backward adds both parts again.
    loss(&p.get(), &p.get_as(LOW)).backward();
    assert_eq!(p.grad().unwrap().to_vec::<f32>().unwrap(), g.iter().map(|v| 2.0 * v).collect::<Vec<_>>());
    p.zero_grad();
    loss(&p.get(), &p.get_as(LOW)).backward();
    p.zero_grad(); // before `grad()` has added the copy's part
    assert!(p.grad().is_none());
    // Clipping scales the whole gradient, the copy's part included.
    loss(&p.get(), &p.get_as(LOW)).backward();
    let norm = g.iter().map(|v| v * v).sum::<f32>().sqrt();
    clip_grad_norm(std::slice::from_ref(&p), (norm / 2.0) as f64);
    let clipped = p.grad().unwrap().to_vec::<f32>().unwrap();
    for (c, v) in clipped.iter().zip(&g) {
        assert!((c - v / 2.0).abs() <= 1e-5 * v.abs(), "{clipped:?} vs {g:?} / 2");
    }
    p.zero_grad();
    loss(&p.get(), &p.get_as(LOW)).backward();
    assert_eq!(p.grad().unwrap().to_vec::<f32>().unwrap(), g, "zero_grad cleared the copy's part");
}

fn panic_text(f: impl FnOnce()) -> String {
    let e = std::panic::catch_unwind(AssertUnwindSafe(f)).expect_err("a panic");
    e.downcast_ref::<String>().cloned().unwrap_or_default()
}

#[test]
fn a_copy_in_a_non_float_dtype_is_an_error_at_the_callers_line() {
    let p = Param::new(Tensor::from_slice(&[1.0f32, 2.0], &[2]));
    let line = line!() + 1;
    let msg = panic_text(|| drop(p.get_as(DType::I32)));
    assert!(msg.contains("Param::get_as") && msg.contains("floating-point dtype, not i32"), "{msg}");
    assert!(msg.contains(&format!("{}:{line}:", file!())), "{msg}");
    let line = line!() + 1;
    let msg = panic_text(|| drop(Linear::from_tensors(p.get().reshape(&[1, 2]), None).with_matmul_dtype(DType::U8)));
    assert!(msg.contains("Linear::with_matmul_dtype") && msg.contains(&format!("{}:{line}:", file!())), "{msg}");
}

/// Under `LAZULI_CHECK_FINITE=skip` a skipped step keeps the copies as it keeps the values, from the first step
/// on: the copies are inputs of the step's program from step 1, so it compiles once, and are updated in place.
#[test]
fn a_skipped_step_keeps_the_copies_and_the_step_compiles_once() {
    if child::alone(module_path!(), "a_skipped_step_keeps_the_copies_and_the_step_compiles_once") {
        return; // the runtime's configuration and the counters are process-wide
    }
    lazuli::init(Config { check_finite: CheckFinite::Skip, ..Config::from_env().unwrap() }).unwrap();
    let run = |scales: &[f32]| {
        let model = mlp(true);
        let mut opt = AdamW::new(model.named_params(), 1e-2);
        let (mut compiles, mut donated) = (Vec::new(), Vec::new());
        let (x, y) = batch(0);
        for &scale in scales {
            let before = lazuli::metrics().bytes_donated;
            ((model.forward(&x) - &y).pow(2.0).mean_all() * Tensor::scalar(scale)).backward();
            opt.step();
            opt.zero_grad();
            lazuli::sync().unwrap();
            lazuli::wait().unwrap();
            compiles.push(lazuli::metrics().compiles);
            donated.push(lazuli::metrics().bytes_donated - before);
        }
        // Each step updates in place the f32 values and moments and the bf16 copies of the three weights.
        let (values, weights) = (4 * 32 + 32 + 32 * 32 + 32 + 32 + 1, 4 * 32 + 32 * 32 + 32);
        assert!(donated.iter().all(|&d| d == 3 * 4 * values + 2 * weights), "{donated:?}");
        assert_copies_follow(&model.named_params());
        let copies: Vec<Vec<u32>> = model.params().iter().map(|p| bits(&p.get_as(LOW))).collect();
        (all_bits(&model.params()), copies, compiles)
    };
    // The first step skipped: the copies made before it stay, as the values do.
    let (values, copies, compiles) = run(&[f32::INFINITY, 1.0, 1.0]);
    assert_eq!(compiles[0], compiles[2], "steps 2 and 3 compiled again: {compiles:?}");
    let clean = run(&[1.0, 1.0]);
    assert_eq!((&values, &copies), (&clean.0, &clean.1));
    let skipped_later = run(&[1.0, 1.0, f32::INFINITY]);
    assert_eq!((&skipped_later.0, &skipped_later.1), (&clean.0, &clean.1));
    assert_eq!(lazuli::metrics().skipped_steps, 2);
}

/// Strict mode takes the copies' creation as set-up: training with copies is one program per step from step 1.
#[test]
fn strict_mode_takes_the_copies_creation_as_set_up() {
    if child::alone(module_path!(), "strict_mode_takes_the_copies_creation_as_set_up") {
        return; // strict mode is process-wide
    }
    let _strict = strict_scope(Budget::training());
    let model = mlp(true);
    let mut opt = AdamW::new(model.named_params(), 1e-2);
    let (x, y) = batch(0);
    for _ in 0..4 {
        (model.forward(&x) - &y).pow(2.0).mean_all().backward();
        opt.step();
        opt.zero_grad();
        lazuli::sync().unwrap();
    }
    lazuli::wait().unwrap();
}

/// The copies a first forward pass asks for, one weight at a time, are computed together in one program before
/// the step's: two programs in the first step, not one per weight (three shapes: three compiles more before). Each
/// copy equals the f32 weight rounded to bf16 on the host (`half`), and the next step runs the step's program
/// alone.
#[test]
fn the_copies_a_first_step_asks_for_are_computed_in_one_program() {
    if child::alone(module_path!(), "the_copies_a_first_step_asks_for_are_computed_in_one_program") {
        return; // the counters are process-wide
    }
    let model = mlp(true);
    let mut opt = AdamW::new(model.named_params(), 1e-2);
    let (x, y) = batch(0);
    let weights: Vec<Vec<f32>> = model.layers.iter().map(|l| l.weight.get().to_vec::<f32>().unwrap()).collect();
    let step = |opt: &mut AdamW| {
        let before = lazuli::metrics();
        (model.forward(&x) - &y).pow(2.0).mean_all().backward();
        opt.step();
        opt.zero_grad();
        lazuli::sync().unwrap();
        lazuli::wait().unwrap();
        let after = lazuli::metrics();
        (after.compiles - before.compiles, after.executions - before.executions)
    };
    let rounded = |w: &[f32]| -> Vec<u32> { w.iter().map(|&v| half::bf16::from_f32(v).to_f32().to_bits()).collect() };
    assert_eq!(step(&mut opt), (2, 2), "the first step: the copies' program and the step's");
    assert_eq!(step(&mut opt), (0, 1), "the second step: the step's program alone");
    // The copies follow the values; the first step's copies were those of the initial weights.
    assert_copies_follow(&model.named_params());
    let fresh = mlp(true);
    for (l, w) in fresh.layers.iter().zip(&weights) {
        let copy = bits(&l.weight.get_as(LOW));
        assert_eq!(copy, rounded(w), "a copy of the initial weights");
    }
}

/// Parameters split over two devices: each copy is laid out as its parameter, from its creation on and after
/// every update, and training equals converting at each use on the same mesh.
#[test]
fn copies_of_sharded_parameters_keep_their_layout() {
    if child::alone(module_path!(), "copies_of_sharded_parameters_keep_their_layout") {
        return; // the runtime (on 2 devices) is process-wide
    }
    lazuli::init(Config { cpu_device_count: 2, ..Config::from_env().unwrap() }).unwrap();
    let m = mesh(&[("data", 2)]).unwrap();
    let split = |t: &Tensor| match t.dims()[0] % 2 {
        0 => PartitionSpec::split(t.rank(), 0, "data"),
        _ => PartitionSpec::replicated(t.rank()),
    };
    let run = |copies: bool| {
        let model = mlp(copies);
        shard_params(&model, &m, |_, t| split(t));
        let mut opt = AdamW::new(model.named_params(), 1e-2);
        for s in 0..3 {
            let (x, y) = batch(s);
            let (x, y) = (x.shard(&m, &split(&x)), y.shard(&m, &split(&y)));
            let out = if copies { model.forward(&x) } else { mlp_converting(&model, &x) };
            (out - &y).pow(2.0).mean_all().backward();
            opt.step();
            opt.zero_grad();
            lazuli::sync().unwrap();
            if copies {
                for (name, p) in model.named_params() {
                    let (value, copy) = (p.get(), p.get_as(LOW));
                    assert_eq!(copy.sharding(), value.sharding(), "{name} at step {s}");
                    assert!(value.sharding().is_some(), "{name} at step {s}");
                }
            }
        }
        all_bits(&model.params())
    };
    assert_eq!(run(true), run(false));
}
