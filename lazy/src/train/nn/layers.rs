//! Basic layers: Linear and an MLP built from it.

use lazuli_hlo::DType;

use super::init::{uniform, HostRng};
use super::{join, Module, Param};
use crate::graph::tensor::Tensor;

/// `y = x W + b` with `W: [in, out]` (stored input-major, so no transpose is recorded).
pub struct Linear {
    /// `[in, out]`.
    pub weight: Param,
    /// `[out]`, if the layer has a bias.
    pub bias: Option<Param>,
    /// Mixed precision: the product on operands in this dtype (the weight's copy kept by the optimizer,
    /// [`Param::get_as`]), its result back in the input's dtype before the bias. `None`: the weight's own dtype.
    pub matmul_dtype: Option<DType>,
}

impl Linear {
    /// PyTorch's default initialisation: uniform(±1/√in) for weight and bias.
    #[track_caller]
    pub fn new(rng: &mut HostRng, d_in: usize, d_out: usize, bias: bool, dtype: DType) -> Linear {
        let bound = 1.0 / (d_in as f64).sqrt();
        let weight = Param::new(uniform(rng, &[d_in, d_out], bound, dtype));
        // Not in a closure: the caller's line is where a size the host cannot hold is named.
        let bias = if bias { Some(Param::new(uniform(rng, &[d_out], bound, dtype))) } else { None };
        Linear { weight, bias, matmul_dtype: None }
    }

    /// A layer with given initial values (for tests and ports).
    pub fn from_tensors(weight: Tensor, bias: Option<Tensor>) -> Linear {
        Linear { weight: Param::new(weight), bias: bias.map(Param::new), matmul_dtype: None }
    }

    /// With its product computed in `dtype` (e.g. bf16 for f32 weights; the field `matmul_dtype`). Panics at
    /// the caller's line for a dtype that is not floating-point.
    #[track_caller]
    pub fn with_matmul_dtype(mut self, dtype: DType) -> Linear {
        super::param::check_copy_dtype("Linear::with_matmul_dtype", dtype, crate::Loc::caller());
        self.matmul_dtype = Some(dtype);
        self
    }

    /// `x @ weight` without the bias: in [`Linear::matmul_dtype`] when it is set (the product's own type, from the
    /// weight's copy kept by the optimizer), else in `x`'s type.
    #[track_caller]
    pub fn product(&self, x: &Tensor) -> Tensor {
        match self.matmul_dtype {
            Some(dt) => x.to_dtype(dt).matmul(&self.weight.get_as(dt)),
            None => x.matmul(&self.weight.get()),
        }
    }

    /// `x: [..., in]` → `[..., out]`.
    #[track_caller]
    pub fn forward(&self, x: &Tensor) -> Tensor {
        let y = self.product(x).to_dtype(x.dtype());
        match &self.bias {
            Some(b) => y + b.get(),
            None => y,
        }
    }

    /// `x @ weight + bias` in the product's own type ([`Linear::matmul_dtype`] when set), for a consumer that
    /// reads the result in that type (attention's q, k and v): the bias added in `x`'s type would round the
    /// result twice, and on GPUs it keeps XLA from adding the bias in the product's own epilogue.
    #[track_caller]
    pub fn forward_in_product_dtype(&self, x: &Tensor) -> Tensor {
        let y = self.product(x);
        match &self.bias {
            Some(b) => {
                let b = b.get().to_dtype(y.dtype());
                y + b
            }
            None => y,
        }
    }
}

impl Module for Linear {
    fn visit_params(&self, prefix: &str, f: &mut dyn FnMut(String, &Param)) {
        f(join(prefix, "weight"), &self.weight);
        if let Some(b) = &self.bias {
            f(join(prefix, "bias"), b);
        }
    }
}

/// Elementwise nonlinearities usable between layers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// `tanh`.
    Tanh,
    /// `max(x, 0)`.
    Relu,
    /// `1 / (1 + e^-x)`.
    Sigmoid,
}

impl Activation {
    /// The nonlinearity applied to `x`, elementwise.
    #[track_caller]
    pub fn apply(self, x: &Tensor) -> Tensor {
        match self {
            Activation::Tanh => x.tanh(),
            Activation::Relu => x.relu(),
            Activation::Sigmoid => x.sigmoid(),
        }
    }
}

