//! AdamW (decoupled weight decay, Loshchilov & Hutter), with PyTorch's update order and bias correction.

use std::collections::HashMap;
use std::sync::OnceLock;

use lazuli_hlo::{DType, Fused, FusedBuilder, Loc, UnaryKind};

use super::{check_hyperparameters, take_state, zeros_like_host, Bound, Optimizer, Scalars};
use crate::error::Result;
use crate::graph::autodiff::no_grad;
use crate::graph::record::fused;
use crate::graph::tensor::Tensor;
use crate::train::nn::Param;

/// AdamW (Adam with decoupled weight decay), as PyTorch's `AdamW` computes it. The moments are device tensors; the
/// update is recorded into the step's graph.
pub struct AdamW {
    params: Vec<(String, Param)>,
    exp_avg: Vec<Tensor>,
    exp_avg_sq: Vec<Tensor>,
    /// Learning rate.
    pub lr: f64,
    /// Decay of the first moment (default 0.9).
    pub beta1: f64,
    /// Decay of the second moment (default 0.999).
    pub beta2: f64,
    /// Added to the second moment's square root (default 1e-8).
    pub eps: f64,
    /// Decoupled weight decay (default 0.01).
    pub weight_decay: f64,
    steps: u64,
    /// The steps applied, an f64 scalar on the device (see `applied_corrections`); `None` before the first step
    /// (and after `load_state`), when it starts from `steps`.
    applied: Option<Tensor>,
}

impl AdamW {
    /// Defaults: betas (0.9, 0.999), eps 1e-8, weight decay 0.01. Panics at the caller's line for a learning rate
    /// that is negative or not finite (as the builders below do for theirs, and `step()` for values set later).
    #[track_caller]
    pub fn new(params: Vec<(String, Param)>, lr: f64) -> AdamW {
        // Loops, not closures: a state the host cannot hold is refused at the caller's line.
        let (mut exp_avg, mut exp_avg_sq) = (Vec::with_capacity(params.len()), Vec::with_capacity(params.len()));
        for (_, p) in &params {
            exp_avg.push(zeros_like_host(p));
            exp_avg_sq.push(zeros_like_host(p));
        }
        let adamw = AdamW {
            params,
            exp_avg,
            exp_avg_sq,
            lr,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.01,
            steps: 0,
            applied: None,
        };
        adamw.check(Loc::caller());
        adamw
    }

    /// With moment decays `beta1` and `beta2`, each in `[0, 1)`.
    #[track_caller]
    pub fn betas(mut self, beta1: f64, beta2: f64) -> AdamW {
        (self.beta1, self.beta2) = (beta1, beta2);
        self.check(Loc::caller());
        self
    }

    /// With `eps` added to the second moment's square root.
    #[track_caller]
    pub fn eps(mut self, eps: f64) -> AdamW {
        self.eps = eps;
        self.check(Loc::caller());
        self
    }

    /// With decoupled weight decay `wd`.
    #[track_caller]
    pub fn weight_decay(mut self, wd: f64) -> AdamW {
        self.weight_decay = wd;
        self.check(Loc::caller());
        self
    }

    /// Panics at `at` for a hyperparameter out of its bound.
    #[track_caller]
    fn check(&self, at: Loc) {
        let values = [
            ("lr", self.lr, Bound::NonNegative),
            ("beta1", self.beta1, Bound::Fraction),
            ("beta2", self.beta2, Bound::Fraction),
            ("eps", self.eps, Bound::NonNegative),
            ("weight_decay", self.weight_decay, Bound::NonNegative),
        ];
        check_hyperparameters("AdamW", &values, at);
    }
}

/// AdamW's update as three fused expressions (one node per updated tensor; see `lazuli_hlo::ops::fused`), in
/// PyTorch's order of operations:
/// - `m' = m·β1 + g·(1−β1)`
/// - `v' = v·β2 + (g·g)·(1−β2)`
/// - `w' = w·(1 − lr·wd) − m' / (√v'·(1/√bc2) + ε) · (lr/bc1)`
fn expressions() -> &'static [Fused; 3] {
    static EXPRS: OnceLock<[Fused; 3]> = OnceLock::new();
    EXPRS.get_or_init(|| {
        let mut e = FusedBuilder::new("adamw_moment", 4);
        let (m, g, b, c) = (e.arg(0), e.arg(1), e.arg(2), e.arg(3));
        let (mb, gc) = (e.mul(m, b), e.mul(g, c));
        e.add(mb, gc);
        let moment = e.finish();

        let mut e = FusedBuilder::new("adamw_square_moment", 4);
        let (v, g, b, c) = (e.arg(0), e.arg(1), e.arg(2), e.arg(3));
        let vb = e.mul(v, b);
        let gg = e.mul(g, g);
        let ggc = e.mul(gg, c);
        e.add(vb, ggc);
        let square_moment = e.finish();

        let mut e = FusedBuilder::new("adamw_update", 7);
        let (w, m, v, decay, step, k, eps) = (e.arg(0), e.arg(1), e.arg(2), e.arg(3), e.arg(4), e.arg(5), e.arg(6));
        let root = e.unary(UnaryKind::Sqrt, v);
        let scaled = e.mul(root, k);
        let denom = e.add(scaled, eps);
        let ratio = e.div(m, denom);
        let delta = e.mul(ratio, step);
        let kept = e.mul(w, decay);
        e.sub(kept, delta);
        [moment, square_moment, e.finish()]
    })
}

