//! Gradient checkpointing (`lazuli::checkpoint`, `GptConfig::checkpoint_blocks`): the same gradients and losses
//! as without it, gradients against finite differences, and a program that really recomputes the block behind
//! an optimization barrier.

use std::sync::Mutex;

use lazuli::nn::{Gpt, GptConfig, HostRng, Module};
use lazuli::{AdamW, DType, Optimizer, Tensor};
use ndarray::{ArrayD, IxDyn};

use crate::common::{assert_close, child, gradcheck::check_grad, Rng};

static SERIAL: Mutex<()> = Mutex::new(());

fn array(dims: &[usize], seed: u64, scale: f64) -> ArrayD<f64> {
    let mut rng = Rng::new(seed);
    let n = dims.iter().product();
    ArrayD::from_shape_vec(IxDyn(dims), (0..n).map(|_| rng.uniform(-scale, scale)).collect()).unwrap()
}

/// A two-layer MLP block with a skip connection: `x + tanh(x·w1 + b1)·w2`.
fn mlp(x: &Tensor, w1: &Tensor, b1: &Tensor, w2: &Tensor) -> Tensor {
    x + (x.matmul(w1) + b1).tanh().matmul(w2)
}

/// The gradients of `sum(block(block(x)) * c)` with respect to `x` and the weights (the weights read from
/// outside the checkpointed closure), with or without checkpointing each block.
fn mlp_grads(checkpointed: bool) -> Vec<Vec<f64>> {
    let leaf = |a: &ArrayD<f64>| Tensor::from_ndarray(a).requires_grad();
    let x = leaf(&array(&[3, 4], 1, 1.0));
    let (w1, b1, w2) = (leaf(&array(&[4, 6], 2, 0.7)), leaf(&array(&[6], 3, 0.5)), leaf(&array(&[6, 4], 4, 0.7)));
    let c = Tensor::from_ndarray(&array(&[3, 4], 5, 1.0));
    let block = |h: &Tensor| if checkpointed { h.checkpoint(|h| mlp(h, &w1, &b1, &w2)) } else { mlp(h, &w1, &b1, &w2) };
    let loss = (&block(&block(&x)) * &c).sum_all();
    let grads = lazuli::grad(&loss, &[&x, &w1, &b1, &w2]);
    grads.iter().map(|g| g.to_vec::<f64>().unwrap()).collect()
}

#[test]
fn mlp_gradients_equal_with_and_without_checkpoint() {
    let (plain, checkpointed) = (mlp_grads(false), mlp_grads(true));
    for (i, (p, c)) in plain.iter().zip(&checkpointed).enumerate() {
        assert_close(&format!("gradient {i}"), DType::F64, c, p);
    }
}

/// Both inputs and captured parameters get gradients that agree with central differences.
#[test]
fn checkpointed_mlp_gradients_match_finite_differences() {
    let inputs = [array(&[3, 4], 1, 1.0), array(&[4, 6], 2, 0.7), array(&[6], 3, 0.5), array(&[6, 4], 4, 0.7)];
    check_grad("checkpointed mlp", &inputs, |t| {
        let (w1, b1, w2) = (&t[1], &t[2], &t[3]);
        let h = lazuli::checkpoint(&[&t[0]], |x| vec![mlp(&x[0], w1, b1, w2)]).remove(0);
        h.checkpoint(|h| mlp(h, w1, b1, w2).sin())
    });
}

/// A block with two inputs and two results, one of them unused by the loss.
#[test]
fn several_inputs_and_results() {
    let leaf = |a: &ArrayD<f64>| Tensor::from_ndarray(a).requires_grad();
    let (a, b) = (leaf(&array(&[2, 3], 6, 1.0)), leaf(&array(&[2, 3], 7, 1.0)));
    let run = |checkpointed: bool| {
        let f = |x: &[Tensor]| vec![(&x[0] * &x[1]).exp(), &x[0] - &x[1], x[1].sin()];
        let outs = if checkpointed { lazuli::checkpoint(&[&a, &b], f) } else { f(&[a.clone(), b.clone()]) };
        let loss = outs[0].sum_all() + (&outs[2] * &outs[2]).sum_all();
        let values: Vec<f64> = outs.iter().flat_map(|o| o.to_vec::<f64>().unwrap()).collect();
        let grads = lazuli::grad(&loss, &[&a, &b]);
        (values, grads.iter().map(|g| g.to_vec::<f64>().unwrap()).collect::<Vec<_>>())
    };
    let ((v0, g0), (v1, g1)) = (run(false), run(true));
    assert_close("results", DType::F64, &v1, &v0);
    for (i, (c, p)) in g1.iter().zip(&g0).enumerate() {
        assert_close(&format!("gradient {i}"), DType::F64, c, p);
    }
}

