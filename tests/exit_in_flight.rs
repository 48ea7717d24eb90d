//! `sync()` only launches the step's program. A process that ends right after it (returning from `main`) must
//! still exit cleanly: lazuli waits for programs in flight before the plugin tears its threads down.

use std::process::Command;

use lazuli::Tensor;

const CHILD: &str = "LAZULI_TEST_EXIT_CHILD";

#[test]
fn exiting_right_after_sync_is_clean() {
    if std::env::var_os(CHILD).is_some() {
        // Enough work that the program is still running when the process exits.
        let n = 384;
        let x = Tensor::from_slice(&vec![0.5f32; n * n], &[n, n]);
        let mut y = x.clone();
        for _ in 0..40 {
            y = y.matmul(&x).tanh();
        }
        lazuli::sync().expect("launch");
        assert_eq!(lazuli::metrics().executions, 1);
        // Drop every buffer while the program may still run, then let the process end by returning from `main`.
        drop((x, y));
        return;
    }
    for _ in 0..3 {
        let out = Command::new(std::env::current_exe().expect("test binary"))
            .args(["--exact", "exiting_right_after_sync_is_clean", "--nocapture", "--test-threads=1"])
            .env(CHILD, "1")
            .output()
            .expect("run the child");
        assert!(
            out.status.success(),
            "the child exited with {:?}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
