//! Joining a multi-process group (`Config::distributed`, or `LAZULI_COORDINATOR`, `LAZULI_PROCESS_ID`,
//! `LAZULI_NUM_PROCESSES`): before the PJRT client is made, this process joins the group through its
//! coordinator (process 0 serves it unless `external_coordinator`), reports its step with every heartbeat, and
//! hands the group's key-value store to the client (`PJRT_Client_Create`'s callbacks; the CUDA plugin also gets
//! `node_id` and `num_nodes`).
//!
//! A lost member (it exited, was killed, or stopped heartbeating) ends every other process with the error
//! naming it and its last step, exit code [`GROUP_FAILED_EXIT_CODE`]: a process blocked in a collective could
//! not be told otherwise. A process that exits leaves the group at exit as done (process 0, serving the
//! coordinator, first waits for the others to leave); [`shutdown`] leaves once every process called it.

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use lazuli_distributed::MemberConfig;
use lazuli_pjrt::{ClientOptions, ErrorCode, KeyValueError, KeyValueStore};

use crate::error::{Error, Result};
use crate::settings::Backend;

pub use lazuli_distributed::{Error as MemberError, Failure, Member};

/// The exit code of a process ended because its group failed (EX_TEMPFAIL: a restart may succeed).
pub const GROUP_FAILED_EXIT_CODE: i32 = 75;

/// How this process takes part in a multi-process group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Distributed {
    /// The coordinator's "host:port"; process 0 serves it there unless `external_coordinator`.
    pub coordinator: String,
    /// This process's id, 0 to `num_processes - 1`.
    pub process_id: u32,
    pub num_processes: u32,
    /// Silence after which a member counts as lost (default 60 s). The coordinator's host decides it for all.
    pub heartbeat_timeout: Duration,
    /// How long to keep trying to reach the coordinator, and to wait for every process to join (default 60 s).
    pub connect_timeout: Duration,
    /// A coordinator is already running at `coordinator` (`lazuli-run --external-coordinator`); no process
    /// serves one.
    pub external_coordinator: bool,
}

impl Distributed {
    pub const DEFAULT_HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(60);

    pub fn new(coordinator: impl Into<String>, process_id: u32, num_processes: u32) -> Distributed {
        Distributed {
            coordinator: coordinator.into(),
            process_id,
            num_processes,
            heartbeat_timeout: Self::DEFAULT_HEARTBEAT_TIMEOUT,
            connect_timeout: Duration::from_secs(60),
            external_coordinator: false,
        }
    }

    pub(crate) fn check(&self) -> Result<()> {
        if self.num_processes == 0 || self.process_id >= self.num_processes {
            return Err(Error::Config(format!(
                "process id {} is out of range for {} process(es) (LAZULI_PROCESS_ID, LAZULI_NUM_PROCESSES or \
                 Config::distributed): expected 0 to {}",
                self.process_id,
                self.num_processes,
                self.num_processes.saturating_sub(1)
            )));
        }
        if self.heartbeat_timeout.is_zero() {
            return Err(Error::Config("the heartbeat timeout must be longer than 0 s".into()));
        }
        Ok(())
    }

    /// Whether this process serves the coordinator.
    fn hosts_coordinator(&self) -> bool {
        self.process_id == 0 && !self.external_coordinator
    }
}

static GROUP: OnceLock<Member> = OnceLock::new();
static EXITING: AtomicBool = AtomicBool::new(false);
/// The backend the group's runtime runs on.
static BACKEND: OnceLock<Backend> = OnceLock::new();

/// Writes `line` to stderr in one write: a panic on another thread (a failed collective, say) prints through an
/// unlocked stderr, and `eprintln!`'s piecewise writes of a `Display` could be cut by it mid-sentence.
fn say_whole(line: &str) {
    use std::io::Write;
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

/// This process's membership, once the runtime joined a group.
pub fn group() -> Option<&'static Member> {
    GROUP.get()
}

/// Joins the group (once per process) and adds what the plugin needs to `options`.
pub(crate) fn join(config: &Distributed, backend: Backend, options: ClientOptions) -> Result<ClientOptions> {
    config.check()?;
    let _ = BACKEND.set(backend);
    let member = match GROUP.get() {
        Some(m) => m,
        None => {
            let member = connect(config)?;
            member.report_steps_from(crate::diagnostics::current_step);
            member.on_failure(|failure| {
                if EXITING.load(Relaxed) {
                    say_whole(&format!("lazuli: {failure}\n"));
                    return;
                }
                say_whole(&format!("lazuli: {failure}; ending this process (exit code {GROUP_FAILED_EXIT_CODE})\n"));
                std::process::exit(GROUP_FAILED_EXIT_CODE);
            });
            GROUP.get_or_init(|| member)
        }
    };
    let options = options.key_value_store(Arc::new(GroupStore(member)));
    // The CPU plugins build no multi-process client (docs/perf-log/2026-12-01-multi-process-cpu.md): each CPU
    // process keeps a client of its own, and only the CUDA plugin is told its place in the group.
    Ok(match backend {
        Backend::Gpu => options
            .int_option("node_id", i64::from(config.process_id))
            .int_option("num_nodes", i64::from(config.num_processes)),
        // Not tried on ROCm and Intel GPUs: their plugins get the store only.
        Backend::Cpu | Backend::Tpu | Backend::Rocm | Backend::Xpu => options,
    })
}

