//! What the training examples share: a progress bar, per-step program accounting, and the final report.
#![allow(dead_code)]

use std::path::Path;

use indicatif::{ProgressBar, ProgressStyle};
use lazuli::{Metrics, Optimizer, Tensor};

/// The end of a training step: gradients, the update, the step boundary, and (when `read`) the loss, read after
/// the boundary so that reading it runs no second program.
pub fn finish_step(opt: &mut dyn Optimizer, loss: &Tensor, read: bool) -> lazuli::Result<Option<f32>> {
    loss.backward();
    opt.step();
    opt.zero_grad();
    lazuli::sync()?;
    read.then(|| loss.item::<f32>()).transpose()
}

/// Tracks what each step cost: after the first step, a step must compile nothing and run one program.
pub struct StepLog {
    bar: ProgressBar,
    last: Metrics,
    start: std::time::Instant,
    pub steps: u64,
    /// Steps after the first that compiled or ran more than one program.
    pub irregular: Vec<(u64, Metrics)>,
    step_times: Vec<f64>,
}

impl StepLog {
    pub fn new(first_step: u64, total: u64) -> StepLog {
        let bar = ProgressBar::new(total);
        bar.set_style(
            ProgressStyle::with_template("{bar:40.cyan/blue} {pos}/{len} steps  {msg}  [{elapsed_precise} < {eta}]")
                .expect("a valid template")
                .progress_chars("=> "),
        );
        bar.set_position(first_step);
        StepLog {
            bar,
            last: lazuli::metrics(),
            start: std::time::Instant::now(),
            steps: 0,
            irregular: Vec::new(),
            step_times: Vec::new(),
        }
    }

    /// Call right after the step boundary (`lazuli::sync()`).
    pub fn step_done(&mut self, step: u64, loss: Option<f32>) {
        let now = lazuli::metrics();
        let d = now - self.last;
        self.last = now;
        if self.steps > 0 && (d.compiles != 0 || d.executions != 1) {
            self.irregular.push((step, d));
        }
        self.step_times.push(self.start.elapsed().as_secs_f64());
        self.steps += 1;
        if let Some(l) = loss {
            self.bar.set_message(format!("loss {l:.4}"));
        }
        self.bar.inc(1);
    }

    /// Median wall time per step after the first (ms).
    pub fn median_step_ms(&self) -> f64 {
        let mut d: Vec<f64> = self.step_times.windows(2).map(|w| (w[1] - w[0]) * 1e3).collect();
        if d.is_empty() {
            return f64::NAN;
        }
        d.sort_by(|a, b| a.total_cmp(b));
        d[d.len() / 2]
    }

    /// Print the program accounting; returns whether every step after the first was one cached program.
    pub fn finish(&self) -> bool {
        self.bar.finish_and_clear();
        if self.steps == 0 {
            println!("no steps run");
            return true;
        }
        let m = lazuli::metrics();
        println!("steps: {}, median step: {:.3} ms", self.steps, self.median_step_ms());
        println!("runtime: {m}");
        if self.irregular.is_empty() {
            println!("every step after the first: 0 compiles, 1 program");
            true
        } else {
            for (step, d) in &self.irregular {
                println!("step {step} was irregular: {d}");
            }
            false
        }
    }
}

/// The repository's own `.rs` and `.md` files, concatenated in a stable order.
pub fn default_corpus() -> Vec<u8> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        for e in entries.flatten() {
            let p = e.path();
            let name = e.file_name().to_string_lossy().to_string();
            if p.is_dir() && !name.starts_with('.') && name != "target" {
                stack.push(p);
            } else if name.ends_with(".rs") || name.ends_with(".md") {
                files.push(p);
            }
        }
    }
    files.sort();
    files.iter().flat_map(|f| std::fs::read(f).unwrap_or_default()).collect()
}

/// Byte-level vocabulary of the bytes that occur, and the unigram entropy (nats) of the text.
pub fn vocabulary(text: &[u8]) -> (Vec<u8>, [usize; 256], f64) {
    let mut counts = [0usize; 256];
    text.iter().for_each(|&b| counts[b as usize] += 1);
    let symbols: Vec<u8> = (0..=255u8).filter(|&b| counts[b as usize] > 0).collect();
    let mut index = [0usize; 256];
    for (i, &b) in symbols.iter().enumerate() {
        index[b as usize] = i;
    }
    let n = text.len() as f64;
    let entropy = -counts.iter().filter(|&&c| c > 0).map(|&c| c as f64 / n * (c as f64 / n).ln()).sum::<f64>();
    (symbols, index, entropy)
}