/// Linear layers with an activation between them (none after the last).
pub struct Mlp {
    /// The layers, input first.
    pub layers: Vec<Linear>,
    /// Applied after every layer but the last.
    pub activation: Activation,
}

impl Mlp {
    /// `sizes = [in, hidden…, out]`.
    #[track_caller]
    pub fn new(rng: &mut HostRng, sizes: &[usize], activation: Activation, dtype: DType) -> Mlp {
        let mut layers = Vec::with_capacity(sizes.len().saturating_sub(1));
        for w in sizes.windows(2) {
            layers.push(Linear::new(rng, w[0], w[1], true, dtype));
        }
        Mlp { layers, activation }
    }

    /// `x: [..., in]` → `[..., out]`.
    #[track_caller]
    pub fn forward(&self, x: &Tensor) -> Tensor {
        let mut h = x.clone();
        for (i, layer) in self.layers.iter().enumerate() {
            h = layer.forward(&h);
            if i + 1 < self.layers.len() {
                h = self.activation.apply(&h);
            }
        }
        h
    }
}

impl Module for Mlp {
    fn visit_params(&self, prefix: &str, f: &mut dyn FnMut(String, &Param)) {
        for (i, l) in self.layers.iter().enumerate() {
            l.visit_params(&join(prefix, &format!("layers.{i}")), f);
        }
    }
}

/// A lookup table: `ids` (integers, any shape) → rows of `weight: [vocab, dim]`.
pub struct Embedding {
    /// `[vocab, dim]`.
    pub weight: Param,
}

impl Embedding {
    /// Normal(0, std²) initialisation (GPT-2 uses 0.02).
    #[track_caller]
    pub fn new(rng: &mut HostRng, vocab: usize, dim: usize, std: f64, dtype: DType) -> Embedding {
        Embedding { weight: Param::new(super::init::normal(rng, &[vocab, dim], std, dtype)) }
    }

    /// `ids: [...]` → `[..., dim]`.
    #[track_caller]
    pub fn forward(&self, ids: &Tensor) -> Tensor {
        self.weight.get().embedding(ids)
    }
}

impl Module for Embedding {
    fn visit_params(&self, prefix: &str, f: &mut dyn FnMut(String, &Param)) {
        f(join(prefix, "weight"), &self.weight);
    }
}

/// Layer normalisation over the last dimension with a learned scale and shift.
pub struct LayerNorm {
    /// Scale, `[dim]` (ones at first).
    pub weight: Param,
    /// Shift, `[dim]` (zeros at first).
    pub bias: Param,
    /// Added to the variance before the square root.
    pub eps: f64,
}

impl LayerNorm {
    /// Normalization over a last dimension of size `dim`.
    #[track_caller]
    pub fn new(dim: usize, eps: f64, dtype: DType) -> LayerNorm {
        let ones = super::init::host_tensor(&[dim], dtype, || 1.0);
        let zeros = super::init::host_zeros(&[dim], dtype);
        LayerNorm { weight: Param::new(ones), bias: Param::new(zeros), eps }
    }

    /// `x: [..., dim]` normalized over its last dimension, scaled and shifted (one op:
    /// [`Tensor::layer_norm_affine`], a fused kernel on NVIDIA GPUs).
    #[track_caller]
    pub fn forward(&self, x: &Tensor) -> Tensor {
        self.forward_as(x, x.dtype())
    }

    /// [`LayerNorm::forward`] with the result in `dtype`: bf16 for a matmul that follows, written by the kernel
    /// instead of converted after it.
    #[track_caller]
    pub fn forward_as(&self, x: &Tensor, dtype: DType) -> Tensor {
        x.layer_norm_affine(&self.weight.get(), &self.bias.get(), self.eps, dtype)
    }

