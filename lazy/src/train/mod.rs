//! Training on top of the engine: modules and layers (`nn`), optimizers (`optim`), checkpoints, plain
//! safetensors files (`safetensors`: weights from and for other frameworks) and training data (`data`).

pub mod checkpoint;
pub mod data;
pub mod nn;
pub mod optim;
pub mod safetensors;
