//! The harness's correctness: for each workload, lazuli and JAX start from the same weights (the safetensors file
//! lazuli writes) and their losses over the first steps agree within float tolerance, so the benchmark compares
//! the same computation. Makes the comparison environment on first use (bench/.venv, from PyPI).

use std::path::{Path, PathBuf};

use lazuli_bench::compare::loss_tolerance;
use lazuli_bench::workloads::{Attention, LazuliRun, Model, Opt, Workload};
use lazuli_bench::{losses_agree, pyenv, worker};

const STEPS: usize = 4;

struct Env {
    python: PathBuf,
    dir: PathBuf,
    script: PathBuf,
}

impl Env {
    fn new(tag: &str) -> Env {
        let python = pyenv::ensure(None).unwrap_or_else(|e| panic!("comparison environment: {e}"));
        let dir = std::env::temp_dir().join(format!("lazuli-bench-test-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("scratch directory");
        let script = worker::write_script(&dir).expect("worker script");
        Env { python, dir, script }
    }

    /// Losses of lazuli's first steps, and the weights file it started from.
    fn lazuli(&self, w: &Workload) -> (Vec<f64>, PathBuf) {
        let weights = self.dir.join(format!("{}.safetensors", w.name));
        let mut run = LazuliRun::new(w);
        run.write_weights(&weights).expect("writing weights");
        (run.run(STEPS, false).expect("lazuli steps").losses, weights)
    }

    fn jax(&self, w: &Workload, weights: &Path) -> Vec<f64> {
        let mut jax = worker::Worker::start(&self.python, &self.script, "jax").expect("starting the JAX worker");
        jax.setup(w, weights).unwrap_or_else(|e| panic!("JAX setup of {}: {e}", w.name));
        jax.run(STEPS, false).expect("JAX steps").losses
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A GPT as small as gpt-tiny with bf16 matmul operands: the GPU row's model code, checked on the CPU.
fn gpt_tiny_bf16() -> Workload {
    let mut w = Workload::gpt_tiny();
    w.name = "gpt-tiny-bf16".into();
    w.bf16_matmul = true;
    w
}

#[test]
fn lazuli_and_jax_losses_agree_on_every_workload() {
    let env = Env::new("agree");
    for w in [Workload::mlp_tiny(), Workload::mlp_mnist(), Workload::gpt_tiny(), gpt_tiny_bf16()] {
        let (lz, weights) = env.lazuli(&w);
        let jx = env.jax(&w, &weights);
        let tol = loss_tolerance(&w);
        println!("{}: lazuli {lz:?}\n{}: JAX    {jx:?}", w.name, w.name);
        if let Err(e) = losses_agree(&lz, &jx, tol) {
            panic!("{}: lazuli and JAX disagree: {e}", w.name);
        }
        // Training must move the loss well beyond the tolerance, or agreement would prove nothing.
        let moved = lz.iter().map(|l| (l - lz[0]).abs()).fold(0.0, f64::max);
        assert!(moved > 10.0 * tol * lz[0].abs().max(1.0), "{}: the loss barely moved ({lz:?})", w.name);
    }
}

/// Fused attention computes what the written-out one does, within the bf16 tolerance: JAX's
/// `dot_product_attention` (XLA's lowering here, cuDNN's on a GPU) against lazuli's written-out model, and lazuli's
/// own fused model (its composite on the CPU, cuDNN's kernel on a GPU).
#[test]
fn fused_attention_agrees_with_written_out() {
    let env = Env::new("fused");
    let written = gpt_tiny_bf16();
    let fused = Workload { attention: Attention::Fused, ..written.clone() };
    let (lz, weights) = env.lazuli(&written);
    let fused_runs = vec![("JAX", env.jax(&fused, &weights)), ("lazuli", env.lazuli(&fused).0)];
    println!("lazuli, written-out attention: {lz:?}");
    for (name, losses) in fused_runs {
        println!("{name}, fused attention: {losses:?}");
        if let Err(e) = losses_agree(&lz, &losses, loss_tolerance(&fused)) {
            panic!("{name}'s fused attention disagrees with lazuli's written-out attention: {e}");
        }
    }
}

/// The dispatch-only measurement runs an empty program: it passes the donated weights through unchanged, so the
/// training steps around it continue as if it had not run.
#[test]
fn the_empty_program_leaves_the_weights_alone() {
    let env = Env::new("empty");
    let w = Workload::mlp_tiny();
    let (_, weights) = env.lazuli(&w);
    let straight = env.jax(&w, &weights);
    let mut jax = worker::Worker::start(&env.python, &env.script, "jax").expect("starting the JAX worker");
    jax.setup(&w, &weights).expect("JAX setup");
    let first = jax.run(2, false).expect("JAX steps").losses;
    let empty = jax.run_empty(3, false).expect("empty program").losses;
    assert_eq!(empty, vec![0.0; 3], "the empty program's results");
    let rest = jax.run(STEPS - 2, false).expect("JAX steps").losses;
    assert_eq!([first, rest].concat(), straight, "training around the empty program");
}

/// The comparison notices a small difference in the optimizer: JAX with a 5% larger learning rate disagrees.
#[test]
fn a_different_learning_rate_is_detected() {
    let env = Env::new("lr");
    let w = Workload::mlp_tiny();
    let (lz, weights) = env.lazuli(&w);
    let mut other = w.clone();
    if let Opt::Sgd { lr } = &mut other.opt {
        *lr *= 1.05;
    }
    let jx = env.jax(&other, &weights);
    assert!(losses_agree(&lz, &jx, loss_tolerance(&w)).is_err(), "lazuli {lz:?} vs JAX (lr ×1.05) {jx:?}");
    // The first loss comes before any update, so it still agrees: the weights are shared.
    assert!((lz[0] - jx[0]).abs() <= loss_tolerance(&w) * lz[0].abs(), "{} vs {}", lz[0], jx[0]);
}

#[test]
fn workloads_describe_themselves_to_the_worker() {
    let w = Workload::gpt_tiny();
    let v = w.to_json();
    assert_eq!(v["kind"], "gpt");
    assert_eq!(v["optimizer"]["name"], "adamw");
    assert_eq!(v["attention"], "written");
    assert_eq!(Workload { attention: Attention::Fused, ..w.clone() }.to_json()["attention"], "fused");
    let Model::Gpt { config, seq } = &w.model else { panic!("gpt-tiny is a GPT") };
    assert_eq!((v["n_layer"].as_u64(), v["seq"].as_u64()), (Some(config.n_layer as u64), Some(*seq as u64)));
    assert_eq!(Workload::mlp_tiny().to_json()["sizes"], serde_json::json!([32, 64, 10]));
}

#[test]
fn loss_comparison_rules() {
    assert!(losses_agree(&[2.0, 1.5], &[2.0, 1.5 + 1e-5], 1e-4).is_ok());
    assert!(losses_agree(&[2.0, 1.5], &[2.0, 1.6], 1e-4).is_err());
    assert!(losses_agree(&[2.0], &[2.0, 1.0], 1e-4).is_err());
    assert!(losses_agree(&[f64::NAN], &[f64::NAN], 1e-4).is_err());
    assert!(losses_agree(&[], &[], 1e-4).is_err());
}
