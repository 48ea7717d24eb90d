//! Training: optimizers against host references, one program per step and donation, the GPT model, gradient
//! checkpointing (recomputing blocks in the backward pass), and checkpoints (resume, damaged files, saves
//! interrupted by signals in child processes), training data (token files, batches, prefetching) and tracing spans.
//!
//! One of the root package's four test binaries by theme (`tests/ops`, `tests/engine`, `tests/errors`,
//! `tests/train`), a module per topic, so that `cargo test` links the stack four times rather than once per file.
//!
//! Tests that read process-wide state (the counters, captured events) run alone in a child process
//! (`common::child::alone`).

#[path = "../common/mod.rs"]
mod common;

mod checkpoint;
mod data;
mod gpt;
mod gpt2;
mod grad_checkpoint;
mod low_precision;
mod multi_process;
mod scanned_gpt;
mod train;
mod weights;
