//! Training on top of the engine: modules and layers (`nn`), optimizers (`optim`), checkpoints, and plain
//! safetensors files (`safetensors`: weights from and for other frameworks).

pub mod checkpoint;
pub mod nn;
pub mod optim;
pub mod safetensors;