    /// A residual add and this normalization of its sum, as one op ([`Tensor::add_layer_norm_affine`]):
    /// `(s, forward_as(s, dtype))` for `s = x + added (+ added_bias)`, the sum in `x`'s type for the residual
    /// stream to carry on. `added_bias` is the bias of the linear layer whose product is `added`.
    #[track_caller]
    pub fn forward_added_as(
        &self,
        x: &Tensor,
        added: &Tensor,
        added_bias: Option<&Tensor>,
        dtype: DType,
    ) -> (Tensor, Tensor) {
        x.add_layer_norm_affine(added, added_bias, &self.weight.get(), &self.bias.get(), self.eps, dtype)
    }
}

impl Module for LayerNorm {
    fn visit_params(&self, prefix: &str, f: &mut dyn FnMut(String, &Param)) {
        f(join(prefix, "weight"), &self.weight);
        f(join(prefix, "bias"), &self.bias);
    }
}

/// Dropout with probability `p` in training mode, the identity in evaluation mode. The mask comes from the
/// device generator (`lazuli::manual_seed`), and `p` is a program parameter.
pub struct Dropout {
    /// Probability of zeroing an element.
    pub p: f64,
    training: std::sync::atomic::AtomicBool,
}

impl Dropout {
    /// Dropout with probability `p`, in training mode. Panics at the caller's line when `p` is not in `[0, 1]`.
    #[track_caller]
    pub fn new(p: f64) -> Dropout {
        if !(0.0..=1.0).contains(&p) {
            crate::graph::record::fail(crate::Loc::caller(), format!("Dropout: p = {p} is not a probability"));
        }
        Dropout { p, training: std::sync::atomic::AtomicBool::new(true) }
    }

    /// Training mode (dropping) or evaluation mode (the identity); see `Module::set_training`.
    pub fn is_training(&self) -> bool {
        self.training.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// In training mode, each element zeroed with probability `p` and the rest scaled by `1 / (1 - p)`; otherwise `x`.
    #[track_caller]
    pub fn forward(&self, x: &Tensor) -> Tensor {
        if self.p == 0.0 || !self.is_training() {
            return x.clone();
        }
        x.dropout(self.p, true)
    }
}

impl Module for Dropout {
    fn visit_params(&self, _: &str, _: &mut dyn FnMut(String, &Param)) {}
    fn set_training(&self, training: bool) {
        self.training.store(training, std::sync::atomic::Ordering::Relaxed);
    }
}

/// 2-D convolution over NCHW input with an OIHW kernel and a per-channel bias.
pub struct Conv2d {
    /// `[out_channels, in_channels, kh, kw]`.
    pub weight: Param,
    /// `[out_channels]`, if the layer has a bias.
    pub bias: Option<Param>,
    /// Stride along height and width.
    pub stride: [usize; 2],
    /// Zero padding on each side, along height and width.
    pub padding: [usize; 2],
}

impl Conv2d {
    /// PyTorch's default initialisation: uniform(±1/√(in·kh·kw)).
    #[allow(clippy::too_many_arguments)]
    #[track_caller]
    pub fn new(
        rng: &mut HostRng,
        c_in: usize,
        c_out: usize,
        kernel: [usize; 2],
        stride: [usize; 2],
        padding: [usize; 2],
        bias: bool,
        dtype: DType,
    ) -> Conv2d {
        let bound = 1.0 / ((c_in * kernel[0] * kernel[1]) as f64).sqrt();
        let weight = Param::new(uniform(rng, &[c_out, c_in, kernel[0], kernel[1]], bound, dtype));
        let bias = if bias { Some(Param::new(uniform(rng, &[c_out], bound, dtype))) } else { None };
        Conv2d { weight, bias, stride, padding }
    }

    /// `x: [N, C_in, H, W]` → `[N, C_out, H', W']`.
    #[track_caller]
    pub fn forward(&self, x: &Tensor) -> Tensor {
        let y = x.conv2d(&self.weight.get(), self.stride, self.padding);
        match &self.bias {
            Some(b) => {
                let c = b.get().dims()[0] as isize;
                y + b.get().reshape(&[1, c, 1, 1])
            }
            None => y,
        }
    }
}

impl Module for Conv2d {
    fn visit_params(&self, prefix: &str, f: &mut dyn FnMut(String, &Param)) {
        f(join(prefix, "weight"), &self.weight);
        if let Some(b) = &self.bias {
            f(join(prefix, "bias"), b);
        }
    }
}
