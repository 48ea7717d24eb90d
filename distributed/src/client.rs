//! A member of a group: joins through the coordinator, beats, watches for the loss of another member, and
//! offers the key-value store and barriers as blocking calls (training loops and the PJRT plugin's callbacks
//! are not async).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prost::Message as _;
use tokio::runtime::Runtime;
use tokio::sync::watch;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status};

use crate::error::{Error, Failure, Result};
use crate::proto::{
    BarrierRequest, GetRequest, GroupFailure, HeartbeatRequest, Membership, PutRequest, RegisterRequest,
};
use crate::rpc::coordinator_client::CoordinatorClient;
use crate::server::{Coordinator, CoordinatorConfig};

/// How a process joins a group.
#[derive(Clone, Debug)]
pub struct MemberConfig {
    /// The coordinator's "host:port".
    pub coordinator: String,
    pub process_id: u32,
    pub num_processes: u32,
    /// How long to keep trying to reach the coordinator, and to wait for every member to join.
    pub connect_timeout: Duration,
    /// The process that hosts the coordinator, named when the coordinator is lost (`None`: an external one).
    pub coordinator_host: Option<u32>,
}

impl MemberConfig {
    pub fn new(coordinator: impl Into<String>, process_id: u32, num_processes: u32) -> MemberConfig {
        MemberConfig {
            coordinator: coordinator.into(),
            process_id,
            num_processes,
            connect_timeout: Duration::from_secs(60),
            coordinator_host: Some(0),
        }
    }

    fn check(&self) -> Result<()> {
        if self.num_processes == 0 {
            return Err(Error::Config("the number of processes must be at least 1, got 0".into()));
        }
        if self.process_id >= self.num_processes {
            return Err(Error::Config(format!(
                "process id {} is out of range: a group of {} processes has ids 0 to {}",
                self.process_id,
                self.num_processes,
                self.num_processes - 1
            )));
        }
        if !self.coordinator.contains(':') {
            return Err(Error::Config(format!("coordinator address {:?} is not host:port", self.coordinator)));
        }
        Ok(())
    }
}

/// A hook run once when the group fails.
pub type FailureHook = Box<dyn Fn(&Failure) + Send + Sync>;

struct Shared {
    failure: watch::Sender<Option<Failure>>,
    hooks: Mutex<Vec<FailureHook>>,
    step: AtomicU64,
    step_source: Mutex<Option<Box<dyn Fn() -> u64 + Send + Sync>>>,
    /// Set before a clean leave, so that the coordinator's going away is not a failure.
    leaving: AtomicBool,
    /// On the coordinator's host: whether every other member was told of the failure.
    told_everyone: Option<Box<dyn Fn() -> bool + Send + Sync>>,
}

impl Shared {
    /// Records the group's first failure and runs the hooks.
    fn fail(&self, failure: Failure) {
        let first = self.failure.send_if_modified(|f| {
            let first = f.is_none();
            if first {
                *f = Some(failure.clone());
            }
            first
        });
        if first {
            self.let_the_others_learn();
            for hook in self.hooks.lock().unwrap_or_else(|e| e.into_inner()).iter() {
                hook(&failure);
            }
        }
    }

