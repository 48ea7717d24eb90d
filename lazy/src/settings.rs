//! Every environment variable lazuli reads, read here and nowhere else in the library, each with its accepted
//! values, its default and its error for a bad value. [`VARIABLES`] lists them (the README's table lists the same
//! ones: its unit test checks it). The runtime's [`Config`](crate::runtime::Config) is made from them
//! (`Config::from_env`); what is needed before a runtime exists (the precision of products, the event file, strict
//! mode) is read here on first use: they apply before a runtime exists (`diagnostics::strict_budget()`, a
//! product's precision at its recording line). The library never sets an environment variable.

use std::path::PathBuf;
use std::time::Duration;

use lazuli_hlo::Precision;
use lazuli_kernels::cross_entropy::GradTiling;
use lazuli_kernels::Implementation;
use lazuli_pjrt::provision::Sources;
use lazuli_pjrt::XlaOption;

use crate::error::{Error, Result};
use crate::runtime::distributed::Distributed;

/// One variable: its name, what it sets, the values it takes and its default.
#[derive(Clone, Copy, Debug)]
pub struct Variable {
    pub name: &'static str,
    pub sets: &'static str,
    pub values: &'static str,
    pub default: &'static str,
}

const fn v(name: &'static str, sets: &'static str, values: &'static str, default: &'static str) -> Variable {
    Variable { name, sets, values, default }
}

