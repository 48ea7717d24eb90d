//! The CPU launcher: one thread that uploads inputs, runs single-device CPU programs and frees the buffers they
//! replace, so that the host records step N+1 while step N runs.
//!
//! Why a thread of lazuli's own: the CPU plugin's asynchronous mode hands every program to a worker thread and
//! wakes the waiter through the operating system, about 80 µs per step on the 2-core machine of
//! `docs/perf-log/2026-11-30-cpu-launcher.md`, more than a small step runs. Here each side of a hand-off spins for
//! a while (`WAIT_SPIN`, `IDLE_SPIN`) before it sleeps, so the steps of a training loop meet a launcher that is
//! still awake.
//!
//! The plugin calls for these programs (uploads, execution, destroying the buffers the launcher made) happen on
//! the launcher. Buffers that one thread makes and another destroys cost the plugin's allocator more than the
//! hand-off saves (a prototype: 16.5 → 20.7 µs per mlp-tiny launch), so a dropped [`DeviceValue`] goes back.
//!
//! Which programs come here is `materialize`'s choice (`Config::cpu_launcher`): single-device CPU programs of a
//! thread that has not read a result of its latest program since launching it.

use std::cell::Cell;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use lazuli_hlo::Loc;
use lazuli_pjrt::{Buffer, ElementType, ErrorCode, LoadedExecutable};

use crate::diagnostics::metrics::{Counters, COUNTERS};
use crate::error::Result;
use crate::runtime::value::{DeviceValue, Failure};
use crate::runtime::Runtime;

/// How long a thread waiting for a program spins before it sleeps: longer than a small step's program, short
/// against a big one (whose cores it would take from the program).
const WAIT_SPIN: Duration = Duration::from_micros(200);

/// How long the idle launcher spins before it sleeps. Longer than a thread takes to wake from sleep (tens of µs
/// on a virtual machine) plus record a small step: were it shorter, a loop whose host once slept (preempted, say)
/// would wake the launcher through the OS, sleep while it runs, and both would keep sleeping every step (measured:
/// 160 µs per mlp-tiny step instead of 17). It spins only between programs, when its core is otherwise idle.
const IDLE_SPIN: Duration = Duration::from_millis(1);

/// One input of a program.
#[derive(Clone)]
pub(crate) enum Arg {
    /// A value on the device (or soon there: an earlier program in the queue computes it).
    Value(Arc<DeviceValue>),
    /// Host data the launcher uploads into `into` right before the program runs.
    Upload { bytes: Arc<Vec<u8>>, ty: ElementType, dims: Vec<i64>, reuse: bool, into: Arc<DeviceValue> },
    /// One device's piece of a value laid out over a mesh (programs on a mesh run from the materializing thread).
    Shard(Arc<Buffer>),
}

impl Arg {
    /// The input's buffer, waiting for the launcher if it is making it.
    pub fn buffer(&self) -> Result<&Buffer> {
        match self {
            Arg::Value(v) | Arg::Upload { into: v, .. } => v.buffer(),
            Arg::Shard(b) => Ok(b),
        }
    }
}

/// A program to run: its inputs in parameter order and the values its outputs fill.
pub(crate) struct Job {
    pub exe: Arc<LoadedExecutable>,
    pub args: Vec<Arg>,
    pub outputs: Vec<Arc<DeviceValue>>,
    pub ticket: Arc<Ticket>,
    /// The core the submitting thread ran on (see `cores::step_aside`).
    pub from_core: Option<usize>,
}

/// A queued program's completion, and the line that launched it.
pub(crate) struct Ticket {
    pub at: Loc,
    done: AtomicBool,
    failure: OnceLock<Failure>,
}

impl Ticket {
    pub fn new(at: Loc) -> Arc<Ticket> {
        Arc::new(Ticket { at, done: AtomicBool::new(false), failure: OnceLock::new() })
    }

    pub fn is_done(&self) -> bool {
        self.done.load(Ordering::Acquire)
    }

    /// Wait until the program has run; its error, if it failed.
    pub fn wait(&self) -> Result<()> {
        wait_until(|| self.is_done());
        self.failure.get().map_or(Ok(()), |f| Err(f.error()))
    }
}

struct Launcher {
    queue: Mutex<Queue>,
    wake: Condvar,
    /// Jobs and buffers queued since the launcher last emptied the queue (read while spinning, without the lock).
    queued: AtomicUsize,
}

#[derive(Default)]
struct Queue {
    jobs: VecDeque<Job>,
    /// Buffers dropped on other threads, destroyed here.
    graves: Vec<Buffer>,
    /// The launcher sleeps on `wake`.
    parked: bool,
}

