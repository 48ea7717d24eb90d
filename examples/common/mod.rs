//! What the training examples share: progress (a bar on a terminal, plain lines otherwise), per-step program
//! accounting, the final report, and the default corpus as a token file.
#![allow(dead_code)]

use std::io::IsTerminal;
use std::path::Path;

use indicatif::{ProgressBar, ProgressStyle};
use lazuli::data::{TokenFile, TokenWidth};
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

/// Tracks what each step cost: after the first step, a step must compile nothing and run one program. Shows the
/// progress as a bar on a terminal (stderr), or as a plain line every few steps otherwise (CI, a pipe), with the
/// loss and the throughput.
pub struct StepLog {
    /// `None` when stderr is not a terminal: then `step_done` prints plain lines.
    bar: Option<ProgressBar>,
    last: Metrics,
    start: std::time::Instant,
    total: u64,
    pub steps: u64,
    /// Steps after the first that compiled or ran more than one program.
    pub irregular: Vec<(u64, Metrics)>,
    step_times: Vec<f64>,
    /// Tokens or samples a step consumes, and their name.
    per_step: u64,
    unit: &'static str,
    /// Plain lines for steps that are multiples of this (and the last).
    every: u64,
    /// The latest step whose loss was shown, and when (s since `start`): the throughput is measured between
    /// shown losses, since reading a loss waits for its step.
    mark: Option<(u64, f64)>,
}

impl StepLog {
    pub fn new(first_step: u64, total: u64) -> StepLog {
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar = ProgressBar::new(total);
            bar.set_style(
                ProgressStyle::with_template(
                    "{bar:40.cyan/blue} {pos}/{len} steps  {msg}  [{elapsed_precise} < {eta}]",
                )
                .expect("a valid template")
                .progress_chars("=> "),
            );
            bar.set_position(first_step);
            bar
        });
        StepLog {
            bar,
            last: lazuli::metrics(),
            start: std::time::Instant::now(),
            total,
            steps: 0,
            irregular: Vec::new(),
            step_times: Vec::new(),
            per_step: 0,
            unit: "",
            every: 50,
            mark: None,
        }
    }

    /// Show the throughput in `unit`s per second (`"tokens"`, `"samples"`), a step consuming `per_step` of them.
    pub fn throughput(mut self, per_step: u64, unit: &'static str) -> StepLog {
        (self.per_step, self.unit) = (per_step, unit);
        self
    }

    /// Without a terminal, print a line for the steps that are multiples of `every` (and the last).
    pub fn every(mut self, every: u64) -> StepLog {
        self.every = every.max(1);
        self
    }

    /// Call right after the step boundary (`lazuli::sync()`), with the loss if it was read.
    pub fn step_done(&mut self, step: u64, loss: Option<f32>) {
        let now = lazuli::metrics();
        let d = now - self.last;
        self.last = now;
        if self.steps > 0 && (d.compiles != 0 || d.executions != 1) {
            self.irregular.push((step, d));
        }
        let t = self.start.elapsed().as_secs_f64();
        self.step_times.push(t);
        self.steps += 1;
        let Some(loss) = loss else {
            if let Some(bar) = &self.bar {
                bar.inc(1);
            }
            return;
        };
        let mut status = format!("loss {loss:.4}");
        if let Some((from, then)) = self.mark.filter(|_| self.per_step > 0) {
            let per_s = (step - from) as f64 * self.per_step as f64 / (t - then);
            status += &format!("  {} {}/s", human(per_s), self.unit);
        }
        self.mark = Some((step, t));
        match &self.bar {
            Some(bar) => {
                bar.set_message(status);
                bar.inc(1);
            }
            None if step / self.every * self.every == step || step + 1 == self.total => {
                println!("step {step}/{}  {status}", self.total)
            }
            None => {}
        }
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
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
        if self.steps == 0 {
            println!("no steps run");
            return true;
        }
        let m = lazuli::metrics();
        let ms = self.median_step_ms();
        let rate = if self.per_step > 0 && ms > 0.0 {
            format!(" ({} {}/s)", human(self.per_step as f64 / (ms / 1e3)), self.unit)
        } else {
            String::new()
        };
        println!("steps: {}, median step: {ms:.3} ms{rate}", self.steps);
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

/// `x` with a k or M suffix: `12.3k`.
fn human(x: f64) -> String {
    match x {
        x if x >= 1e6 => format!("{:.2}M", x / 1e6),
        x if x >= 1e3 => format!("{:.1}k", x / 1e3),
        x => format!("{x:.0}"),
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

/// `ids` as a token file of `u16` ids, for `lazuli::data::Batches` to read: written to the temporary directory,
/// opened, and (on Unix) unlinked at once, so that nothing is left behind however the run ends.
pub fn token_file(ids: &[u32]) -> lazuli::Result<TokenFile> {
    let path = std::env::temp_dir().join(format!("lazuli-example-{}.u16", std::process::id()));
    TokenFile::write(&path, ids, TokenWidth::U16)?;
    let file = TokenFile::open(&path, TokenWidth::U16)?;
    if cfg!(unix) {
        let _ = std::fs::remove_file(&path); // the open file stays readable
    }
    Ok(file)
}