/// Every variable lazuli reads, in the order of the README's table.
pub const VARIABLES: &[Variable] = &[
    v("LAZULI_DEVICE", "the backend", "cpu, gpu (cuda), tpu, rocm, xpu", "cpu"),
    v("LAZULI_CPU_PLUGIN", "which pinned CPU plugin", "lammps-jax-pjrt-cpu, xla-cpu-pjrt", "lammps-jax-pjrt-cpu"),
    v("LAZULI_PJRT_PLUGIN", "any PJRT plugin file, instead of a CPU plugin", "a path", "unset"),
    v("LAZULI_GPU_PLUGIN", "the CUDA plugin file", "a path", "found in Python's site-packages"),
    v("LAZULI_TPU_PLUGIN", "libtpu (also TPU_LIBRARY_PATH)", "a path", "found in Python's site-packages"),
    v("LAZULI_ROCM_PLUGIN", "the ROCm plugin file", "a path", "found in Python's site-packages"),
    v("LAZULI_XPU_PLUGIN", "the oneAPI (Intel GPU) plugin file", "a path", "found in Python's site-packages"),
    v("LAZULI_TARGET", "a pinned plugin of the target table, even if one is installed", "a row's name", "unset"),
    v("LAZULI_WHEELS", "wheel files to take plugins and libraries from before downloading", "a directory", "unset"),
    v("LAZULI_CACHE_DIR", "where plugins and compiled programs are kept", "a directory", "~/.cache/lazuli"),
    v(
        "LAZULI_PYTHON",
        "the Python whose pip fetches plugins and libraries; none: no Python, no site-packages",
        "a command, or none",
        "python3",
    ),
    v("LAZULI_CPU_DEVICES", "virtual CPU devices", "1 to 2048", "1"),
    v("LAZULI_CPU_LAUNCHER", "where CPU programs run", "1 (on), 0 (off), always", "1 with two cores or more"),
    v("LAZULI_CPU_ASYNC", "CPU programs on the plugin's threads", "1, 0", "0"),
    v("LAZULI_XLA_OPTIONS", "XLA debug options for every compile", "name=value …", "none"),
    v("LAZULI_MATMUL_PRECISION", "the precision of f32 products", "default, high, highest", "default"),
    v("LAZULI_ATTENTION", "attention's implementation", "auto, cudnn, triton, composite", "auto"),
    v("LAZULI_LAYER_NORM", "layer norm's implementation (`nn::LayerNorm`)", "auto, triton, composite", "auto"),
    v("LAZULI_BIAS_GELU", "bias + GELU's implementation (`Tensor::bias_gelu`)", "auto, triton, composite", "auto"),
    v(
        "LAZULI_CROSS_ENTROPY",
        "cross-entropy's implementation (`Tensor::cross_entropy`)",
        "auto, triton, composite",
        "auto",
    ),
    v(
        "LAZULI_FINITE_COUNT",
        "how a guarded finite check counts (one Triton kernel on NVIDIA GPUs, or XLA's reductions)",
        "auto, triton, composite",
        "auto",
    ),
    v(
        "LAZULI_CROSS_ENTROPY_GRAD",
        "where lazuli's cross-entropy kernel writes the loss's gradient, and the forward's tiling",
        "forward, forward:ROWS,COLS,WARPS,STAGES, backward",
        "forward (1,2048,4,2)",
    ),
    v("LAZULI_DUMP_DIR", "a directory every compiled program is written to", "a directory", "unset"),
    v(
        "LAZULI_PROFILE_TRACE",
        "a file each `profile()` writes the plugin's whole trace to (an `XSpace`, as `*.xplane.pb` holds)",
        "a path",
        "unset",
    ),
    v("LAZULI_COMPILE_CACHE", "the persistent compile cache", "a directory, off", "<cache dir>/executables"),
    v("LAZULI_COMPILE_CACHE_LIMIT", "its size limit", "bytes, or with K, M, G", "2G"),
    v(
        "LAZULI_PROGRAM_CACHE_LIMIT",
        "how many compiled programs a process keeps (the least recently used beyond it are evicted)",
        "1 or more",
        "64",
    ),
    v(
        "LAZULI_WAIT_SPIN",
        "how long a wait for the device polls before it sleeps",
        "microseconds",
        "200; 50000 on GPUs",
    ),
    v("LAZULI_DONATE", "donation of dying inputs' buffers to outputs", "1, 0", "1"),
    v(
        "LAZULI_SPLIT_UPDATE",
        "an optimizer's step() launching the gradients before recording its update",
        "auto, on, off",
        "auto (on for NVIDIA GPUs, unchecked or under stop)",
    ),
    v(
        "LAZULI_SCANNED_BLOCKS",
        "how scanned blocks (GptConfig::scan_blocks) run: a loop, or written out in the program",
        "auto, loop, unrolled",
        "auto (unrolled on GPUs, a loop elsewhere)",
    ),
    v(
        "LAZULI_BACKWARD_REPLAY",
        "backward() making its gradient ops from those of an earlier pass over a forward of the same shape",
        "1, 0",
        "1",
    ),
    v("LAZULI_EVENTS", "a JSON-lines file of events", "a path", "unset"),
    v("LAZULI_STRICT", "strict mode", "1 (on), 0 (off), programs=N,warmup=S", "0"),
    v("LAZULI_CHECK_FINITE", "checking each step's outputs for NaN and infinities", "off, stop, skip, log", "off"),
    v(
        "LAZULI_LOCATE_AHEAD",
        "the program locating a trip compiled on a thread and run once before any trip (stop and log)",
        "auto (on for NVIDIA GPUs, after 10 s of training), 1, 0",
        "auto",
    ),
    v(
        "LAZULI_CHECK_INDICES",
        "index_select, embedding and cross-entropy targets checked like index_select_checked",
        "1, 0",
        "0",
    ),
    v("LAZULI_COORDINATOR", "the coordinator of a multi-process group (`lazuli-run` sets it)", "host:port", "unset"),
    v("LAZULI_PROCESS_ID", "this process's id in its group", "0 to N-1", "unset"),
    v("LAZULI_NUM_PROCESSES", "the group's number of processes", "1 or more", "unset"),
    v("LAZULI_COORDINATOR_EXTERNAL", "the coordinator runs elsewhere (else process 0 serves it)", "1, 0", "0"),
    v("LAZULI_HEARTBEAT_TIMEOUT", "silence after which a member counts as lost", "seconds", "60"),
];

/// The value of `name` if set and not empty. The only place the library reads its environment.
fn var(name: &'static str) -> Option<String> {
    debug_assert!(VARIABLES.iter().any(|v| v.name == name), "{name} is not listed");
    let value = std::env::var_os(name)?.to_string_lossy().into_owned(); // not UTF-8: read lossily, then checked
    (!value.trim().is_empty()).then_some(value)
}

fn bad(name: &str, value: &str, expected: impl std::fmt::Display) -> Error {
    Error::Config(format!("{name}={value:?}: expected {expected}"))
}