/// A checkpointed block made of checkpointed blocks: the inner stand-ins are lifted into the outer block.
#[test]
fn nested_checkpoints_give_the_plain_gradients() {
    let leaf = |a: &ArrayD<f64>| Tensor::from_ndarray(a).requires_grad();
    let x = leaf(&array(&[3, 4], 1, 1.0));
    let (w1, b1, w2) = (leaf(&array(&[4, 6], 2, 0.7)), leaf(&array(&[6], 3, 0.5)), leaf(&array(&[6, 4], 4, 0.7)));
    let grads = |nested: bool| {
        let two = |h: &Tensor| {
            if nested {
                h.checkpoint(|h| h.checkpoint(|h| mlp(h, &w1, &b1, &w2)).checkpoint(|h| mlp(h, &w1, &b1, &w2)))
            } else {
                mlp(&mlp(h, &w1, &b1, &w2), &w1, &b1, &w2)
            }
        };
        let loss = two(&x).sin().sum_all();
        let g = lazuli::grad(&loss, &[&x, &w1, &b1, &w2]);
        g.iter().map(|g| g.to_vec::<f64>().unwrap()).collect::<Vec<_>>()
    };
    for (i, (c, p)) in grads(true).iter().zip(&grads(false)).enumerate() {
        assert_close(&format!("gradient {i}"), DType::F64, c, p);
    }
}

#[test]
#[should_panic(expected = "checkpoint: the block returned no tensor")]
fn a_block_without_results_is_refused_at_the_callers_line() {
    let x = Tensor::from_slice(&[1.0f64, 2.0], &[2]).requires_grad();
    let _ = lazuli::checkpoint(&[&x], |_| Vec::new());
}

fn gpt(dtype: DType, dropout: f64, checkpoint_blocks: bool) -> Gpt {
    let cfg = GptConfig {
        vocab: 13,
        block_size: 8,
        n_layer: 2,
        n_head: 2,
        d_model: 16,
        dropout,
        dtype,
        checkpoint_blocks,
        scan_blocks: false,
    };
    Gpt::new(&mut HostRng::new(5), cfg)
}

fn tokens() -> (Tensor, Tensor) {
    let seq: Vec<i32> = (0..17).map(|i| (i * 7 + 3) % 13).collect();
    (
        Tensor::from_slice(&[&seq[..8], &seq[8..16]].concat(), &[2, 8]),
        Tensor::from_slice(&[&seq[1..9], &seq[9..17]].concat(), &[2, 8]),
    )
}

/// The loss and every parameter's gradient of a 2-layer GPT in f64, by name.
fn gpt_grads(checkpoint_blocks: bool) -> (f64, Vec<(String, Vec<f64>)>) {
    let model = gpt(DType::F64, 0.0, checkpoint_blocks);
    let (x, y) = tokens();
    let loss = model.loss(&x, &y);
    loss.backward();
    lazuli::sync().unwrap();
    let grads = model
        .named_params()
        .into_iter()
        .map(|(name, p)| {
            let g = p.grad().unwrap_or_else(|| panic!("{name} has a gradient"));
            (name, g.to_vec::<f64>().unwrap())
        })
        .collect();
    (loss.item::<f64>().unwrap(), grads)
}

