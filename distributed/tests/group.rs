//! The coordinator with real member processes over real gRPC: the key-value store, barriers, timeouts, bad
//! configuration, and the loss of a member (kill -9, SIGSTOP) or of the coordinator's host.
//!
//! Member processes are this test binary run again with `LAZULI_TEST_SCENARIO` set: `member_process` then
//! plays one member and exits with its verdict.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use lazuli_distributed::{Coordinator, CoordinatorConfig, Error, Member, MemberConfig};

const SCENARIO: &str = "LAZULI_TEST_SCENARIO";
/// Short, so that a stalled member is found quickly; the group's other timeouts are far longer.
const HEARTBEAT: Duration = Duration::from_secs(3);

fn env_u32(name: &str) -> u32 {
    std::env::var(name).unwrap().parse().unwrap()
}

/// One member of a group, in a process of its own (a no-op unless a test started it as one).
#[test]
fn member_process() {
    let Ok(scenario) = std::env::var(SCENARIO) else { return };
    let process_id = env_u32("LAZULI_PROCESS_ID");
    let n = env_u32("LAZULI_NUM_PROCESSES");
    let address = std::env::var("LAZULI_COORDINATOR").unwrap();
    let config = MemberConfig::new(address.clone(), process_id, n);
    let external = std::env::var_os("LAZULI_COORDINATOR_EXTERNAL").is_some();
    let member = if process_id == 0 && !external {
        Member::host_and_join(&address, config, HEARTBEAT)
    } else {
        Member::join(MemberConfig { coordinator_host: if external { None } else { Some(0) }, ..config })
    };
    let member = member.unwrap_or_else(|e| {
        eprintln!("JOIN FAILED: {e}");
        std::process::exit(4)
    });
    let code = match scenario.as_str() {
        "kv" => kv_member(&member),
        "steps" => steps_member(&member),
        other => panic!("unknown scenario {other}"),
    };
    if code == 0 {
        member.leave(Duration::from_secs(20)).unwrap();
    }
    std::process::exit(code);
}

/// Each member puts a value, reads every other member's, and checks timeouts and try-get.
fn kv_member(m: &Member) -> i32 {
    let (me, n) = (m.process_id(), m.num_processes());
    m.put(&format!("value/{me}"), format!("from process {me}").as_bytes()).unwrap();
    for p in 0..n {
        let v = m.get(&format!("value/{p}"), Duration::from_secs(20)).unwrap();
        assert_eq!(String::from_utf8(v).unwrap(), format!("from process {p}"));
    }
    assert_eq!(m.try_get("never/set").unwrap(), None);
    let asked = Instant::now();
    let missing = m.get("never/set", Duration::from_millis(300));
    let waited = asked.elapsed();
    assert!(matches!(&missing, Err(Error::Timeout(t)) if t.contains("never/set")), "{missing:?}");
    assert!(waited >= Duration::from_millis(300) && waited < Duration::from_secs(3), "{waited:?}");
    // A value set after a member started waiting for it arrives: process 0 sets it after a barrier.
    m.barrier("before-late-key", Duration::from_secs(20)).unwrap();
    if me == 0 {
        std::thread::sleep(Duration::from_millis(200));
        m.put("late", b"late value").unwrap();
    }
    assert_eq!(m.get("late", Duration::from_secs(20)).unwrap(), b"late value");
    // Deleted keys are gone for everyone (deleting one that is not there is no error).
    m.barrier("read-late", Duration::from_secs(20)).unwrap();
    if me == 1 {
        m.delete("late").unwrap();
        m.delete("never/set").unwrap();
    }
    m.barrier("deleted", Duration::from_secs(20)).unwrap();
    assert_eq!(m.try_get("late").unwrap(), None);
    // Barriers may be passed again by the same name.
    for _ in 0..3 {
        m.barrier("round", Duration::from_secs(20)).unwrap();
    }
    println!("KV OK {me}");
    0
}

/// Prints one line and ends the process; the first of the watcher and the failed call to get here does it
/// (the other waits), so that the line is never cut short by the other's exit.
fn fail_and_exit(line: String) -> ! {
    static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _only = ONE.lock();
    use std::io::Write;
    let _ = std::io::stderr().write_all(format!("{line}\n").as_bytes());
    std::process::exit(3)
}

/// Steps in lockstep (a barrier per step, the step reported), until the group fails.
fn steps_member(m: &Member) -> i32 {
    m.on_failure(|f| fail_and_exit(format!("FAILED (watcher): {f}")));
    for step in 0.. {
        m.set_step(step);
        if let Err(e) = m.barrier("step", Duration::from_secs(120)) {
            fail_and_exit(format!("FAILED (call): {e}"));
        }
        println!("step {step}");
        std::thread::sleep(Duration::from_millis(30));
    }
    unreachable!()
}

fn free_address() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().to_string()
}

