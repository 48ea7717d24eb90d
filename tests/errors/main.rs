//! Errors and diagnostics: bad input refused at the caller's line (control flow's too), XLA's errors at the Rust line, graph breaks,
//! recompile explanations and strict mode, and the fuzz harness.
//!
//! One of the root package's four test binaries by theme (`tests/ops`, `tests/engine`, `tests/errors`,
//! `tests/train`), a module per topic, so that `cargo test` links the stack four times rather than once per file.
//!
//! Tests that read or change process-wide state (the counters, captured events, strict mode) run alone in a child
//! process (`common::child::alone`).

#[path = "../common/mod.rs"]
mod common;

mod bad_input;
mod control_flow;
mod diagnostics;
mod errors;
mod finite;
mod finite_steps;
mod fuzz;
mod try_ops;
mod xla_errors;
