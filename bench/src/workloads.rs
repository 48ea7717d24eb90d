//! The training workloads and their lazuli side: model, optimizer, batches, the shared weights file, and a timed
//! step (record forward, backward and update, then `sync()`, which launches one program, and `wait()`).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Instant;

use lazuli::nn::{Activation, Gpt, GptConfig, HostRng, Mlp};
use lazuli::{checkpoint, AdamW, DType, Module, Optimizer, Sgd, Tensor};
use serde_json::{json, Value};

use crate::worker::{Split, StepRun};
use crate::BenchResult;

#[derive(Clone, Debug, PartialEq)]
pub enum Opt {
    Sgd { lr: f64 },
    AdamW { lr: f64, beta1: f64, beta2: f64, eps: f64, weight_decay: f64 },
}

#[derive(Clone, Debug, PartialEq)]
pub enum Model {
    /// ReLU between layers, cross-entropy on the output.
    Mlp { sizes: Vec<usize> },
    /// lazuli's `nn::Gpt`; `seq` tokens per example.
    Gpt { config: GptConfig, seq: usize },
}

/// How a GPT computes causal self-attention.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Attention {
    /// Scores, mask, softmax and the weighted sum as separate ops (bf16 matmuls, f32 mask and softmax).
    #[default]
    Written,
    /// One fused attention op on bf16 q, k, v (cuDNN flash attention on a GPU); bf16-matmul GPTs only.
    Fused,
}

