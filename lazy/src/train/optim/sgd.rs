//! SGD with momentum and weight decay (PyTorch's semantics, dampening 0).

use std::collections::HashMap;
use std::sync::OnceLock;

use lazuli_hlo::{Fused, FusedBuilder, Loc};

use super::{check_hyperparameters, take_state, zeros_like_host, Bound, Optimizer, Scalars};
use crate::error::Result;
use crate::graph::autodiff::no_grad;
use crate::graph::record::fused;
use crate::graph::tensor::Tensor;
use crate::train::nn::Param;

/// Stochastic gradient descent with optional momentum and weight decay, as PyTorch's `SGD` computes it; the update is
/// recorded into the step's graph.
pub struct Sgd {
    params: Vec<(String, Param)>,
    /// Momentum buffers (zeros at first, so every step has one structure).
    momentum_buf: Vec<Option<Tensor>>,
    /// Learning rate.
    pub lr: f64,
    /// Momentum (0: none).
    pub momentum: f64,
    /// Weight decay, added to the gradient (0: none).
    pub weight_decay: f64,
    steps: u64,
}

impl Sgd {
    /// Plain SGD over `params` (e.g. `model.named_params()`) with learning rate `lr`. Panics at the caller's line
    /// for a learning rate that is negative or not finite (as the builders below do for theirs, and `step()` for
    /// values set later).
    #[track_caller]
    pub fn new(params: Vec<(String, Param)>, lr: f64) -> Sgd {
        let n = params.len();
        let sgd = Sgd { params, momentum_buf: vec![None; n], lr, momentum: 0.0, weight_decay: 0.0, steps: 0 };
        sgd.check(Loc::caller());
        sgd
    }

    /// With momentum `m` (its buffers start at zero).
    #[track_caller]
    pub fn momentum(mut self, m: f64) -> Sgd {
        self.momentum = m;
        self.check(Loc::caller());
        self.start_momentum();
        self
    }

    /// With weight decay `wd`.
    #[track_caller]
    pub fn weight_decay(mut self, wd: f64) -> Sgd {
        self.weight_decay = wd;
        self.check(Loc::caller());
        self
    }

    /// Panics at `at` for a hyperparameter out of its bound.
    #[track_caller]
    fn check(&self, at: Loc) {
        let values = [
            ("lr", self.lr, Bound::NonNegative),
            ("momentum", self.momentum, Bound::NonNegative),
            ("weight_decay", self.weight_decay, Bound::NonNegative),
        ];
        check_hyperparameters("SGD", &values, at);
    }

    /// Zero momentum buffers where there are none, when there is momentum: set through the builder or the field.
    #[track_caller]
    fn start_momentum(&mut self) {
        if self.momentum != 0.0 {
            for ((_, p), buf) in self.params.iter().zip(&mut self.momentum_buf) {
                if buf.is_none() {
                    *buf = Some(zeros_like_host(p));
                }
            }
        }
    }
}

/// SGD's update as fused expressions (one node each; see `lazuli_hlo::ops::fused`), in PyTorch's order:
/// - weight decay `g' = g + w·wd`
/// - momentum `b' = b·μ + g'`
/// - step `w' = w − u·lr` (`u` is `b'` with momentum, else `g'`)
fn expressions() -> &'static [Fused; 3] {
    static EXPRS: OnceLock<[Fused; 3]> = OnceLock::new();
    EXPRS.get_or_init(|| {
        // `a + b·c` and `a − b·c` over three operands.
        let mul_then = |name, sub: bool| {
            let mut e = FusedBuilder::new(name, 3);
            let (a, b, c) = (e.arg(0), e.arg(1), e.arg(2));
            let bc = e.mul(b, c);
            if sub {
                e.sub(a, bc);
            } else {
                e.add(a, bc);
            }
            e.finish()
        };
        let mut e = FusedBuilder::new("sgd_momentum", 3);
        let (b, mu, g) = (e.arg(0), e.arg(1), e.arg(2));
        let bm = e.mul(b, mu);
        e.add(bm, g);
        [mul_then("sgd_weight_decay", false), e.finish(), mul_then("sgd_update", true)]
    })
}

impl Optimizer for Sgd {
    fn step(&mut self) {
        self.check(Loc::caller());
        self.start_momentum();
        // Where the step is split (`LAZULI_SPLIT_UPDATE`), the gradients run while the update is recorded.
        crate::exec::read::launch_gradients(Loc::caller());
        self.steps += 1;
        let mut s = Scalars::new();
        let [decay, momentum, update] = expressions();
        let at = Loc::caller();
        no_grad(|| {
            for (i, (_, p)) in self.params.iter().enumerate() {
                let Some(g) = p.grad_at(at) else { continue };
                let w = p.get();
                let dt = w.dtype();
                let g = if self.weight_decay != 0.0 {
                    fused(decay, &[&g, &w, &s.scalar(dt, self.weight_decay)], at)
                } else {
                    g
                };
                let u = match &mut self.momentum_buf[i] {
                    Some(buf) => {
                        *buf = super::follow(buf, &w);
                        let next = super::follow(&fused(momentum, &[&*buf, &s.scalar(dt, self.momentum), &g], at), &w);
                        super::replace(buf, next);
                        buf.clone()
                    }
                    None => g,
                };
                p.set_at(fused(update, &[&w, &u, &s.scalar(dt, self.lr)], at), at);
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
    fn state(&self) -> Vec<(String, Tensor)> {
        // With momentum set through the field and no step yet, the buffers the first step starts from: zeros.
        let buffer =
            |p: &Param, b: &Option<Tensor>| b.clone().or_else(|| (self.momentum != 0.0).then(|| zeros_like_host(p)));
        let bufs = self.params.iter().zip(&self.momentum_buf);
        bufs.filter_map(|((n, p), b)| buffer(p, b).map(|b| (format!("{n}.momentum_buffer"), b))).collect()
    }
    fn load_state(&mut self, state: &HashMap<String, Tensor>, steps: u64) -> Result<()> {
        self.start_momentum();
        for (i, (name, p)) in self.params.iter().enumerate() {
            if self.momentum_buf[i].is_some() {
                self.momentum_buf[i] = Some(take_state(state, &format!("{name}.momentum_buffer"), p)?);
            }
        }
        self.steps = steps;
        Ok(())
    }
}