static LAUNCHER: OnceLock<Launcher> = OnceLock::new();

thread_local! {
    static ON_LAUNCHER: Cell<bool> = const { Cell::new(false) };
    /// Launcher-made buffers this thread dropped, not yet handed back (see `bury`).
    static GRAVES: std::cell::RefCell<Vec<Buffer>> = const { std::cell::RefCell::new(Vec::new()) };
    /// This thread read a result of its latest program, or waited for its programs, since it launched that
    /// program (see `take_demand`).
    static DEMANDED: Cell<bool> = const { Cell::new(false) };
    /// The number of this thread's latest program (see `next_program`).
    static PROGRAMS: Cell<u64> = const { Cell::new(0) };
}

/// Number this thread's next program (from 1).
pub(crate) fn next_program() -> u64 {
    PROGRAMS.set(PROGRAMS.get() + 1);
    PROGRAMS.get()
}

/// Note that this thread waited for all its programs (`wait()`).
pub(crate) fn note_wait() {
    DEMANDED.set(true);
}

/// Note a read of `value`: a result of the thread's latest program means the thread needs results as soon as
/// they exist. A result of an earlier one (a loop that logs the previous step's loss) does not.
pub(crate) fn note_read(value: &DeviceValue) {
    if of_latest_program(value) {
        DEMANDED.set(true);
    }
}

/// Whether `value` is a result of this thread's latest program.
pub(crate) fn of_latest_program(value: &DeviceValue) -> bool {
    value.program != 0 && value.program == PROGRAMS.get()
}

/// Whether this thread read a result of its latest program (or waited) since launching it, and start over. A
/// loop that reads every step's loss gains nothing from the launcher (the read waits for the program anyway) and
/// would pay the hand-over both ways, so such a step runs on the calling thread; a loop that records the next
/// step instead, or reads an older step's results, is queued.
pub(crate) fn take_demand() -> bool {
    DEMANDED.replace(false)
}

impl Launcher {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Everything queued, spinning for up to `IDLE_SPIN` and then sleeping until something is.
    fn next(&self) -> (VecDeque<Job>, Vec<Buffer>) {
        let mut spin = Spin::new(IDLE_SPIN);
        while self.queued.load(Ordering::Acquire) == 0 && spin.again() {}
        let mut q = self.lock();
        while q.jobs.is_empty() && q.graves.is_empty() {
            q.parked = true;
            q = self.wake.wait(q).unwrap_or_else(|e| e.into_inner());
        }
        q.parked = false;
        self.queued.store(0, Ordering::Release);
        (std::mem::take(&mut q.jobs), std::mem::take(&mut q.graves))
    }

    fn push(&self, add: impl FnOnce(&mut Queue)) {
        let mut q = self.lock();
        add(&mut q);
        self.queued.fetch_add(1, Ordering::Release);
        if q.parked {
            self.wake.notify_one();
        }
    }
}

/// Queue `job` on the launcher (started on first use).
pub(crate) fn submit(rt: &'static Runtime, job: Job) {
    let launcher = LAUNCHER.get_or_init(|| {
        std::thread::Builder::new()
            .name("lazuli-launcher".into())
            .spawn(move || run(rt))
            .map(|_| ())
            .unwrap_or_else(|e| panic!("lazuli cannot start its launcher thread: {e}"));
        Launcher { queue: Mutex::new(Queue::default()), wake: Condvar::new(), queued: AtomicUsize::new(0) }
    });
    let graves = take_graves();
    launcher.push(|q| {
        q.jobs.push_back(job);
        q.graves.extend(graves);
    });
}

/// Hand this thread's buried buffers to the launcher now (when it waits for everything, for example).
pub(crate) fn flush_graves() {
    if let Some(l) = LAUNCHER.get() {
        hand_over_graves(l);
    }
}

/// Destroy `buffer` (made on the launcher) there. Small ones wait on this thread for the next program it queues
/// (one hand-over per step instead of one per buffer); large ones, whose memory matters, go at once.
pub(super) fn bury(buffer: Buffer) {
    const AT_ONCE_BYTES: usize = 1 << 20;
    const BATCH: usize = 64;
    if ON_LAUNCHER.try_with(Cell::get).unwrap_or(true) {
        return drop(buffer);
    }
    let Some(l) = LAUNCHER.get() else { return drop(buffer) };
    if buffer.element_count() * buffer.element_type().byte_size() >= AT_ONCE_BYTES {
        return l.push(|q| q.graves.push(buffer));
    }
    let full = GRAVES.try_with(|g| {
        let mut g = g.borrow_mut();
        g.push(buffer);
        g.len() >= BATCH
    });
    match full {
        Ok(true) => hand_over_graves(l),
        Ok(false) => {}
        // During thread teardown the list is gone: destroyed here (correct from any thread, only slower).
        Err(_) => {}
    }
}

