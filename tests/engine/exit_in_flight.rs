//! `sync()` only launches the step's program. A process that ends right after it (returning from `main`) must
//! still exit cleanly. It crashed in the CPU plugin's teardown when the process ended during the first run of a
//! new program; lazuli now waits for a new program's first run and, at exit, for programs still in flight, and
//! keeps its launcher thread out of the plugin from then on. Both ways programs run on the CPU are checked: on
//! the plugin's own threads (`LAZULI_CPU_ASYNC=1`) and queued on lazuli's launcher (the default).

use std::process::Command;

use lazuli::nn::{Activation, HostRng, Mlp};
use lazuli::{AdamW, CheckFinite, Config, DType, LocateAhead, Module, Optimizer, Tensor};

const CHILD: &str = "LAZULI_TEST_EXIT_CHILD";

#[test]
fn exiting_right_after_sync_is_clean() {
    if std::env::var_os(CHILD).is_some() {
        // Enough work that the program is still running when the process exits. The first step (a new program)
        // is waited for; the second reuses it and is in flight when the process ends.
        let n = 384;
        let mut kept = Vec::new();
        for step in 0..2 {
            let x = Tensor::from_slice(&vec![0.5f32; n * n], &[n, n]);
            let mut y = x.clone();
            for _ in 0..40 {
                y = y.matmul(&x).tanh();
            }
            lazuli::sync().expect("launch");
            assert_eq!(lazuli::metrics().executions, step + 1);
            if std::env::var("LAZULI_CPU_LAUNCHER").as_deref() == Ok("always") {
                assert_eq!(lazuli::metrics().queued, step + 1, "the program went to the launcher");
            }
            kept.push((x, y));
        }
        let (x, y) = kept.pop().expect("two steps");
        drop(kept);
        // Drop every buffer while the program may still run, then let the process end by returning from `main`.
        drop((x, y));
        return;
    }
    // The CPU client runs programs on its own threads only when asked to; the launcher queues them by default.
    let test = crate::common::child::test_name(module_path!(), "exiting_right_after_sync_is_clean");
    for mode in [("LAZULI_CPU_ASYNC", "1"), ("LAZULI_CPU_LAUNCHER", "always")].iter().flat_map(|m| [m; 3]) {
        let out = Command::new(std::env::current_exe().expect("test binary"))
            .args(["--exact", &test, "--nocapture", "--test-threads=1"])
            .env(CHILD, "1")
            .env_remove("LAZULI_CPU_ASYNC")
            .env_remove("LAZULI_CPU_LAUNCHER")
            .env(mode.0, mode.1)
            .output()
            .expect("run the child");
        assert!(
            out.status.success(),
            "the child ({}={}) exited with {:?}\n{}",
            mode.0,
            mode.1,
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(String::from_utf8_lossy(&out.stdout).contains("1 passed"), "the child ran the test");
    }
}

const AHEAD_CHILD: &str = "LAZULI_TEST_EXIT_AHEAD_CHILD";

/// Under `LAZULI_LOCATE_AHEAD` a training step's locating program is compiled on a thread of its own once the
/// step runs again. A process that ends within that compile must wait for it and exit cleanly: it crashed in the
/// CPU plugin, whose compile used statics that the exit had already destroyed.
#[test]
fn exiting_within_a_locator_compile_ahead_is_clean() {
    if std::env::var_os(AHEAD_CHILD).is_some() {
        let config =
            Config { check_finite: CheckFinite::Stop, locate_ahead: LocateAhead::On, ..Config::from_env().unwrap() };
        lazuli::init(config).unwrap();
        let mlp = Mlp::new(&mut HostRng::new(7), &[64, 256, 256, 256, 10], Activation::Tanh, DType::F32);
        let mut opt = AdamW::new(mlp.named_params(), 1e-3);
        let x = Tensor::from_slice(&vec![0.25f32; 32 * 64], &[32, 64]);
        for _ in 0..3 {
            let y = mlp.forward(&x);
            (&y * &y).mean_all().backward();
            opt.step();
            opt.zero_grad();
            lazuli::sync().expect("step");
        }
        let m = lazuli::metrics();
        // The compile ahead started at the second step; end the process before it is done.
        assert_eq!((m.locate_ahead, m.locate_compiles), (1, 0), "the compile ahead is under way: {m:?}");
        return;
    }
    let test = crate::common::child::test_name(module_path!(), "exiting_within_a_locator_compile_ahead_is_clean");
    for _ in 0..3 {
        let out = crate::common::child::command(&test)
            .env(AHEAD_CHILD, "1")
            .env_remove("LAZULI_CHECK_FINITE")
            .env_remove("LAZULI_LOCATE_AHEAD")
            .output()
            .expect("run the child");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "the child exited with {:?}\n{stdout}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(stdout.contains("1 passed"), "the child ran the test");
        // The wait at exit is as long as a compile: it says so rather than look like a hang.
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("waiting for the NaN locator's compile ahead to finish before exit"), "{stderr}");
    }
}
