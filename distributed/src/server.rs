//! The coordinator: a gRPC service holding the group's key-value store, its members, barriers and heartbeats.
//!
//! One mutex guards the whole state; every change bumps a version on a `watch` channel, and a call that waits
//! (a get, a barrier) checks its condition, then waits for the next version or its deadline. A member is lost
//! when its watch stream's connection closes before it left (it exited or was killed) or when it has not
//! beaten for longer than the heartbeat timeout (it stalled); the first loss fails the group for good, and
//! every member's next call, and its watch stream at once, carry that failure.
// tonic's `Status` is the error type every service method returns; boxing it here would only add copies.
#![allow(clippy::result_large_err)]

use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use crate::error::{Error, Result};
use crate::proto::{
    BarrierRequest, Empty, GetRequest, GetResponse, GroupFailure, HeartbeatRequest, Membership, PutRequest,
    RegisterRequest, RegisterResponse,
};
use crate::rpc::coordinator_server::{Coordinator as CoordinatorRpc, CoordinatorServer};

/// How a coordinator is set up.
#[derive(Clone, Debug)]
pub struct CoordinatorConfig {
    /// The group's size; `None` takes it from the first process that registers.
    pub num_processes: Option<u32>,
    /// A member silent for longer than this is lost (default 60 s).
    pub heartbeat_timeout: Duration,
}

impl Default for CoordinatorConfig {
    fn default() -> Self {
        CoordinatorConfig { num_processes: None, heartbeat_timeout: Duration::from_secs(60) }
    }
}

#[derive(Debug)]
struct Member {
    last_beat: Instant,
    step: Option<u64>,
    left: bool,
}

#[derive(Default)]
struct State {
    num_processes: Option<u32>,
    /// Which process fixed `num_processes` (for the mismatch error); `None`: the coordinator's configuration.
    size_set_by: Option<u32>,
    members: HashMap<u32, Member>,
    kv: HashMap<String, Vec<u8>>,
    barriers: HashMap<String, BTreeSet<u32>>,
    failure: Option<GroupFailure>,
    /// Members whose watch stream was handed the failure, or closed.
    told: BTreeSet<u32>,
}

impl State {
    fn fail(&mut self, process: u32, reason: String) {
        if self.failure.is_none() {
            let last_step = self.members.get(&process).and_then(|m| m.step);
            self.failure = Some(GroupFailure { lost_process: process, last_step, reason });
        }
    }

    fn check_failed(&self) -> std::result::Result<(), Status> {
        match &self.failure {
            Some(f) => Err(Status::with_details(
                tonic::Code::Aborted,
                crate::error::describe_failure(f),
                prost::Message::encode_to_vec(f).into(),
            )),
            None => Ok(()),
        }
    }

    fn check_member(&self, process_id: u32) -> std::result::Result<(), Status> {
        self.check_failed()?;
        match self.members.get(&process_id) {
            Some(m) if !m.left => Ok(()),
            Some(_) => Err(Status::failed_precondition(format!("process {process_id} has already left the group"))),
            None => Err(Status::failed_precondition(format!("process {process_id} has not registered"))),
        }
    }
}

struct Shared {
    state: Mutex<State>,
    /// Bumped on every change a waiting call may be waiting for.
    version: watch::Sender<u64>,
    heartbeat_timeout: Duration,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn changed(&self) {
        self.version.send_modify(|v| *v += 1);
    }

    /// Waits until `ready` returns `Some`, the deadline passes (`None`), or `ready` returns an error.
    async fn wait_for<T>(
        &self,
        deadline: Instant,
        mut ready: impl FnMut(&mut State) -> std::result::Result<Option<T>, Status>,
    ) -> std::result::Result<Option<T>, Status> {
        let mut version = self.version.subscribe();
        loop {
            if let Some(v) = ready(&mut self.lock())? {
                return Ok(Some(v));
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(None);
            }
            if tokio::time::timeout(deadline - now, version.changed()).await.is_err() {
                return ready(&mut self.lock());
            }
        }
    }

