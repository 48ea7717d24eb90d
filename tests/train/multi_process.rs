//! Data-parallel training across real processes started by the `lazuli-run` launcher, on the CPU. The CPU plugins
//! have no cross-process collectives (`docs/perf-log/2026-12-01-multi-process-cpu.md`), so the replicas agree
//! through the group's key-value store: each computes its gradient on its own shard of the batch with lazuli,
//! publishes it, and applies the mean of all of them. Process 0 checkpoints every few steps; a replica that
//! dies once makes the launcher restart the group, which resumes from the checkpoint and must end bit for bit
//! where an uninterrupted run ends, and near an f64 host reference of the same training.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use lazuli::Tensor;

use crate::common::child;

const ROLE: &str = "LAZULI_TEST_ROLE";
const DIR: &str = "LAZULI_TEST_DIR";
/// Set: process 1 dies once (exit code 1) before this step.
const FAIL_AT: &str = "LAZULI_TEST_FAIL_AT";

const STEPS: u64 = 24;
const CHECKPOINT_EVERY: u64 = 5;
const DIM: usize = 6;
const ROWS: usize = 8;
const LR: f64 = 0.1;
const PROCESSES: u32 = 2;

/// Process `p`'s rows of step `step`'s batch, and their targets (a fixed linear map of the rows).
fn shard(step: u64, p: u32) -> (Vec<f64>, Vec<f64>) {
    let x: Vec<f64> = (0..ROWS * DIM)
        .map(|i| ((step * 7919 + u64::from(p) * 104_729 + i as u64 * 31) % 1000) as f64 / 500.0 - 1.0)
        .collect();
    let y = x.chunks(DIM).map(|r| r.iter().enumerate().map(|(j, v)| v * (j as f64 - 2.5)).sum()).collect();
    (x, y)
}

/// One replica: trains from the checkpoint (if any) to `STEPS`, exchanging gradients through the group's store.
#[test]
fn replica() {
    if std::env::var(ROLE).as_deref() != Ok("replica") {
        return;
    }
    let dir = PathBuf::from(std::env::var(DIR).unwrap());
    lazuli::platform().unwrap(); // joins the group the launcher's variables describe
    let group = lazuli::distributed::group().expect("started by lazuli-run");
    let me = group.process_id();
    let checkpoint = dir.join("checkpoint.safetensors");
    let (mut w, start) = resume(&checkpoint);
    if start > 0 {
        eprintln!("replica {me} resumes at step {start}");
    }
    let fail_at: Option<u64> = std::env::var(FAIL_AT).ok().map(|s| s.parse().unwrap());
    for step in start..STEPS {
        if me == 1 && fail_at == Some(step) && !dir.join("failed-once").exists() {
            std::fs::write(dir.join("failed-once"), b"").unwrap();
            eprintln!("replica 1 dies before step {step}");
            std::process::exit(1);
        }
        let gradient = local_gradient(&w, step, me);
        group.put(&format!("grad/{step}/{me}"), &bytes(&gradient)).unwrap();
        let mut mean = vec![0f32; DIM];
        for p in 0..group.num_processes() {
            let g = floats(&group.get(&format!("grad/{step}/{p}"), Duration::from_secs(30)).unwrap());
            mean.iter_mut().zip(&g).for_each(|(m, g)| *m += g / PROCESSES as f32);
        }
        w.iter_mut().zip(&mean).for_each(|(w, g)| *w -= LR as f32 * g);
        if me == 0 && (step + 1) % CHECKPOINT_EVERY == 0 {
            save(&checkpoint, &w, step + 1);
        }
    }
    if me == 0 {
        std::fs::write(dir.join("final"), bytes(&w)).unwrap();
    }
}

/// The gradient of the mean squared error of `w` on this process's shard, computed by lazuli.
fn local_gradient(w: &[f32], step: u64, p: u32) -> Vec<f32> {
    let (x, y) = shard(step, p);
    let x = Tensor::from_slice(&x.iter().map(|&v| v as f32).collect::<Vec<_>>(), &[ROWS, DIM]);
    let y = Tensor::from_slice(&y.iter().map(|&v| v as f32).collect::<Vec<_>>(), &[ROWS, 1]);
    let w = Tensor::from_slice(w, &[DIM, 1]).requires_grad();
    let loss = (x.matmul(&w) - &y).pow(2.0).mean_all();
    lazuli::grad(&loss, &[&w])[0].to_vec::<f32>().unwrap()
}