fn connect(config: &Distributed) -> Result<Member> {
    let member_config = MemberConfig {
        connect_timeout: config.connect_timeout,
        coordinator_host: (!config.external_coordinator).then_some(0),
        ..MemberConfig::new(&config.coordinator, config.process_id, config.num_processes)
    };
    let joined = if config.hosts_coordinator() {
        Member::host_and_join(&config.coordinator, member_config, config.heartbeat_timeout)
    } else {
        Member::join(member_config)
    };
    joined.map_err(|e| Error::Config(format!("joining the group as process {}: {e}", config.process_id)))
}

/// Leaves the group cleanly: waits until every process arrives here (at most the heartbeat timeout), then
/// leaves. Processes that exit normally do it at exit by themselves; an error if the group failed.
pub fn shutdown() -> Result<()> {
    let Some(member) = GROUP.get() else { return Ok(()) };
    member.leave(member.heartbeat_timeout()).map_err(|e| Error::Config(format!("leaving the group: {e}")))
}

/// The process is exiting: a failure of the group from now on is only reported, since calling `exit` again
/// from the failure hook while the exit hooks run would not end the process.
pub(crate) fn begin_exit() {
    EXITING.store(true, Relaxed);
}

/// At exit: leave the group as done, unless it failed (its members just end). An exit hook cannot tell an
/// exit with an error from a normal one: `lazuli-run` reports a process that exited with an error to the
/// coordinator. The coordinator's host waits here until the others left.
pub(crate) fn leave_at_exit() {
    if let Some(member) = GROUP.get() {
        if member.failure().is_none() {
            // This thread's thread-locals, the async runtime's context among them, may be gone by now.
            let _ = std::thread::spawn(|| member.depart()).join();
        }
    }
}

/// Whether exiting must not wait for the programs still running: this process's group failed, and on an
/// accelerator a collective waiting for the lost process never finishes. CPU programs do finish (the CPU plugins
/// have no cross-process collectives), and tearing the plugin down under one would crash the exit.
pub(crate) fn exit_without_waiting() -> bool {
    GROUP.get().is_some_and(|m| m.failure().is_some()) && BACKEND.get().is_some_and(|b| *b != Backend::Cpu)
}

/// The group's store as the plugin's key-value callbacks see it, under a prefix of their own.
struct GroupStore(&'static Member);

const PLUGIN_PREFIX: &str = "pjrt/";

fn store_error(e: lazuli_distributed::Error) -> KeyValueError {
    let code = match e {
        lazuli_distributed::Error::Timeout(_) => ErrorCode::DeadlineExceeded,
        lazuli_distributed::Error::GroupFailed(_) => ErrorCode::Aborted,
        _ => ErrorCode::Unavailable,
    };
    KeyValueError::new(code, e.to_string())
}

impl KeyValueStore for GroupStore {
    fn get(&self, key: &str, timeout: Duration) -> std::result::Result<Vec<u8>, KeyValueError> {
        self.0.get(&format!("{PLUGIN_PREFIX}{key}"), timeout).map_err(store_error)
    }

    fn try_get(&self, key: &str) -> std::result::Result<Option<Vec<u8>>, KeyValueError> {
        self.0.try_get(&format!("{PLUGIN_PREFIX}{key}")).map_err(store_error)
    }

    fn put(&self, key: &str, value: &[u8]) -> std::result::Result<(), KeyValueError> {
        self.0.put(&format!("{PLUGIN_PREFIX}{key}"), value).map_err(store_error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The plugin's view of the group's store: its keys under their own prefix, a missing key's timeout as
    /// DEADLINE_EXCEEDED (what XLA's key-value clients expect), try-get of a missing key as `None`.
    #[test]
    fn the_plugin_sees_the_group_store_under_its_prefix() {
        let config = MemberConfig::new("127.0.0.1:0", 0, 1);
        let member =
            Member::host_and_join("127.0.0.1:0", config, Duration::from_secs(30)).unwrap_or_else(|e| panic!("{e}"));
        let member: &'static Member = Box::leak(Box::new(member));
        let store = GroupStore(member);
        store.put("topology/0", b"bytes").unwrap();
        assert_eq!(store.get("topology/0", Duration::from_secs(1)).unwrap(), b"bytes");
        assert_eq!(member.try_get("pjrt/topology/0").unwrap().as_deref(), Some(&b"bytes"[..]));
        assert_eq!(member.try_get("topology/0").unwrap(), None);
        assert_eq!(store.try_get("missing").unwrap(), None);
        let err = store.get("missing", Duration::from_millis(50)).unwrap_err();
        assert_eq!(err.code, ErrorCode::DeadlineExceeded, "{err:?}");
    }
}