/// This thread's buried buffers (none during thread teardown: the list is dropped with the thread).
fn take_graves() -> Vec<Buffer> {
    GRAVES.try_with(|g| std::mem::take(&mut *g.borrow_mut())).unwrap_or_default()
}

/// This thread's buried buffers, to the launcher.
fn hand_over_graves(l: &Launcher) {
    let graves = take_graves();
    if !graves.is_empty() {
        l.push(|q| q.graves.extend(graves));
    }
}

fn run(rt: &'static Runtime) {
    ON_LAUNCHER.set(true);
    // `submit` initializes the cell right after spawning this thread.
    let launcher = loop {
        match LAUNCHER.get() {
            Some(l) => break l,
            None => std::thread::yield_now(),
        }
    };
    loop {
        let (jobs, graves) = launcher.next();
        // `shutdown` sets STOPPING, then waits while BUSY: set BUSY first, then look (both sequentially
        // consistent), so that one of the two sees the other.
        BUSY.store(true, Ordering::SeqCst);
        if STOPPING.load(Ordering::SeqCst) {
            // The process is ending and the plugin may be torn down next: touch nothing of it.
            std::mem::forget((jobs, graves));
            BUSY.store(false, Ordering::SeqCst);
            continue;
        }
        drop(graves);
        for job in jobs {
            cores::step_aside(job.from_core);
            let ticket = job.ticket.clone();
            let result =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| execute(rt, &job))).unwrap_or_else(|_| {
                    let message = "the launcher thread panicked while running this program".to_string();
                    Err(Failure { at: ticket.at, code: Some(ErrorCode::Internal), message })
                });
            if let Err(f) = result {
                // Whatever this job was to make fails the same way (a value that stayed pending would hang reads).
                let uploads = job.args.iter().filter_map(|a| match a {
                    Arg::Upload { into, .. } => Some(into),
                    _ => None,
                });
                for value in job.outputs.iter().chain(uploads) {
                    value.fill(Err(f.clone()));
                }
                let _ = ticket.failure.set(f);
            }
            drop(job);
            ticket.done.store(true, Ordering::Release);
            wake_waiters();
        }
        BUSY.store(false, Ordering::SeqCst);
    }
}

/// The process is ending (see `shutdown`).
static STOPPING: AtomicBool = AtomicBool::new(false);
/// The launcher is running programs or destroying buffers.
static BUSY: AtomicBool = AtomicBool::new(false);

/// At process exit, after the queued programs were waited for: from now on the launcher calls into the plugin no
/// more (what it holds is leaked), and this returns once it is not in the middle of a call.
pub(crate) fn shutdown() {
    STOPPING.store(true, Ordering::SeqCst);
    while BUSY.load(Ordering::SeqCst) {
        std::thread::yield_now();
    }
}

/// Upload the job's host inputs, run it and fill its outputs. An error fails the job's outputs and its ticket.
fn execute(rt: &Runtime, job: &Job) -> std::result::Result<(), Failure> {
    let at = job.ticket.at;
    let t0 = Instant::now();
    for arg in &job.args {
        if let Arg::Upload { bytes, ty, dims, reuse, into } = arg {
            // Nothing runs while the launcher uploads, so an earlier upload's buffer may be overwritten.
            let uploaded = if *reuse {
                rt.client.buffer_from_host_reusing(bytes, *ty, dims, &rt.device)
            } else {
                rt.client.buffer_from_host(bytes, *ty, dims, &rt.device)
            };
            into.fill(uploaded.map_err(|e| Failure::new(at, &e)));
        }
    }
    let mut inputs = Vec::with_capacity(job.args.len());
    for arg in &job.args {
        let value = match arg {
            Arg::Value(v) | Arg::Upload { into: v, .. } => v,
            Arg::Shard(b) => {
                inputs.push(b.as_ref());
                continue;
            }
        };
        match value.cell.get() {
            Some(Ok(b)) => inputs.push(b),
            // An earlier program failed to make this input: this one fails the same way.
            Some(Err(f)) => return Err(f.clone()),
            None => {
                let message = "an input was queued after the program that reads it".to_string();
                return Err(Failure { at, code: Some(ErrorCode::Internal), message });
            }
        }
    }
    let t1 = Instant::now();
    Counters::add(&COUNTERS.upload_ns, (t1 - t0).as_nanos() as u64);
    let (mut outs, done) = job.exe.launch_sharded(&[inputs]).map_err(|e| Failure::new(at, &e))?;
    done.wait().map_err(|e| Failure::new(at, &e))?;
    Counters::add(&COUNTERS.execute_ns, t1.elapsed().as_nanos() as u64);
    let outs = outs.pop().unwrap_or_default();
    if outs.len() != job.outputs.len() {
        let message = format!("the program returned {} outputs, {} expected", outs.len(), job.outputs.len());
        return Err(Failure { at, code: Some(ErrorCode::Internal), message });
    }
    for (value, buffer) in job.outputs.iter().zip(outs) {
        value.fill(Ok(buffer));
    }
    Ok(())
}