fn resume(path: &Path) -> (Vec<f32>, u64) {
    if !path.exists() {
        return (vec![0.0; DIM], 0);
    }
    let tensors = lazuli::safetensors::load(path).unwrap();
    let find = |name: &str| tensors.iter().find(|(n, _)| n == name).map(|(_, t)| t.clone()).unwrap();
    let step = find("step").to_vec::<i64>().unwrap()[0] as u64;
    (find("w").to_vec::<f32>().unwrap(), step)
}

fn save(path: &Path, w: &[f32], step: u64) {
    let w = Tensor::from_slice(w, &[DIM]);
    let step = Tensor::from_slice(&[step as i64], &[1]);
    lazuli::safetensors::save(path, &[("w", &w), ("step", &step)]).unwrap();
}

fn bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn floats(b: &[u8]) -> Vec<f32> {
    b.chunks(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()
}

/// The launcher, in a child process whose environment its replicas inherit.
#[test]
fn launcher() {
    if std::env::var(ROLE).as_deref() != Ok("launcher") {
        return;
    }
    // This child runs one test alone, so changing its environment races nothing: the replicas inherit it.
    std::env::set_var(ROLE, "replica");
    let exe = std::env::current_exe().unwrap().to_string_lossy().into_owned();
    let test = child::test_name(module_path!(), "replica");
    let args = lazuli_distributed::launcher::Args {
        nproc: PROCESSES,
        hosts: 1,
        host_rank: 0,
        max_restarts: 1,
        coordinator: None,
        external_coordinator: false,
        serve_coordinator: false,
        heartbeat_timeout: 60.0,
        command: vec![exe, "--exact".into(), test, "--test-threads=1".into(), "--nocapture".into()],
    };
    let code = lazuli_distributed::launcher::run(&args);
    assert_eq!(code, 0, "the group failed");
}

/// Runs the launcher over `PROCESSES` replicas; the final weights, and the launcher's output.
fn run_group(fail_at: Option<u64>) -> (Vec<f32>, String) {
    let dir = std::env::temp_dir().join(format!("lazuli-multi-process-{}-{fail_at:?}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let mut env = vec![(ROLE, "launcher".to_string()), (DIR, dir.to_string_lossy().into_owned())];
    env.extend(fail_at.map(|s| (FAIL_AT, s.to_string())));
    env.push(("LAZULI_HEARTBEAT_TIMEOUT", "5".into()));
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let out = child::run(&child::test_name(module_path!(), "launcher"), &env);
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{text}");
    let w = floats(&std::fs::read(dir.join("final")).unwrap_or_else(|e| panic!("no final weights ({e}): {text}")));
    let _ = std::fs::remove_dir_all(&dir);
    (w, text)
}

/// The same training on the host in f64.
fn reference() -> Vec<f64> {
    let mut w = vec![0f64; DIM];
    for step in 0..STEPS {
        let mut mean = vec![0f64; DIM];
        for p in 0..PROCESSES {
            let (x, y) = shard(step, p);
            for (row, target) in x.chunks(DIM).zip(&y) {
                let err: f64 = row.iter().zip(&w).map(|(a, b)| a * b).sum::<f64>() - target;
                for j in 0..DIM {
                    mean[j] += 2.0 * err * row[j] / ROWS as f64 / f64::from(PROCESSES);
                }
            }
        }
        w.iter_mut().zip(&mean).for_each(|(w, g)| *w -= LR * g);
    }
    w
}

#[test]
fn a_restarted_group_resumes_from_its_checkpoint_and_ends_where_an_uninterrupted_one_does() {
    let started = Instant::now();
    let (uninterrupted, _) = run_group(None);
    let (restarted, log) = run_group(Some(12));
    assert!(log.contains("replica 1 dies before step 12"), "{log}");
    assert!(log.contains("restarting the group (1 of 1)"), "{log}");
    // The last checkpoint before step 12 is step 10's.
    for p in 0..PROCESSES {
        assert!(log.contains(&format!("[p{p}] replica {p} resumes at step 10")), "{log}");
    }
    let bits = |w: &[f32]| w.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&restarted), bits(&uninterrupted));
    let expected = reference();
    for (got, want) in uninterrupted.iter().zip(&expected) {
        assert!((f64::from(*got) - want).abs() < 1e-4, "{uninterrupted:?} against the f64 reference {expected:?}");
    }
    // Training moved the weights towards the map the targets come from (-2.5, -1.5, …, 2.5).
    assert!((f64::from(uninterrupted[5]) - expected[5]).abs() < 1e-4 && expected[5] > 0.5, "{expected:?}");
    eprintln!("two launcher runs of {PROCESSES} processes: {:?}", started.elapsed());
}

/// In a child: the first read fails with an error holding `LAZULI_TEST_EXPECT`.
#[test]
fn bad_group_setting() {
    let Ok(expect) = std::env::var("LAZULI_TEST_EXPECT") else { return };
    let err = (&Tensor::from_slice(&[1.0f32], &[1]) * 2.0).to_vec::<f32>().unwrap_err().to_string();
    assert!(err.contains(&expect), "{err}");
}

/// An incomplete group, an id outside it, or a malformed timeout is an error naming the variables, before
/// anything is contacted.
#[test]
fn bad_group_settings_are_clear_errors() {
    let test = child::test_name(module_path!(), "bad_group_setting");
    let coordinator = ("LAZULI_COORDINATOR", "127.0.0.1:1");
    let cases: [(&[(&str, &str)], &str); 3] = [
        (&[coordinator], "LAZULI_PROCESS_ID and LAZULI_NUM_PROCESSES not set"),
        (&[coordinator, ("LAZULI_PROCESS_ID", "2"), ("LAZULI_NUM_PROCESSES", "2")], "process id 2 is out of range"),
        (
            &[
                coordinator,
                ("LAZULI_PROCESS_ID", "0"),
                ("LAZULI_NUM_PROCESSES", "2"),
                ("LAZULI_HEARTBEAT_TIMEOUT", "soon"),
            ],
            "LAZULI_HEARTBEAT_TIMEOUT=\"soon\": expected a number of seconds > 0",
        ),
    ];
    for (env, expect) in cases {
        let mut env = env.to_vec();
        env.push(("LAZULI_TEST_EXPECT", expect));
        child::passes(&test, &env);
    }
}

/// In a child started by `a_killed_replica_ends_the_others_with_its_name`: joins, then steps (a program and a
/// barrier per step) until ended.
#[test]
fn stepping_replica() {
    if std::env::var(ROLE).as_deref() != Ok("stepping") {
        return;
    }
    lazuli::platform().unwrap();
    let group = lazuli::distributed::group().expect("joined through the variables");
    loop {
        let x = Tensor::from_slice(&[1.0f32, 2.0], &[2]);
        lazuli::sync().unwrap();
        (&x * 2.0).to_vec::<f32>().unwrap();
        if let Err(e) = group.barrier("step", Duration::from_secs(60)) {
            // The runtime's failure hook ends this process with its own message; a panic here would race it.
            std::thread::sleep(Duration::from_secs(30));
            panic!("the failure hook did not end this process: {e}");
        }
        println!("step {}", lazuli::diagnostics::current_step());
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// lazuli's own reaction to a lost member: with three replicas stepping, `kill -9` of one ends the two others
/// through the runtime's failure hook, with exit code 75 and the error naming the lost process and its step.
#[test]
fn a_killed_replica_ends_the_others_with_its_name() {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;
    let address = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().to_string();
    let test = child::test_name(module_path!(), "stepping_replica");
    let mut children: Vec<_> = (0..3)
        .map(|p| {
            child::command(&test)
                .env(ROLE, "stepping")
                .env("LAZULI_COORDINATOR", &address)
                .env("LAZULI_PROCESS_ID", p.to_string())
                .env("LAZULI_NUM_PROCESSES", "3")
                .env("LAZULI_HEARTBEAT_TIMEOUT", "5")
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    // Over a second of steps, so that heartbeats (every 5/6 s) have reported some.
    let victim_out = BufReader::new(children[2].stdout.take().unwrap());
    let stepped = victim_out.lines().map_while(Result::ok).any(|l| l.ends_with("step 100"));
    assert!(stepped, "the replicas did not step");
    children[2].kill().unwrap();
    let killed = Instant::now();
    for p in 0..2 {
        let out = children.remove(0).wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(75), "process {p}: {stderr}");
        assert!(stderr.contains("distributed group failed: process 2 was lost"), "process {p}: {stderr}");
        let step: u64 = stderr
            .split("its last reported step was ")
            .nth(1)
            .and_then(|s| s.split(';').next())
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or_else(|| panic!("process {p}: {stderr}"));
        assert!((1..=101).contains(&step), "process {p}: {stderr}");
    }
    assert!(killed.elapsed() < Duration::from_secs(5), "{:?}", killed.elapsed());
    let _ = children[0].wait();
}