/// A 1/0 switch.
fn switch(name: &'static str, default: bool) -> Result<bool> {
    match var(name) {
        None => Ok(default),
        Some(v) => match v.as_str() {
            "1" | "true" | "on" => Ok(true),
            "0" | "false" | "off" => Ok(false),
            _ => Err(bad(name, &v, "1 or 0")),
        },
    }
}

/// Which kind of plugin to load.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// XLA's CPU plugin, provisioned automatically (see `lazuli_pjrt::provision`).
    Cpu,
    /// NVIDIA GPUs: `LAZULI_GPU_PLUGIN`, else an installed CUDA plugin (`jax_plugins/xla_cuda13` or `xla_cuda12`),
    /// else the pinned `jax-cuda13-pjrt` wheel.
    Gpu,
    /// libtpu: `LAZULI_TPU_PLUGIN` or `TPU_LIBRARY_PATH`, else installed, else the pinned `libtpu` wheel.
    Tpu,
    /// AMD GPUs: `LAZULI_ROCM_PLUGIN`, else installed, else the pinned `jax-rocm7-pjrt` wheel.
    Rocm,
    /// Intel GPUs: `LAZULI_XPU_PLUGIN`, else installed, else the pinned `jax-oneapi-pjrt` wheel.
    Xpu,
}

impl Backend {
    /// The device of `lazuli_pjrt::provision`'s target table.
    pub fn device(self) -> lazuli_pjrt::provision::Device {
        use lazuli_pjrt::provision::Device;
        match self {
            Backend::Cpu => Device::Cpu,
            Backend::Gpu => Device::Cuda,
            Backend::Tpu => Device::Tpu,
            Backend::Rocm => Device::Rocm,
            Backend::Xpu => Device::Xpu,
        }
    }
}

/// Where single-device CPU programs run. On the CPU the "device" is the host's own cores: a program launched from
/// the thread that recorded it runs there before `sync()` returns. lazuli's launcher thread runs it instead, so
/// the host records the next step meanwhile (`runtime/launcher.rs`); the launcher and a thread that waits for it
/// spin for a short while before sleeping, so a tight training loop keeps a second core busy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CpuLauncher {
    /// Every program runs on the thread that materializes it.
    Off,
    /// A step's program goes to the launcher unless the thread read a result of its latest program (or called
    /// `wait()`) since launching it: a loop that reads every step's loss would wait for the program anyway, and
    /// the hand-over costs a few µs. Reading an older program's results (the previous step's loss) does not
    /// count. The default where the machine has two cores or more (`LAZULI_CPU_LAUNCHER=1`).
    Adaptive,
    /// Every single-device program goes to the launcher (`LAZULI_CPU_LAUNCHER=always`; for testing it).
    Always,
}

impl Default for CpuLauncher {
    /// `Adaptive` with two cores or more; a spinning launcher would take the only core from the host.
    fn default() -> CpuLauncher {
        if std::thread::available_parallelism().is_ok_and(|n| n.get() >= 2) {
            CpuLauncher::Adaptive
        } else {
            CpuLauncher::Off
        }
    }
}

/// Whether an optimizer's `step()` first launches the step's gradients (every live pending tensor: the loss,
/// the gradients) as a program of their own, its update then being the step boundary's program
/// (`LAZULI_SPLIT_UPDATE`). On a device that runs programs asynchronously, the host then records the update,
/// plans it and the plugin prepares its launch (its many parameter, moment and weight-copy buffers) while the
/// device runs the forward and backward, instead of before the device starts. Under `LAZULI_CHECK_FINITE=stop`
/// the update's guard reads the gradients' trip from the sticky flag; `skip` and `log` keep a step in one program.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SplitUpdate {
    /// On NVIDIA GPUs, where it shortens a step the host waits for (the default).
    #[default]
    Auto,
    /// On every device (on the CPU a program launched from the recording thread runs before the launch returns,
    /// so there is nothing to overlap; for testing it).
    On,
    /// One program per step.
    Off,
}

/// How [`ScannedBlocks`](crate::nn::scanned::ScannedBlocks) lowers its scan (`LAZULI_SCANNED_BLOCKS`), where the model does
/// not say ([`ScannedBlocks::unroll`](crate::nn::scanned::ScannedBlocks)). Either way the graph holds one block, so
/// recording and walking do not grow with depth; what differs is the compiled program.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BlockScan {
    /// Written out on GPUs, where XLA's compile grows little with depth and a loop's state (its stacked
    /// activations and gradients, copied and zeroed every step) costs a large part of the step; a loop elsewhere,
    /// where the compile grows with depth (the default).
    #[default]
    Auto,
    /// A `stablehlo.while` over the blocks: the compiled program holds one block.
    Loop,
    /// The blocks written out one after the other ([`Scan::unroll`](crate::Scan::unroll)).
    Unrolled,
}

