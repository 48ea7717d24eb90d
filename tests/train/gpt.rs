//! The GPT model: shapes, causality, initial loss, one program per training step, dropout modes.

use std::sync::Mutex;

use lazuli::nn::{Gpt, GptConfig, HostRng};
use lazuli::{AdamW, DType, Module, Optimizer, Tensor};

use crate::common::child;

static SERIAL: Mutex<()> = Mutex::new(());

fn tiny(dropout: f64) -> Gpt {
    let cfg = GptConfig {
        vocab: 11,
        block_size: 8,
        n_layer: 2,
        n_head: 2,
        d_model: 16,
        dropout,
        dtype: DType::F32,
        scan_blocks: false,
        checkpoint_blocks: false,
    };
    Gpt::new(&mut HostRng::new(3), cfg)
}

#[test]
fn shapes_causality_and_initial_loss() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let model = tiny(0.0);
    let a: Vec<i32> = vec![1, 2, 3, 4, 5, 6, 7, 8, 2, 2, 2, 2, 9, 9, 9, 9];
    let mut b = a.clone();
    b[5] = 0; // change a later token of the first sequence
    let la = model.forward(&Tensor::from_slice(&a, &[2, 8]));
    let lb = model.forward(&Tensor::from_slice(&b, &[2, 8]));
    assert_eq!(la.dims(), &[2, 8, 11]);
    let (va, vb) = (la.to_vec::<f32>().unwrap(), lb.to_vec::<f32>().unwrap());
    // Positions 0..5 of sequence 0 cannot see token 5.
    assert_eq!(&va[..5 * 11], &vb[..5 * 11], "causal: earlier positions unchanged");
    assert_ne!(&va[5 * 11..6 * 11], &vb[5 * 11..6 * 11], "position 5 sees its own token");
    // Small initial weights: predictions near uniform, loss near ln(vocab).
    // (Targets other than the inputs: the tied head slightly favours each position's own token.)
    let t: Vec<i32> = a.iter().map(|&v| (v + 3) % 11).collect();
    let loss = model.loss(&Tensor::from_slice(&a, &[2, 8]), &Tensor::from_slice(&t, &[2, 8]));
    let l = loss.item::<f32>().unwrap() as f64;
    assert!((l - 11f64.ln()).abs() < 0.25, "initial loss {l} vs ln 11 = {}", 11f64.ln());
}

/// The MFU numerator counts the model's own parameters: 6 FLOPs per parameter outside the position table, plus
/// attention's 12·L·d·T.
#[test]
fn train_flops_count_the_models_parameters() {
    let model = tiny(0.0);
    let c = &model.config;
    let positions = c.block_size * c.d_model;
    let matmul_params = (model.num_params() - positions) as f64;
    let attention = 12.0 * (c.n_layer * c.d_model * 8) as f64;
    assert_eq!(c.train_flops_per_token(8), 6.0 * matmul_params + attention);
}

#[test]
fn training_steps_are_one_program_and_learn_a_pattern() {
    if child::alone(module_path!(), "training_steps_are_one_program_and_learn_a_pattern") {
        return; // the counters are process-wide: alone in a process of its own
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let model = tiny(0.1);
    let mut opt = AdamW::new(model.named_params(), 1e-2);
    lazuli::manual_seed(0);
    // A repeating sequence is easy to predict.
    let seq: Vec<i32> = (0..9).map(|i| (i % 5) + 1).collect();
    let x = Tensor::from_slice(&[&seq[..8], &seq[..8]].concat(), &[2, 8]);
    let y = Tensor::from_slice(&[&seq[1..9], &seq[1..9]].concat(), &[2, 8]);
    let mut losses = Vec::new();
    for step in 0..40 {
        let before = lazuli::metrics();
        let loss = model.loss(&x, &y);
        loss.backward();
        opt.step();
        opt.zero_grad();
        lazuli::sync().unwrap();
        losses.push(loss.item::<f32>().unwrap());
        let d = lazuli::metrics() - before;
        if step > 0 {
            assert_eq!((d.compiles, d.executions), (0, 1), "step {step}: {d}");
        }
    }
    assert!(losses[39] < 0.3 * losses[0], "{losses:?}");

    // Dropout: training-mode forwards differ (fresh masks), evaluation-mode forwards agree.
    let logits = |m: &Gpt| lazuli::no_grad(|| m.forward(&x)).to_vec::<f32>().unwrap();
    assert_ne!(logits(&model), logits(&model));
    model.set_training(false);
    assert_eq!(logits(&model), logits(&model));
}
