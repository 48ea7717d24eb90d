//! AdamW (decoupled weight decay, Loshchilov & Hutter), with PyTorch's update order and bias correction.

use std::collections::HashMap;

use super::{take_state, zeros_like_host, Optimizer, Scalars};
use crate::autodiff::no_grad;
use crate::error::Result;
use crate::nn::Param;
use crate::tensor::Tensor;

pub struct AdamW {
    params: Vec<(String, Param)>,
    exp_avg: Vec<Tensor>,
    exp_avg_sq: Vec<Tensor>,
    pub lr: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
    steps: u64,
}

impl AdamW {
    /// Defaults: betas (0.9, 0.999), eps 1e-8, weight decay 0.01.
    pub fn new(params: Vec<(String, Param)>, lr: f64) -> AdamW {
        let exp_avg = params.iter().map(|(_, p)| zeros_like_host(p)).collect();
        let exp_avg_sq = params.iter().map(|(_, p)| zeros_like_host(p)).collect();
        AdamW { params, exp_avg, exp_avg_sq, lr, beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.01, steps: 0 }
    }

    pub fn betas(mut self, beta1: f64, beta2: f64) -> AdamW {
        (self.beta1, self.beta2) = (beta1, beta2);
        self
    }

    pub fn eps(mut self, eps: f64) -> AdamW {
        self.eps = eps;
        self
    }

    pub fn weight_decay(mut self, wd: f64) -> AdamW {
        self.weight_decay = wd;
        self
    }
}

impl Optimizer for AdamW {
    fn step(&mut self) {
        self.steps += 1;
        let t = self.steps as f64;
        // Bias corrections are computed on the host and enter as parameters: no recompile as t grows.
        let bc1 = 1.0 - self.beta1.powf(t);
        let bc2 = 1.0 - self.beta2.powf(t);
        let step_size = self.lr / bc1;
        let inv_sqrt_bc2 = 1.0 / bc2.sqrt();
        let decay = 1.0 - self.lr * self.weight_decay;
        let mut s = Scalars::new();
        no_grad(|| {
            for (i, (_, p)) in self.params.iter().enumerate() {
                let Some(g) = p.grad() else { continue };
                self.exp_avg[i] = super::follow(&self.exp_avg[i], &p.get());
                self.exp_avg_sq[i] = super::follow(&self.exp_avg_sq[i], &p.get());
                let m = &self.exp_avg[i] * &s.like(&g, self.beta1) + &g * &s.like(&g, 1.0 - self.beta1);
                let v = &self.exp_avg_sq[i] * &s.like(&g, self.beta2) + &g * &g * &s.like(&g, 1.0 - self.beta2);
                let denom = v.sqrt() * &s.like(&g, inv_sqrt_bc2) + &s.like(&g, self.eps);
                let w = p.get();
                p.set(&w * &s.like(&g, decay) - &m / &denom * &s.like(&g, step_size));
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
        Ok(())
    }
}
