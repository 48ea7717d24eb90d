//! Train a character-level GPT on a text file (default: a corpus made of this repository's own sources and docs),
//! with AdamW and one compiled program per step; optionally sample from it. The text becomes a token file that
//! `lazuli::data` reads batches from at random offsets, a step ahead on a background thread.
//!
//! cargo run --release --example train_gpt -- [--data file.txt] [--steps N] [--save c.safetensors] [--resume c.safetensors] [--sample 300]

#[path = "common/mod.rs"]
mod common;

use std::collections::BTreeMap;
use std::path::PathBuf;

use clap::Parser;
use lazuli::data::Batches;
use lazuli::nn::{Gpt, GptConfig, HostRng};
use lazuli::{checkpoint, AdamW, DType, Module, Optimizer, Schedule, Tensor};

/// lazuli sets no allocator; an application picks one. mimalloc, also as C's malloc (its `override` feature),
/// serves recording's many small allocations and the plugin's much faster than glibc's malloc (README, "Allocator").
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(about = "Character-level GPT trained with lazuli")]
struct Args {
    /// Training text (UTF-8 or any bytes). Default: this repository's Rust sources and docs.
    #[arg(long)]
    data: Option<PathBuf>,
    #[arg(long, default_value_t = 600)]
    steps: u64,
    #[arg(long)]
    save: Option<PathBuf>,
    #[arg(long)]
    resume: Option<PathBuf>,
    /// Stop (and save, with --save) after this many steps, as if interrupted; --resume continues the same run.
    #[arg(long)]
    stop_at: Option<u64>,
    /// After training, print this many generated characters.
    #[arg(long)]
    sample: Option<usize>,
    #[arg(long, default_value_t = 16)]
    batch: usize,
    #[arg(long, default_value_t = 64)]
    block: usize,
    #[arg(long, default_value_t = 3)]
    layers: usize,
    #[arg(long, default_value_t = 4)]
    heads: usize,
    #[arg(long, default_value_t = 128)]
    dim: usize,
    #[arg(long, default_value_t = 3e-3)]
    lr: f64,
    /// Dropout probability (the mask comes from the device generator; resumed runs restore it).
    #[arg(long, default_value_t = 0.0)]
    dropout: f64,
    #[arg(long, default_value_t = 50)]
    log_every: u64,
    /// Seed of the batches' offsets.
    #[arg(long, default_value_t = 20_000)]
    data_seed: u64,
}

fn main() -> lazuli::Result<()> {
    let args = Args::parse();
    println!("train_gpt on {}", lazuli::runtime_info()?);
    let text = match &args.data {
        Some(p) => std::fs::read(p).map_err(|e| lazuli::Error::Config(format!("reading {}: {e}", p.display())))?,
        None => common::default_corpus(),
    };
    let (symbols, index, entropy) = common::vocabulary(&text);
    let ids: Vec<u32> = text.iter().map(|&b| index[b as usize] as u32).collect();
    let tokens = common::token_file(&ids)?;
    let config = GptConfig {
        vocab: symbols.len(),
        block_size: args.block,
        n_layer: args.layers,
        n_head: args.heads,
        d_model: args.dim,
        dropout: args.dropout,
        dtype: DType::F32,
        scan_blocks: false,
        checkpoint_blocks: false,
    };
    let model = Gpt::new(&mut HostRng::new(1), config);
    let mut opt = AdamW::new(model.named_params(), args.lr).betas(0.9, 0.95).weight_decay(0.01);
    let schedule = Schedule::WarmupCosine { peak: args.lr, min: args.lr / 10.0, warmup: 30, total: args.steps };
    println!(
        "corpus: {} bytes as {} u16 tokens, vocabulary {}, unigram entropy {entropy:.3} nats; model: {} parameters",
        text.len(),
        tokens.len(),
        symbols.len(),
        model.num_params()
    );
    lazuli::manual_seed(1234);
    let mut start = 0;
    if let Some(path) = &args.resume {
        let (extra, meta) = checkpoint::load(path, &model, Some(&mut opt))?;
        if let Some(state) = extra.get("rng") {
            lazuli::set_rng_state(state);
        }
        start = meta.optimizer_steps;
        println!("resumed from {} at step {start}", path.display());
    }

    let (b, t) = (args.batch, args.block);
    let end = args.stop_at.unwrap_or(args.steps).min(args.steps);
    // Batch k is a function of the seed and k alone: a resumed run starts at its step and sees the same data.
    let mut batches = Batches::new(&tokens, b, t, args.data_seed)?.starting_at(start).prefetch(2);
    let mut log = common::StepLog::new(start, args.steps).throughput((b * t) as u64, "tokens").every(args.log_every);
    let mut last_loss = f32::NAN;
    for (step, batch) in (start..end).zip(&mut batches) {
        let (x, y) = batch?;
        opt.set_lr(schedule.at(step));
        let loss = model.loss(&x, &y);
        let logged = common::finish_step(&mut opt, &loss, step % args.log_every == 0 || step + 1 == end)?;
        if let Some(l) = logged {
            last_loss = l;
        }
        log.step_done(step, logged);
    }
    let regular = log.finish();
    println!("unigram entropy: {entropy:.4} nats, last training loss: {last_loss:.4}");

    if let Some(path) = &args.save {
        let mut meta = BTreeMap::new();
        meta.insert("example".into(), "train_gpt".into());
        checkpoint::save(path, &model, Some(&opt), &[("rng", lazuli::rng_state())], &meta)?;
        println!("saved {}", path.display());
    }
    model.set_training(false);
    if let Some(n) = args.sample {
        // Sampling is not a training step: keep it out of the step accounting (and strict mode).
        let prompt = tokens.read(0, t / 2)?;
        let text = lazuli::diagnostics::unchecked(|| sample(&model, &prompt, &symbols, n))?;
        println!("--- sample ---\n{text}\n--------------");
    }
    if !regular {
        println!("warning: some steps compiled or ran more than one program");
    }
    println!("final loss: {last_loss}");
    Ok(())
}

/// Generate `n` characters after `prompt`. The window is always `block` long (right-padded): causal attention
/// makes the padding invisible to earlier positions, and one shape means one compiled program for every token.
fn sample(model: &Gpt, prompt: &[i32], symbols: &[u8], n: usize) -> lazuli::Result<String> {
    let (t, v) = (model.config.block_size, model.config.vocab);
    let mut seq: Vec<i32> = prompt.to_vec();
    let mut rng = HostRng::new(5);
    for _ in 0..n {
        let ctx: Vec<i32> = seq[seq.len().saturating_sub(t)..].to_vec();
        let pos = ctx.len() - 1;
        let mut window = ctx.clone();
        window.resize(t, 0);
        let logits = lazuli::no_grad(|| model.forward(&Tensor::from_slice(&window, &[1, t])));
        let row = &logits.to_vec::<f32>()?[pos * v..(pos + 1) * v];
        // Temperature 0.8 sampling on the host.
        let m = row.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        let w: Vec<f64> = row.iter().map(|&l| (((l - m) / 0.8) as f64).exp()).collect();
        let mut u = rng.uniform() * w.iter().sum::<f64>();
        let mut next = v - 1;
        for (i, wi) in w.iter().enumerate() {
            if u < *wi {
                next = i;
                break;
            }
            u -= wi;
        }
        seq.push(next as i32);
    }
    Ok(String::from_utf8_lossy(&seq.iter().map(|&i| symbols[i as usize]).collect::<Vec<u8>>()).to_string())
}
