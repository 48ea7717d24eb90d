//! SGD with momentum and weight decay (PyTorch's semantics, dampening 0).

use std::collections::HashMap;

use super::{take_state, zeros_like_host, Optimizer, Scalars};
use crate::autodiff::no_grad;
use crate::error::Result;
use crate::nn::Param;
use crate::tensor::Tensor;

pub struct Sgd {
    params: Vec<(String, Param)>,
    /// Momentum buffers (zeros at first, so every step has one structure).
    momentum_buf: Vec<Option<Tensor>>,
    pub lr: f64,
    pub momentum: f64,
    pub weight_decay: f64,
    steps: u64,
}

impl Sgd {
    pub fn new(params: Vec<(String, Param)>, lr: f64) -> Sgd {
        let n = params.len();
        Sgd { params, momentum_buf: vec![None; n], lr, momentum: 0.0, weight_decay: 0.0, steps: 0 }
    }

    pub fn momentum(mut self, m: f64) -> Sgd {
        self.momentum = m;
        if m != 0.0 {
            self.momentum_buf = self.params.iter().map(|(_, p)| Some(zeros_like_host(p))).collect();
        }
        self
    }

    pub fn weight_decay(mut self, wd: f64) -> Sgd {
        self.weight_decay = wd;
        self
    }
}

impl Optimizer for Sgd {
    fn step(&mut self) {
        self.steps += 1;
        let mut s = Scalars::new();
        no_grad(|| {
            for (i, (_, p)) in self.params.iter().enumerate() {
                let Some(g) = p.grad() else { continue };
                let w = p.get();
                let g = if self.weight_decay != 0.0 { g + &w * &s.like(&w, self.weight_decay) } else { g };
                let update = match &mut self.momentum_buf[i] {
                    Some(buf) => {
                        *buf = super::follow(buf, &w);
                        let next = super::follow(&(&*buf * &s.like(&w, self.momentum) + g), &w);
                        super::replace(buf, next);
                        buf.clone()
                    }
                    None => g,
                };
                p.set(&w - update * &s.like(&w, self.lr));
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
        let bufs = self.params.iter().zip(&self.momentum_buf);
        bufs.filter_map(|((n, _), b)| b.as_ref().map(|b| (format!("{n}.momentum_buffer"), b.clone()))).collect()
    }
    fn load_state(&mut self, state: &HashMap<String, Tensor>, steps: u64) -> Result<()> {
        for (i, (name, p)) in self.params.iter().enumerate() {
            if self.momentum_buf[i].is_some() {
                self.momentum_buf[i] = Some(take_state(state, &format!("{name}.momentum_buffer"), p)?);
            }
        }
        self.steps = steps;
        Ok(())
    }
}
