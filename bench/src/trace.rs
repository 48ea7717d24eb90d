//! The `trace` workload: the host-side cost of a GPT-2-small-sized training step (forward, backward, AdamW)
//! without executing it: recording, autodiff, the optimizer's recording, then what `sync()` does before it runs
//! anything (collect the live tensors, walk the graph, hash it, look it up). Split by phase, for several depths.
//!
//! It must run with donation off (`LAZULI_DONATE=0`, set by the `cpu` command when it starts this as a child):
//! the timing hook's key leaves donation out, and only then is it `sync()`'s key, so the primed step is a hit.

use std::collections::HashMap;
use std::time::Instant;

use lazuli::nn::{Gpt, GptConfig, HostRng};
use lazuli::{AdamW, DType, Module, Optimizer, Tensor};
use lazuli_lazy::exec::bench_hooks::time_boundary;
use serde_json::{json, Value};

use crate::stats::median;
use crate::BenchResult;

/// Medians over the timed iterations, in seconds.
#[derive(Clone, Debug, Default)]
pub struct TraceRow {
    pub layers: usize,
    pub nodes: usize,
    pub inputs: usize,
    pub outputs: usize,
    pub record: f64,
    pub autodiff: f64,
    pub optimizer: f64,
    /// Collecting the live pending tensors (the targets).
    pub collect: f64,
    /// Walking their graph, hashing the structure as it goes.
    pub walk: f64,
    pub hash: f64,
    pub lookup: f64,
    pub total: f64,
    pub cache_hit: bool,
}

impl TraceRow {
    pub fn to_json(&self) -> Value {
        json!({"layers": self.layers, "nodes": self.nodes, "inputs": self.inputs, "outputs": self.outputs,
            "record": self.record, "autodiff": self.autodiff, "optimizer": self.optimizer, "collect": self.collect, "walk": self.walk,
            "hash": self.hash, "lookup": self.lookup, "total": self.total, "cache_hit": self.cache_hit})
    }

    pub fn from_json(v: &Value) -> TraceRow {
        let f = |k: &str| v[k].as_f64().unwrap_or(f64::NAN);
        let u = |k: &str| v[k].as_u64().unwrap_or(0) as usize;
        TraceRow {
            layers: u("layers"),
            nodes: u("nodes"),
            inputs: u("inputs"),
            outputs: u("outputs"),
            record: f("record"),
            autodiff: f("autodiff"),
            optimizer: f("optimizer"),
            collect: f("collect"),
            walk: f("walk"),
            hash: f("hash"),
            lookup: f("lookup"),
            total: f("total"),
            cache_hit: v["cache_hit"].as_bool().unwrap_or(false),
        }
    }
}

/// GPT-2 small's structure (12 heads, d = 768, vocabulary 50304, 1024 positions) at `layers` layers. The batch
/// recorded is [1, 64] tokens: shapes enter the graph only as types, so tracing costs the same as at [8, 1024],
/// while the one step that is executed (to compile and cache the program) stays cheap on a CPU.
pub fn config(layers: usize) -> GptConfig {
    GptConfig { n_layer: layers, dropout: 0.0, dtype: DType::F32, ..GptConfig::gpt2_small(50304) }
}

const TOKENS: [usize; 2] = [1, 64];

fn batch() -> (Tensor, Tensor) {
    let mut rng = HostRng::new(7);
    let n = TOKENS[0] * TOKENS[1];
    let ids: Vec<i32> = (0..n).map(|_| rng.below(50304) as i32).collect();
    let tgt: Vec<i32> = (0..n).map(|_| rng.below(50304) as i32).collect();
    (Tensor::from_slice(&ids, &TOKENS), Tensor::from_slice(&tgt, &TOKENS))
}

/// Time `iters` traces of one training step at `layers` layers, each after the host slept `pause` (none: back to
/// back). With `prime`, one real step runs first (compiling the program), so the lookups are hits.
pub fn measure(layers: usize, iters: usize, prime: bool, pause: std::time::Duration) -> BenchResult<TraceRow> {
    if std::env::var("LAZULI_DONATE").as_deref() != Ok("0") {
        return Err("the trace workload needs LAZULI_DONATE=0 (see bench/src/trace.rs)".into());
    }
    let model = Gpt::new(&mut HostRng::new(1), config(layers));
    let mut opt = AdamW::new(model.named_params(), 6e-4).betas(0.9, 0.95).weight_decay(0.1);
    let (ids, targets) = batch();
    if prime {
        let loss = model.loss(&ids, &targets);
        loss.backward();
        opt.step();
        opt.zero_grad();
        lazuli::sync()?;
    }
    // Each iteration records on these values and is then thrown away: put them back after it.
    let params = model.params();
    let weights: Vec<Tensor> = params.iter().map(|p| p.get()).collect();
    let state: HashMap<String, Tensor> = opt.state().into_iter().collect();
    let steps = opt.steps();
    let mut cols: [Vec<f64>; 8] = Default::default();
    let mut last = None;
    for i in 0..iters + 2 {
        if !pause.is_zero() {
            std::thread::sleep(pause);
        }
        let t0 = Instant::now();
        let loss = model.loss(&ids, &targets);
        let t1 = Instant::now();
        loss.backward();
        let t2 = Instant::now();
        opt.step();
        opt.zero_grad();
        let t3 = Instant::now();
        let b = time_boundary()?;
        let total = t3 - t0 + b.collect + b.walk + b.hash + b.lookup;
        // The first two iterations warm allocator and caches up.
        if i >= 2 {
            let phases = [t1 - t0, t2 - t1, t3 - t2, b.collect, b.walk, b.hash, b.lookup, total];
            for (c, d) in cols.iter_mut().zip(phases) {
                c.push(d.as_secs_f64());
            }
        }
        last = Some(b);
        drop(loss);
        for (p, w) in params.iter().zip(&weights) {
            p.set(w.clone());
            p.zero_grad();
        }
        opt.load_state(&state, steps)?;
    }
    let b = last.ok_or("no iteration ran")?;
    let m = |i: usize| median(&cols[i]);
    Ok(TraceRow {
        layers,
        nodes: b.nodes,
        inputs: b.inputs,
        outputs: b.outputs,
        record: m(0),
        autodiff: m(1),
        optimizer: m(2),
        collect: m(3),
        walk: m(4),
        hash: m(5),
        lookup: m(6),
        total: m(7),
        cache_hit: b.cache_hit,
    })
}