/// Under [`LocateAhead::Auto`], how long a step structure trains (from its first checked run) before its locating
/// program is compiled ahead: a script of a few steps then ends without waiting at exit for a compile it never
/// used, while a run long enough to trip late has it ready (the compile itself takes some 15 s for GPT-2 small on
/// an H200). A trip before it compiles its locating program.
pub const LOCATE_AHEAD_AFTER: std::time::Duration = std::time::Duration::from_secs(10);

/// Where the check locates trips (`LAZULI_CHECK_FINITE=stop` or `log`): whether each training step structure's
/// locating program is compiled on a thread of its own once the structure runs again, and run once on a finite
/// step, so that a trip names its op without a compile (`LAZULI_LOCATE_AHEAD`). The price: a compile as long as
/// the locator's on a host thread while the run trains, one locating run (its memory beside the state), and, for a
/// process that ends within the compile, a wait for it at exit. Measured on an H200 in
/// `docs/perf-log/2026-12-05-locator-ahead-by-default.md`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LocateAhead {
    /// On NVIDIA GPUs, where a trip's compile is many steps' time and the host has cores to spare (the default),
    /// once a structure has been trained for [`LOCATE_AHEAD_AFTER`]: a shorter run would wait at exit for a compile
    /// it never used. Off on the CPU, whose few cores run the step's kernels.
    #[default]
    Auto,
    /// On every device, from a structure's second run.
    On,
    /// A trip compiles its locating program.
    Off,
}

/// What a step whose values hold NaN or infinities does (`LAZULI_CHECK_FINITE`). When on, every program computes
/// one more, tiny output (counts of non-finite elements). Under `Skip` and `Stop` the program also keeps its state:
/// each parameter and optimizer state output becomes the value it replaces when what enters the update is
/// non-finite (under `Stop`, also in every program after a trip), so donation stays on and a tripped step changes
/// nothing (`exec/finite/`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CheckFinite {
    /// No check (the default): programs are as recorded.
    #[default]
    Off,
    /// A step whose loss or gradients are not all finite is an [`Error::NonFinite`], naming the first op that made
    /// a non-finite value from finite operands and its line. The step and every program launched after it leave
    /// parameters and optimizer state as they were before it (a sticky flag on the device), so the check is read
    /// once two later programs are launched (or at `wait()`, or at a read of a result of the thread's latest
    /// program: a loop reading its loss gets the error from the bad step's own read), never waiting for the device,
    /// and the step is run again on exactly its inputs to locate the op (compiled ahead on NVIDIA GPUs, see
    /// [`LocateAhead`]). A non-finite value that an update makes from finite inputs
    /// shows at the next step, as a non-finite input named with its line.
    Stop,
    /// A step whose loss or gradients (what enters the update) are not all finite leaves the state as it was
    /// before it and the run carries on, like dynamic loss scaling's skipped step: an event, a report on stderr
    /// for the first one, and `Metrics::skipped_steps`. A step's check is read once two later programs are
    /// launched (or at `wait()`, or at a read of a result of the thread's latest program), so checking never
    /// waits for the device. A non-finite value that the update
    /// makes from finite inputs reaches the state and is an [`Error::NonFinite`] saying so.
    Skip,
    /// The step's values are kept, non-finite or not, and the run carries on; the first trip is located and its
    /// report printed to stderr. Donation is off, so that the step can run again on its inputs.
    Log,
}

/// The most virtual CPU devices one process may ask for: beyond a few thousand the plugin's per-device state
/// grows without bound (99,999,999,999 grew past 6 GB before failing), and no mesh needs more.
pub const MAX_CPU_DEVICES: i64 = 2048;

/// Where compiled programs are kept between processes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CompileCache {
    /// `<cache dir>/executables`.
    Default,
    /// A directory of the user's.
    Dir(PathBuf),
    /// No persistent cache.
    Off,
}