/// Threads sleeping in `wait_until`, and what they sleep on.
static WAITERS: AtomicUsize = AtomicUsize::new(0);
static PARK: Mutex<()> = Mutex::new(());
static PARKED: Condvar = Condvar::new();

fn wake_waiters() {
    if WAITERS.load(Ordering::Acquire) > 0 {
        let _guard = PARK.lock().unwrap_or_else(|e| e.into_inner());
        PARKED.notify_all();
    }
}

/// Spin until `ready()`, for up to `WAIT_SPIN`, then sleep until the launcher finishes a program and it holds.
pub(super) fn wait_until(ready: impl Fn() -> bool) {
    let mut spin = Spin::new(WAIT_SPIN);
    while !ready() {
        if !spin.again() {
            WAITERS.fetch_add(1, Ordering::AcqRel);
            let mut guard = PARK.lock().unwrap_or_else(|e| e.into_inner());
            while !ready() {
                // The timeout only guards against a missed wake-up; the launcher wakes sleepers after every program.
                guard = PARKED.wait_timeout(guard, Duration::from_millis(5)).unwrap_or_else(|e| e.into_inner()).0;
            }
            drop(guard);
            WAITERS.fetch_sub(1, Ordering::AcqRel);
            break;
        }
    }
}

/// A bounded spin: busy at first, then yielding the core between checks. The scheduler sometimes puts the
/// launcher and the thread that waits for it on one core; a pure spin would then hold the core the other side
/// needs until the time slice ends (measured: whole repetitions at 53 µs per mlp-tiny step instead of 17).
struct Spin {
    start: Instant,
    limit: Duration,
    rounds: u32,
}

impl Spin {
    fn new(limit: Duration) -> Spin {
        Spin { start: Instant::now(), limit, rounds: 0 }
    }

    /// Wait a little; false once the time is up.
    fn again(&mut self) -> bool {
        const BUSY_ROUNDS: u32 = 16;
        self.rounds += 1;
        if self.rounds < BUSY_ROUNDS {
            std::hint::spin_loop();
            return true;
        }
        std::thread::yield_now();
        let now = Instant::now();
        now - self.start < self.limit
    }
}

/// Keeping the launcher off the core of the thread that records.
pub(crate) mod cores {
    /// The calling thread's core, where the system says.
    pub fn current() -> Option<usize> {
        #[cfg(target_os = "linux")]
        return Some(rustix::thread::sched_getcpu());
        #[cfg(not(target_os = "linux"))]
        None
    }

    /// Move the launcher off `core` if it runs there. The scheduler sometimes wakes the launcher on the core of
    /// the thread that woke it and then keeps both there (a thread that ran recently is not moved to an idle
    /// core): they would take turns on one core while another idles (measured in the benchmark's alternating
    /// runs: 75 µs per mlp-tiny step instead of 18). Excluding the core moves the thread at once; the full set is
    /// restored right after, so the launcher is never pinned.
    pub fn step_aside(core: Option<usize>) {
        #[cfg(target_os = "linux")]
        if let Some(core) = core.filter(|&c| c == rustix::thread::sched_getcpu()) {
            use rustix::thread::{sched_getaffinity, sched_setaffinity};
            let Ok(allowed) = sched_getaffinity(None) else { return };
            let mut elsewhere = allowed;
            elsewhere.unset(core);
            if elsewhere.count() > 0 && sched_setaffinity(None, &elsewhere).is_ok() {
                let _ = sched_setaffinity(None, &allowed);
            }
        }
        #[cfg(not(target_os = "linux"))]
        let _ = core;
    }
}