#[test]
fn gpt_gradients_equal_with_checkpointed_blocks() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (l0, g0) = gpt_grads(false);
    let (l1, g1) = gpt_grads(true);
    assert_close("loss", DType::F64, &[l1], &[l0]);
    assert_eq!(g0.len(), g1.len());
    assert!(g0.len() > 20, "every parameter of 2 blocks: {}", g0.len());
    for ((name, p), (_, c)) in g0.iter().zip(&g1) {
        assert!(p.iter().any(|v| *v != 0.0), "{name}: a gradient to compare");
        assert_close(name, DType::F64, c, p);
    }
}

/// Six AdamW steps of a 2-layer GPT with dropout: each step's loss, and its compiles and executions (the counters
/// are process-wide: only meaningful in a process of its own).
fn train_gpt(checkpoint_blocks: bool) -> (Vec<f64>, Vec<(u64, u64)>) {
    let model = gpt(DType::F32, 0.1, checkpoint_blocks);
    let mut opt = AdamW::new(model.named_params(), 1e-2);
    lazuli::manual_seed(11);
    let (x, y) = tokens();
    let mut programs = Vec::new();
    let losses = (0..6)
        .map(|_| {
            let before = lazuli::metrics();
            let loss = model.loss(&x, &y);
            loss.backward();
            opt.step();
            opt.zero_grad();
            lazuli::sync().unwrap();
            let d = lazuli::metrics() - before;
            programs.push((d.compiles, d.executions));
            loss.item::<f32>().unwrap() as f64
        })
        .collect();
    (losses, programs)
}

/// AdamW steps of a 2-layer GPT (with dropout: the recomputation must draw the same masks) give the same losses
/// with checkpointed blocks as without.
#[test]
fn training_losses_equal_with_checkpointed_blocks() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let ((plain, _), (checkpointed, _)) = (train_gpt(false), train_gpt(true));
    assert!(plain[5] < plain[0], "it learns: {plain:?}");
    // XLA may fuse the two programs differently: equal up to f32 rounding.
    for (step, (c, p)) in checkpointed.iter().zip(&plain).enumerate() {
        assert!((c - p).abs() <= 1e-5 * p.abs(), "step {step}: {c} vs {p} ({checkpointed:?} vs {plain:?})");
    }
}

/// A checkpointed training step with dropout is still one program, compiled once: the block is recorded anew
/// each step with the same structure, and its random draws leave the generator's state in the step's program.
#[test]
fn a_checkpointed_training_step_is_one_cached_program() {
    if child::alone(module_path!(), "a_checkpointed_training_step_is_one_cached_program") {
        return; // the counters are process-wide: alone in a process of its own
    }
    let (_, programs) = train_gpt(true);
    assert_eq!(programs[0].1, 1, "one program in the first step: {programs:?}");
    assert!(programs[1..].iter().all(|&p| p == (0, 1)), "then no compile, one execution: {programs:?}");
}

/// Counts of `"stablehlo.<op>"` in every program dumped into `dir`, summed.
fn count_in_dumps(dir: &std::path::Path, op: &str) -> usize {
    let needle = format!("\"stablehlo.{op}\"");
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| std::fs::read_to_string(e.unwrap().path()).unwrap().matches(&needle).count())
        .sum()
}