pub(crate) fn device() -> Result<Backend> {
    Ok(match var("LAZULI_DEVICE").unwrap_or_default().to_ascii_lowercase().as_str() {
        "" | "cpu" => Backend::Cpu,
        "gpu" | "cuda" => Backend::Gpu,
        "tpu" => Backend::Tpu,
        "rocm" => Backend::Rocm,
        "xpu" => Backend::Xpu,
        other => return Err(bad("LAZULI_DEVICE", other, "cpu, gpu, tpu, rocm or xpu")),
    })
}

pub(crate) fn cpu_devices() -> Result<i64> {
    match var("LAZULI_CPU_DEVICES") {
        None => Ok(1),
        Some(s) => s
            .parse::<i64>()
            .ok()
            .filter(|n| (1..=MAX_CPU_DEVICES).contains(n))
            .ok_or_else(|| bad("LAZULI_CPU_DEVICES", &s, format!("1 to {MAX_CPU_DEVICES}"))),
    }
}

pub(crate) fn cpu_async() -> Result<bool> {
    switch("LAZULI_CPU_ASYNC", false)
}

pub(crate) fn cpu_launcher() -> Result<CpuLauncher> {
    match var("LAZULI_CPU_LAUNCHER") {
        None => Ok(CpuLauncher::default()),
        Some(v) => match v.as_str() {
            "0" | "off" => Ok(CpuLauncher::Off),
            "1" | "on" => Ok(CpuLauncher::Adaptive),
            "always" => Ok(CpuLauncher::Always),
            _ => Err(bad("LAZULI_CPU_LAUNCHER", &v, "1, 0 or always")),
        },
    }
}

/// `name=value …`, whitespace-separated; `true`/`false` and integers are typed, anything else is a string, list
/// options comma-separated.
pub(crate) fn xla_options() -> Result<Vec<(String, XlaOption)>> {
    var("LAZULI_XLA_OPTIONS")
        .unwrap_or_default()
        .split_whitespace()
        .map(|item| match item.split_once('=') {
            Some((name, value)) if !name.is_empty() => Ok((name.to_string(), XlaOption::parse(value))),
            _ => Err(Error::Config(format!("LAZULI_XLA_OPTIONS: {item:?} is not name=value"))),
        })
        .collect()
}

pub(crate) fn attention() -> Result<Implementation> {
    let v = var("LAZULI_ATTENTION").unwrap_or_default();
    Implementation::parse(&v).ok_or_else(|| bad("LAZULI_ATTENTION", &v, "auto, cudnn, triton or composite"))
}

/// A Triton kernel's setting (`LAZULI_LAYER_NORM`, `LAZULI_BIAS_GELU`, `LAZULI_CROSS_ENTROPY`): auto, triton or
/// composite.
pub(crate) fn triton_kernel(name: &'static str) -> Result<Implementation> {
    let v = var(name).unwrap_or_default();
    match Implementation::parse(&v) {
        Some(Implementation::Cudnn) | None => Err(bad(name, &v, "auto, triton or composite")),
        Some(i) => Ok(i),
    }
}

/// `LAZULI_CROSS_ENTROPY_GRAD`: the tiling of a forward that also writes the gradient, or `None` for a backward
/// kernel of its own.
pub(crate) fn cross_entropy_grad() -> Result<Option<GradTiling>> {
    const NAME: &str = "LAZULI_CROSS_ENTROPY_GRAD";
    match var(NAME) {
        None => Ok(Some(GradTiling::DEFAULT)),
        Some(v) => parse_cross_entropy_grad(&v).ok_or_else(|| {
            bad(
                NAME,
                &v,
                "forward, forward:ROWS,COLS,WARPS,STAGES (powers of two; warps up to 32, stages 1 to 8) or backward",
            )
        }),
    }
}

fn parse_cross_entropy_grad(v: &str) -> Option<Option<GradTiling>> {
    match v.trim() {
        "backward" => return Some(None),
        "forward" => return Some(Some(GradTiling::DEFAULT)),
        _ => {}
    }
    let numbers = v.trim().strip_prefix("forward:")?.split(',').map(|n| n.trim().parse::<usize>().ok());
    let numbers: Vec<usize> = numbers.collect::<Option<_>>()?;
    let [rows, cols, warps, stages] = numbers[..] else { return None };
    let tiling = GradTiling { rows, cols, warps: u32::try_from(warps).ok()?, stages: u32::try_from(stages).ok()? };
    tiling.unsupported().is_none().then_some(Some(tiling))
}

