//! A GPT whose blocks are stacked and scanned (`GptConfig::scan_blocks`) against the same GPT unrolled: the same
//! seed gives the same weights, logits, gradients and training losses, whether the scan saves each block's
//! activations or recomputes them (`checkpoint_blocks`); checkpoints of either form load into the other under the
//! unrolled model's names.

use std::collections::BTreeMap;

use lazuli::nn::{Gpt, GptConfig, HostRng};
use lazuli::{checkpoint, AdamW, DType, Module, Optimizer, Tensor};

use crate::common;

fn config(scan_blocks: bool, n_layer: usize) -> GptConfig {
    config_remat(scan_blocks, false, n_layer)
}

fn config_remat(scan_blocks: bool, checkpoint_blocks: bool, n_layer: usize) -> GptConfig {
    GptConfig {
        vocab: 13,
        block_size: 8,
        n_layer,
        n_head: 2,
        d_model: 16,
        dropout: 0.0,
        dtype: DType::F32,
        scan_blocks,
        checkpoint_blocks,
    }
}

fn gpt(scan_blocks: bool, seed: u64) -> Gpt {
    Gpt::new(&mut HostRng::new(seed), config(scan_blocks, 3))
}

fn batch() -> (Tensor, Tensor) {
    let seq: Vec<i32> = (0..17).map(|i| (i * 7 % 11) + 1).collect();
    let x = Tensor::from_slice(&[&seq[..8], &seq[8..16]].concat(), &[2, 8]);
    let y = Tensor::from_slice(&[&seq[1..9], &seq[9..17]].concat(), &[2, 8]);
    (x, y)
}

fn logits(m: &Gpt) -> Vec<f64> {
    lazuli::no_grad(|| m.forward(&batch().0)).to_vec::<f32>().unwrap().into_iter().map(f64::from).collect()
}

#[test]
fn scanned_blocks_compute_what_the_unrolled_ones_do() {
    let (unrolled, scanned) = (gpt(false, 5), gpt(true, 5));
    assert!(scanned.blocks.is_empty() && scanned.scanned.as_ref().is_some_and(|s| s.len() == 3));
    assert_eq!(scanned.num_params(), unrolled.num_params());
    common::assert_close("logits", DType::F32, &logits(&scanned), &logits(&unrolled));
    // Against the reference interpreter too.
    let reference = lazuli::no_grad(|| scanned.forward(&batch().0)).evaluate_reference().unwrap();
    common::assert_close("logits vs reference", DType::F32, reference.as_slice().unwrap(), &logits(&unrolled));
}

#[test]
fn gradients_are_the_unrolled_gradients_stacked() {
    // A loop (the CPU's default) and written out (`ScannedBlocks::unroll`, the GPUs' default), saved or recomputed.
    for (remat, unroll) in [(false, None), (true, None), (false, Some(true)), (true, Some(true))] {
        let mut scanned = Gpt::new(&mut HostRng::new(6), config_remat(true, remat, 3));
        assert_eq!(scanned.scanned.as_ref().map(|s| s.remat), Some(remat));
        if let Some(s) = &mut scanned.scanned {
            s.unroll = unroll;
        }
        check_stacked_gradients(&gpt(false, 6), &scanned, remat);
    }
}

/// The scanned model's gradients are the unrolled one's, stacked over the blocks.
fn check_stacked_gradients(unrolled: &Gpt, scanned: &Gpt, remat: bool) {
    let (x, y) = batch();
    unrolled.loss(&x, &y).backward();
    scanned.loss(&x, &y).backward();
    lazuli::sync().unwrap(); // every gradient in one program, not one per read
    let grads: BTreeMap<String, Vec<f64>> = unrolled
        .named_params()
        .into_iter()
        .map(|(n, p)| (n, p.grad().unwrap().to_vec::<f32>().unwrap().into_iter().map(f64::from).collect()))
        .collect();
    for (name, p) in scanned.named_params() {
        let got: Vec<f64> = p.grad().unwrap().to_vec::<f32>().unwrap().into_iter().map(f64::from).collect();
        let want: Vec<f64> = match name.strip_prefix("blocks.*.") {
            Some(rest) => (0..3).flat_map(|i| grads[&format!("blocks.{i}.{rest}")].clone()).collect(),
            None => grads[&name].clone(),
        };
        common::assert_close(&format!("d/d {name} (remat {remat})"), DType::F32, &got, &want);
    }
}

