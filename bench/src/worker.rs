//! The comparison side as a child process: `python/worker.py` (embedded in this binary, so a copied binary is
//! all a benchmark machine needs), driven by JSON lines on its stdin and stdout.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use serde_json::{json, Value};

use crate::workloads::Workload;
use crate::BenchResult;

const WORKER_PY: &str = include_str!("../python/worker.py");

/// Write the worker script into `dir` and return its path.
pub fn write_script(dir: &Path) -> BenchResult<PathBuf> {
    let path = dir.join("lazuli_bench_worker.py");
    std::fs::write(&path, WORKER_PY)?;
    Ok(path)
}

/// What a framework's side reported at setup.
#[derive(Clone, Debug, Default)]
pub struct SetupInfo {
    /// e.g. "jax 0.10.2 (jaxlib 0.10.2)".
    pub framework: String,
    pub device: String,
    pub python: String,
    pub compile_s: f64,
    /// How the side computes attention, as it reports it (e.g. which fused implementation).
    pub attention: String,
}

/// Step times (seconds) and losses of a run of steps.
#[derive(Clone, Debug, Default)]
pub struct StepRun {
    pub times: Vec<f64>,
    pub losses: Vec<f64>,
    /// lazuli only: where its step time goes.
    pub split: Option<Split>,
    /// The device allocator's peak so far, where the framework reports one (GPUs).
    pub peak_bytes: Option<f64>,
}

/// Where a lazuli step's time goes (seconds per step).
#[derive(Clone, Copy, Debug, Default)]
pub struct Split {
    /// Recording forward, backward and the optimizer update (median).
    pub record: f64,
    /// The recording's parts: forward (with the batch's upload), backward, optimizer update (medians).
    pub record_parts: [f64; 3],
    /// Inside the plugin's execute call: launching the program (median).
    pub execute: f64,
    /// Waiting for the program to finish (`wait()`; pipelined: the final wait spread over the steps) (median).
    pub wait: f64,
    /// `sync()`'s host work before binding arguments: collect, walk, hash, lookup, donation planning (median).
    pub boundary: f64,
    /// Binding arguments: uploads of the batch and host scalars (median).
    pub upload: f64,
    /// After the launch: storing outputs, releasing donated inputs and the graph (median).
    pub finish: f64,
    pub programs_per_step: f64,
    /// Programs compiled during the run (0 once warm).
    pub compiles: u64,
}

impl Split {
    /// The phases of a step in order, with the names the tables print.
    pub fn phases(&self) -> [(&'static str, f64); 6] {
        [
            ("recording", self.record),
            ("sync before arguments (collect, walk, hash, lookup, donation)", self.boundary),
            ("uploads", self.upload),
            ("launch (in the plugin)", self.execute),
            ("after launch (outputs, release)", self.finish),
            ("wait for the device", self.wait),
        ]
    }
}

pub struct Worker {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    framework: String,
}

impl Worker {
    /// Start `python script framework` ("jax" or "torch").
    pub fn start(python: &Path, script: &Path, framework: &str) -> BenchResult<Worker> {
        Worker::start_with(python, script, framework, &[])
    }

