//! Checkpoints: resuming continues bit for bit; bad files give clear errors and change nothing.

use std::collections::BTreeMap;

use lazuli::checkpoint;
use lazuli::nn::{Activation, HostRng, Mlp};
use lazuli::{AdamW, DType, Module, Optimizer, Tensor};

fn batch(step: u64) -> (Tensor, Tensor) {
    // Deterministic data per step, so a resumed run sees the same batches.
    let mut rng = HostRng::new(1000 + step);
    let x: Vec<f32> = (0..32 * 4).map(|_| rng.normal() as f32).collect();
    let y: Vec<f32> = x.chunks(4).map(|r| (r[0] * r[1] - r[2] + 0.5 * r[3]).tanh()).collect();
    (Tensor::from_slice(&x, &[32, 4]), Tensor::from_slice(&y, &[32, 1]))
}

fn train(model: &Mlp, opt: &mut AdamW, steps: std::ops::Range<u64>) -> Vec<u32> {
    let mut losses = Vec::new();
    for step in steps {
        let (x, y) = batch(step);
        let loss = (model.forward(&x) - &y).pow(2.0).mean_all();
        loss.backward();
        opt.step();
        opt.zero_grad();
        lazuli::sync().unwrap();
        losses.push(loss.item::<f32>().unwrap().to_bits());
    }
    losses
}

fn fresh(seed: u64) -> (Mlp, AdamW) {
    let model = Mlp::new(&mut HostRng::new(seed), &[4, 32, 1], Activation::Tanh, DType::F32);
    let opt = AdamW::new(model.named_params(), 3e-3);
    (model, opt)
}

fn params_bits(m: &Mlp) -> Vec<u32> {
    m.params().iter().flat_map(|p| p.get().to_vec::<f32>().unwrap()).map(f32::to_bits).collect()
}

#[test]
fn resume_is_bit_exact_and_bad_files_change_nothing() {
    let dir = std::env::temp_dir().join(format!("lazuli-ckpt-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("run.safetensors");

    // Uninterrupted: 12 steps.
    let (model, mut opt) = fresh(1);
    let all = train(&model, &mut opt, 0..12);
    let final_params = params_bits(&model);

    // Interrupted after 5 steps, saved, resumed into a differently initialised model and optimizer.
    let (model, mut opt) = fresh(1);
    let first = train(&model, &mut opt, 0..5);
    let mut user = BTreeMap::new();
    user.insert("step".to_string(), "5".to_string());
    checkpoint::save(&path, &model, Some(&opt), &[], &user).unwrap();
    drop((model, opt));
    let (model, mut opt) = fresh(99);
    let (_, meta) = checkpoint::load(&path, &model, Some(&mut opt)).unwrap();
    assert_eq!(meta.optimizer_steps, 5);
    assert_eq!(meta.user.get("step").map(String::as_str), Some("5"));
    let rest = train(&model, &mut opt, 5..12);
    assert_eq!([first, rest].concat(), all, "losses of the resumed run equal the uninterrupted run, bit for bit");
    assert_eq!(params_bits(&model), final_params);

    let good = std::fs::read(&path).unwrap();
    let before = params_bits(&model);

    // A model of another shape: a clear error naming the parameter; the model and the file are untouched.
    let (other, mut other_opt) = {
        let m = Mlp::new(&mut HostRng::new(3), &[4, 16, 1], Activation::Tanh, DType::F32);
        let o = AdamW::new(m.named_params(), 1e-3);
        (m, o)
    };
    let other_before = params_bits(&other);
    let e = checkpoint::load(&path, &other, Some(&mut other_opt)).unwrap_err().to_string();
    assert!(e.contains("layers.0.weight") && e.contains("f32[4,32]") && e.contains("f32[4,16]"), "{e}");
    assert_eq!(params_bits(&other), other_before);
    assert_eq!(std::fs::read(&path).unwrap(), good);

    // A truncated file: a clear error, nothing changed.
    let cut = dir.join("cut.safetensors");
    std::fs::write(&cut, &good[..good.len() / 2]).unwrap();
    let e = checkpoint::load(&cut, &model, Some(&mut opt)).unwrap_err().to_string();
    assert!(e.contains("truncated") || e.contains("not a valid"), "{e}");
    assert_eq!(params_bits(&model), before);

    // A file that is not a lazuli checkpoint.
    let junk = dir.join("junk.safetensors");
    std::fs::write(&junk, b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ").unwrap();
    assert!(checkpoint::load(&junk, &model, None).is_err());

    // Saving over an existing checkpoint replaces it whole (no temp files left behind).
    checkpoint::save(&path, &model, Some(&opt), &[], &BTreeMap::new()).unwrap();
    let names: Vec<String> =
        std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    assert!(names.iter().all(|n| !n.contains(".tmp-")), "{names:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}
