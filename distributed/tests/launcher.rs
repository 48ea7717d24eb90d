//! The `lazuli-run` binary over small shell programs: the environment each process gets, output prefixed by
//! process, a failing process stopping the group (and its exit code returned), restarts, the line printed for
//! other hosts, and bad arguments.

use std::process::{Command, Output};
use std::time::{Duration, Instant};

fn lazuli_run(args: &[&str]) -> (Output, Duration) {
    let started = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_lazuli-run")).args(args).output().unwrap();
    (out, started.elapsed())
}

fn output_text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

#[test]
fn each_process_gets_its_place_in_the_group_and_a_prefix() {
    let program = r#"echo "id=$LAZULI_PROCESS_ID of $LAZULI_NUM_PROCESSES at $LAZULI_COORDINATOR"; echo oops >&2"#;
    let (out, _) = lazuli_run(&["--nproc", "3", "--", "sh", "-c", program]);
    let text = output_text(&out);
    assert!(out.status.success(), "{text}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    for p in 0..3 {
        let line = stdout.lines().find(|l| l.starts_with(&format!("[p{p}] id={p} of 3 at 127.0.0.1:")));
        assert!(line.is_some(), "{text}");
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.lines().filter(|l| l.ends_with("] oops")).count(), 3, "{text}");
}

#[test]
fn a_failing_process_stops_the_group_and_its_exit_code_is_returned() {
    let program = r#"if [ "$LAZULI_PROCESS_ID" = 1 ]; then exit 7; fi; sleep 30"#;
    let (out, took) = lazuli_run(&["--nproc", "3", "--", "sh", "-c", program]);
    let text = output_text(&out);
    assert_eq!(out.status.code(), Some(7), "{text}");
    assert!(text.contains("process 1 failed") && text.contains("the group was stopped"), "{text}");
    assert!(took < Duration::from_secs(10), "the sleeping processes were killed: {took:?}");
}

#[test]
fn the_group_is_restarted_up_to_max_restarts_times() {
    let dir = std::env::temp_dir().join(format!("lazuli-run-restarts-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let marker = dir.join("attempts");
    // Process 0 counts the attempts; the group fails until the third one.
    let program = format!(
        r#"if [ "$LAZULI_PROCESS_ID" = 0 ]; then echo x >> {m}; fi; sleep 0.2; [ "$(wc -l < {m})" -ge 3 ]"#,
        m = marker.display()
    );
    let (out, _) = lazuli_run(&["--nproc", "2", "--max-restarts", "2", "--", "sh", "-c", &program]);
    let text = output_text(&out);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("restarting the group (1 of 2)") && text.contains("restarting the group (2 of 2)"), "{text}");
    assert_eq!(std::fs::read_to_string(&marker).unwrap().lines().count(), 3);

    std::fs::remove_file(&marker).unwrap();
    let (out, _) = lazuli_run(&["--nproc", "2", "--max-restarts", "1", "--", "sh", "-c", &program]);
    assert_eq!(out.status.code(), Some(1), "{}", output_text(&out));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn host_0_prints_the_command_for_the_other_hosts() {
    let (out, _) =
        lazuli_run(&["--nproc", "2", "--hosts", "3", "--coordinator", "127.0.0.1:29555", "--", "echo", "two words"]);
    let text = output_text(&out);
    assert!(out.status.success(), "{text}");
    let expected = "lazuli-run --nproc 2 --hosts 3 --host-rank RANK --coordinator 127.0.0.1:29555 -- echo 'two words'";
    assert!(text.contains(expected), "{text}");
    assert!(text.contains("RANK = 1 to 2"), "{text}");
}

#[test]
fn bad_arguments_are_clear_errors() {
    let cases: [(&[&str], &str); 5] = [
        (&["--nproc", "0", "--", "true"], "--nproc must be at least 1"),
        // A typo of 100,000 aborted once the host refused a thread, after starting thousands of processes. One
        // over the limit: without it, 1,025 processes that exit at once.
        (&["--nproc", "1025", "--", "true"], "--nproc 1025: at most 1024 processes on one host"),
        (&["--nproc", "1000", "--hosts", "5000000", "--coordinator", "127.0.0.1:1", "--", "true"], "more than a group"),
        (&["--nproc", "1", "--hosts", "2", "--host-rank", "2", "--", "true"], "--host-rank 2 is out of range"),
        (&["--nproc", "1", "--hosts", "2", "--", "true"], "several hosts need --coordinator"),
    ];
    for (args, expected) in cases {
        let (out, _) = lazuli_run(args);
        assert_eq!(out.status.code(), Some(2), "{}", output_text(&out));
        assert!(output_text(&out).contains(expected), "{}", output_text(&out));
    }
    let (out, _) = lazuli_run(&["--nproc", "1", "--", "/no/such/program"]);
    assert!(output_text(&out).contains("cannot start \"/no/such/program\""), "{}", output_text(&out));
}
