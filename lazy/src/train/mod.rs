//! Training on top of the engine: modules and layers (`nn`), optimizers (`optim`), checkpoints, and training data
//! (`data`).

pub mod checkpoint;
pub mod data;
pub mod nn;
pub mod optim;