/// The emitted program of a checkpointed step holds the block's forward ops twice (the forward pass and the
/// recomputation) and the barrier in front of the recomputation; without checkpointing, once and no barrier.
#[test]
fn a_checkpointed_step_recomputes_the_block_behind_a_barrier() {
    const DUMP: &str = "LAZULI_DUMP_DIR";
    let Ok(dir) = std::env::var(DUMP) else {
        let test = child::test_name(module_path!(), "a_checkpointed_step_recomputes_the_block_behind_a_barrier");
        for checkpointed in [false, true] {
            let dir = std::env::temp_dir().join(format!("lazuli-remat-dump-{}-{checkpointed}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            let on = if checkpointed { "1" } else { "0" };
            child::passes(&test, &[(DUMP, dir.to_str().unwrap()), ("REMAT_TEST_CHECKPOINT", on)]);
            let (tanh, barriers) = (count_in_dumps(&dir, "tanh"), count_in_dumps(&dir, "optimization_barrier"));
            std::fs::remove_dir_all(&dir).unwrap();
            if checkpointed {
                assert_eq!((tanh, barriers), (2, 1), "forward and recomputed tanh, one barrier");
            } else {
                assert_eq!((tanh, barriers), (1, 0), "the gradient of tanh reads its result");
            }
        }
        return;
    };
    // The child: one training step of the MLP block, one program.
    assert!(std::path::Path::new(&dir).is_dir());
    let checkpointed = std::env::var("REMAT_TEST_CHECKPOINT").as_deref() == Ok("1");
    let leaf = |a: &ArrayD<f64>| Tensor::from_ndarray(a).requires_grad();
    let x = Tensor::from_ndarray(&array(&[3, 4], 1, 1.0));
    let (w1, b1, w2) = (leaf(&array(&[4, 6], 2, 0.7)), leaf(&array(&[6], 3, 0.5)), leaf(&array(&[6, 4], 4, 0.7)));
    let y = if checkpointed { x.checkpoint(|x| mlp(x, &w1, &b1, &w2)) } else { mlp(&x, &w1, &b1, &w2) };
    y.sum_all().backward();
    let before = lazuli::metrics();
    lazuli::sync().unwrap();
    assert_eq!((lazuli::metrics() - before).compiles, 1, "one program");
    assert!(w1.grad().unwrap().to_vec::<f64>().unwrap().iter().any(|v| *v != 0.0));
}

/// XLA's memory plan of a training step (`lazuli::program_memory`) names the step's inputs and outputs, with
/// and without checkpointed blocks, whose step gives the same loss and gradients. The CPU plugin's plan does not
/// show what checkpointing saves: its temporaries stay at 320 KiB for 1, 2 or 8 blocks of 256 KiB hidden
/// activations each, with or without checkpointing (it reports no device allocator statistics either); the
/// saving shows on GPUs, through the same call or `lazuli::memory_stats()`.
#[test]
fn program_memory_reports_a_steps_inputs_and_outputs() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (batch, d, hidden, depth) = (64, 128, 1024, 8);
    let step = |checkpointed: bool| {
        let weights: Vec<(Tensor, Tensor, Tensor)> = (0..depth as u64)
            .map(|i| {
                let w = |dims: &[usize], seed: u64| {
                    Tensor::from_ndarray(&array(dims, seed, 0.05)).to_dtype(DType::F32).requires_grad()
                };
                (w(&[d, hidden], 3 * i), w(&[hidden], 3 * i + 1), w(&[hidden, d], 3 * i + 2))
            })
            .collect();
        let mut x = Tensor::from_ndarray(&array(&[batch, d], 99, 1.0)).to_dtype(DType::F32);
        lazuli::sync().unwrap();
        for (w1, b1, w2) in &weights {
            x = if checkpointed { x.checkpoint(|x| mlp(x, w1, b1, w2)) } else { mlp(&x, w1, b1, w2) };
        }
        let loss = (&x * &x).sum_all();
        loss.backward();
        lazuli::sync().unwrap();
        let grads: Vec<f32> = weights.iter().flat_map(|(w1, ..)| w1.grad().unwrap().to_vec::<f32>().unwrap()).collect();
        (lazuli::program_memory().unwrap().expect("a step ran"), loss.item::<f32>().unwrap(), grads)
    };
    let (plain, l0, g0) = step(false);
    let (checkpointed, l1, g1) = step(true);
    assert!((l1 - l0).abs() <= 1e-5 * l0.abs(), "{l1} vs {l0}");
    let scale = g0.iter().fold(0f32, |m, v| m.max(v.abs()));
    assert!(g0.iter().zip(&g1).all(|(a, b)| (a - b).abs() <= 1e-4 * scale), "the same gradients");
    let weights = 4 * depth * (d * hidden + hidden + hidden * d);
    let x = 4 * batch * d;
    for m in [plain, checkpointed] {
        assert_eq!(m.argument_bytes as usize, weights + x, "the weights and the input: {m:?}");
        assert!(m.output_bytes as usize >= weights + x + 4, "the gradients, the output and the loss: {m:?}");
        assert!(m.peak_bytes() >= m.argument_bytes, "{m:?}");
    }
}