    /// Marks members silent for longer than the timeout as lost.
    fn check_heartbeats(&self) {
        let mut state = self.lock();
        if state.failure.is_some() {
            return;
        }
        let silent = state
            .members
            .iter()
            .filter(|(_, m)| !m.left && m.last_beat.elapsed() > self.heartbeat_timeout)
            .map(|(&id, m)| (id, m.last_beat.elapsed()))
            .min_by_key(|&(id, _)| id);
        if let Some((id, silence)) = silent {
            let reason = format!(
                "stopped heartbeating: nothing for {:.1} s (heartbeat timeout {:.1} s); it is stalled or hung",
                silence.as_secs_f64(),
                self.heartbeat_timeout.as_secs_f64()
            );
            state.fail(id, reason);
            drop(state);
            self.changed();
        }
    }

    /// A member's watch stream closed: lost unless it left first.
    fn disconnected(&self, process_id: u32) {
        let mut state = self.lock();
        if state.members.get(&process_id).is_some_and(|m| !m.left) {
            state.fail(process_id, "lost its connection to the coordinator: it exited or was killed".into());
            drop(state);
            self.changed();
        }
    }
}

fn millis(ms: u64) -> Duration {
    Duration::from_millis(ms)
}

struct Service {
    shared: Arc<Shared>,
}

type FailureStream = Pin<Box<dyn tokio_stream::Stream<Item = std::result::Result<GroupFailure, Status>> + Send>>;

#[tonic::async_trait]
impl CoordinatorRpc for Service {
    async fn register(
        &self,
        request: Request<RegisterRequest>,
    ) -> std::result::Result<Response<RegisterResponse>, Status> {
        let RegisterRequest { process_id, num_processes } = request.into_inner();
        let mut state = self.shared.lock();
        state.check_failed()?;
        if num_processes == 0 {
            return Err(Status::invalid_argument("the number of processes must be at least 1, got 0"));
        }
        let group_size = match state.num_processes {
            Some(n) => n,
            None => {
                state.num_processes = Some(num_processes);
                state.size_set_by = Some(process_id);
                num_processes
            }
        };
        if num_processes != group_size {
            let by = match state.size_set_by {
                Some(p) => format!("process {p}"),
                None => "the coordinator's configuration".into(),
            };
            return Err(Status::invalid_argument(format!(
                "mismatched process counts: process {process_id} was started for a group of {num_processes} \
                 processes, but the group has {group_size} (set by {by})"
            )));
        }
        if process_id >= group_size {
            return Err(Status::invalid_argument(format!(
                "process id {process_id} is out of range: a group of {group_size} processes has ids 0 to {}",
                group_size - 1
            )));
        }
        if state.members.get(&process_id).is_some_and(|m| !m.left) {
            return Err(Status::already_exists(format!(
                "duplicate process id {process_id}: another process registered with this id first"
            )));
        }
        state.members.insert(process_id, Member { last_beat: Instant::now(), step: None, left: false });
        drop(state);
        self.shared.changed();
        let heartbeat_timeout_ms = self.shared.heartbeat_timeout.as_millis() as u64;
        Ok(Response::new(RegisterResponse { heartbeat_timeout_ms }))
    }

    async fn heartbeat(&self, request: Request<HeartbeatRequest>) -> std::result::Result<Response<Empty>, Status> {
        let HeartbeatRequest { process_id, step } = request.into_inner();
        let mut state = self.shared.lock();
        state.check_member(process_id)?;
        if let Some(m) = state.members.get_mut(&process_id) {
            m.last_beat = Instant::now();
            m.step = Some(step);
        }
        Ok(Response::new(Empty {}))
    }

    type WatchStream = FailureStream;

