//! The ops: values against ndarray and the reference interpreter, gradients against finite differences, fused
//! and custom kernels (`gpu_kernels`, ignored without an NVIDIA GPU), control flow, precision, random numbers,
//! numerics, and generated shapes and programs.
//!
//! One of the root package's four test binaries by theme (`tests/ops`, `tests/engine`, `tests/errors`,
//! `tests/train`), a module per topic, so that `cargo test` links the stack four times rather than once per file.
//!
//! Tests that read or change process-wide state run alone in a child process (`common::child::alone`).

#[path = "../common/mod.rs"]
mod common;

mod attention;
mod control;
mod cpu_library_fusions;
mod custom_kernel;
mod finite_count;
mod fused;
mod gpu_kernels;
mod grad;
mod grad_array;
mod numerics;
mod ops;
mod ops_array;
mod ops_index;
mod ops_window;
mod precision;
mod random;
mod random_programs;
mod shapes_proptest;