impl Attention {
    /// The name the worker and the command line use.
    pub fn name(self) -> &'static str {
        match self {
            Attention::Written => "written",
            Attention::Fused => "fused",
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Workload {
    pub name: String,
    pub model: Model,
    pub batch: usize,
    pub opt: Opt,
    /// Matmul operands converted to bf16 (results back to f32); everything else f32.
    pub bf16_matmul: bool,
    /// Causal self-attention, written out or fused (GPT only).
    pub attention: Attention,
    /// Distinct synthetic batches, used in turn.
    pub batches: usize,
    /// Seed of the initial weights and the batches.
    pub seed: u64,
}

const GPT_ADAMW: Opt = Opt::AdamW { lr: 3e-3, beta1: 0.9, beta2: 0.95, eps: 1e-8, weight_decay: 0.1 };

impl Workload {
    fn mlp(name: &str, sizes: &[usize], batch: usize) -> Workload {
        Workload {
            name: name.into(),
            model: Model::Mlp { sizes: sizes.to_vec() },
            batch,
            opt: Opt::Sgd { lr: 0.1 },
            bf16_matmul: false,
            attention: Attention::Written,
            batches: 4,
            seed: 1,
        }
    }

    /// SGD step of a 32-64-10 MLP on batches of 8: overhead-bound.
    pub fn mlp_tiny() -> Workload {
        Workload::mlp("mlp-tiny", &[32, 64, 10], 8)
    }

    /// SGD step of a 784-512-512-10 MLP on batches of 128 (MNIST's shapes, synthetic data).
    pub fn mlp_mnist() -> Workload {
        Workload::mlp("mlp-mnist", &[784, 512, 512, 10], 128)
    }

    /// The CPU workloads, in table order: `mlp-tiny`, `mlp-mnist`, `gpt-tiny`.
    pub fn cpu_workloads() -> [Workload; 3] {
        [Workload::mlp_tiny(), Workload::mlp_mnist(), Workload::gpt_tiny()]
    }

    /// A GPT training step with AdamW sized to run in about 10 ms on a 2-core CPU.
    pub fn gpt_tiny() -> Workload {
        let config = GptConfig {
            vocab: 128,
            block_size: 64,
            n_layer: 2,
            n_head: 4,
            d_model: 64,
            dropout: 0.0,
            dtype: DType::F32,
            scan_blocks: false,
            checkpoint_blocks: false,
        };
        Workload {
            name: "gpt-tiny".into(),
            model: Model::Gpt { config, seq: 64 },
            batch: 8,
            opt: GPT_ADAMW,
            bf16_matmul: false,
            attention: Attention::Written,
            batches: 4,
            seed: 1,
        }
    }

    /// GPT-2 small (124M) at T = 1024, B = 8, vocabulary 50304, f32 master weights and bf16 matmuls: the GPU row.
    pub fn gpt2_small_gpu() -> Workload {
        let config = GptConfig { dropout: 0.0, ..GptConfig::gpt2_small(50304) };
        Workload {
            name: "gpt2-small".into(),
            model: Model::Gpt { config, seq: 1024 },
            batch: 8,
            opt: Opt::AdamW { lr: 6e-4, beta1: 0.9, beta2: 0.95, eps: 1e-8, weight_decay: 0.1 },
            bf16_matmul: true,
            attention: Attention::Written,
            batches: 2,
            seed: 1,
        }
    }

    /// The description the Python worker builds the same model from.
    pub fn to_json(&self) -> Value {
        let opt = match self.opt {
            Opt::Sgd { lr } => json!({"name": "sgd", "lr": lr}),
            Opt::AdamW { lr, beta1, beta2, eps, weight_decay } => {
                json!({"name": "adamw", "lr": lr, "beta1": beta1, "beta2": beta2, "eps": eps, "weight_decay": weight_decay})
            }
        };
        let mut v = match &self.model {
            Model::Mlp { sizes } => json!({"kind": "mlp", "sizes": sizes}),
            Model::Gpt { config: c, seq } => json!({"kind": "gpt", "vocab": c.vocab, "n_layer": c.n_layer,
                "n_head": c.n_head, "d_model": c.d_model, "seq": seq, "scan_layers": c.scan_blocks}),
        };
        v["name"] = json!(self.name);
        v["batch"] = json!(self.batch);
        v["optimizer"] = opt;
        v["bf16_matmul"] = json!(self.bf16_matmul);
        v["attention"] = json!(self.attention.name());
        v
    }

    /// Tokens per step (GPT) or examples per step (MLP).
    pub fn items_per_step(&self) -> usize {
        match &self.model {
            Model::Mlp { .. } => self.batch,
            Model::Gpt { seq, .. } => self.batch * seq,
        }
    }
}

enum Net {
    Mlp(Mlp),
    Gpt(Gpt),
}

impl Net {
    fn module(&self) -> &dyn Module {
        match self {
            Net::Mlp(m) => m,
            Net::Gpt(g) => g,
        }
    }
}

/// Inputs of one batch: f32 features (MLP) or i32 token ids (GPT), and i32 targets.
enum Batch {
    Features(Vec<f32>),
    Tokens(Vec<i32>),
}

/// A workload's lazuli side: the model, its optimizer and the batches.
pub struct LazuliRun {
    pub workload: Workload,
    net: Net,
    opt: Box<dyn Optimizer>,
    inputs: Vec<Batch>,
    targets: Vec<Vec<i32>>,
    next: usize,
    /// When the latest step began, in ns since the epoch (for `LAZULI_BENCH_MARKS`, see `head.rs`).
    started_ns: i128,
}

impl LazuliRun {
    pub fn new(workload: &Workload) -> LazuliRun {
        let w = workload.clone();
        let mut rng = HostRng::new(w.seed);
        let net = match &w.model {
            Model::Mlp { sizes } => Net::Mlp(Mlp::new(&mut rng, sizes, Activation::Relu, DType::F32)),
            Model::Gpt { config, .. } => Net::Gpt(Gpt::new(&mut rng, config.clone())),
        };
        let params = net.module().named_params();
        let opt: Box<dyn Optimizer> = match w.opt {
            Opt::Sgd { lr } => Box::new(Sgd::new(params, lr)),
            Opt::AdamW { lr, beta1, beta2, eps, weight_decay } => {
                Box::new(AdamW::new(params, lr).betas(beta1, beta2).eps(eps).weight_decay(weight_decay))
            }
        };
        let mut data = HostRng::new(w.seed + 1000);
        let (mut inputs, mut targets) = (Vec::new(), Vec::new());
        for _ in 0..w.batches {
            match &w.model {
                Model::Mlp { sizes } => {
                    let (d_in, classes) = (sizes[0], sizes[sizes.len() - 1] as u64);
                    inputs.push(Batch::Features((0..w.batch * d_in).map(|_| data.normal() as f32).collect()));
                    targets.push((0..w.batch).map(|_| data.below(classes) as i32).collect());
                }
                Model::Gpt { config, seq } => {
                    let n = w.batch * seq;
                    let vocab = config.vocab as u64;
                    // Random tokens; each target is a fixed function of its token, so the loss falls from step 1.
                    let ids: Vec<i32> = (0..n).map(|_| data.below(vocab) as i32).collect();
                    targets.push(ids.iter().map(|&t| ((t as u64 * 7 + 3) % vocab) as i32).collect());
                    inputs.push(Batch::Tokens(ids));
                }
            }
        }
        LazuliRun { workload: w, net, opt, inputs, targets, next: 0, started_ns: 0 }
    }

    fn input_dims(&self) -> Vec<usize> {
        match &self.workload.model {
            Model::Mlp { sizes } => vec![self.workload.batch, sizes[0]],
            Model::Gpt { seq, .. } => vec![self.workload.batch, *seq],
        }
    }

    /// Write the initial weights (`model.<name>`) and all batches (`extra.x`, `extra.y`) as safetensors.
    pub fn write_weights(&self, path: &Path) -> BenchResult<()> {
        let mut dims = vec![self.workload.batches];
        dims.extend(self.input_dims());
        let x = match &self.inputs[0] {
            Batch::Features(_) => {
                let all: Vec<f32> = self
                    .inputs
                    .iter()
                    .flat_map(|b| if let Batch::Features(v) = b { v.clone() } else { vec![] })
                    .collect();
                Tensor::from_slice(&all, &dims)
            }
            Batch::Tokens(_) => {
                let all: Vec<i32> = self
                    .inputs
                    .iter()
                    .flat_map(|b| if let Batch::Tokens(v) = b { v.clone() } else { vec![] })
                    .collect();
                Tensor::from_slice(&all, &dims)
            }
        };
        let ydims = match &self.workload.model {
            Model::Mlp { .. } => vec![self.workload.batches, self.workload.batch],
            Model::Gpt { seq, .. } => vec![self.workload.batches, self.workload.batch, *seq],
        };
        let y = Tensor::from_slice(&self.targets.concat(), &ydims);
        let mut meta = BTreeMap::new();
        meta.insert("workload".to_string(), self.workload.to_json().to_string());
        checkpoint::save(path, self.net.module(), None, &[("x", x), ("y", y)], &meta)?;
        Ok(())
    }

    /// Record one training step on the next batch and run it (one program); returns the loss (on the device)
    /// and the time spent recording before `sync()`: forward, backward, optimizer update.
    pub fn step(&mut self) -> BenchResult<(Tensor, [f64; 3])> {
        let t0 = Instant::now();
        self.started_ns = crate::head::wall_ns();
        let i = self.next % self.inputs.len();
        self.next += 1;
        let dims = self.input_dims();
        let x = match &self.inputs[i] {
            Batch::Features(v) => Tensor::from_slice(v, &dims),
            Batch::Tokens(v) => Tensor::from_slice(v, &dims),
        };
        // Targets: one class per example (MLP) or one token per position (GPT).
        let target_rank = if matches!(self.workload.model, Model::Mlp { .. }) { 1 } else { 2 };
        let y = Tensor::from_slice(&self.targets[i], &dims[..target_rank]);
        let loss = match &self.net {
            Net::Mlp(m) => m.forward(&x).cross_entropy(&y),
            Net::Gpt(g) if self.workload.bf16_matmul => crate::gpt_bf16::loss(g, &x, &y, self.workload.attention)?,
            Net::Gpt(_) if self.workload.attention == Attention::Fused => {
                return Err("fused attention is in the bf16-matmul GPT only (bench/src/gpt_bf16.rs)".into())
            }
            Net::Gpt(g) => g.loss(&x, &y),
        };
        let t1 = Instant::now();
        loss.backward();
        let t2 = Instant::now();
        self.opt.step();
        self.opt.zero_grad();
        let recorded = [t1 - t0, t2 - t1, t2.elapsed()].map(|d| d.as_secs_f64());
        lazuli::sync()?;
        Ok((loss, recorded))
    }

    /// `steps` timed steps; each time spans recording to the end of the step's program (`sync()` launches it,
    /// `wait()` waits for it). Pipelined: the steps run back to back, one `wait()` at the end, and every step
    /// gets the mean; the host then records step k+1 while the device runs step k.
    pub fn run(&mut self, steps: usize, pipelined: bool) -> BenchResult<StepRun> {
        let mut times = Vec::with_capacity(steps);
        let mut losses = Vec::with_capacity(steps);
        let mut record: Vec<[f64; 3]> = Vec::with_capacity(steps);
        // Per step, in seconds: execute (launch), sync before arguments, uploads, after launch, wait.
        let mut phases: [Vec<f64>; 5] = Default::default();
        // As a loop that logs its loss does: every step reads it to the host (`item()`), on every side.
        let read = std::env::var("LAZULI_BENCH_READ_LOSS").is_ok_and(|v| v == "1");
        // Each step's wall-clock marks, to set beside the plugin's profile (`lazuli-bench head`).
        let marks = std::env::var_os("LAZULI_BENCH_MARKS").map(std::path::PathBuf::from);
        let before = lazuli::metrics();
        let start = Instant::now();
        let probe = crate::host_probe::wanted();
        let mut probes = Vec::new();
        for _ in 0..steps {
            if probe {
                probes.push(crate::host_probe::run());
            }
            let m0 = lazuli::metrics();
            let t0 = Instant::now();
            let (loss, recorded) = self.step()?;
            if read {
                loss.item::<f32>()?;
            } else if !pipelined {
                lazuli::wait()?;
            }
            times.push(t0.elapsed().as_secs_f64());
            if let Some(path) = &marks {
                let ns = |s: f64| self.started_ns + (s * 1e9) as i128;
                let waited = (!pipelined).then(crate::head::wall_ns);
                let m = crate::head::Marks {
                    start: self.started_ns,
                    forward: ns(recorded[0]),
                    backward: ns(recorded[0] + recorded[1]),
                    waited,
                };
                crate::head::append(path, &m)?;
            }
            record.push(recorded);
            let d = lazuli::metrics() - m0;
            for (v, ms) in phases.iter_mut().zip([d.execute_ms, d.boundary_ms, d.upload_ms, d.finish_ms, d.wait_ms]) {
                v.push(ms / 1e3);
            }
            losses.push(loss);
        }
        if pipelined {
            let w0 = lazuli::metrics();
            lazuli::wait()?;
            let waited = (lazuli::metrics() - w0).wait_ms / 1e3;
            times = vec![start.elapsed().as_secs_f64() / steps.max(1) as f64; steps];
            phases[4].iter_mut().for_each(|w| *w += waited / steps.max(1) as f64);
        }
        let m = lazuli::metrics() - before;
        let losses = losses.iter().map(|l| l.item::<f32>().map(f64::from)).collect::<lazuli::Result<Vec<_>>>()?;
        let med = |v: &[f64]| crate::stats::median(v);
        let split = Split {
            record: med(&record.iter().map(|r| r.iter().sum()).collect::<Vec<f64>>()),
            record_parts: [0, 1, 2].map(|i| med(&record.iter().map(|r| r[i]).collect::<Vec<f64>>())),
            execute: med(&phases[0]),
            boundary: med(&phases[1]),
            upload: med(&phases[2]),
            finish: med(&phases[3]),
            wait: med(&phases[4]),
            programs_per_step: m.executions as f64 / steps.max(1) as f64,
            compiles: m.compiles,
        };
        if probe {
            let us = |i: usize| {
                med(&probes.iter().map(|p: &(f64, f64)| if i == 0 { p.0 } else { p.1 }).collect::<Vec<_>>()) * 1e6
            };
            eprintln!(
                "lazuli-bench: host probe before each step: compute {:.1} µs, memory {:.1} µs (medians)",
                us(0),
                us(1)
            );
        }
        let peak_bytes = lazuli::memory_stats().ok().and_then(|s| s.first()?.peak_bytes_in_use).map(|b| b as f64);
        Ok(StepRun { times, losses, split: Some(split), peak_bytes })
    }

    /// Number of parameter elements.
    pub fn num_params(&self) -> usize {
        self.net.module().num_params()
    }
}