struct Group {
    children: Vec<Child>,
    /// (process, line, is stderr)
    lines: mpsc::Receiver<(u32, String, bool)>,
}

fn start_group(scenario: &str, n: u32) -> Group {
    start_group_at(scenario, n, &free_address(), false)
}

fn start_group_at(scenario: &str, n: u32, address: &str, external: bool) -> Group {
    let (tx, lines) = mpsc::channel();
    let children = (0..n)
        .map(|p| {
            let mut child = Command::new(std::env::current_exe().unwrap())
                .args(["member_process", "--exact", "--nocapture", "--test-threads=1"])
                .env(SCENARIO, scenario)
                .env("LAZULI_COORDINATOR", address)
                .env("LAZULI_PROCESS_ID", p.to_string())
                .env("LAZULI_NUM_PROCESSES", n.to_string())
                .envs(external.then_some(("LAZULI_COORDINATOR_EXTERNAL", "1")))
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            for (pipe, is_err) in [
                (Box::new(child.stdout.take().unwrap()) as Box<dyn std::io::Read + Send>, false),
                (Box::new(child.stderr.take().unwrap()), true),
            ] {
                let tx = tx.clone();
                std::thread::spawn(move || {
                    for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                        let _ = tx.send((p, line, is_err));
                    }
                });
            }
            child
        })
        .collect();
    Group { children, lines }
}

