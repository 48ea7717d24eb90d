//! The op methods users call on tensors beyond `graph::record`'s core: array ops, activations and losses,
//! operators, convolutions, random numbers, fused attention and custom Triton kernels.

pub(crate) mod array_ops;
pub mod attention;
mod conv;
pub mod custom_kernel;
mod nn_functional;
mod operators;
pub mod random;