    /// [`Worker::start`] with these variables set in the worker's environment (`XLA_FLAGS`, say).
    pub fn start_with(python: &Path, script: &Path, framework: &str, env: &[(&str, &str)]) -> BenchResult<Worker> {
        let mut child = Command::new(python)
            .envs(env.iter().copied())
            .arg("-u")
            .arg(script)
            .arg(framework)
            .env("TF_CPP_MIN_LOG_LEVEL", "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("starting {} {}: {e}", python.display(), script.display()))?;
        let stdin = child.stdin.take().ok_or("the worker has no stdin")?;
        let stdout = BufReader::new(child.stdout.take().ok_or("the worker has no stdout")?);
        Ok(Worker { child, stdin, stdout, framework: framework.to_string() })
    }

    fn request(&mut self, msg: Value) -> BenchResult<Value> {
        writeln!(self.stdin, "{msg}")?;
        self.stdin.flush()?;
        let mut line = String::new();
        if self.stdout.read_line(&mut line)? == 0 {
            return Err(format!("the {} worker exited (its error output is above)", self.framework).into());
        }
        let reply: Value = serde_json::from_str(&line).map_err(|e| format!("bad reply {line:?}: {e}"))?;
        if reply["ok"] != json!(true) {
            let trace = reply["trace"].as_str().unwrap_or("");
            return Err(
                format!("{} worker: {}\n{trace}", self.framework, reply["error"].as_str().unwrap_or("?")).into()
            );
        }
        Ok(reply)
    }

    /// Load the weights file and compile the workload's step.
    pub fn setup(&mut self, workload: &Workload, weights: &Path) -> BenchResult<SetupInfo> {
        let r = self.request(json!({"cmd": "setup", "workload": workload.to_json(), "weights": weights}))?;
        Ok(SetupInfo {
            framework: r["versions"]["framework"].as_str().unwrap_or("?").to_string(),
            device: r["versions"]["device"].as_str().unwrap_or("?").to_string(),
            python: r["python"].as_str().unwrap_or("?").to_string(),
            compile_s: r["compile_s"].as_f64().unwrap_or(f64::NAN),
            attention: r["versions"]["attention"].as_str().unwrap_or("?").to_string(),
        })
    }

    /// Run `steps` training steps, each timed until its results are ready (or, pipelined, all of them back to
    /// back until the last one's results are ready; every step then gets the mean).
    pub fn run(&mut self, steps: usize, pipelined: bool) -> BenchResult<StepRun> {
        self.run_program(steps, pipelined, false)
    }

    /// As [`Self::run`], with a program that does nothing but take the step's arguments (donated as the step
    /// donates them) and pass them through: the framework's dispatch cost alone (JAX only).
    pub fn run_empty(&mut self, steps: usize, pipelined: bool) -> BenchResult<StepRun> {
        self.run_program(steps, pipelined, true)
    }

    /// Run `steps` more steps under the framework's profiler, which writes its trace under `dir` (JAX only).
    pub fn profile(&mut self, steps: usize, dir: &Path) -> BenchResult<()> {
        self.request(json!({"cmd": "profile", "steps": steps, "dir": dir}))?;
        Ok(())
    }

    fn run_program(&mut self, steps: usize, pipelined: bool, empty: bool) -> BenchResult<StepRun> {
        let r = self.request(json!({"cmd": "run", "steps": steps, "pipelined": pipelined, "empty": empty}))?;
        let floats = |v: &Value| -> Vec<f64> {
            v.as_array().map(|a| a.iter().filter_map(Value::as_f64).collect()).unwrap_or_default()
        };
        Ok(StepRun {
            times: floats(&r["times"]),
            losses: floats(&r["losses"]),
            split: None,
            peak_bytes: r["peak_bytes"].as_f64(),
        })
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        // Ask it to leave; if it does not answer, end it (it is our own child).
        if self.request(json!({"cmd": "quit"})).is_err() {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

/// With `LAZULI_BENCH_JAX_XLA=lazuli`, the `XLA_FLAGS` that make a JAX CPU worker compile with lazuli's CPU
/// options (`Config::backend_xla_options`), after any the environment sets; otherwise `None` (JAX as installed).
pub fn jax_cpu_xla_flags() -> BenchResult<Option<String>> {
    match std::env::var("LAZULI_BENCH_JAX_XLA").as_deref() {
        Err(_) | Ok("") | Ok("default") => return Ok(None),
        Ok("lazuli") => {}
        Ok(other) => return Err(format!("LAZULI_BENCH_JAX_XLA={other:?}: expected lazuli or default").into()),
    }
    let mut flags = std::env::var("XLA_FLAGS").unwrap_or_default();
    for (name, value) in lazuli::Config::default().backend_xla_options() {
        let value = match value {
            lazuli::XlaOption::Str(s) => s,
            lazuli::XlaOption::Bool(b) => b.to_string(),
            lazuli::XlaOption::Int(i) => i.to_string(),
        };
        flags += &format!(" --{name}={value}");
    }
    Ok(Some(flags.trim().to_string()))
}