impl Group {
    /// Waits for every process's exit code, at most `limit`.
    fn wait_all(&mut self, limit: Duration) -> Vec<Option<i32>> {
        let deadline = Instant::now() + limit;
        let mut codes = vec![None; self.children.len()];
        while Instant::now() < deadline && codes.iter().any(Option::is_none) {
            for (i, c) in self.children.iter_mut().enumerate() {
                if codes[i].is_none() {
                    if let Ok(Some(s)) = c.try_wait() {
                        codes[i] = Some(s.code().unwrap_or(-1));
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        codes
    }

    /// Reads output until `process` printed `line`.
    fn wait_for_line(&self, process: u32, line: &str, limit: Duration, seen: &mut Vec<(u32, String, bool)>) {
        let deadline = Instant::now() + limit;
        while let Ok(l) = self.lines.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            // libtest prints its "test member_process ... " before the first line.
            let found = l.0 == process && (l.1 == line || l.1.ends_with(&format!(" {line}")));
            seen.push(l);
            if found {
                return;
            }
        }
        panic!("process {process} did not print {line:?} within {limit:?}; output: {seen:#?}");
    }

    fn drain(&self, seen: &mut Vec<(u32, String, bool)>) {
        std::thread::sleep(Duration::from_millis(100));
        seen.extend(self.lines.try_iter());
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

#[test]
fn key_value_store_and_barriers_across_processes() {
    let mut group = start_group("kv", 3);
    let codes = group.wait_all(Duration::from_secs(60));
    let mut seen = Vec::new();
    group.drain(&mut seen);
    assert_eq!(codes, vec![Some(0); 3], "{seen:#?}");
    for p in 0..3 {
        assert!(seen.iter().any(|l| l.0 == p && l.1.ends_with(&format!("KV OK {p}"))), "{seen:#?}");
    }
}

/// A coordinator served by `lazuli-run --serve-coordinator`, and members that point at it: they use the store,
/// leave, and the service ends with 0.
#[test]
fn an_external_coordinator_serves_the_group_until_it_left() {
    let address = free_address();
    let mut server = Command::new(env!("CARGO_BIN_EXE_lazuli-run"))
        .args(["--serve-coordinator", "--nproc", "3", "--coordinator", &address, "--heartbeat-timeout", "3"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut group = start_group_at("kv", 3, &address, true);
    let codes = group.wait_all(Duration::from_secs(60));
    let mut seen = Vec::new();
    group.drain(&mut seen);
    assert_eq!(codes, vec![Some(0); 3], "{seen:#?}");
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = server.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "the coordinator did not end after the group left");
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut out = String::new();
    std::io::Read::read_to_string(&mut server.stdout.take().unwrap(), &mut out).unwrap();
    assert!(status.success(), "{out}");
    assert!(out.contains(&format!("serving the coordinator of 3 processes at {address}")), "{out}");
}

fn signal(child: &Child, sig: &str) {
    let status = Command::new("kill").args([sig, &child.id().to_string()]).status().unwrap();
    assert!(status.success());
}

/// Starts 3 members stepping in lockstep, signals `victim` after step 20 (some heartbeats later), and checks that the others exit
/// with the error naming it within `bound`; returns the survivors' stderr.
fn lose_a_member(victim: u32, sig: &str, bound: Duration) -> Vec<String> {
    let mut group = start_group("steps", 3);
    let mut seen = Vec::new();
    group.wait_for_line(victim, "step 20", Duration::from_secs(60), &mut seen);
    signal(&group.children[victim as usize], sig);
    let killed = Instant::now();
    let survivors: Vec<usize> = (0..3).filter(|&p| p != victim as usize).collect();
    let deadline = killed + bound;
    let mut codes = [None; 3];
    while Instant::now() < deadline && survivors.iter().any(|&p| codes[p].is_none()) {
        for &p in &survivors {
            if let Ok(Some(s)) = group.children[p].try_wait() {
                codes[p] = codes[p].or(Some(s.code().unwrap_or(-1)));
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let took = killed.elapsed();
    group.drain(&mut seen);
    for &p in &survivors {
        assert_eq!(codes[p], Some(3), "process {p} after {sig} of process {victim} ({took:?}): {seen:#?}");
    }
    eprintln!("{sig} of process {victim}: survivors exited after {took:?}");
    if sig == "-STOP" {
        signal(&group.children[victim as usize], "-CONT");
    }
    let errors: Vec<String> = seen
        .iter()
        .filter(|l| l.2 && l.1.starts_with("FAILED") && survivors.contains(&(l.0 as usize)))
        .map(|l| l.1.clone())
        .collect();
    for &p in &survivors {
        assert!(seen.iter().any(|l| l.0 as usize == p && l.2 && l.1.starts_with("FAILED")), "{p}: {seen:#?}");
    }
    errors
}

#[test]
fn a_killed_member_fails_the_others_at_once() {
    let errors = lose_a_member(2, "-KILL", Duration::from_secs(5));
    for e in &errors {
        assert!(e.contains("process 2 was lost") && e.contains("exited or was killed"), "{e}");
        assert_reported_step(e);
    }
}

/// The step named is one the victim reached before the signal (it printed 20, and at most one more).
fn assert_reported_step(e: &str) {
    let step: u64 = e.split("its last reported step was ").nth(1).and_then(|s| s.trim().parse().ok()).expect(e);
    assert!((1..=21).contains(&step), "{e}");
}

#[test]
fn a_stalled_member_fails_the_others_within_the_heartbeat_timeout() {
    let errors = lose_a_member(1, "-STOP", HEARTBEAT + Duration::from_secs(5));
    for e in &errors {
        assert!(e.contains("process 1 was lost") && e.contains("stopped heartbeating"), "{e}");
        assert_reported_step(e);
    }
}

#[test]
fn losing_the_coordinators_host_fails_the_others() {
    let errors = lose_a_member(0, "-KILL", Duration::from_secs(5));
    for e in &errors {
        assert!(e.contains("lost the coordinator") && e.contains("hosted by process 0"), "{e}");
    }
}

#[test]
fn bad_configurations_are_clear_errors() {
    let coordinator =
        Coordinator::start("127.0.0.1:0", CoordinatorConfig { num_processes: Some(2), heartbeat_timeout: HEARTBEAT })
            .unwrap();
    let address = coordinator.address().to_string();
    let quick = |id, n| MemberConfig { connect_timeout: Duration::from_secs(2), ..MemberConfig::new(&address, id, n) };

    // Process 0 joins and waits for process 1 to join; a second process 0 is refused at once.
    let first = std::thread::spawn({
        let config = quick(0, 2);
        move || Member::join(config).map(|m| m.process_id())
    });
    std::thread::sleep(Duration::from_millis(300));
    let duplicate = Member::join(quick(0, 2)).err().expect("a duplicate id must be refused").to_string();
    assert!(duplicate.contains("duplicate process id 0"), "{duplicate}");

    let mismatched = Member::join(quick(1, 3)).err().expect("a wrong count must be refused").to_string();
    assert!(mismatched.contains("mismatched process counts") && mismatched.contains("group of 3"), "{mismatched}");
    assert!(mismatched.contains("has 2"), "{mismatched}");

    let out_of_range = Member::join(quick(2, 2)).err().unwrap().to_string();
    assert!(
        out_of_range.contains("process id 2 is out of range") && out_of_range.contains("ids 0 to 1"),
        "{out_of_range}"
    );

    // Process 1 never comes: the first join times out naming it.
    let joined = first.join().unwrap().expect_err("process 1 never joined").to_string();
    assert!(joined.contains("not every process joined") && joined.contains("waiting for process(es) 1"), "{joined}");

    let asked = Instant::now();
    let nobody =
        MemberConfig { connect_timeout: Duration::from_millis(500), ..MemberConfig::new(free_address(), 0, 2) };
    let unreachable = Member::join(nobody).err().unwrap();
    assert!(matches!(unreachable, Error::Unreachable { .. }), "{unreachable}");
    assert!(unreachable.to_string().contains("no coordinator answered"), "{unreachable}");
    assert!(asked.elapsed() < Duration::from_secs(5));

    let zero =
        Coordinator::start("127.0.0.1:0", CoordinatorConfig { num_processes: None, heartbeat_timeout: Duration::ZERO });
    assert!(zero.err().unwrap().to_string().contains("heartbeat timeout"));
}
