//! Training on top of the engine: modules and layers (`nn`), optimizers (`optim`), checkpoints.

pub mod checkpoint;
pub mod nn;
pub mod optim;
