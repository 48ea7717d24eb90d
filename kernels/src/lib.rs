//! lazuli's custom kernels. Each kernel is one place holding its shape and dtype rule, the conditions under
//! which a device implementation applies, that implementation (a cuDNN or Triton custom call), its gradient, and
//! a composite written with lazuli's ops that runs everywhere else and is the tests' reference.
//!
//! A kernel is made per signature as a [`lazuli_hlo::KernelDef`] and recorded through the op family
//! `lazuli_hlo::ops::kernel`, so the emitter, the graph hash, events and the recompile explainer treat it like any
//! op. Which implementation runs is decided when the kernel is recorded, from the [`Target`] the program is
//! compiled for and the user's [`Implementation`] setting, and is part of the graph's structure.
//!
//! - [`attention`]: scaled dot-product attention (cuDNN flash attention, a Triton flash kernel, the composite).
//! - [`custom`]: a user's own Triton kernel, with a composite or a gradient rule.
//! - [`layer_norm`]: layer normalization with scale and shift (lazuli's Triton kernels, the composite).
//! - [`bias_gelu`]: `gelu(x + b)`, a matmul's bias and activation (lazuli's Triton kernels, the composite).
//! - [`finite_count`]: the non-finite elements of many tensors counted in one launch (lazuli's Triton kernel, the
//!   composite).
//! - [`triton`]: Triton custom calls (validation, escaping) and lazuli's Triton IR generators.
#![forbid(unsafe_code)]

pub mod attention;
pub mod bias_gelu;
mod choice;
pub mod cross_entropy;
pub mod custom;
pub mod finite_count;
pub mod layer_norm;
pub mod triton;

use std::fmt;

/// The device a program is compiled for, as far as kernels care.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Target {
    /// XLA's CPU plugin: composites only.
    Cpu,
    /// An NVIDIA GPU through XLA's CUDA plugin, with its compute capability (major, minor) where the plugin
    /// reports it.
    Cuda { compute_capability: Option<(u32, u32)> },
    /// Any other platform, by the plugin's platform name (`tpu`, `rocm`, …): composites only.
    Other(String),
}

impl Target {
    /// The compute capability of a CUDA target.
    pub fn compute_capability(&self) -> Option<(u32, u32)> {
        match self {
            Target::Cuda { compute_capability } => *compute_capability,
            _ => None,
        }
    }

    /// Why custom GPU kernels cannot run here, or `None` on an NVIDIA GPU of compute capability 8.0 (Ampere) or
    /// newer, which cuDNN's flash attention and Triton's bf16 products need.
    pub fn no_gpu_kernels(&self) -> Option<String> {
        match self {
            Target::Cuda { compute_capability: Some(cc) } if *cc >= (8, 0) => None,
            Target::Cuda { compute_capability: Some((a, b)) } => {
                Some(format!("compute capability {a}.{b} is below 8.0 (Ampere)"))
            }
            Target::Cuda { compute_capability: None } => Some("the CUDA plugin reports no compute capability".into()),
            other => Some(format!("the device is {other}, not an NVIDIA GPU")),
        }
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Cpu => f.write_str("cpu"),
            Target::Cuda { compute_capability: Some((a, b)) } => write!(f, "cuda (compute capability {a}.{b})"),
            Target::Cuda { compute_capability: None } => f.write_str("cuda"),
            Target::Other(name) => f.write_str(name),
        }
    }
}

/// Which implementation a kernel should use (`LAZULI_ATTENTION`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Implementation {
    /// The fastest that applies: cuDNN or Triton (where both apply, the one measured faster for such a call), then
    /// the composite.
    #[default]
    Auto,
    /// cuDNN's fused kernel, or an error saying why it does not apply.
    Cudnn,
    /// lazuli's Triton kernel, or an error saying why it does not apply.
    Triton,
    /// lazuli's ops, which XLA fuses as it can: runs everywhere.
    Composite,
}

impl Implementation {
    /// `auto`, `cudnn`, `triton` or `composite`.
    pub fn parse(s: &str) -> Option<Implementation> {
        Some(match s.to_ascii_lowercase().as_str() {
            "" | "auto" => Implementation::Auto,
            "cudnn" => Implementation::Cudnn,
            "triton" => Implementation::Triton,
            "composite" => Implementation::Composite,
            _ => return None,
        })
    }
}

impl fmt::Display for Implementation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Implementation::Auto => "auto",
            Implementation::Cudnn => "cudnn",
            Implementation::Triton => "triton",
            Implementation::Composite => "composite",
        })
    }
}