    /// On the coordinator's host, waits (briefly) until the other members were handed the failure, so that a
    /// hook or caller that ends this process does not take the coordinator, and the news, with it.
    fn let_the_others_learn(&self) {
        if let Some(told) = &self.told_everyone {
            let deadline = Instant::now() + Duration::from_secs(2);
            while !told() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn step(&self) -> u64 {
        match &*self.step_source.lock().unwrap_or_else(|e| e.into_inner()) {
            Some(source) => source(),
            None => self.step.load(Relaxed),
        }
    }
}

/// A process's membership of a group. Dropping it without [`Member::leave`] looks like a crash to the others.
pub struct Member {
    runtime: Runtime,
    client: CoordinatorClient<Channel>,
    config: MemberConfig,
    heartbeat_timeout: Duration,
    shared: Arc<Shared>,
    barrier_rounds: Mutex<HashMap<String, u64>>,
    /// The coordinator this process hosts, if any (process 0 by default).
    hosted: Option<Coordinator>,
}

impl Member {
    /// Joins the group at `config.coordinator`: registers, starts heartbeats and the watch for failures, and
    /// waits until every member has joined.
    pub fn join(config: MemberConfig) -> Result<Member> {
        Self::join_with(config, None)
    }

    /// Starts a coordinator on `bind` (this process hosts it), then joins it (at the port it got, when
    /// `config.coordinator`'s port is 0).
    pub fn host_and_join(bind: &str, config: MemberConfig, heartbeat_timeout: Duration) -> Result<Member> {
        config.check()?;
        let coordinator_config = CoordinatorConfig { num_processes: Some(config.num_processes), heartbeat_timeout };
        let coordinator = Coordinator::start(bind, coordinator_config)?;
        let address = match config.coordinator.strip_suffix(":0") {
            Some(host) => format!("{host}:{}", coordinator.address().port()),
            None => config.coordinator.clone(),
        };
        let config = MemberConfig { coordinator: address, coordinator_host: Some(config.process_id), ..config };
        Self::join_with(config, Some(coordinator))
    }

    fn join_with(config: MemberConfig, hosted: Option<Coordinator>) -> Result<Member> {
        config.check()?;
        let runtime = runtime("lazuli-member")?;
        let client = runtime.block_on(connect(&config))?;
        let registered = runtime.block_on(
            client
                .clone()
                .register(RegisterRequest { process_id: config.process_id, num_processes: config.num_processes }),
        );
        let heartbeat_timeout = match registered {
            Ok(r) => Duration::from_millis(r.into_inner().heartbeat_timeout_ms),
            Err(status) => {
                return Err(Error::Refused {
                    coordinator: config.coordinator.clone(),
                    process_id: config.process_id,
                    message: status.message().to_string(),
                })
            }
        };
        let shared = Arc::new(Shared {
            failure: watch::channel(None).0,
            hooks: Mutex::new(Vec::new()),
            step: AtomicU64::new(0),
            step_source: Mutex::new(None),
            leaving: AtomicBool::new(false),
            told_everyone: hosted
                .as_ref()
                .map(|c| Box::new(c.failure_delivered()) as Box<dyn Fn() -> bool + Send + Sync>),
        });
        let member = Member {
            runtime,
            client,
            config,
            heartbeat_timeout,
            shared,
            barrier_rounds: Mutex::new(HashMap::new()),
            hosted,
        };
        member.runtime.spawn(member.beat());
        member.runtime.spawn(member.watch());
        member.barrier("lazuli/join", member.config.connect_timeout).map_err(|e| match e {
            Error::Timeout(why) => Error::Timeout(format!("not every process joined the group in time: {why}")),
            other => other,
        })?;
        Ok(member)
    }

    pub fn process_id(&self) -> u32 {
        self.config.process_id
    }

    pub fn num_processes(&self) -> u32 {
        self.config.num_processes
    }

    /// The coordinator's heartbeat timeout.
    pub fn heartbeat_timeout(&self) -> Duration {
        self.heartbeat_timeout
    }

    /// The step reported with the next heartbeat.
    pub fn set_step(&self, step: u64) {
        self.shared.step.store(step, Relaxed);
    }

    /// Reports steps from `source` instead of [`Member::set_step`] (e.g. a training loop's step counter).
    pub fn report_steps_from(&self, source: impl Fn() -> u64 + Send + Sync + 'static) {
        *self.shared.step_source.lock().unwrap_or_else(|e| e.into_inner()) = Some(Box::new(source));
    }

    /// Runs `hook` once when the group fails (on a thread of the member's own), e.g. to end a process that
    /// may be blocked where no error can reach it.
    pub fn on_failure(&self, hook: impl Fn(&Failure) + Send + Sync + 'static) {
        self.shared.hooks.lock().unwrap_or_else(|e| e.into_inner()).push(Box::new(hook));
        if let Some(f) = self.failure() {
            if let Some(hook) = self.shared.hooks.lock().unwrap_or_else(|e| e.into_inner()).last() {
                hook(&f);
            }
        }
    }

    /// Whether [`Member::leave`] got as far as leaving.
    pub fn has_left(&self) -> bool {
        self.shared.leaving.load(Relaxed)
    }

    /// The group's failure, if one was seen.
    pub fn failure(&self) -> Option<Failure> {
        self.shared.failure.borrow().clone()
    }

    /// Sets `key` to `value` for every member.
    pub fn put(&self, key: &str, value: &[u8]) -> Result<()> {
        let request = PutRequest { key: key.to_string(), value: value.to_vec() };
        self.call("put", Duration::ZERO, |mut c| async move { c.put(request).await.map(drop) })
    }

    /// The value of `key`, waiting up to `timeout` for some member to set it.
    pub fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        let request = GetRequest { key: key.to_string(), timeout_ms: timeout.as_millis().max(1) as u64 };
        let found = self.call("get", timeout, |mut c| async move { c.get(request).await })?;
        found.into_inner().value.ok_or_else(|| Error::Timeout(format!("key {key:?} was not set in time")))
    }

    /// The value of `key` if set, without waiting.
    pub fn try_get(&self, key: &str) -> Result<Option<Vec<u8>>> {
        let request = GetRequest { key: key.to_string(), timeout_ms: 0 };
        Ok(self.call("try_get", Duration::ZERO, |mut c| async move { c.get(request).await })?.into_inner().value)
    }

    /// Removes `key` (nothing if it is not set): a key per step would otherwise grow the store for the whole run.
    pub fn delete(&self, key: &str) -> Result<()> {
        let request = GetRequest { key: key.to_string(), timeout_ms: 0 };
        self.call("delete", Duration::ZERO, |mut c| async move { c.delete(request).await.map(drop) })
    }

    /// Waits until every member reached the barrier `name` as often as this one, at most `timeout`.
    pub fn barrier(&self, name: &str, timeout: Duration) -> Result<()> {
        let round = {
            let mut rounds = self.barrier_rounds.lock().unwrap_or_else(|e| e.into_inner());
            let r = rounds.entry(name.to_string()).or_insert(0);
            *r += 1;
            *r
        };
        let request = BarrierRequest {
            name: format!("{name}#{round}"),
            process_id: self.config.process_id,
            timeout_ms: timeout.as_millis() as u64,
        };
        self.call("barrier", timeout, |mut c| async move { c.barrier(request).await.map(drop) })
    }

    /// Leaves the group cleanly once every member got here: waits (at most `timeout`) for them, then
    /// [`Member::depart`]s.
    pub fn leave(&self, timeout: Duration) -> Result<()> {
        if self.has_left() {
            return Ok(());
        }
        self.barrier("lazuli/leave", timeout)?;
        self.depart()
    }

    /// Leaves the group now, as a member whose work is done: its going away is no failure. The coordinator's
    /// host then waits until every other member left too (or the group failed), since they still need it.
    pub fn depart(&self) -> Result<()> {
        if self.shared.leaving.swap(true, Relaxed) {
            return Ok(());
        }
        let me = Membership { process_id: self.config.process_id };
        // The coordinator's host may end as soon as the last member left, before its answer gets here: once
        // the request is sent, this member is gone either way.
        let _ = self.call("leave", Duration::ZERO, |mut c| async move { c.leave(me).await.map(drop) });
        if let Some(coordinator) = &self.hosted {
            coordinator.wait_until_all_left(Duration::from_secs(365 * 24 * 3600));
            // Lets the answer to the last member's leave go out before this process ends.
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(())
    }

    /// One call to the coordinator, ended early by a failure of the group (whose error it then returns), and
    /// given up when the coordinator does not answer within `wait` plus the heartbeat timeout.
    fn call<T, F>(
        &self,
        name: &'static str,
        wait: Duration,
        rpc: impl FnOnce(CoordinatorClient<Channel>) -> F,
    ) -> Result<T>
    where
        F: std::future::Future<Output = std::result::Result<T, Status>>,
    {
        let result = self.call_once(name, wait, rpc);
        if let Err(Error::GroupFailed(_)) = &result {
            self.shared.let_the_others_learn();
        }
        result
    }

    fn call_once<T, F>(
        &self,
        name: &'static str,
        wait: Duration,
        rpc: impl FnOnce(CoordinatorClient<Channel>) -> F,
    ) -> Result<T>
    where
        F: std::future::Future<Output = std::result::Result<T, Status>>,
    {
        if let Some(f) = self.failure() {
            return Err(Error::GroupFailed(f));
        }
        let mut failed = self.shared.failure.subscribe();
        let limit = wait + self.heartbeat_timeout;
        let result = self.runtime.block_on(async {
            tokio::select! {
                r = tokio::time::timeout(limit, rpc(self.client.clone())) => Some(r),
                _ = failed.wait_for(Option::is_some) => None,
            }
        });
        match result {
            None | Some(Ok(Err(_)) | Err(_)) if self.failure().is_some() => {
                Err(Error::GroupFailed(self.failure().expect("checked")))
            }
            Some(Ok(Ok(v))) => Ok(v),
            Some(Ok(Err(status))) => Err(self.status_error(name, status)),
            Some(Err(_)) => Err(Error::Timeout(format!(
                "the coordinator at {} did not answer {name} within {:.1} s",
                self.config.coordinator,
                limit.as_secs_f64()
            ))),
            None => unreachable!("a failure was recorded"),
        }
    }

    fn status_error(&self, call: &'static str, status: Status) -> Error {
        match status.code() {
            Code::Aborted => {
                let failure = failure_of(&status).unwrap_or_else(|| Failure {
                    lost_process: None,
                    last_step: None,
                    reason: status.message().to_string(),
                });
                self.shared.fail(failure.clone());
                Error::GroupFailed(failure)
            }
            Code::DeadlineExceeded => Error::Timeout(status.message().to_string()),
            Code::Unavailable | Code::Unknown | Code::Cancelled => {
                Error::GroupFailed(self.coordinator_lost(&format!("its connection failed ({})", status.message())))
            }
            _ => Error::Call { call, message: status.message().to_string() },
        }
    }

    fn coordinator_lost(&self, how: &str) -> Failure {
        let host = match self.config.coordinator_host {
            Some(p) if p == self.config.process_id => String::new(),
            Some(p) => format!(" (hosted by process {p}, which exited, was killed or stalled)"),
            None => String::new(),
        };
        Failure {
            lost_process: None,
            last_step: None,
            reason: format!("lost the coordinator at {}{host}: {how}", self.config.coordinator),
        }
    }

    /// Beats several times per heartbeat timeout with the current step; records the coordinator's loss when
    /// no beat got through for a whole timeout.
    fn beat(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let (mut client, shared, timeout) = (self.client.clone(), Arc::clone(&self.shared), self.heartbeat_timeout);
        let process_id = self.config.process_id;
        let lost = self.coordinator_lost(&format!("no heartbeat was answered for {:.1} s", timeout.as_secs_f64()));
        let interval = (timeout / 6).clamp(Duration::from_millis(10), Duration::from_secs(10));
        async move {
            let mut last_answer = Instant::now();
            loop {
                tokio::time::sleep(interval).await;
                if shared.leaving.load(Relaxed) || shared.failure.borrow().is_some() {
                    return;
                }
                let beat = HeartbeatRequest { process_id, step: shared.step() };
                match tokio::time::timeout(timeout, client.heartbeat(beat)).await {
                    Ok(Ok(_)) => last_answer = Instant::now(),
                    Ok(Err(status)) if status.code() == Code::Aborted => {
                        if let Some(f) = failure_of(&status) {
                            shared.fail(f);
                        }
                        return;
                    }
                    _ if last_answer.elapsed() >= timeout && !shared.leaving.load(Relaxed) => {
                        shared.fail(lost);
                        return;
                    }
                    _ => {}
                }
            }
        }
    }

    /// Holds a stream open to the coordinator: it brings another member's loss at once, and its closing
    /// means the coordinator is gone.
    fn watch(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let (mut client, shared) = (self.client.clone(), Arc::clone(&self.shared));
        let me = Membership { process_id: self.config.process_id };
        let lost = self.coordinator_lost("the connection to it closed");
        async move {
            let stream = client.watch(me).await;
            let message = match stream {
                Ok(s) => s.into_inner().message().await,
                Err(status) => Err(status),
            };
            match message {
                Ok(Some(failure)) => shared.fail(Failure::from(&failure)),
                Err(status) if status.code() == Code::Aborted => {
                    if let Some(f) = failure_of(&status) {
                        shared.fail(f);
                    }
                }
                _ if !shared.leaving.load(Relaxed) => shared.fail(lost),
                _ => {}
            }
        }
    }
}

/// Tells the coordinator at `coordinator` that `process_id` failed (e.g. `lazuli-run` saw it exit with an
/// error), so that every member learns it at once; best effort, within a second.
pub fn report_failure(coordinator: &str, process_id: u32, reason: String) -> Result<()> {
    let runtime = runtime("lazuli-report")?;
    let config = MemberConfig { connect_timeout: Duration::from_millis(500), ..MemberConfig::new(coordinator, 0, 1) };
    runtime.block_on(async {
        let mut client = connect(&config).await?;
        let failure = GroupFailure { lost_process: process_id, last_step: None, reason };
        match tokio::time::timeout(Duration::from_secs(1), client.report_failure(failure)).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(status)) => Err(Error::Call { call: "report_failure", message: status.message().to_string() }),
            Err(_) => Err(Error::Timeout(format!("the coordinator at {coordinator} did not answer in time"))),
        }
    })
}

