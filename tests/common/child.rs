//! Running one test of the current test binary in a child process, with its own environment: settings are read
//! once per process, process-wide state (the counters, captured events, strict mode, the runtime's configuration)
//! must be the test's alone, and aborts or signals must not take the test runner down.
//!
//! The integration tests are a few binaries of several modules each, so the harness knows a test by its path
//! below the crate (`fuzz::fuzz_child`): [`test_name`] makes it from `module_path!()`, and `--exact` with it
//! selects that one test. A child that ran no test passes, so every caller checks that the child ran one.

use std::process::{Command, Output};

/// The name the harness knows test `name` of `module` (the test's `module_path!()`) by, as `--exact` takes it.
pub fn test_name(module: &str, name: &str) -> String {
    match module.split_once("::") {
        Some((_crate, path)) => format!("{path}::{name}"),
        None => name.to_string(),
    }
}

/// A command that runs this test binary's test `test` (a [`test_name`]) alone, ignored or not.
pub fn command(test: &str) -> Command {
    let mut cmd = Command::new(std::env::current_exe().expect("test binary"));
    cmd.args(["--exact", test, "--include-ignored", "--test-threads=1", "--nocapture"]);
    cmd
}

/// Run this test binary's test `test` (a [`test_name`]) alone in a child process with `env` set; returns its
/// output.
pub fn run(test: &str, env: &[(&str, &str)]) -> Output {
    command(test).envs(env.iter().copied()).output().expect("run the child")
}

/// [`run`], and panic unless the child ran the test and it passed.
#[track_caller]
pub fn passes(test: &str, env: &[(&str, &str)]) {
    let out = run(test, env);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("1 passed"), "the child ran the check");
}

/// Set in the child that [`alone`] starts: the test it runs.
const ALONE: &str = "LAZULI_TEST_ALONE";

/// For a test that reads or changes process-wide state, which the other tests of its binary would disturb or see:
/// runs test `name` of `module` (its `module_path!()`) alone in a child process of this binary. True in the
/// parent, once the child ran the test and it passed (the test then returns); false in that child, where the
/// test goes on.
#[track_caller]
pub fn alone(module: &str, name: &str) -> bool {
    let test = test_name(module, name);
    if std::env::var(ALONE).is_ok_and(|t| t == test) {
        return false;
    }
    passes(&test, &[(ALONE, test.as_str())]);
    true
}
