//! The op methods users call on tensors beyond `graph::record`'s core: array ops, activations and losses,
//! operators, convolutions, random numbers, fused attention, custom Triton kernels, control flow (`scan`,
//! `while_loop`, `cond`), gradient checkpointing, and sorting (`sort`, `argsort`, `topk`).

pub(crate) mod array_ops;
pub mod attention;
pub mod checkpoint;
pub mod control;
mod conv;
pub mod custom_kernel;
pub mod einsum;
pub mod finite_count;
pub(crate) mod fused_layers;
pub mod indexing;
pub(crate) mod nn_functional;
mod operators;
pub mod random;
mod scatter;
mod sort;
