//! The engine: the executable cache and the persistent compile cache, the CPU launcher, threads, deep graphs, a
//! clean exit with programs in flight, sharding and its planner on virtual devices, and the runtime's
//! configuration.
//!
//! One of the root package's four test binaries by theme (`tests/ops`, `tests/engine`, `tests/errors`,
//! `tests/train`), a module per topic, so that `cargo test` links the stack four times rather than once per file.
//!
//! Tests that read or change process-wide state (the counters, the runtime's configuration) run alone in a child
//! process (`common::child::alone`).

#[path = "../common/mod.rs"]
mod common;

mod cache;
mod compile_cache;
mod deep_graphs;
mod exit_in_flight;
mod launcher;
mod planner;
mod program_cache;
mod runtime_config;
mod sharding;
mod threads;
