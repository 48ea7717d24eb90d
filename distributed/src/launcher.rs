//! `lazuli-run`: starts a group of local processes of one program, as `torchrun` does.
//!
//! Each process gets `LAZULI_COORDINATOR`, `LAZULI_PROCESS_ID` and `LAZULI_NUM_PROCESSES`;
//! their output lines are streamed with a `[pN]` prefix. When one fails, the others are killed (a member
//! that is still running would otherwise find the loss itself, within its heartbeat timeout); with
//! `--max-restarts K` the whole group is started again, at most K times, and the program is expected to resume
//! from its last checkpoint.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use clap::Parser;

use crate::env;
use crate::server::{Coordinator, CoordinatorConfig};

#[derive(Parser, Debug, Clone)]
#[command(name = "lazuli-run", about = "Run N processes of a lazuli program as one distributed group")]
pub struct Args {
    /// Processes to start on this host.
    #[arg(long)]
    pub nproc: u32,
    /// Hosts taking part (each runs `--nproc` processes); this host is `--host-rank`.
    #[arg(long, default_value_t = 1)]
    pub hosts: u32,
    /// This host's rank among `--hosts`: its processes are `rank * nproc` to `rank * nproc + nproc - 1`.
    #[arg(long, default_value_t = 0)]
    pub host_rank: u32,
    /// Restart the whole group this many times after a failure.
    #[arg(long, default_value_t = 0)]
    pub max_restarts: u32,
    /// The coordinator's "host:port": process 0 serves it there (default: 127.0.0.1 and a free port on one
    /// host; required with several hosts, as an address the other hosts reach).
    #[arg(long)]
    pub coordinator: Option<String>,
    /// The coordinator is a separate, already running service (`LAZULI_COORDINATOR_EXTERNAL=1`), e.g. one
    /// started with `--serve-coordinator`.
    #[arg(long)]
    pub external_coordinator: bool,
    /// Start no program: serve the coordinator of a group of `--hosts` × `--nproc` processes at
    /// `--coordinator` until they all left (exit 0) or the group failed (exit 1).
    #[arg(long)]
    pub serve_coordinator: bool,
    /// With `--serve-coordinator`: seconds of silence after which a member counts as lost.
    #[arg(long, default_value_t = 60.0)]
    pub heartbeat_timeout: f64,
    /// The program and its arguments.
    #[arg(last = true, required_unless_present = "serve_coordinator")]
    pub command: Vec<String>,
}

/// How a group's run ended.
#[derive(Debug)]
pub enum Outcome {
    /// Every process exited with 0.
    Success,
    /// A process failed; the group was stopped.
    Failed { process_id: u32, status: ExitStatus },
}

/// Runs the group, restarting it on failure up to `--max-restarts` times; the exit code for `lazuli-run`.
pub fn run(args: &Args) -> i32 {
    if let Err(message) = check(args) {
        eprintln!("lazuli-run: {message}");
        return 2;
    }
    if args.serve_coordinator {
        return serve_coordinator(args);
    }
    if args.hosts > 1 && args.host_rank == 0 {
        print_other_hosts(args);
    }
    groups::stop_on_signals();
    for attempt in 0..=args.max_restarts {
        let coordinator = match &args.coordinator {
            Some(c) => c.clone(),
            None => match free_local_address() {
                Ok(a) => a,
                Err(e) => {
                    eprintln!("lazuli-run: no free local port for the coordinator: {e}");
                    return 1;
                }
            },
        };
        match run_group(args, &coordinator) {
            Ok(Outcome::Success) => return 0,
            Ok(Outcome::Failed { process_id, status }) => {
                eprintln!("lazuli-run: process {process_id} failed ({status}); the group was stopped");
                if attempt < args.max_restarts {
                    eprintln!("lazuli-run: restarting the group ({} of {})", attempt + 1, args.max_restarts);
                } else {
                    return status.code().filter(|&c| c != 0).unwrap_or(1);
                }
            }
            Err(e) => {
                eprintln!("lazuli-run: cannot start {:?}: {e}", args.command[0]);
                return 1;
            }
        }
    }
    1
}