    async fn watch(&self, request: Request<Membership>) -> std::result::Result<Response<FailureStream>, Status> {
        let process_id = request.into_inner().process_id;
        self.shared.lock().check_member(process_id)?;
        let (tx, rx) = mpsc::channel(1);
        let shared = Arc::clone(&self.shared);
        tokio::spawn(async move {
            let failure = shared.wait_for(far_future(), |s| Ok(s.failure.clone()));
            tokio::select! {
                _ = tx.closed() => shared.disconnected(process_id),
                f = failure => if let Ok(Some(f)) = f { let _ = tx.send(Ok(f)).await; },
            }
            shared.lock().told.insert(process_id);
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn put(&self, request: Request<PutRequest>) -> std::result::Result<Response<Empty>, Status> {
        let PutRequest { key, value } = request.into_inner();
        let mut state = self.shared.lock();
        state.check_failed()?;
        state.kv.insert(key, value);
        drop(state);
        self.shared.changed();
        Ok(Response::new(Empty {}))
    }

    async fn get(&self, request: Request<GetRequest>) -> std::result::Result<Response<GetResponse>, Status> {
        let GetRequest { key, timeout_ms } = request.into_inner();
        let deadline = Instant::now() + millis(timeout_ms);
        let found = self
            .shared
            .wait_for(deadline, |s| {
                s.check_failed()?;
                Ok(s.kv.get(&key).cloned())
            })
            .await?;
        if found.is_none() && timeout_ms > 0 {
            return Err(Status::deadline_exceeded(format!(
                "key {key:?} was not set within {:.1} s",
                millis(timeout_ms).as_secs_f64()
            )));
        }
        Ok(Response::new(GetResponse { value: found }))
    }

    async fn delete(&self, request: Request<GetRequest>) -> std::result::Result<Response<Empty>, Status> {
        let key = request.into_inner().key;
        let mut state = self.shared.lock();
        state.check_failed()?;
        state.kv.remove(&key);
        Ok(Response::new(Empty {}))
    }

    async fn barrier(&self, request: Request<BarrierRequest>) -> std::result::Result<Response<Empty>, Status> {
        let BarrierRequest { name, process_id, timeout_ms } = request.into_inner();
        let deadline = Instant::now() + millis(timeout_ms);
        {
            let mut state = self.shared.lock();
            state.check_member(process_id)?;
            state.barriers.entry(name.clone()).or_default().insert(process_id);
        }
        self.shared.changed();
        let mut missing = Vec::new();
        let done = self
            .shared
            .wait_for(deadline, |s| {
                s.check_failed()?;
                let arrived = s.barriers.get(&name).map_or(0, BTreeSet::len);
                let n = s.num_processes.unwrap_or(0);
                missing = (0..n).filter(|p| !s.barriers[&name].contains(p)).collect();
                Ok((arrived as u32 >= n).then_some(()))
            })
            .await?;
        match done {
            Some(()) => Ok(Response::new(Empty {})),
            None => Err(Status::deadline_exceeded(format!(
                "barrier {name:?} timed out after {:.1} s waiting for process(es) {}",
                millis(timeout_ms).as_secs_f64(),
                list(&missing)
            ))),
        }
    }

    async fn report_failure(&self, request: Request<GroupFailure>) -> std::result::Result<Response<Empty>, Status> {
        let GroupFailure { lost_process, reason, .. } = request.into_inner();
        self.shared.lock().fail(lost_process, reason);
        self.shared.changed();
        Ok(Response::new(Empty {}))
    }

    async fn leave(&self, request: Request<Membership>) -> std::result::Result<Response<Empty>, Status> {
        let process_id = request.into_inner().process_id;
        let mut state = self.shared.lock();
        if let Some(m) = state.members.get_mut(&process_id) {
            m.left = true;
        }
        drop(state);
        self.shared.changed();
        Ok(Response::new(Empty {}))
    }
}

pub(crate) fn list(ids: &[u32]) -> String {
    ids.iter().map(u32::to_string).collect::<Vec<_>>().join(", ")
}

fn far_future() -> Instant {
    Instant::now() + Duration::from_secs(100 * 365 * 24 * 3600)
}

/// A running coordinator. Dropping it stops the service.
pub struct Coordinator {
    address: SocketAddr,
    shared: Arc<Shared>,
    stop: Option<oneshot::Sender<()>>,
    runtime: Option<tokio::runtime::Runtime>,
}

impl Coordinator {
    /// Serves on `bind` ("host:port"; port 0 picks a free one, see [`Coordinator::address`]) on threads of
    /// its own.
    pub fn start(bind: &str, config: CoordinatorConfig) -> Result<Coordinator> {
        if config.heartbeat_timeout.is_zero() {
            return Err(Error::Config("the heartbeat timeout must be longer than 0 s".into()));
        }
        let runtime = crate::client::runtime("lazuli-coordinator")?;
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind(bind))
            .map_err(|e| Error::Config(format!("the coordinator cannot listen on {bind}: {e}")))?;
        let address = listener.local_addr().map_err(|e| Error::Config(format!("{bind}: {e}")))?;
        let (version, _) = watch::channel(0);
        let state = State { num_processes: config.num_processes, ..State::default() };
        let shared =
            Arc::new(Shared { state: Mutex::new(state), version, heartbeat_timeout: config.heartbeat_timeout });
        let (stop, stopped) = oneshot::channel::<()>();
        let service = CoordinatorServer::new(Service { shared: Arc::clone(&shared) });
        // Without TCP_NODELAY each small answer waits for the peer's delayed ACK.
        let incoming = tokio_stream::StreamExt::map(tokio_stream::wrappers::TcpListenerStream::new(listener), |s| {
            if let Ok(stream) = &s {
                let _ = stream.set_nodelay(true);
            }
            s
        });
        runtime.spawn(async move {
            let server = tonic::transport::Server::builder().add_service(service).serve_with_incoming_shutdown(
                incoming,
                async {
                    let _ = stopped.await;
                },
            );
            let _ = server.await;
        });
        runtime.spawn(monitor(Arc::clone(&shared)));
        Ok(Coordinator { address, shared, stop: Some(stop), runtime: Some(runtime) })
    }

    /// A check whether every member still there was handed the group's failure: the host of the coordinator
    /// waits for it before exiting, so that the others learn which member was lost rather than only that the
    /// coordinator went away.
    pub fn failure_delivered(&self) -> impl Fn() -> bool + Send + Sync + 'static {
        let shared = Arc::clone(&self.shared);
        move || {
            let state = shared.lock();
            let lost = state.failure.as_ref().map(|f| f.lost_process);
            state.members.iter().all(|(id, m)| m.left || Some(*id) == lost || state.told.contains(id))
        }
    }

    /// The group's failure, once it failed.
    pub fn failure(&self) -> Option<crate::Failure> {
        self.shared.lock().failure.as_ref().map(crate::Failure::from)
    }

    /// The address it listens on.
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// Waits until every registered member has left (or the group failed), at most `timeout`; true if they did.
    pub fn wait_until_all_left(&self, timeout: Duration) -> bool {
        let runtime = self.runtime.as_ref().expect("a running coordinator has its runtime");
        let all_left = self.shared.wait_for(Instant::now() + timeout, |s| {
            let n = s.num_processes.unwrap_or(0) as usize;
            let done = s.failure.is_some() || (s.members.len() == n && s.members.values().all(|m| m.left));
            Ok(done.then_some(()))
        });
        matches!(runtime.block_on(all_left), Ok(Some(())))
    }
}

impl Drop for Coordinator {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_timeout(Duration::from_millis(200));
        }
    }
}

/// Checks heartbeats several times per timeout, so a stalled member is found within about 1.1 timeouts.
async fn monitor(shared: Arc<Shared>) {
    let period = (shared.heartbeat_timeout / 10).clamp(Duration::from_millis(20), Duration::from_secs(1));
    loop {
        tokio::time::sleep(period).await;
        shared.check_heartbeats();
    }
}