/// The structured failure an `ABORTED` status carries in its details.
fn failure_of(status: &Status) -> Option<Failure> {
    GroupFailure::decode(status.details()).ok().map(|f| Failure::from(&f))
}

/// Connects, retrying until the connect timeout: the coordinator's host may start after this process.
async fn connect(config: &MemberConfig) -> Result<CoordinatorClient<Channel>> {
    let endpoint = Endpoint::from_shared(format!("http://{}", config.coordinator))
        .map_err(|e| Error::Config(format!("coordinator address {:?}: {e}", config.coordinator)))?
        .connect_timeout(Duration::from_secs(1))
        .tcp_nodelay(true);
    let started = Instant::now();
    loop {
        match endpoint.connect().await {
            Ok(channel) => return Ok(CoordinatorClient::new(channel)),
            Err(e) if started.elapsed() >= config.connect_timeout => {
                return Err(Error::Unreachable {
                    coordinator: config.coordinator.clone(),
                    waited: started.elapsed(),
                    reason: source_chain(&e),
                })
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

fn source_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(&format!(": {s}"));
        source = s.source();
    }
    text
}

/// A small runtime of its own, so that blocking callers on any thread can use it.
pub(crate) fn runtime(name: &str) -> Result<Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name(name)
        .enable_all()
        .build()
        .map_err(|e| Error::Config(format!("cannot start the {name} threads: {e}")))
}