/// `--serve-coordinator`: the group's coordinator as a process of its own.
fn serve_coordinator(args: &Args) -> i32 {
    let Some(address) = &args.coordinator else {
        eprintln!("lazuli-run: --serve-coordinator needs --coordinator host:port, the address to serve at");
        return 2;
    };
    let heartbeat_timeout = match Duration::try_from_secs_f64(args.heartbeat_timeout) {
        Ok(t) if !t.is_zero() => t,
        _ => {
            eprintln!("lazuli-run: --heartbeat-timeout {}: expected seconds > 0", args.heartbeat_timeout);
            return 2;
        }
    };
    let config = CoordinatorConfig { num_processes: Some(args.hosts * args.nproc), heartbeat_timeout };
    let coordinator = match Coordinator::start(address, config) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("lazuli-run: {e}");
            return 1;
        }
    };
    println!(
        "lazuli-run: serving the coordinator of {} processes at {}",
        args.hosts * args.nproc,
        coordinator.address()
    );
    coordinator.wait_until_all_left(Duration::from_secs(365 * 24 * 3600));
    // Lets the answer to the last member's leave go out.
    std::thread::sleep(Duration::from_millis(100));
    match coordinator.failure() {
        Some(failure) => {
            eprintln!("lazuli-run: {failure}");
            1
        }
        None => 0,
    }
}

fn check(args: &Args) -> Result<(), String> {
    if args.nproc == 0 {
        return Err("--nproc must be at least 1".into());
    }
    if args.nproc > MOST_PER_HOST {
        return Err(format!(
            "--nproc {}: at most {MOST_PER_HOST} processes on one host (each is a process and two threads here)",
            args.nproc
        ));
    }
    if args.hosts.checked_mul(args.nproc).is_none() {
        return Err(format!(
            "--hosts {} × --nproc {} processes is more than a group can number",
            args.hosts, args.nproc
        ));
    }
    if args.hosts == 0 || args.host_rank >= args.hosts {
        return Err(format!("--host-rank {} is out of range for --hosts {}", args.host_rank, args.hosts));
    }
    if args.hosts > 1 && args.coordinator.is_none() {
        return Err("several hosts need --coordinator host:port, an address of host 0 the others reach".into());
    }
    Ok(())
}

/// The most processes `lazuli-run` starts on one host: far above one per accelerator or core, and below what a
/// host's limits on processes and threads refuse (a typo of 100,000 had started thousands before the host did).
const MOST_PER_HOST: u32 = 1024;

/// The line to run on each other host.
fn print_other_hosts(args: &Args) {
    let coordinator = args.coordinator.as_deref().unwrap_or_default();
    let program: Vec<String> = args.command.iter().map(|a| shell_word(a)).collect();
    println!("lazuli-run: on each other host, run (with RANK = 1 to {}):", args.hosts - 1);
    println!(
        "  lazuli-run --nproc {} --hosts {} --host-rank RANK --coordinator {coordinator}{} -- {}",
        args.nproc,
        args.hosts,
        if args.external_coordinator { " --external-coordinator" } else { "" },
        program.join(" ")
    );
}

fn shell_word(s: &str) -> String {
    if !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c)) {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// Binds port 0 and lets it go: the port is free now, and process 0 binds it moments later.
fn free_local_address() -> std::io::Result<String> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.to_string())
}

