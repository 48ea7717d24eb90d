//! Fine-tune GPT-2 weights in Hugging Face's layout: load a `model.safetensors` into `nn::Gpt`, train it on a
//! token file with `lazuli::data`, save it back in the same layout, and check that the saved file reloads into
//! the same model.
//!
//! cargo run --release --example finetune_gpt2 -- [--weights model.safetensors --heads 12] [--tokens t.bin] [--steps N] [--out f]
//!
//! With `--weights` (e.g. GPT-2 small's `model.safetensors` from the Hugging Face hub) and `--tokens` (GPT-2 token
//! ids, u16, one after another) it fine-tunes the real model. Without them it makes a stand-in so that it runs
//! anywhere, offline: a small byte-level GPT written in GPT-2's layout, and this repository's sources as bytes.

#[path = "common/mod.rs"]
mod common;

use std::path::PathBuf;

use clap::Parser;
use lazuli::data::{Batches, TokenFile, TokenWidth};
use lazuli::nn::{gpt2, Gpt, GptConfig, HostRng};
use lazuli::{AdamW, DType, Error, Module, Optimizer, Schedule};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(about = "Fine-tune GPT-2-layout weights with lazuli and save them back")]
struct Args {
    /// GPT-2 weights (`model.safetensors`, `GPT2Model` or `GPT2LMHeadModel` names). Default: a stand-in.
    #[arg(long)]
    weights: Option<PathBuf>,
    /// Attention heads of `--weights` (shapes do not record them; GPT-2 small has 12).
    #[arg(long, default_value_t = 12)]
    heads: usize,
    /// Training tokens: u16 ids (`--u32` for u32). Default: this repository's sources as bytes.
    #[arg(long)]
    tokens: Option<PathBuf>,
    #[arg(long)]
    u32: bool,
    /// Where the fine-tuned weights go (GPT-2's layout). Default: a file in the temporary directory.
    #[arg(long)]
    out: Option<PathBuf>,
    #[arg(long, default_value_t = 120)]
    steps: u64,
    #[arg(long, default_value_t = 8)]
    batch: usize,
    /// Tokens per sequence (at most the model's positions).
    #[arg(long, default_value_t = 64)]
    seq: usize,
    #[arg(long, default_value_t = 1e-3)]
    lr: f64,
    #[arg(long, default_value_t = 30)]
    log_every: u64,
}

/// The stand-in for downloaded weights: a byte-level GPT (vocabulary 256) of random weights in GPT-2's layout.
fn stand_in_weights(dir: &std::path::Path) -> lazuli::Result<PathBuf> {
    let config = GptConfig {
        vocab: 256,
        block_size: 128,
        n_layer: 2,
        n_head: 4,
        d_model: 128,
        dropout: 0.0,
        dtype: DType::F32,
        scan_blocks: false,
        checkpoint_blocks: false,
    };
    let path = dir.join("stand-in-gpt2.safetensors");
    gpt2::save_hf(&path, &Gpt::new(&mut HostRng::new(7), config))?;
    Ok(path)
}

fn main() -> lazuli::Result<()> {
    let args = Args::parse();
    println!("finetune_gpt2 on {}", lazuli::runtime_info()?);
    let dir = std::env::temp_dir().join(format!("lazuli-finetune-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| Error::Config(format!("creating {}: {e}", dir.display())))?;
    let (weights, heads) = match &args.weights {
        Some(p) => (p.clone(), args.heads),
        None => (stand_in_weights(&dir)?, 4),
    };

    // Load: the file's tensors, the config their shapes imply, and the model holding them.
    let tensors = lazuli::safetensors::load(&weights)?.into_vec();
    let config = gpt2::config_of(&tensors, heads)?;
    let model = gpt2::from_hf(&tensors, config.clone())?;
    drop(tensors);
    println!(
        "loaded {}: {} layers, width {}, vocabulary {}, {} positions, {} parameters",
        weights.display(),
        config.n_layer,
        config.d_model,
        config.vocab,
        config.block_size,
        model.num_params()
    );

    let tokens = match &args.tokens {
        Some(p) => TokenFile::open(p, if args.u32 { TokenWidth::U32 } else { TokenWidth::U16 })?,
        None => {
            let ids: Vec<u32> = common::default_corpus().iter().map(|&b| b as u32).collect();
            common::token_file(&ids)?
        }
    };
    let seq = args.seq.min(config.block_size);
    let mut batches = Batches::new(&tokens, args.batch, seq, 1)?.prefetch(2);
    // One fixed batch (its own seed) measures the model before, after, and after the round trip through the file.
    let (probe_x, probe_y) = Batches::new(&tokens, args.batch, seq, 99)?.host(0)?.tensors();
    let probe = |m: &Gpt| lazuli::no_grad(|| m.loss(&probe_x, &probe_y)).item::<f32>();
    let before = lazuli::diagnostics::unchecked(|| probe(&model))?;

    let mut opt = AdamW::new(model.named_params(), args.lr).betas(0.9, 0.95).weight_decay(0.01);
    let schedule = Schedule::WarmupCosine { peak: args.lr, min: args.lr / 10.0, warmup: 10, total: args.steps };
    let per_step = (args.batch * seq) as u64;
    let mut log = common::StepLog::new(0, args.steps).throughput(per_step, "tokens").every(args.log_every);
    for (step, batch) in (0..args.steps).zip(&mut batches) {
        let (x, y) = batch?;
        opt.set_lr(schedule.at(step));
        let loss = model.loss(&x, &y);
        let read = step % args.log_every == 0 || step + 1 == args.steps;
        let logged = common::finish_step(&mut opt, &loss, read)?;
        log.step_done(step, logged);
    }
    log.finish();

    // Save in GPT-2's layout, load the file again, and check that it is the same model.
    let out = args.out.clone().unwrap_or_else(|| dir.join("finetuned.safetensors"));
    gpt2::save_hf(&out, &model)?;
    let reloaded = gpt2::load_hf(&out, config.clone())?;
    let (after, again) = lazuli::diagnostics::unchecked(|| Ok::<_, Error>((probe(&model)?, probe(&reloaded)?)))?;
    println!(
        "loss on a fixed batch: {before:.4} before, {after:.4} after fine-tuning, {again:.4} reloaded from {}",
        out.display()
    );
    if after.to_bits() != again.to_bits() {
        return Err(Error::Weights(format!("the saved weights give {again}, the model in memory {after}")));
    }
    if args.out.is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    println!("final loss: {after}");
    Ok(())
}
