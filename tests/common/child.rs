//! Running one test of the current test binary in a child process, with its own environment: settings are read
//! once per process, and aborts or signals must not take the test runner down.

use std::process::{Command, Output};

/// Run this test binary's test `name` alone in a child process with `env` set; returns its output.
pub fn run(name: &str, env: &[(&str, &str)]) -> Output {
    Command::new(std::env::current_exe().expect("test binary"))
        .args(["--exact", name, "--include-ignored", "--test-threads=1", "--nocapture"])
        .envs(env.iter().copied())
        .output()
        .expect("run the child")
}

/// [`run`], and panic unless the child's test passed.
#[track_caller]
pub fn passes(name: &str, env: &[(&str, &str)]) {
    let out = run(name, env);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("1 passed"), "the child ran the check");
}