/// Starts this host's processes and waits: all succeed, or the first failure stops the others.
fn run_group(args: &Args, coordinator: &str) -> std::io::Result<Outcome> {
    let first = args.host_rank * args.nproc;
    let total = args.hosts * args.nproc;
    let mut children: Vec<(u32, Child)> = Vec::new();
    let mut streams = Vec::new();
    for process_id in first..first + args.nproc {
        let mut command = Command::new(&args.command[0]);
        command
            .args(&args.command[1..])
            .env(env::COORDINATOR, coordinator)
            .env(env::PROCESS_ID, process_id.to_string())
            .env(env::NUM_PROCESSES, total.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if args.external_coordinator {
            command.env(env::COORDINATOR_EXTERNAL, "1");
        }
        #[cfg(unix)]
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        let mut child = match command.spawn() {
            Ok(c) => c,
            Err(e) => {
                stop_all(&mut children);
                return Err(e);
            }
        };
        groups::add(child.id());
        let prefix = format!("[p{process_id}] ");
        let out = stream(child.stdout.take().expect("piped"), prefix.clone(), false);
        let err = stream(child.stderr.take().expect("piped"), prefix, true);
        children.push((process_id, child));
        match (out, err) {
            (Ok(out), Ok(err)) => streams.extend([out, err]),
            (Err(e), _) | (_, Err(e)) => {
                // Without its output copied a process could block on a full pipe: the group stops here.
                stop_all(&mut children);
                return Err(e);
            }
        }
    }
    let outcome = wait_group(&mut children, coordinator);
    // What the processes left running in the background would hold their output open.
    stop_all(&mut children);
    for s in streams {
        let _ = s.join();
    }
    Ok(outcome)
}

/// Polls the children until all exited with 0 or one failed (then the rest are killed).
fn wait_group(children: &mut [(u32, Child)], coordinator: &str) -> Outcome {
    let mut running: Vec<bool> = vec![true; children.len()];
    loop {
        for (i, (process_id, child)) in children.iter_mut().enumerate() {
            if !running[i] {
                continue;
            }
            match child.try_wait() {
                Ok(Some(status)) if status.success() => running[i] = false,
                Ok(Some(status)) => {
                    let process_id = *process_id;
                    // An exit with an error ran the program's exit handlers, which left the group as if done:
                    // tell the coordinator, so that members on other hosts learn it too.
                    let reason = format!("it exited with {status} (seen by lazuli-run)");
                    let _ = crate::client::report_failure(coordinator, process_id, reason);
                    stop_all(children);
                    return Outcome::Failed { process_id, status };
                }
                Ok(None) | Err(_) => {}
            }
        }
        if running.iter().all(|r| !r) {
            return Outcome::Success;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Kills every child still running, with whatever it started, and reaps them all.
fn stop_all(children: &mut [(u32, Child)]) {
    for (_, child) in children.iter_mut() {
        groups::kill(child.id());
        let _ = child.kill();
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    for (_, child) in children.iter_mut() {
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// Copies a child's output line by line with its prefix, on a thread of its own (an error if none can start).
fn stream(
    from: impl Read + Send + 'static,
    prefix: String,
    stderr: bool,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new().name("lazuli-run-output".into()).spawn(move || {
        let mut reader = BufReader::new(from);
        let mut line = Vec::new();
        while matches!(reader.read_until(b'\n', &mut line), Ok(n) if n > 0) {
            let text = String::from_utf8_lossy(&line);
            let text = text.trim_end_matches('\n');
            if stderr {
                let _ = writeln!(std::io::stderr().lock(), "{prefix}{text}");
            } else {
                let _ = writeln!(std::io::stdout().lock(), "{prefix}{text}");
            }
            line.clear();
        }
    })
}

/// Each process runs in a process group of its own, so that stopping it stops what it started too (a shell's
/// children); the launcher passes on a signal that stops it to every group.
#[cfg(unix)]
mod groups {
    use std::sync::Mutex;

    use rustix::process::{kill_process_group, Pid, Signal};

    static GROUPS: Mutex<Vec<u32>> = Mutex::new(Vec::new());

    pub fn add(leader: u32) {
        GROUPS.lock().unwrap_or_else(|e| e.into_inner()).push(leader);
    }

    fn send(leader: u32, signal: Signal) {
        if let Some(pid) = i32::try_from(leader).ok().and_then(Pid::from_raw) {
            let _ = kill_process_group(pid, signal);
        }
    }

    pub fn kill(leader: u32) {
        send(leader, Signal::KILL);
        GROUPS.lock().unwrap_or_else(|e| e.into_inner()).retain(|&g| g != leader);
    }

    /// On SIGINT, SIGTERM or SIGHUP: the same signal to every group, then exit as the signal would.
    pub fn stop_on_signals() {
        use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
        let Ok(mut signals) = signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP]) else { return };
        std::thread::spawn(move || {
            if let Some(raw) = signals.forever().next() {
                let signal = Signal::from_named_raw(raw).unwrap_or(Signal::TERM);
                for &leader in GROUPS.lock().unwrap_or_else(|e| e.into_inner()).iter() {
                    send(leader, signal);
                }
                std::process::exit(128 + raw);
            }
        });
    }
}

#[cfg(not(unix))]
mod groups {
    pub fn add(_: u32) {}
    pub fn kill(_: u32) {}
    pub fn stop_on_signals() {}
}