impl AdamW {
    /// The bias corrections' factors `lr / bc1` and `1 / √bc2` of this step (f64 scalars), computed in the program
    /// from the count of steps applied, which stays on the device (one f64 in, one out, with the step):
    /// - Under `LAZULI_CHECK_FINITE=skip` or `stop`, the check's guard keeps that count on a skipped (or, under
    ///   `stop`, frozen) step as it keeps the moments, so that the steps after it correct as if it had never run,
    ///   also in a run that catches `stop`'s error and goes on. A count on the host could not follow exactly: the
    ///   check of a step is read up to two launches later, when the next steps are recorded already.
    /// - Otherwise it counts every step, as the host does. Factors computed on the host would change every step,
    ///   and each new value is an upload before the step can start: two per step, on the path of a loop that
    ///   waits for every step (`docs/perf-log/2026-12-02-recording-and-waiting.md`).
    #[track_caller]
    fn applied_corrections(&mut self) -> (Tensor, Tensor) {
        let before = (self.steps - 1) as f64;
        let applied = self.applied.get_or_insert_with(|| Tensor::scalar_of(DType::F64, before));
        let t = &*applied + 1.0;
        // 1 − β^t, in f64 as the host computes it otherwise.
        let correction = |beta: f64| 1.0 - (&t * beta.ln()).exp();
        let step_size = Tensor::scalar_of(DType::F64, self.lr) / correction(self.beta1);
        let inv_sqrt_bc2 = 1.0 / correction(self.beta2).sqrt();
        super::replace(applied, t);
        (step_size, inv_sqrt_bc2)
    }
}

impl Optimizer for AdamW {
    fn step(&mut self) {
        // Where the step is split (`LAZULI_SPLIT_UPDATE`), the gradients run while the update is recorded.
        self.check(Loc::caller());
        crate::exec::read::launch_gradients(Loc::caller());
        self.steps += 1;
        let decay = 1.0 - self.lr * self.weight_decay;
        // Bias corrections are computed in the program from the device's count: no recompile as t grows.
        let (step_size, inv_sqrt_bc2) = self.applied_corrections();
        let mut s = Scalars::new();
        let [moment, square_moment, update] = expressions();
        let at = Loc::caller();
        let (beta1, beta2, eps) = (self.beta1, self.beta2, self.eps);
        // The update's eight scalars, for the dtype of the last parameter seen (usually all share one).
        let mut scalars: Option<(lazuli_hlo::DType, Vec<Tensor>)> = None;
        no_grad(|| {
            for (i, (_, p)) in self.params.iter().enumerate() {
                let Some(g) = p.grad_at(at) else { continue };
                let dt = g.dtype();
                if scalars.as_ref().is_none_or(|(d, _)| *d != dt) {
                    let mut host = |v: f64| s.scalar(dt, v);
                    // In the expressions' order: the moments' decays, the weight's decay, the bias corrections, eps.
                    let c = vec![
                        host(beta1),
                        host(1.0 - beta1),
                        host(beta2),
                        host(1.0 - beta2),
                        host(decay),
                        step_size.to_dtype(dt),
                        inv_sqrt_bc2.to_dtype(dt),
                        host(eps),
                    ];
                    scalars = Some((dt, c));
                }
                let c = &scalars.as_ref().expect("set above").1;
                let w = p.get();
                self.exp_avg[i] = super::follow(&self.exp_avg[i], &w);
                self.exp_avg_sq[i] = super::follow(&self.exp_avg_sq[i], &w);
                let m = fused(moment, &[&self.exp_avg[i], &g, &c[0], &c[1]], at);
                let v = fused(square_moment, &[&self.exp_avg_sq[i], &g, &c[2], &c[3]], at);
                p.set_at(fused(update, &[&w, &m, &v, &c[4], &c[5], &c[6], &c[7]], at), at);
                super::replace(&mut self.exp_avg[i], super::follow(&m, &w));
                super::replace(&mut self.exp_avg_sq[i], super::follow(&v, &w));
            }
        });
    }

    fn zero_grad(&self) {
        self.params.iter().for_each(|(_, p)| p.zero_grad());
    }
    fn lr(&self) -> f64 {
        self.lr
    }
    fn set_lr(&mut self, lr: f64) {
        self.lr = lr;
    }
    fn steps(&self) -> u64 {
        self.steps
    }
    fn steps_applied(&self) -> Result<u64> {
        match &self.applied {
            Some(count) => Ok(count.item::<f64>()? as u64),
            None => Ok(self.steps),
        }
    }
    fn state(&self) -> Vec<(String, Tensor)> {
        let mut out = Vec::with_capacity(2 * self.params.len());
        for (i, (name, _)) in self.params.iter().enumerate() {
            out.push((format!("{name}.exp_avg"), self.exp_avg[i].clone()));
            out.push((format!("{name}.exp_avg_sq"), self.exp_avg_sq[i].clone()));
        }
        out
    }
    fn load_state(&mut self, state: &HashMap<String, Tensor>, steps: u64) -> Result<()> {
        for (i, (name, p)) in self.params.iter().enumerate() {
            self.exp_avg[i] = take_state(state, &format!("{name}.exp_avg"), p)?;
            self.exp_avg_sq[i] = take_state(state, &format!("{name}.exp_avg_sq"), p)?;
        }
        self.steps = steps;
        self.applied = None;
        Ok(())
    }
}