/// `LAZULI_WAIT_SPIN` in microseconds; `None` when unset (the backend's default).
pub(crate) fn wait_spin() -> Result<Option<std::time::Duration>> {
    let Some(v) = var("LAZULI_WAIT_SPIN") else { return Ok(None) };
    let us: u64 = v.trim().parse().map_err(|_| bad("LAZULI_WAIT_SPIN", &v, "microseconds (0 or more)"))?;
    Ok(Some(std::time::Duration::from_micros(us)))
}

pub(crate) fn donate() -> Result<bool> {
    switch("LAZULI_DONATE", true)
        .map_err(|_| bad("LAZULI_DONATE", &var("LAZULI_DONATE").unwrap_or_default(), "1 (default) or 0"))
}

pub(crate) fn check_finite() -> Result<CheckFinite> {
    match var("LAZULI_CHECK_FINITE") {
        None => Ok(CheckFinite::Off),
        Some(v) => match v.to_ascii_lowercase().as_str() {
            "off" | "0" => Ok(CheckFinite::Off),
            "stop" => Ok(CheckFinite::Stop),
            "skip" => Ok(CheckFinite::Skip),
            "log" => Ok(CheckFinite::Log),
            _ => Err(bad("LAZULI_CHECK_FINITE", &v, "off, stop, skip or log")),
        },
    }
}

/// `LAZULI_BACKWARD_REPLAY`: on unless `0`.
pub(crate) fn backward_replay_setting() -> Result<bool> {
    switch("LAZULI_BACKWARD_REPLAY", true)
}

/// [`backward_replay_setting`], read once (every `backward()` asks, with or without a runtime). A bad value is
/// `Config::from_env`'s error, and counts as on here.
pub(crate) fn backward_replay() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| backward_replay_setting().unwrap_or(true))
}

pub(crate) fn block_scan() -> Result<BlockScan> {
    match var("LAZULI_SCANNED_BLOCKS") {
        None => Ok(BlockScan::Auto),
        Some(v) => match v.to_ascii_lowercase().as_str() {
            "auto" => Ok(BlockScan::Auto),
            "loop" => Ok(BlockScan::Loop),
            "unrolled" => Ok(BlockScan::Unrolled),
            _ => Err(bad("LAZULI_SCANNED_BLOCKS", &v, "auto, loop or unrolled")),
        },
    }
}

pub(crate) fn split_update() -> Result<SplitUpdate> {
    Ok(match auto_switch("LAZULI_SPLIT_UPDATE", "auto, on or off")? {
        None => SplitUpdate::Auto,
        Some(true) => SplitUpdate::On,
        Some(false) => SplitUpdate::Off,
    })
}

pub(crate) fn locate_ahead() -> Result<LocateAhead> {
    Ok(match auto_switch("LAZULI_LOCATE_AHEAD", "auto, 1 or 0")? {
        None => LocateAhead::Auto,
        Some(true) => LocateAhead::On,
        Some(false) => LocateAhead::Off,
    })
}

/// A switch that may also be `auto` (or unset): `None` then, else whether it is on, in [`switch`]'s words. A bad
/// value is an error that names `expected`.
fn auto_switch(name: &'static str, expected: &str) -> Result<Option<bool>> {
    match var(name) {
        None => Ok(None),
        Some(v) => match v.to_ascii_lowercase().as_str() {
            "auto" => Ok(None),
            "1" | "on" | "true" => Ok(Some(true)),
            "0" | "off" | "false" => Ok(Some(false)),
            _ => Err(bad(name, &v, expected)),
        },
    }
}

/// A directory lazuli can create (it is created here).
pub(crate) fn dump_dir() -> Result<Option<PathBuf>> {
    let Some(dir) = var("LAZULI_DUMP_DIR") else { return Ok(None) };
    std::fs::create_dir_all(&dir)
        .map_err(|e| bad("LAZULI_DUMP_DIR", &dir, format_args!("a directory lazuli can create ({e})")))?;
    Ok(Some(PathBuf::from(dir)))
}

/// `LAZULI_PROFILE_TRACE`: where `profile()` writes the plugin's raw trace.
pub(crate) fn profile_trace() -> Option<PathBuf> {
    var("LAZULI_PROFILE_TRACE").map(PathBuf::from)
}