/// Losses of `steps` AdamW steps.
fn train(m: &Gpt, opt: &mut AdamW, steps: usize) -> Vec<f64> {
    let (x, y) = batch();
    (0..steps)
        .map(|_| {
            let loss = m.loss(&x, &y);
            loss.backward();
            opt.step();
            opt.zero_grad();
            lazuli::sync().unwrap();
            loss.item::<f32>().unwrap() as f64
        })
        .collect()
}

#[test]
fn training_and_checkpoints_agree_between_the_two_forms() {
    let dir = std::env::temp_dir().join(format!("lazuli-scanned-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (unrolled, scanned) = (gpt(false, 7), gpt(true, 7));
    let (mut uo, mut so) = (AdamW::new(unrolled.named_params(), 1e-2), AdamW::new(scanned.named_params(), 1e-2));
    let (lu, ls) = (train(&unrolled, &mut uo, 4), train(&scanned, &mut so, 4));
    common::assert_close("losses", DType::F32, &ls, &lu);
    assert!(ls[3] < ls[0], "it learns: {ls:?}");

    // The scanned model's checkpoint, optimizer included, resumes the unrolled model, and the other way round.
    let (from_scanned, from_unrolled) = (dir.join("scanned.safetensors"), dir.join("unrolled.safetensors"));
    checkpoint::save(&from_scanned, &scanned, Some(&so), &[], &BTreeMap::new()).unwrap();
    checkpoint::save(&from_unrolled, &unrolled, Some(&uo), &[], &BTreeMap::new()).unwrap();
    let (u2, s2) = (gpt(false, 99), gpt(true, 99));
    let (mut u2o, mut s2o) = (AdamW::new(u2.named_params(), 1e-2), AdamW::new(s2.named_params(), 1e-2));
    checkpoint::load(&from_scanned, &u2, Some(&mut u2o)).unwrap();
    checkpoint::load(&from_unrolled, &s2, Some(&mut s2o)).unwrap();
    common::assert_close("unrolled from the scanned file", DType::F32, &logits(&u2), &logits(&unrolled));
    common::assert_close("scanned from the unrolled file", DType::F32, &logits(&s2), &logits(&scanned));
    let more = train(&unrolled, &mut uo, 2);
    common::assert_close("resumed unrolled", DType::F32, &train(&u2, &mut u2o, 2), &more);
    common::assert_close("resumed scanned", DType::F32, &train(&s2, &mut s2o, 2), &more);

    // A file of a model with other sizes is refused, naming the layer.
    let other = Gpt::new(&mut HostRng::new(1), config(true, 2));
    let e = checkpoint::load(&from_unrolled, &other, None).unwrap_err().to_string();
    assert!(e.contains("blocks.2."), "{e}");
    std::fs::remove_dir_all(&dir).ok();
}

/// A new scanned model's stacked parameters are values, not pending stacks: its first step runs the program every
/// later step runs, so the second step compiles nothing (looped or written out).
#[test]
fn the_second_step_of_a_scanned_gpt_compiles_nothing() {
    if common::child::alone(module_path!(), "the_second_step_of_a_scanned_gpt_compiles_nothing") {
        return; // the compile counter is process-wide: alone in a process of its own
    }
    for unroll in [false, true] {
        let mut m = gpt(true, 8);
        assert!(m.named_params().iter().all(|(_, p)| !p.get().is_pending()), "unroll {unroll}: pending parameters");
        if let Some(s) = &mut m.scanned {
            s.unroll = Some(unroll);
        }
        let mut opt = AdamW::new(m.named_params(), 1e-2);
        train(&m, &mut opt, 1);
        let compiled = lazuli::metrics().compiles;
        let losses = train(&m, &mut opt, 2);
        assert_eq!(lazuli::metrics().compiles, compiled, "unroll {unroll}: later steps compiled again");
        assert!(losses.iter().all(|l| l.is_finite()), "{losses:?}");
    }
}

/// Blocks whose parameters are pending values (here: scaled after construction) stack into computed values too,
/// equal to the blocks' parameters stacked.
#[test]
fn blocks_with_pending_parameters_stack_into_values() {
    let unrolled = gpt(false, 9);
    for (_, p) in unrolled.named_params() {
        p.set(&p.get() * 0.5);
    }
    let scanned = lazuli::nn::scanned::ScannedBlocks::from_blocks(&unrolled.blocks, &config(true, 3));
    let blocks: BTreeMap<String, Vec<f64>> = unrolled
        .named_params()
        .into_iter()
        .map(|(n, p)| (n, p.get().to_dtype(DType::F64).to_vec::<f64>().unwrap()))
        .collect();
    for (name, p) in &scanned.stacked {
        assert!(!p.get().is_pending(), "{name} is still pending");
        let got = p.get().to_dtype(DType::F64).to_vec::<f64>().unwrap();
        let want: Vec<f64> = (0..3).flat_map(|i| blocks[&format!("blocks.{i}.{name}")].clone()).collect();
        assert_eq!(got, want, "{name}");
    }
}

/// Checkpointed blocks written out keep what the unrolled model's checkpointed blocks keep (XLA's memory plan of the
/// gradients' program, `lazuli::program_memory`): each recomputed step stays apart from the forward step it
/// recomputes (an optimization barrier; without it XLA merges the two and keeps every activation, 78 MB against
/// 13 MB on the default CPU plugin). How much that is depends on the plugin's scheduler: the default CPU plugin's
/// plan keeps about a sixth of what saving the activations keeps, the second CPU plugin's about as much (the same
/// for the unrolled model). Losses are equal in all four.
#[test]
fn checkpointed_blocks_written_out_keep_what_unrolled_checkpointed_blocks_keep() {
    let temp_bytes = |scan: bool, remat: bool| {
        let cfg = GptConfig { block_size: 128, d_model: 32, ..config_remat(scan, remat, 8) };
        let mut m = Gpt::new(&mut HostRng::new(3), cfg);
        if let Some(s) = &mut m.scanned {
            s.unroll = Some(true);
        }
        let seq: Vec<i32> = (0..16 * 128 + 1).map(|i| (i * 7 % 11) + 1).collect();
        let (x, y) = (Tensor::from_slice(&seq[..16 * 128], &[16, 128]), Tensor::from_slice(&seq[1..], &[16, 128]));
        let loss = m.loss(&x, &y);
        loss.backward();
        lazuli::sync().unwrap();
        let mem = lazuli::program_memory().unwrap().expect("a program ran");
        (mem.temp_bytes, loss.item::<f32>().unwrap())
    };
    let (saving, l0) = temp_bytes(true, false);
    let (recomputing, l1) = temp_bytes(true, true);
    let (unrolled_saving, l2) = temp_bytes(false, false);
    let (unrolled_recomputing, l3) = temp_bytes(false, true);
    let close = |a: f32, b: f32| (a - b).abs() <= 1e-5 * b.abs();
    assert!(close(l0, l2) && close(l1, l2) && close(l3, l2), "losses {l0} {l1} {l2} {l3}");
    assert!(
        recomputing * 4 <= unrolled_recomputing * 5,
        "written out {recomputing} against the unrolled model's {unrolled_recomputing}"
    );
    if unrolled_recomputing * 3 < unrolled_saving {
        assert!(recomputing * 3 < saving, "written out: {recomputing} recomputing against {saving} saving");
    }
}