pub(crate) fn compile_cache() -> CompileCache {
    match var("LAZULI_COMPILE_CACHE") {
        None => CompileCache::Default,
        Some(v) if matches!(v.to_ascii_lowercase().as_str(), "off" | "0" | "false" | "no" | "none") => {
            CompileCache::Off
        }
        Some(v) => CompileCache::Dir(PathBuf::from(v)),
    }
}

/// Bytes (default 2 GiB).
pub(crate) fn compile_cache_limit() -> Result<u64> {
    match var("LAZULI_COMPILE_CACHE_LIMIT") {
        None => Ok(2 << 30),
        Some(v) => parse_size(&v)
            .ok_or_else(|| bad("LAZULI_COMPILE_CACHE_LIMIT", &v, "a size in bytes, or with K, M or G (500M, 2G)")),
    }
}

pub(crate) fn program_cache_limit() -> Result<usize> {
    match var("LAZULI_PROGRAM_CACHE_LIMIT") {
        None => Ok(crate::runtime::program_cache::DEFAULT_LIMIT),
        Some(s) => s
            .parse::<usize>()
            .ok()
            .filter(|&n| n >= 1)
            .ok_or_else(|| bad("LAZULI_PROGRAM_CACHE_LIMIT", &s, "1 or more")),
    }
}

/// `123`, `500K`, `20M`, `2G`, `1T` (binary units; `KiB`, `MB` … spelled out too) as bytes.
pub(crate) fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let (digits, unit) = match s.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        Some((i, _)) => s.split_at(i),
        None => (s, ""),
    };
    let shift = match unit.trim().to_ascii_uppercase().trim_end_matches("IB").trim_end_matches('B') {
        "" => 0,
        "K" => 10,
        "M" => 20,
        "G" => 30,
        "T" => 40,
        _ => return None,
    };
    digits.parse::<u64>().ok()?.checked_mul(1 << shift)
}

/// Where plugins come from: `LAZULI_PJRT_PLUGIN`, `LAZULI_CPU_PLUGIN`, `LAZULI_GPU_PLUGIN`, `LAZULI_TPU_PLUGIN`
/// (else `TPU_LIBRARY_PATH`), `LAZULI_ROCM_PLUGIN`, `LAZULI_XPU_PLUGIN`, `LAZULI_TARGET`, `LAZULI_WHEELS`,
/// `LAZULI_CACHE_DIR`, `LAZULI_PYTHON`. The plugin crate reads these itself (programs
/// that use it without lazuli name plugins the same way); this is the one call that does it for lazuli.
pub(crate) fn plugin_sources() -> Result<Sources> {
    Ok(Sources::from_env()?)
}

/// `LAZULI_CHECK_INDICES`, or the error naming it (read when the first index_select is recorded).
pub(crate) fn check_indices() -> std::result::Result<bool, String> {
    switch("LAZULI_CHECK_INDICES", false).map_err(|_| {
        let v = var("LAZULI_CHECK_INDICES").unwrap_or_default();
        format!("LAZULI_CHECK_INDICES={v:?}: expected 1 or 0 (default)")
    })
}

/// `LAZULI_MATMUL_PRECISION`, or the error naming it.
pub(crate) fn matmul_precision() -> std::result::Result<Precision, String> {
    Ok(match var("LAZULI_MATMUL_PRECISION").unwrap_or_default().to_ascii_lowercase().as_str() {
        "" | "default" => Precision::Default,
        "high" => Precision::High,
        "highest" => Precision::Highest,
        other => return Err(format!("LAZULI_MATMUL_PRECISION={other:?}: expected default, high or highest")),
    })
}

/// XLA's own `XLA_FLAGS` (read by the plugin; lazuli keys its compile cache on them).
pub(crate) fn xla_flags() -> String {
    std::env::var("XLA_FLAGS").unwrap_or_default()
}

/// `LAZULI_EVENTS`: the event file's path.
pub(crate) fn events_file() -> Option<PathBuf> {
    var("LAZULI_EVENTS").map(PathBuf::from)
}

/// The group this process joins: all three of `LAZULI_COORDINATOR`, `LAZULI_PROCESS_ID` and
/// `LAZULI_NUM_PROCESSES`, or none.
pub(crate) fn distributed() -> Result<Option<Distributed>> {
    let names = ["LAZULI_COORDINATOR", "LAZULI_PROCESS_ID", "LAZULI_NUM_PROCESSES"];
    let [coordinator, process_id, num_processes] = names.map(var);
    let (coordinator, process_id, num_processes) = match (coordinator, process_id, num_processes) {
        (None, None, None) => return Ok(None),
        (Some(c), Some(p), Some(n)) => (c, p, n),
        (c, p, n) => {
            let missing: Vec<&str> = names
                .iter()
                .zip([c.is_none(), p.is_none(), n.is_none()])
                .filter(|(_, m)| *m)
                .map(|(n, _)| *n)
                .collect();
            return Err(Error::Config(format!(
                "a multi-process run needs LAZULI_COORDINATOR, LAZULI_PROCESS_ID and LAZULI_NUM_PROCESSES; {} not set",
                missing.join(" and ")
            )));
        }
    };
    let number = |name: &str, s: &str, min: u32| {
        s.trim().parse::<u32>().ok().filter(|&v| v >= min).ok_or_else(|| bad(name, s, format!("an integer >= {min}")))
    };
    let process_id = number("LAZULI_PROCESS_ID", &process_id, 0)?;
    let num_processes = number("LAZULI_NUM_PROCESSES", &num_processes, 1)?;
    let heartbeat_timeout = match var("LAZULI_HEARTBEAT_TIMEOUT") {
        None => Distributed::DEFAULT_HEARTBEAT_TIMEOUT,
        Some(s) => s
            .trim()
            .parse::<f64>()
            .ok()
            .filter(|t| t.is_finite() && *t > 0.0)
            .map(Duration::from_secs_f64)
            .ok_or_else(|| bad("LAZULI_HEARTBEAT_TIMEOUT", &s, "a number of seconds > 0"))?,
    };
    let external_coordinator = switch("LAZULI_COORDINATOR_EXTERNAL", false)?;
    let d = Distributed {
        external_coordinator,
        heartbeat_timeout,
        ..Distributed::new(coordinator, process_id, num_processes)
    };
    d.check()?;
    Ok(Some(d))
}

/// `LAZULI_STRICT`'s raw value (`diagnostics` parses it, naming this variable in its errors).
pub(crate) fn strict() -> Option<String> {
    var("LAZULI_STRICT")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The README's table of settings lists exactly the variables read here, in the same order.
    #[test]
    fn the_readme_lists_every_variable() {
        let readme = include_str!("../../README.md");
        let table = readme.split("### Every setting").nth(1).expect("the README's \"Every setting\" section");
        let listed: Vec<&str> = table
            .lines()
            .skip_while(|l| !l.starts_with('|'))
            .take_while(|l| l.starts_with('|'))
            .skip(2)
            .filter_map(|l| l.split('`').nth(1))
            .collect();
        let read: Vec<&str> = VARIABLES.iter().map(|v| v.name).collect();
        assert_eq!(listed, read);
    }

    #[test]
    fn the_cross_entropy_gradient_setting() {
        let t = |rows, cols, warps, stages| Some(Some(GradTiling { rows, cols, warps, stages }));
        assert_eq!(parse_cross_entropy_grad("forward"), Some(Some(GradTiling::DEFAULT)));
        assert_eq!(parse_cross_entropy_grad(" backward "), Some(None));
        assert_eq!(parse_cross_entropy_grad("forward:2,2048,4,3"), t(2, 2048, 4, 3));
        for wrong in [
            "forward:3,2048,4,3",
            "forward:1,4096,64,1",
            "forward:1,4096,8,9",
            "forward:1,4096,8",
            "forward:1,4096,8,2,264",
            "fwd",
            "",
        ] {
            assert_eq!(parse_cross_entropy_grad(wrong), None, "{wrong:?}");
        }
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("1024"), Some(1024));
        assert_eq!(parse_size("500M"), Some(500 << 20));
        assert_eq!(parse_size("2G"), Some(2 << 30));
        assert_eq!(parse_size("2GiB"), Some(2 << 30));
        assert_eq!(parse_size("64k"), Some(64 << 10));
        assert_eq!(parse_size("lots"), None);
        assert_eq!(parse_size("1X"), None);
    }
}
